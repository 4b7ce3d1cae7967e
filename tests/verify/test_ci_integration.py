"""The CI integration of ``cuvil verify``: GitHub workflow, GitLab template, pre-commit hook, pytest plugin.

Each YAML file is validated against a schema written here for the parts that matter
(job and step structure, the report paths CI publishes), then its command lines are
dry-run: the shell commands are executed as the CI system would run them, against the
bundled ``cuvil/examples/tiny_cnn.onnx``, with the CI system's own variables
(``$GITHUB_STEP_SUMMARY``, ``$CI_PROJECT_DIR``) pointing into a temporary folder.
Steps that only install Cuvil (``pip install``) or run a hosted action (``uses:``: checkout,
publishing the JUnit report, uploading artifacts) are skipped, and each skip is asserted to
be of that kind; what they would publish is checked to exist at the paths they name.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from tests.support.paths import REPO

pytest_plugins = ["pytester"]

WORKFLOW = REPO / "ci" / "github" / "cuvil-verify.yml"
GITLAB = REPO / "ci" / "gitlab" / "cuvil-verify.gitlab-ci.yml"
HOOKS = REPO / ".pre-commit-hooks.yaml"
PRECOMMIT_EXAMPLE = REPO / "ci" / "pre-commit" / "pre-commit-config.example.yaml"
TINY = REPO / "cuvil" / "examples" / "tiny_cnn.onnx"
#: fast arguments for dry runs: one cheap check on the reference target
FAST_ARGS = "--checks coverage --targets ref"


# --------------------------------------------------------------------------- YAML as CI systems read it


class _CILoader(yaml.SafeLoader):
    """YAML 1.2 booleans only: GitHub reads the key ``on:`` as a string, PyYAML (YAML 1.1) as True."""


_CILoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_CILoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                list("tTfF"))


def load_yaml(path: Path) -> Any:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_CILoader)


def cuvil_verify_cli() -> None:
    """Fail clearly when the ``cuvil verify`` command the CI files call is not installed."""
    r = subprocess.run([sys.executable, "-m", "cuvil", "verify", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"`cuvil verify` is not available: {r.stderr.strip()[-500:]}")
    if shutil.which("cuvil") is None:
        pytest.fail("the `cuvil` console script is not on PATH (pip install -e .)")


def unsupported_model(path: Path) -> Path:
    """An ONNX model using an op no one registered: every verification of it must fail and name the node."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob_node", domain="com.example")
    graph = helper.make_graph([node], "unsupported", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(model, path)
    return path


def run_shell(script: str, env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run one CI command block as GitHub and GitLab do: bash, stop at the first failing command."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=600)


def installs_only(command: str) -> bool:
    """Whether a command block only installs packages (skipped in dry runs: the test runs the checkout)."""
    lines = [ln.strip() for ln in command.strip().splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(lines) and all(re.match(r"^(python3? -m )?pip install ", ln) for ln in lines)


# --------------------------------------------------------------------------- GitHub Actions

STEP_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "id": {"type": "string"},
        "if": {"type": "string"},
        "uses": {"type": "string", "pattern": r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[\w.-]+$"},
        "run": {"type": "string", "minLength": 1},
        "with": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
        "env": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
        "shell": {"type": "string"},
        "continue-on-error": {"type": "boolean"},
        "timeout-minutes": {"type": "integer"},
        "working-directory": {"type": "string"},
    },
    "required": ["name"],
    "oneOf": [{"required": ["uses"]}, {"required": ["run"]}],
    "additionalProperties": False,
}

WORKFLOW_SCHEMA = {
    "type": "object",
    "required": ["name", "on", "jobs"],
    "properties": {
        "name": {"type": "string"},
        "on": {"type": ["object", "string", "array"]},
        "permissions": {"type": "object", "additionalProperties": {"enum": ["read", "write", "none"]}},
        "env": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
        "jobs": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": r"^[A-Za-z_][\w-]*$"},
            "additionalProperties": {
                "type": "object",
                "required": ["runs-on", "steps"],
                "properties": {
                    "runs-on": {"type": ["string", "array"]},
                    "timeout-minutes": {"type": "integer", "minimum": 1},
                    "env": {"type": "object"},
                    "steps": {"type": "array", "minItems": 1, "items": STEP_SCHEMA},
                },
            },
        },
    },
    "additionalProperties": False,
}


def test_github_workflow_matches_schema() -> None:
    wf = load_yaml(WORKFLOW)
    jsonschema.validate(wf, WORKFLOW_SCHEMA)
    assert {"push", "pull_request"} <= set(wf["on"])
    # the JUnit publisher writes a check run: it needs that permission
    assert wf["permissions"].get("checks") == "write"


def test_github_schema_rejects_broken_steps() -> None:
    """The schema can fail: a step with both uses and run, or an unpinned action, is rejected."""
    wf = load_yaml(WORKFLOW)
    steps = wf["jobs"]["verify"]["steps"]
    for broken in ({"name": "both", "uses": "actions/checkout@v4", "run": "true"},
                   {"name": "unpinned", "uses": "actions/checkout"},
                   {"name": "neither"}):
        bad = {**wf, "jobs": {"verify": {**wf["jobs"]["verify"], "steps": [*steps, broken]}}}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, WORKFLOW_SCHEMA)


