"""The six-model fleet swept end to end: on this machine's cores (``--executor local --jobs 2``), then
resumed after one model changed, and on a local Ray cluster the test starts.  One model crashes in its
C build (SIGSEGV), one hangs (killed at its 4 s limit), one fails a check, three pass; the sweep
finishes, and every report names each outcome."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO
from tests.verify.fleet.fleet_models import EXPECTED, edit_model, write_fleet

pytestmark = pytest.mark.slow


def _cli(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUVIL_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "cuvil", "verify-fleet", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


def _outcomes(fleet_json: Path) -> dict[tuple[str, str], tuple[str, str | None]]:
    data = json.loads(fleet_json.read_text())
    return {(j["model"], j["target"]): (j["status"], j["signature"] if j["status"] != "fail" else None)
            for j in data["jobs"]}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fleet swept once with the local executor, 2 jobs at a time."""
    folder = tmp_path_factory.mktemp("fleet")
    cache = tmp_path_factory.mktemp("cache")
    fleet = write_fleet(folder)
    run = _cli("fleet.toml", "--executor", "local", "--jobs", "2", "--report-dir", "out", cwd=folder, cache=cache)
    return {"folder": folder, "cache": cache, "fleet": fleet, "run": run, "out": folder / "out"}


def test_the_sweep_finishes_and_names_each_outcome(swept: dict[str, Any]) -> None:
    run = swept["run"]
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.stdout.strip() == "FAIL: 12 of 12 jobs: 8 pass, 2 fail, 1 crash, 1 timeout"
    assert _outcomes(swept["out"] / "fleet.json") == EXPECTED
    # plain progress lines: every job started and finished, with counts and the time left
    lines = run.stderr.splitlines()
    assert sum(line.startswith("[fleet] start ") for line in lines) == 12
    assert "[fleet] CRASH   models/crashes.onnx [native] precision [SIGSEGV]" in run.stderr
    assert "[fleet] TIMEOUT models/hangs.onnx [native] precision [timeout after 4 s]" in run.stderr
    assert any("12/12 done, 4 failed, 0 running, 0 queued" in line for line in lines)


def test_the_reports_of_the_sweep(swept: dict[str, Any]) -> None:
    out: Path = swept["out"]
    data = json.loads((out / "fleet.json").read_text())
    assert data["exit_status"] == 1 and data["executor"] == "local"
    assert data["counts"] == {"pass": 8, "fail": 2, "error": 0, "crash": 1, "timeout": 1, "memory": 0,
                              "not run": 0}
    for job in data["jobs"]:
        # every job links its full cuvil verify report; a process that died before writing one, its log
        assert (out / job["report"]).is_file(), job
        assert job["report"].endswith("log.txt") == (job["status"] in ("crash", "timeout"))
    fails = [j for j in data["jobs"] if j["status"] == "fail"]
    assert all("max_rel_l2" not in j["summary"] and "precision:" in j["summary"] for j in fails)
    suites = ET.parse(out / "junit.xml").getroot()
    assert [s.get("name") for s in suites] == ["models/ok_relu.onnx", "models/ok_sigmoid.onnx",
                                               "models/ok_tanh.onnx", "models/fails.onnx", "models/crashes.onnx",
                                               "models/hangs.onnx"]
    by_suite = {s.get("name"): s for s in suites}
    assert by_suite["models/fails.onnx"].get("failures") == "2"
    crashed = by_suite["models/crashes.onnx"].find("testcase[@name='precision[native]']/error")
    assert crashed is not None and crashed.get("type") == "crash" and "SIGSEGV" in crashed.get("message", "")
    hung = by_suite["models/hangs.onnx"].find("testcase[@name='precision[native]']/error")
    assert hung is not None and hung.get("type") == "timeout"
    md = (out / "summary.md").read_text()
    assert "**FAIL: 12 of 12 jobs: 8 pass, 2 fail, 1 crash, 1 timeout**" in md and "| SIGSEGV |" in md
    html = (out / "index.html").read_text()
    assert html.count('<td class="cell status-') == 12


