"""`cuvil compile` and `cuvil run` on artifacts; --dim; CC and CUVIL_CACHE_DIR, read only by the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.cli import parse_dim
from tests.support.paths import REPO


def cuvil_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cuvil", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """y = relu(x * w + x) over [batch, h], with an i64 second output: shape(x)."""
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["t"]),
        helper.make_node("Add", ["t", "x"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
        helper.make_node("Shape", ["x"], ["shape"]),
    ]
    g = helper.make_graph(
        nodes, "cli_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "h"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "h"]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [onnx.numpy_helper.from_array(np.array([3.0], np.float32), "w")],
    )
    path = tmp_path_factory.mktemp("m") / "cli.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {"CUVIL_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


def test_compile_saves_an_artifact_with_dims_and_reports_the_cache(
    model: Path, cache_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "art"
    r = cuvil_cli("compile", str(model), "-t", "generic", "-o", str(out), "--dim", "batch=1:256", "--dim", "h=%4",
                  env=cache_env)
    assert r.returncode == 0, r.stderr
    assert re.match(rf"compiled {re.escape(str(model))} for generic in \d+\.\d{{3}} s \(built\)\n", r.stdout)
    assert "  symbol batch: 1..256\n" in r.stdout and "  symbol h: %4\n" in r.stdout
    assert f"saved to {out}: " in r.stdout and "model.so" in r.stdout
    meta = json.loads((out / "meta.json").read_text())
    assert meta["target"] == "generic"
    assert meta["symbols"] == [{"name": "batch", "min": 1, "max": 256, "multiple_of": None},
                               {"name": "h", "min": None, "max": None, "multiple_of": 4}]
    # the build landed in CUVIL_CACHE_DIR: compiling again is a reported hit
    assert list(Path(cache_env["CUVIL_CACHE_DIR"]).glob("*/*/model.so"))
    r = cuvil_cli("compile", str(model), "-t", "generic", "--dim", "batch=1:256", "--dim", "h=%4", env=cache_env)
    assert r.returncode == 0, r.stderr
    assert "(from the build cache)" in r.stdout.splitlines()[0]


def test_run_an_artifact_with_inputs_and_random(model: Path, cache_env: dict[str, str], tmp_path: Path) -> None:
    art = tmp_path / "art"
    assert cuvil_cli("compile", str(model), "-t", "native", "-o", str(art), env=cache_env).returncode == 0
    x = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    r = cuvil_cli("run", str(art), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"))
    assert r.returncode == 0, r.stderr
    assert re.match(rf"loaded {re.escape(str(art))} \(native\) in \d+\.\d{{3}} s; ran in \d+\.\d{{3}} s\n", r.stdout)
    assert "  y: float32[2, 3] min 0 max 20 mean 6\n" in r.stdout
    assert "  shape: int64[2] min 2 max 3 mean 2.5\n" in r.stdout
    with np.load(tmp_path / "out.npz") as data:
        np.testing.assert_array_equal(data["y"], np.maximum(4 * x, 0))
        np.testing.assert_array_equal(data["shape"], [2, 3])

    r = cuvil_cli("run", str(art), "--random", "--seed", "4", "-o", str(tmp_path / "rand.npz"))
    assert r.returncode == 0, r.stderr
    r2 = cuvil_cli("run", str(model), "-t", "ref", "--random", "--seed", "4", "-o", str(tmp_path / "rand_ref.npz"))
    assert r2.returncode == 0, r2.stderr
    with np.load(tmp_path / "rand.npz") as a, np.load(tmp_path / "rand_ref.npz") as b:
        np.testing.assert_allclose(a["y"], b["y"], rtol=1e-6)

    r = cuvil_cli("run", str(art), "-t", "generic")
    assert r.returncode == 2 and "was compiled for target 'native', not 'generic'" in r.stderr
    r = cuvil_cli("run", str(art), "--dim", "batch=2")
    assert r.returncode == 2 and "--dim applies when compiling" in r.stderr
    np.savez(tmp_path / "wrong.npz", z=x)
    r = cuvil_cli("run", str(art), "--inputs", str(tmp_path / "wrong.npz"))
    assert r.returncode == 2 and "missing 'x'; unknown 'z'" in r.stderr and "Traceback" not in r.stderr


def test_run_a_model_file_compiles_with_the_environment(model: Path, cache_env: dict[str, str]) -> None:
    r = cuvil_cli("run", str(model), "-t", "generic", "--dim", "batch=2", env=cache_env)
    assert r.returncode == 0, r.stderr
    assert re.match(r"compiled .* for generic in \d+\.\d{3} s \((built|from the build cache)\); ran in", r.stdout)
    assert "  y: float32[2, 1]" in r.stdout  # batch fixed at 2; h takes its smallest value


def test_cc_comes_from_the_environment(model: Path, tmp_path: Path) -> None:
    env = {"CUVIL_CACHE_DIR": str(tmp_path / "cache"), "CC": "no-such-compiler-xyz --quiet"}
    r = cuvil_cli("compile", str(model), "-t", "generic", env=env)
    assert r.returncode == 2
    assert r.stderr.startswith("cuvil: error: C compiler 'no-such-compiler-xyz --quiet' cannot run")
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*/*/model.so"))
    r = cuvil_cli("compile", str(model), "-t", "generic", env={**env, "CC": "gcc -O1"})
    assert r.returncode == 0, r.stderr


def test_user_errors_exit_2_with_one_line(model: Path, tmp_path: Path) -> None:
    for args, message in [
        (("compile", str(model), "--dim", "batch"), "expected NAME=SPEC"),
        (("compile", str(model), "--dim", "batch=1:x"), "maximum 'x' is not an integer"),
        (("compile", str(model), "--dim", "batch=2", "--dim", "batch=3"), "--dim batch is given twice"),
        (("compile", str(model), "--dim", "seq=4"), "the model has no symbolic dim 'seq'"),
        (("compile", str(model), "-t", "tpu"), "unknown target 'tpu'"),
        (("compile", str(model), "-t", "ref", "-o", str(tmp_path / "r")), "target 'ref' cannot be saved"),
        (("run", str(tmp_path)), "holds no meta.json"),
    ]:
        r = cuvil_cli(*args, env={"CUVIL_CACHE_DIR": str(tmp_path / "cache")})
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("cuvil: error: ") and r.stderr.count("\n") == 1, r.stderr
        assert message in r.stderr, (args, r.stderr)


@pytest.mark.parametrize(
    ("text", "name", "want"),
    [
        ("batch=1:256", "batch", (1, 256)),
        ("batch=:64", "batch", (None, 64)),
        ("batch=8:", "batch", (8, None)),
        ("seq=128", "seq", 128),
        ("h=%32", "h", ("multiple", 32, None, None)),
        ("h=%32,32:1024", "h", ("multiple", 32, 32, 1024)),
        (" w = 16:32 ", "w", (16, 32)),
    ],
)
def test_parse_dim(text: str, name: str, want: object) -> None:
    got_name, got = parse_dim(text)
    assert got_name == name
    if isinstance(got, cuvil.multiple_of):
        assert ("multiple", got.n, got.min, got.max) == want
    else:
        assert got == want


@pytest.mark.parametrize("text", ["h", "=4", "h=", "h=%0", "h=%x", "h=4,1:8", "h=a:b"])
def test_parse_dim_rejects(text: str) -> None:
    with pytest.raises(cuvil.CuvilError, match="--dim"):
        parse_dim(text)


# A read or write of one variable. Handing a child process a copy of the whole environment
# (``dict(os.environ, ZIG_CACHE=...)``) reads no setting, so it is not flagged.
_ENV_ACCESS = re.compile(r"os\.environ\s*(\[|\.get\b|\.setdefault\b|\.pop\b|\.update\b)|\bgetenv\b|\bin\s+os\.environ\b")


def test_environment_is_read_only_by_the_cli() -> None:
    offenders = []
    for path in sorted((REPO / "cuvil").rglob("*.py")):
        if path.relative_to(REPO).as_posix() == "cuvil/commands/common.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _ENV_ACCESS.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, offenders
    cli = (REPO / "cuvil" / "commands" / "common.py").read_text(encoding="utf-8")
    assert 'os.environ.get("CC")' in cli and 'os.environ.get("CUVIL_CACHE_DIR")' in cli
    assert _ENV_ACCESS.search('x = os.environ.get("HOME")') and _ENV_ACCESS.search("if 'A' in os.environ:")


def test_readme_artifact_section_runs(tmp_path: Path) -> None:
    """The README's section on artifacts and the C example: its bash and Python blocks, run in order."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Saved models, and running them from C"):]
    section = section[: section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, re.S)
    assert [lang for lang, _ in blocks] == ["bash", "python", "bash"]
    for name in ("cuvil", "examples"):  # the commands' paths are relative to the repository root
        (tmp_path / name).symlink_to(REPO / name)
    env = {**os.environ, "CUVIL_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    outputs = []
    for lang, code in blocks:
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
        assert r.returncode == 0, f"{lang} block failed:\n{code}\n{r.stdout}\n{r.stderr}"
        outputs.append(r.stdout)
    assert "saved to tiny_art: " in outputs[0] and "  probs: float32[1, 10]" in outputs[0]
    assert (tmp_path / "out.npz").is_file()
    line = re.search(r"^output 0: f32 \[2, 10\] sum (\S+) fnv1a [0-9a-f]{16}$", outputs[2], re.M)
    assert line, outputs[2]
    assert float(line.group(1)) == pytest.approx(2.0, rel=1e-5)  # two rows of probabilities
