"""The command line, and the README's commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.support.paths import REPO

EXAMPLE = REPO / "cuvil" / "examples" / "tiny_cnn.onnx"


def cuvil(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cuvil", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "the README's first screen has a bash block"
    return [ln for ln in block.group(1).splitlines() if ln.strip() and not ln.startswith("#")]


def test_readme_gives_two_commands_and_ci_runs_the_test_one_in_tiers() -> None:
    main_job, tests = readme_commands()
    assert "pip install" in main_job and "cuvil" in main_job
    assert "pip install" in tests and "pytest" in tests
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    at = []
    for part in tests.split("&&"):
        assert part.strip() in ci, f"{part.strip()!r} is not what .ci/run runs"
        at.append(ci.index(part.strip()))
    assert at == sorted(at), ".ci/run runs the README's commands in another order"
    # the tiers: fast, then slow, both in parallel, then serial alone
    tiers = [p.strip() for p in tests.split("&&") if "pytest" in p]
    assert [t.rsplit(" -m ", 1)[1] for t in tiers] == ['"not slow and not serial"', '"slow and not serial"', "serial"]
    assert all("-n auto" in t for t in tiers[:2]) and "-n " not in tiers[2]


def test_readme_main_job_runs(tmp_path: Path) -> None:
    main_job, _ = readme_commands()
    work = tmp_path / "work"
    work.mkdir()
    job = main_job.replace("pip install -e .", f"pip install -e {REPO}").replace("cuvil/examples/", f"{REPO}/cuvil/examples/")
    r = subprocess.run(["bash", "-c", job], capture_output=True, text=True, cwd=work, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "compiled" in r.stdout and "probs: float32[1, 10]" in r.stdout
    assert (work / "out" / "tiny_cnn" / "model.c").is_file()


def test_bundled_example_is_reproducible(tmp_path: Path) -> None:
    out = tmp_path / "tiny.onnx"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_tiny_cnn.py"), str(out)], check=True, timeout=120)
    assert out.read_bytes() == EXAMPLE.read_bytes()


def test_inspect_summary_and_coverage() -> None:
    r = cuvil("inspect", str(EXAMPLE))
    assert r.returncode == 0, r.stderr
    assert "input  image: f32[batch, 3, 32, 32]" in r.stdout
    assert "symbol batch: unconstrained" in r.stdout
    assert re.search(r"^Conv\s+2\s+yes$", r.stdout, re.M)


def test_inspect_ir_prints_text_that_parses(tmp_path: Path) -> None:
    from cuvil.frontends.onnx import load_onnx
    from cuvil.ir.parser import parse_graph
    from cuvil.ir.printer import print_graph

    r = cuvil("inspect", str(EXAMPLE), "--ir", "--full")
    assert r.returncode == 0, r.stderr
    assert r.stdout == print_graph(load_onnx(str(EXAMPLE)))
    assert print_graph(parse_graph(r.stdout)) == r.stdout


def test_unsupported_ops_listed_with_exit_2(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Bernoulli", ["x"], ["d"], name="bern1"),
        helper.make_node("Frob", ["x"], ["f"], name="frob1", domain="com.example"),
        helper.make_node("Frob", ["f"], ["g"], name="frob2", domain="com.example"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, []), helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 2])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    r = cuvil("run", str(path))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    err = r.stderr.strip()
    assert "\n" not in err
    assert "ai.onnx::Bernoulli (opset 17); used by 'bern1'" in err
    assert "com.example::Frob (opset 1); used by 'frob1', 'frob2'" in err
    r = cuvil("inspect", str(path))
    assert r.returncode == 2 and re.search(r"^com\.example::Frob\s+2\s+NO$", r.stdout, re.M)


@pytest.mark.parametrize("content", [b"", b"\x00\x01garbage" * 10, None])
def test_bad_files_exit_2_with_one_line(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    for cmd in ("inspect", "run"):
        r = cuvil(cmd, str(path))
        assert r.returncode == 2, (cmd, r.stderr)
        assert r.stderr.startswith("cuvil: error: ") and r.stderr.count("\n") == 1
        assert "Traceback" not in r.stderr


def test_run_writes_outputs(tmp_path: Path) -> None:
    import numpy as np

    out = tmp_path / "out.npz"
    r = cuvil("run", str(EXAMPLE), "--seed", "3", "-o", str(out))
    assert r.returncode == 0, r.stderr
    with np.load(out) as data:
        probs = data["probs"]
    assert probs.shape == (1, 10)
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-5)