def _steps(wf: Mapping[str, Any]) -> list[dict[str, Any]]:
    (job,) = wf["jobs"].values()
    return list(job["steps"])


def test_github_workflow_publishes_the_reports() -> None:
    steps = _steps(load_yaml(WORKFLOW))
    verify = [i for i, s in enumerate(steps) if re.search(r"^\s*cuvil verify ", s.get("run", ""), re.M)]
    assert len(verify) == 1, "one step runs cuvil verify"
    (iv,) = verify
    assert "--report-dir reports" in steps[iv]["run"]
    after = steps[iv + 1:]
    junit = [s for s in after if s.get("uses", "").startswith(("mikepenz/action-junit-report@", "dorny/test-reporter@"))]
    assert junit and junit[0]["with"]["report_paths"] == "reports/junit.xml"
    summary = [s for s in after if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert summary and "reports/summary.md" in summary[0]["run"]
    upload = [s for s in after if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload and upload[0]["with"]["path"].rstrip("/") == "reports"
    # reports are published when the verification failed too (that is when they matter)
    for s in (junit[0], summary[0], upload[0]):
        assert re.search(r"always\(\)|!cancelled\(\)|failure\(\)", s.get("if", "")), s["name"]


def _github_expr(text: str, workspace: Path) -> str:
    """Substitute the ``${{ }}`` expressions the dry run knows; any other one is an error."""
    def sub(m: re.Match[str]) -> str:
        expr = m.group(1).strip()
        if expr == "github.workspace":
            return str(workspace)
        raise AssertionError(f"the dry run does not know the expression {expr!r}")
    return re.sub(r"\$\{\{(.*?)\}\}", sub, text)


def _step_runs(step: Mapping[str, Any], failed: bool) -> bool:
    cond = step.get("if", "")
    if not failed:
        return True
    return bool(re.search(r"always\(\)|!cancelled\(\)|failure\(\)", cond))


def dry_run_github(workspace: Path, model: Path, args: str) -> tuple[list[str], list[str], dict[str, int]]:
    """Run the workflow's steps as the runner would; returns (ran, skipped, exit status per step run)."""
    wf = load_yaml(WORKFLOW)
    (job,) = wf["jobs"].values()
    env = {k: _github_expr(str(v), workspace) for k, v in {**wf.get("env", {}), **job.get("env", {})}.items()}
    env.update(CUVIL_MODEL=str(model), CUVIL_VERIFY_ARGS=args, GITHUB_STEP_SUMMARY=str(workspace / "step-summary.md"),
               GITHUB_WORKSPACE=str(workspace), CI="true")
    ran: list[str] = []
    skipped: list[str] = []
    status: dict[str, int] = {}
    failed = False
    for step in job["steps"]:
        if not _step_runs(step, failed):
            continue
        if "uses" in step:
            skipped.append(f"{step['name']}: hosted action {step['uses']}")
            continue
        if installs_only(step["run"]):
            skipped.append(f"{step['name']}: installs packages (the test runs this checkout)")
            continue
        r = run_shell(_github_expr(step["run"], workspace), {**env, **step.get("env", {})}, workspace)
        ran.append(step["name"])
        status[step["name"]] = r.returncode
        if r.returncode != 0:
            failed = True
    return ran, skipped, status


def _junit_cases(path: Path) -> Iterator[ET.Element]:
    root = ET.parse(path).getroot()
    yield from root.iter("testcase")


def test_github_workflow_dry_run(tmp_path: Path) -> None:
    cuvil_verify_cli()
    ran, skipped, status = dry_run_github(tmp_path, TINY, FAST_ARGS)
    # what was skipped, and why: checkout/setup/cache/publishing actions and the install step only
    assert any("pip" in s or "installs packages" in s for s in skipped)
    assert all("hosted action" in s or "installs packages" in s for s in skipped)
    assert "Run cuvil verify" in ran and status["Run cuvil verify"] == 0
    reports = tmp_path / "reports"
    for name in ("junit.xml", "summary.md", "report.json", "report.html"):
        assert (reports / name).is_file(), name
    cases = list(_junit_cases(reports / "junit.xml"))
    assert cases and all(c.find("failure") is None for c in cases)
    assert any("coverage" in (c.get("name", "") + c.get("classname", "")) for c in cases)
    summary = (tmp_path / "step-summary.md").read_text()
    assert summary and summary == (reports / "summary.md").read_text()


def test_github_workflow_dry_run_failing_model(tmp_path: Path) -> None:
    """A model with an unsupported op fails the verify step; the publishing steps still run and name the node."""
    cuvil_verify_cli()
    bad = unsupported_model(tmp_path / "bad.onnx")
    ran, _skipped, status = dry_run_github(tmp_path, bad, FAST_ARGS)
    assert status["Run cuvil verify"] == 1
    assert "Add the summary to the job summary" in ran
    assert status["Add the summary to the job summary"] == 0
    assert "frob_node" in (tmp_path / "step-summary.md").read_text()
    failures = [c for c in _junit_cases(tmp_path / "reports" / "junit.xml") if c.find("failure") is not None]
    assert failures and "coverage" in failures[0].get("name", "") + failures[0].get("classname", "")


# --------------------------------------------------------------------------- GitLab CI

_JOB_PROPS = {
    "image": {"type": "string"},
    "stage": {"type": "string"},
    "extends": {"type": ["string", "array"]},
    "variables": {"type": "object", "additionalProperties": {"type": "string"}},
    "cache": {"type": "object", "required": ["paths"],
              "properties": {"key": {"type": "string"}, "paths": {"type": "array", "items": {"type": "string"}}}},
    "before_script": {"type": "array", "items": {"type": "string"}},
    "script": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "after_script": {"type": "array", "items": {"type": "string"}},
    "rules": {"type": "array", "items": {"type": "object"}},
    "artifacts": {
        "type": "object",
        "properties": {
            "when": {"enum": ["always", "on_success", "on_failure"]},
            "expose_as": {"type": "string", "pattern": r"^[\w ./-]+$"},
            # GitLab's rules for exposed paths: relative, no ./ prefix, no variables, folders end with /
            "paths": {"type": "array", "items": {"type": "string", "pattern": r"^(?!\./)[^$]+$"}},
            "reports": {"type": "object", "required": ["junit"], "properties": {"junit": {"type": "string"}}},
            "expire_in": {"type": "string"},
        },
        "additionalProperties": False,
    },
}

GITLAB_SCHEMA = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": {"type": "object", "properties": _JOB_PROPS, "additionalProperties": False},
}


def _gitlab_job(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``name`` with its ``extends`` resolved as GitLab does (a deep merge, the job's keys winning)."""
    job = dict(doc[name])
    parents = job.pop("extends", [])
    merged: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        merged = _deep_merge(merged, _gitlab_job(doc, parent))
    return _deep_merge(merged, job)


def _deep_merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def test_gitlab_template_matches_schema() -> None:
    doc = load_yaml(GITLAB)
    jsonschema.validate(doc, GITLAB_SCHEMA)
    assert ".cuvil-verify" in doc, "a hidden template job to extend"
    concrete = [n for n in doc if not n.startswith(".")]
    assert concrete
    for name in concrete:
        job = _gitlab_job(doc, name)
        assert job["script"], name
        art = job["artifacts"]
        assert art["reports"]["junit"] == "reports/junit.xml"
        assert art["when"] == "always"
        assert "reports/summary.md" in art["paths"] and "expose_as" in art
        assert all(not p.endswith(("reports", "/reports")) for p in art["paths"]), "folders end with /"


def test_gitlab_schema_rejects_broken_jobs() -> None:
    doc = load_yaml(GITLAB)
    job = doc[".cuvil-verify"]
    for broken in ({**job, "artifacts": {**job["artifacts"], "when": "sometimes"}},
                   {**job, "artifacts": {**job["artifacts"], "paths": ["./reports/"]}},
                   {**job, "artifacts": {**job["artifacts"], "reports": {}}},
                   {**job, "scripts": ["typo"]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({".cuvil-verify": broken}, GITLAB_SCHEMA)


def dry_run_gitlab(project: Path, model: Path, args: str) -> tuple[int, subprocess.CompletedProcess[str], list[str]]:
    """Run the concrete job's scripts as a runner would; returns (script status, after_script run, skipped)."""
    doc = load_yaml(GITLAB)
    (name,) = [n for n in doc if not n.startswith(".")]
    job = _gitlab_job(doc, name)
    env = {"CI_PROJECT_DIR": str(project), "CI": "true", "GITLAB_CI": "true"}
    for k, v in job.get("variables", {}).items():
        env[k] = os.path.expandvars(v.replace("$CI_PROJECT_DIR", str(project)))
    env.update(CUVIL_MODEL=str(model), CUVIL_VERIFY_ARGS=args)
    skipped = [c for c in job.get("before_script", []) if installs_only(c)]
    assert skipped == job.get("before_script", []), "before_script only installs Cuvil"
    script = run_shell("\n".join(job["script"]), env, project)
    after = run_shell("\n".join(job.get("after_script", [])), env, project)   # runs whatever script did
    return script.returncode, after, skipped


def test_gitlab_template_dry_run(tmp_path: Path) -> None:
    cuvil_verify_cli()
    rc, after, skipped = dry_run_gitlab(tmp_path, TINY, FAST_ARGS)
    assert skipped and all("pip install" in s for s in skipped)
    assert rc == 0
    job = _gitlab_job(load_yaml(GITLAB), "cuvil-verify")
    art = job["artifacts"]
    junit = tmp_path / art["reports"]["junit"]
    assert junit.is_file() and list(_junit_cases(junit))
    for p in art["paths"]:
        assert (tmp_path / p).exists(), p
    # after_script prints the summary into the job log
    assert after.returncode == 0 and after.stdout == (tmp_path / "reports" / "summary.md").read_text()


def test_gitlab_template_dry_run_failing_model(tmp_path: Path) -> None:
    cuvil_verify_cli()
    rc, after, _ = dry_run_gitlab(tmp_path, unsupported_model(tmp_path / "bad.onnx"), FAST_ARGS)
    assert rc == 1
    assert after.returncode == 0 and "frob_node" in after.stdout   # the job log shows what failed
    assert next(_junit_cases(tmp_path / "reports" / "junit.xml")).find("failure") is not None


def test_gitlab_after_script_tolerates_a_missing_report(tmp_path: Path) -> None:
    """A usage error leaves no report; after_script must not add a second failure to the log."""
    cuvil_verify_cli()
    rc, after, _ = dry_run_gitlab(tmp_path, tmp_path / "missing.onnx", FAST_ARGS)
    assert rc == 2
    assert after.returncode == 0 and after.stdout == ""


# --------------------------------------------------------------------------- pre-commit

#: what pre-commit requires of a hook in .pre-commit-hooks.yaml (pre_commit.clientlib.MANIFEST_HOOK_DICT)
HOOK_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["id", "name", "entry", "language"],
        "properties": {
            "id": {"type": "string", "pattern": r"^[\w.-]+$"},
            "name": {"type": "string"},
            "entry": {"type": "string", "minLength": 1},
            "language": {"enum": ["conda", "coursier", "dart", "docker", "docker_image", "dotnet", "fail", "golang",
                                  "haskell", "julia", "lua", "node", "perl", "pygrep", "python", "r", "ruby", "rust",
                                  "swift", "unsupported", "unsupported_script", "system", "script"]},
            "files": {"type": "string"},
            "exclude": {"type": "string"},
            "types": {"type": "array", "items": {"type": "string"}},
            "args": {"type": "array", "items": {"type": "string"}},
            "pass_filenames": {"type": "boolean"},
            "require_serial": {"type": "boolean"},
            "description": {"type": "string"},
            "minimum_pre_commit_version": {"type": "string"},
        },
        "additionalProperties": False,
    },
}


def _hook() -> dict[str, Any]:
    hooks = load_yaml(HOOKS)
    jsonschema.validate(hooks, HOOK_SCHEMA)
    (hook,) = [h for h in hooks if h["id"] == "cuvil-verify"]
    return dict(hook)


def test_precommit_hook_matches_schema() -> None:
    hook = _hook()
    rx = re.compile(hook["files"])
    assert rx.search("models/net.onnx") and not rx.search("net.onnx.txt") and not rx.search("train.py")
    assert hook.get("pass_filenames", True)


def test_precommit_hook_valid_for_pre_commit() -> None:
    """pre-commit's own loader accepts the manifest and the example configuration."""
    clientlib = pytest.importorskip("pre_commit.clientlib")
    (hook,) = clientlib.load_manifest(str(HOOKS))
    assert hook["id"] == "cuvil-verify"
    config = clientlib.load_config(str(PRECOMMIT_EXAMPLE))
    assert config["repos"][0]["hooks"][0]["id"] == "cuvil-verify"


def run_hook(cwd: Path, changed: list[str], args: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the hook as pre-commit does: entry + args + the changed files that match ``files``."""
    hook = _hook()
    rx = re.compile(hook["files"])
    files = [f for f in changed if rx.search(f) and (cwd / f).is_file()]
    cmd = [*shlex.split(hook["entry"]), *(hook.get("args", []) if args is None else args), *files]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_precommit_entry_runs_on_sample_files(tmp_path: Path) -> None:
    cuvil_verify_cli()
    (tmp_path / "models").mkdir()
    shutil.copy(TINY, tmp_path / "models" / "a.onnx")
    shutil.copy(TINY, tmp_path / "b.onnx")
    (tmp_path / "README.md").write_text("not a model\n")
    r = run_hook(tmp_path, ["models/a.onnx", "README.md", "b.onnx"], args=shlex.split(FAST_ARGS))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    runs = re.findall(r"^== cuvil verify (\S+)$", r.stdout, re.M)
    assert runs == ["models/a.onnx", "b.onnx"], out     # one run per model, README.md filtered out
    # the default args are accepted by the command (a usage error would exit 2)
    r = run_hook(tmp_path, ["b.onnx"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_precommit_entry_fails_on_a_bad_model(tmp_path: Path) -> None:
    cuvil_verify_cli()
    shutil.copy(TINY, tmp_path / "good.onnx")
    unsupported_model(tmp_path / "bad.onnx")
    r = run_hook(tmp_path, ["bad.onnx", "good.onnx"], args=shlex.split(FAST_ARGS))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "frob_node" in out or "Frobnicate" in out      # the failure points at the node
    assert re.findall(r"^== cuvil verify (\S+)$", r.stdout, re.M) == ["bad.onnx", "good.onnx"]
    assert out.count("PASS coverage") == 1               # the other model was still verified, and passed


# --------------------------------------------------------------------------- pytest plugin


def test_plugin_entry_point_declared() -> None:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"]["cuvil"] == "cuvil.pytest_plugin"


def _plugin_args() -> list[str]:
    """Load the plugin through its entry point when installed (pip install -e .), else by module name."""
    eps = importlib.metadata.entry_points(group="pytest11")
    return [] if any(ep.value == "cuvil.pytest_plugin" for ep in eps) else ["-p", "cuvil.pytest_plugin"]


def _stand_in_report(results: list[Any], strict: bool = False) -> Any:
    from cuvil.verify.report import Report

    return Report(model="m.onnx", targets=["ref", "native"], checks=sorted({r.check for r in results}), results=results,
                  strict=strict)


def _scripted_verify(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]], strict_config: bool = False) -> None:
    """Replace cuvil.verify with a stand-in returning one result of each status (the plugin's mapping under test)."""
    import cuvil
    from cuvil.verify.base import CheckResult, Status

    def verify(model: Any, **kwargs: Any) -> Any:
        calls.append({"model": model, **kwargs})
        return _stand_in_report(strict=bool(kwargs.get("strict")) or strict_config, results=[
            CheckResult("coverage", Status.PASS, "every op has a kernel", target="ref"),
            CheckResult("coverage", Status.PASS, "every op has a kernel", target="native"),
            CheckResult("layerwise", Status.FAIL, "first layer over threshold: conv2", target="native",
                        figures={"max_rel_l2": 0.031}, where={"layer": "conv2", "node": "/conv2/Conv"}),
            CheckResult("dynamic-shapes", Status.WARN, "symbol batch is unbounded", where={"symbol": "batch"}),
            CheckResult("latency", Status.SKIP, "target wasm32 is not available here", target="wasm32"),
        ])

    monkeypatch.setattr(cuvil, "verify", verify, raising=False)


def test_plugin_items_per_check_and_target(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    _scripted_verify(monkeypatch, calls)
    result = pytester.runpytest(*_plugin_args(), "--cuvil-verify", "m.onnx", "--cuvil-checks", "coverage,layerwise",
                                "--cuvil-targets", "ref,native", "-v", "-p", "no:cacheprovider",
                                f"--junitxml={pytester.path / 'j.xml'}")
    result.assert_outcomes(passed=3, failed=1, skipped=1, warnings=1)
    assert calls == [{"model": "m.onnx", "checks": ["coverage", "layerwise"], "targets": ["ref", "native"]}]
    out = result.stdout.str()
    for nodeid in ("m.onnx::coverage[ref]", "m.onnx::coverage[native]", "m.onnx::layerwise[native]",
                   "m.onnx::dynamic-shapes", "m.onnx::latency[wasm32]"):
        assert nodeid in out, nodeid
    # the failure points at the layer and shows the figure
    assert "layer=conv2" in out and "max_rel_l2=0.031" in out
    assert "symbol batch is unbounded" in out   # the warning is shown
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # figures travel into pytest's own JUnit report as properties
    props = {p.get("name"): p.get("value") for p in ET.parse(pytester.path / "j.xml").getroot().iter("property")}
    assert props.get("cuvil.max_rel_l2") == "0.031" and props.get("cuvil.where.layer") == "conv2"


def test_plugin_strict_and_selection(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    _scripted_verify(monkeypatch, calls)
    result = pytester.runpytest(*_plugin_args(), "--cuvil-verify", "m.onnx", "--cuvil-strict", "-k", "dynamic",
                                "-p", "no:cacheprovider")
    assert calls[0]["strict"] is True
    result.assert_outcomes(failed=1, deselected=4)   # -k selects among the items; strict fails the warning
    assert "symbol=batch" in result.stdout.str()
    pytester.makepyfile("def test_plain():\n    assert True\n")
    result = pytester.runpytest(*_plugin_args(), "--cuvil-verify", "m.onnx", "-m", "cuvil_verify",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1, skipped=1, warnings=1, deselected=1)   # test_plain is not marked


def test_plugin_strict_from_configuration(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run made strict by the configuration (strict = true in cuvil.toml) fails its warnings without the flag."""
    calls: list[dict[str, Any]] = []
    _scripted_verify(monkeypatch, calls, strict_config=True)
    result = pytester.runpytest(*_plugin_args(), "--cuvil-verify", "m.onnx", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2, skipped=1)   # the warning fails too
    assert "strict" not in calls[0]


def test_plugin_usage_error_is_a_collection_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import cuvil
    from cuvil.verify.base import VerifyError

    def verify(model: Any, **kwargs: Any) -> Any:
        raise VerifyError("unknown check 'nope'")

    monkeypatch.setattr(cuvil, "verify", verify, raising=False)
    result = pytester.runpytest(*_plugin_args(), "--cuvil-verify", "m.onnx", "--cuvil-checks", "nope",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED   # 2, like `cuvil verify`
    assert "unknown check 'nope'" in result.stdout.str()


def test_plugin_inactive_without_option(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    _scripted_verify(monkeypatch, calls)
    pytester.makepyfile("def test_plain():\n    assert True\n")
    result = pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert calls == []


def test_fixture_returns_the_report(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    _scripted_verify(monkeypatch, calls)
    pytester.makepyfile(
        """
        def test_report(cuvil_verify):
            report = cuvil_verify("m.onnx", checks=["coverage"])
            assert [r.check for r in report.results][:2] == ["coverage", "coverage"]

        def test_gate(cuvil_verify):
            cuvil_verify.assert_ok(cuvil_verify("m.onnx"))
        """
    )
    result = pytester.runpytest(*_plugin_args(), "--cuvil-targets", "ref", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    assert "layer=conv2" in result.stdout.str()          # assert_ok lists the failing result
    assert calls[0] == {"model": "m.onnx", "checks": ["coverage"], "targets": ["ref"]}


def test_plugin_runs_the_real_suite(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """End to end with the real cuvil.verify: a good model passes, one with an unknown op fails at its node."""
    import cuvil

    if not callable(getattr(cuvil, "verify", None)):
        pytest.fail("cuvil.verify() is not available")
    bad = unsupported_model(tmp_path / "bad.onnx")
    result = pytester.runpytest(*_plugin_args(), "--cuvil-verify", str(TINY), "--cuvil-verify", str(bad),
                                "--cuvil-checks", "coverage", "--cuvil-targets", "ref", "-v", "-p", "no:cacheprovider")
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    assert re.search(r"tiny_cnn\.onnx::coverage\[ref\] PASSED", out), out
    assert re.search(r"bad\.onnx::coverage FAILED", out), out
    assert "node=frob_node" in out
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_fixture_runs_the_real_suite(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The docs' fixture example, on the real suite: a good model passes the gate, a bad one fails it at its node."""
    bad = unsupported_model(tmp_path / "bad.onnx")
    pytester.makepyfile(
        f"""
        def test_good(cuvil_verify):
            report = cuvil_verify({str(TINY)!r}, checks=["coverage"], targets=["ref"])
            assert [(r.check, r.target, str(r.status)) for r in report.results] == [("coverage", "ref", "pass")]
            cuvil_verify.assert_ok(report)

        def test_bad(cuvil_verify):
            cuvil_verify.assert_ok(cuvil_verify({str(bad)!r}, checks=["coverage"], targets=["ref"]))
        """
    )
    result = pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    assert "node=frob_node" in result.stdout.str()
