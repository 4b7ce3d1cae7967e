"""The PassManager: pipeline text, running passes in order with a limit, the signature contract,
the default pipelines, ``cuvil.compile(passes=...)`` and ``cuvil opt``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import cuvil
from cuvil.cli import main
from cuvil.frontends.onnx import load_onnx
from cuvil.ir.graph import Graph, Value
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.passes import (
    Canonicalize,
    DeadCodeElimination,
    FoldConstants,
    Pass,
    PassError,
    PassManager,
    PassResult,
    PipelineError,
    default_pipeline,
    format_pipeline,
    parse_pipeline,
    register_pass,
)
from cuvil.passes.rewrite import copy_graph
from tests.support.ir_text import CHAIN
from tests.support.paths import REPO

EXAMPLE = REPO / "cuvil" / "examples" / "tiny_cnn.onnx"


@register_pass
@dataclass(frozen=True)
class _Options(Pass):
    """A pass with one option of every kind pipeline text can give (test only)."""

    name: ClassVar[str] = "test-options"
    count: int = 1
    scale: float = 1.0
    enabled: bool = True
    label: str = "x"
    cap: int | None = None

    def run(self, graph: Graph) -> PassResult:
        return PassResult(graph, False)


@register_pass
@dataclass(frozen=True)
class _RenameOutput(Pass):
    """Breaks the signature contract (test only)."""

    name: ClassVar[str] = "test-rename-output"

    def run(self, graph: Graph) -> PassResult:
        graph.outputs[0].name += "_renamed"
        return PassResult(graph, True)


@register_pass
@dataclass(frozen=True)
class _Raises(Pass):
    """Fails with a bug (test only)."""

    name: ClassVar[str] = "test-raises"

    def run(self, graph: Graph) -> PassResult:
        raise ZeroDivisionError("boom")


# ---- pipeline text -------------------------------------------------------------------------------------------------


def test_pipeline_text_round_trips() -> None:
    text = "canonicalize,fold-constants{max-elements=100},cse,dce"
    passes = parse_pipeline(text)
    assert [type(p) for p in passes][:2] == [Canonicalize, FoldConstants]
    assert passes[1] == FoldConstants(max_elements=100)
    assert format_pipeline(passes) == text
    assert parse_pipeline(" canonicalize , dce ") == [Canonicalize(), DeadCodeElimination()]
    assert parse_pipeline("") == [] and parse_pipeline("  ") == []
    assert parse_pipeline("dce{}") == [DeadCodeElimination()]


def test_every_option_kind_parses_and_prints_back() -> None:
    (p,) = parse_pipeline('test-options{count=3, scale=0.5, enabled=false, label="a,b}c", cap=7}')
    assert p == _Options(count=3, scale=0.5, enabled=False, label="a,b}c", cap=7)
    assert parse_pipeline(format_pipeline([p])) == [p]
    assert parse_pipeline("test-options{cap=none,label=plain}") == [_Options(cap=None, label="plain")]
    for tricky in ("none", "true", "12", "", "with space"):  # strings that would read as another kind
        q = _Options(label=tricky)
        assert parse_pipeline(format_pipeline([q])) == [q], tricky
    assert format_pipeline([_Options()]) == "test-options"  # defaults are left out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("canonicalize,nope", "unknown pass 'nope'"),
        ("cse{max-ops=3}", "has no option 'max-ops'"),
        ("test-options{count=many}", "takes an integer, got 'many'"),
        ("test-options{enabled=maybe}", "takes true or false"),
        ("test-options{scale=fast}", "takes a number"),
        ("test-options{count=1,count=2}", "given twice"),
        ("canonicalize{max-iterations=0}", "at least 1"),
        ("canonicalize,", "expected a pass name"),
        ("dce{", "expected an option name"),
        ("test-options{count 3}", "expected '='"),
        ("test-options{label=\"open}", "quoted string"),
        ("canonicalize dce", "expected ','"),
    ],
)
def test_bad_pipelines_are_clear_pass_errors(text: str, message: str) -> None:
    with pytest.raises(PassError, match=message):
        parse_pipeline(text)


def test_manager_rejects_what_is_not_a_pass() -> None:
    with pytest.raises(PassError, match="Pass objects"):
        PassManager(["canonicalize"])  # type: ignore[list-item]
    with pytest.raises(PassError, match="negative"):
        PassManager("dce", limit=-1)


def test_default_pipeline_is_one_function_of_the_target_and_documented() -> None:
    assert default_pipeline("ref") == ""  # the oracle runs the graph as imported
    for target in ("generic", "x86_avx2", "x86_avx512", "native", "wasm32"):
        assert default_pipeline(target).startswith("canonicalize,fold-constants,cse,dce")
        parse_pipeline(default_pipeline(target))  # every pass it names exists
        assert "fuse" not in default_pipeline(target, enable_fusion=False)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "canonicalize,fold-constants,cse,dce" in readme


# ---- running -------------------------------------------------------------------------------------------------------



def test_passes_run_in_order_and_the_limit_stops_them() -> None:
    pm = PassManager("canonicalize,fold-constants,cse,dce", limit=2)
    g = pm.run(parse_graph(CHAIN))
    assert pm.report is not None
    assert [(r.name, r.changed, r.skipped) for r in pm.report.records] == [
        ("canonicalize", True, False), ("fold-constants", True, False), ("cse", None, True), ("dce", None, True)]
    assert [n.op for n in g.nodes] == ["constant", "constant", "add", "add", "mul"]
    full = PassManager("canonicalize,fold-constants,cse,dce").run(parse_graph(CHAIN))
    assert [n.op for n in full.nodes] == ["constant", "add", "mul"]
    assert "skipped (limit)" in pm.report.table()


def test_a_pass_that_breaks_the_signature_is_named() -> None:
    pm = PassManager("canonicalize,test-rename-output,dce")
    with pytest.raises(PipelineError, match=r"pass #2 'test-rename-output' changed the graph's signature") as info:
        pm.run(parse_graph(CHAIN))
    assert info.value.report is not None and len(info.value.report.records) == 2


def test_a_pass_that_raises_is_named() -> None:
    with pytest.raises(PipelineError, match=r"pass #1 'test-raises' failed: ZeroDivisionError: boom"):
        PassManager("test-raises").run(parse_graph(CHAIN))


def _signature(g: Graph) -> list[tuple[str, str]]:
    return [(v.name, str(v.type)) for v in (*g.inputs, *g.outputs)]


@pytest.mark.parametrize("pass_name", ["canonicalize", "fold-constants", "cse", "dce"])
def test_each_pass_keeps_the_signature_of_a_real_model(pass_name: str) -> None:
    g = load_onnx(EXAMPLE)
    before = _signature(g)
    out = PassManager(pass_name).run(g)
    assert _signature(out) == before


def test_outputs_that_are_inputs_or_repeated_keep_their_identity_nodes() -> None:
    text = """graph main(%x: f32[3]) {
  %r = relu(%x) : f32[3]
  %a = identity(%x) : f32[3]
  %b = identity(%r) : f32[3]
  %c = identity(%r) : f32[3]
  return %a, %b, %c, %r
}
"""
    g = PassManager("canonicalize,cse,dce").run(parse_graph(text))
    assert [v.name for v in g.outputs] == ["a", "b", "c", "r"]
    assert len({id(v) for v in g.outputs}) == 4  # four distinct values: each output has its own buffer
    assert g.outputs[0] not in g.inputs


def test_copy_graph_shares_nothing_mutable() -> None:
    g = load_onnx(EXAMPLE)
    text = print_graph(g)
    c = copy_graph(g)
    assert print_graph(c) == text
    PassManager("canonicalize,fold-constants,cse,dce").run(c)
    c.nodes.clear()
    assert print_graph(g) == text


# ---- cuvil.compile(passes=...) -------------------------------------------------------------------------------------


def test_compile_runs_the_default_pipeline_and_leaves_a_graph_argument_alone(tmp_path: Path) -> None:
    g = parse_graph(CHAIN)
    text = print_graph(g)
    m = cuvil.compile(g, target="generic", cache_dir=str(tmp_path))
    assert print_graph(g) == text
    assert m.graph is not None and [n.op for n in m.graph.nodes] == ["constant", "add", "mul"]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    (y,) = m(x)
    (ref,) = cuvil.compile(g, target="ref")(x)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=0)


def test_compile_takes_text_a_list_or_a_manager(tmp_path: Path) -> None:
    g = parse_graph(CHAIN)
    m1 = cuvil.compile(g, target="ref", passes="cse")
    assert m1.graph is not None and [n.op for n in m1.graph.nodes].count("add") == 1
    m2 = cuvil.compile(g, target="ref", passes=[Canonicalize()])
    assert m2.graph is not None and "identity" not in [n.op for n in m2.graph.nodes]
    pm = PassManager("canonicalize,dce", limit=1)
    cuvil.compile(g, target="ref", passes=pm)
    assert pm.report is not None and [r.skipped for r in pm.report.records] == [False, True]
    m3 = cuvil.compile(g, target="generic", passes="", cache_dir=str(tmp_path))
    assert m3.graph is not None and print_graph(m3.graph) == print_graph(g)
    with pytest.raises(PassError, match="unknown pass"):
        cuvil.compile(g, target="ref", passes="canonicalise")


def test_outputs_folded_to_constants_compile_and_run(tmp_path: Path) -> None:
    text = """graph main(%x: f32[2, 3]) {
  %s = shape(%x) : i64[2]
  %y = relu(%x) : f32[2, 3]
  return %y, %s
}
"""
    m = cuvil.compile(parse_graph(text), target="generic", cache_dir=str(tmp_path))
    assert m.graph is not None and m.graph.outputs[1].producer is not None
    assert m.graph.outputs[1].producer.op == "constant"
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    y, s = m(x)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(s, np.array([2, 3], np.int64))


# ---- cuvil opt -----------------------------------------------------------------------------------------------------


def test_cli_opt_prints_the_ir_after_the_pipeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "chain.cir"
    src.write_text(CHAIN, encoding="utf-8")
    assert main(["opt", str(src), "--passes", "canonicalize,fold-constants,cse,dce", "--emit", "ir"]) == 0
    out, err = capsys.readouterr()
    g = parse_graph(out)
    assert [n.op for n in g.nodes] == ["constant", "add", "mul"]
    assert "fold-constants" in err and "changed" in err  # the report, on stderr


def test_cli_opt_instruments_limit_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    dumps = tmp_path / "dumps"
    code = main(["opt", str(EXAMPLE), "--verify-each", "--numeric-each", "--seed", "3", "--timing",
                 "--dump-ir", str(dumps), "--passes-limit", "2", "--report-json", str(report), "--emit", "none"])
    assert code == 0
    out, _ = capsys.readouterr()
    assert out == ""
    data = json.loads(report.read_text())
    assert data["pipeline"] == default_pipeline("native") and data["limit"] == 2
    ran = [p for p in data["passes"] if not p["skipped"]]
    assert [p["name"] for p in ran] == ["canonicalize", "fold-constants"]
    assert all(p["verified"] and p["seconds"] is not None and p["errors"] == {"probs": 0.0} for p in ran)
    assert sorted(f.name for f in dumps.iterdir()) == ["000-input.cir", "001-canonicalize.cir", "002-fold-constants.cir"]


def test_cli_opt_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["opt", str(EXAMPLE), "--passes", "canonicalize,nope"]) == 2
    assert "unknown pass 'nope'" in capsys.readouterr().err
    assert main(["opt", str(EXAMPLE), "--passes", "test-rename-output"]) == 2
    err = capsys.readouterr().err
    assert "signature" in err and "test-rename-output" in err  # the report table is printed as well


def test_values_keep_identity_through_folding() -> None:
    g = parse_graph(CHAIN)
    y: Value = g.outputs[0]
    PassManager("fold-constants").run(g)
    assert g.outputs[0] is y


def test_readme_pass_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Pass pipelines", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    # the reference target keeps the test free of C builds; the explicit pipeline runs all the same
    code = code.replace('target="native"', 'target="ref"').replace("cuvil/examples/", f"{REPO}/cuvil/examples/")
    monkeypatch.chdir(tmp_path)
    exec(compile("import cuvil\n" + code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "fold-constants" in out and "skipped (limit)" in out
    assert (tmp_path / "dumps" / "003-cse.cir").is_file()
    command = section.split("`cuvil opt", 1)[1].split("`", 1)[0].split()
    command = [a.replace("cuvil/examples/", f"{REPO}/cuvil/examples/") for a in command]
    assert main(["opt", *command]) == 0
    assert (tmp_path / "dumps" / "003-cse.cir").is_file() and not (tmp_path / "dumps" / "004-dce.cir").exists()


def test_region_outputs_that_read_a_replaced_outer_value_follow_it() -> None:
    text = """graph main(%c: bool[], %x: f32[3]) {
  %r = relu(%x) : f32[3]
  %n = identity(%r) : f32[3]
  %m = relu(%x) : f32[3]
  %y = if(%c) {then_branch = graph then_branch() {
      return %n
    }, else_branch = graph else_branch() {
      return %m
    }} : f32[3]
  return %y
}
"""
    from cuvil.ir.verify import verify

    for pipeline, branch in (("canonicalize", "then_branch"), ("cse", "else_branch")):  # %n -> %r, %m -> %r
        g = PassManager(pipeline).run(parse_graph(text))
        verify(g)
        (if_node,) = [n for n in g.nodes if n.op == "if"]
        assert dict(if_node.regions())[branch].outputs[0] is g.nodes[0].outputs[0], pipeline