def test_resume_runs_only_the_changed_model(swept: dict[str, Any]) -> None:
    folder: Path = swept["folder"]
    edit_model(folder, "ok_relu")
    run = _cli("fleet.toml", "--jobs", "2", "--report-dir", "out", "--resume", cwd=folder, cache=swept["cache"])
    assert run.returncode == 1, run.stderr[-3000:]
    assert "[fleet] 12 jobs: 2 to run, 10 from the results folder" in run.stderr
    started = [line for line in run.stderr.splitlines() if line.startswith("[fleet] start ")]
    assert sorted(started) == ["[fleet] start models/ok_relu.onnx [native] precision",
                               "[fleet] start models/ok_relu.onnx [ref] precision"]
    data = json.loads((swept["out"] / "fleet.json").read_text())
    assert _outcomes(swept["out"] / "fleet.json") == EXPECTED
    fresh = {(j["model"], j["target"]) for j in data["jobs"] if not j["resumed"]}
    assert fresh == {("models/ok_relu.onnx", "ref"), ("models/ok_relu.onnx", "native")}
    # the trends compare with the folder's previous sweep: the edited model ran on other inputs
    trends = {(j["model"], j["target"]): j["trend"] for j in data["jobs"]}
    assert trends[("models/ok_relu.onnx", "ref")]["same_inputs"] is False
    assert trends[("models/fails.onnx", "ref")] == {**trends[("models/fails.onnx", "ref")], "status": "fail",
                                                    "changed": False, "same_inputs": True}


def test_the_same_fleet_on_a_local_ray_cluster(swept: dict[str, Any], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'cuvil[ray]'; CI installs it)")
    import cuvil

    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the cluster's workers start from this environment
    ray.init(num_cpus=2, object_store_memory=80 * 1024 * 1024, include_dashboard=False, log_to_driver=False)
    lines = io.StringIO()
    try:
        report = cuvil.verify_fleet(swept["fleet"], executor="ray", report_dir=tmp_path / "out",
                                    cache_dir=swept["cache"], progress=lines)
    finally:
        ray.shutdown()
    assert report.exit_status == 1 and report.executor == "ray", lines.getvalue()
    assert "[fleet] 12 jobs: 12 to run, 0 from the results folder; ray executor, 2 at a time" in lines.getvalue()
    assert _outcomes(tmp_path / "out" / "fleet.json") == EXPECTED
    for r in report.results:  # each job's folder came back to the driver's results folder
        assert (tmp_path / "out" / report.link(r)).is_file(), r


def _job_processes(key: str) -> list[int]:
    """The pids of the job processes of job ``key`` (its spec lies in a folder named by the key)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "cuvil.verify.fleet.job\0" in cmd and key in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the job processes")
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_ctrl_c_ends_the_running_jobs_and_reports_what_finished(swept: dict[str, Any], tmp_path: Path,
                                                                executor: str) -> None:
    import signal
    import time

    from cuvil.verify.fleet.jobs import plan_jobs
    from cuvil.verify.fleet.spec import load_fleet

    if executor == "ray":
        pytest.importorskip("ray", reason="Ray is not installed (pip install 'cuvil[ray]'; CI installs it)")
    write_fleet(tmp_path)
    (tmp_path / "fleet.toml").write_text('[defaults]\ntargets = ["native"]\nchecks = ["precision"]\n'
                                         '[[model]]\npath = "models/hangs.onnx"\nfaults = ["native-hang"]\n')
    (job,) = plan_jobs(load_fleet(tmp_path / "fleet.toml"))
    env = {**os.environ, "CUVIL_CACHE_DIR": str(swept["cache"]), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "cuvil", "verify-fleet", "fleet.toml", "--executor", executor,
                             "--jobs", "1", "--report-dir", "out"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _job_processes(job.key) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _job_processes(job.key), "the job never started"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends the command (the job runs in a session of its own)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "cancelled: 0 of 1 jobs done" in err
    time.sleep(0.5)
    assert not _job_processes(job.key)  # the hanging job went with the sweep (on Ray: with its task)
    data = json.loads((tmp_path / "out" / "fleet.json").read_text())
    assert data["why_not_run"] == "the sweep was cancelled" and len(data["not_run"]) == 1


def test_max_failures_stops_starting_jobs(swept: dict[str, Any], tmp_path: Path) -> None:
    write_fleet(tmp_path)
    (tmp_path / "fleet.toml").write_text('[defaults]\ntargets = ["ref", "native"]\nchecks = ["precision"]\n'
                                         '[[model]]\npath = "models/crashes.onnx"\nfaults = ["native-crash"]\n'
                                         'targets = ["native"]\n[[model]]\npath = "models/ok_tanh.onnx"\n')
    run = _cli("fleet.toml", "--jobs", "1", "--max-failures", "1", "--report-dir", "out", cwd=tmp_path,
               cache=swept["cache"])
    assert run.returncode == 1, run.stderr[-3000:]
    assert "[fleet] 2 queued jobs not run: --max-failures 1 reached" in run.stderr
    assert run.stdout.strip() == "FAIL: 1 of 3 jobs: 0 pass, 0 fail, 1 crash, 2 not run"
    suites = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert [c.find("skipped") is not None for s in suites for c in s.iter("testcase")] == [False, True, True]
