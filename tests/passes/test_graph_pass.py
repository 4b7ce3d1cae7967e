"""GraphPass: a per-graph rewrite applied to the top graph and every control-flow region."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from cuvil.ir.graph import Graph
from cuvil.ir.parser import parse_graph
from cuvil.passes import FuseElementwise, GraphPass

# The top graph holds an ``if`` (two regions) and a fused op (whose body is not a control-flow region).
TEXT = """graph main(%c: bool[], %x: f32[3]) {
  %y = if(%c) {then_branch = graph then_branch() {
      %t0 = abs(%x) : f32[3]
      %t = sigmoid(%t0) : f32[3]
      return %t
    }, else_branch = graph else_branch() {
      %e = neg(%x) : f32[3]
      return %e
    }} : f32[3]
  %z = fused_elementwise(%x, %y) {body = graph body(%in0: f32[3], %in1: f32[3]) {
      %a = exp(%in0) : f32[3]
      %z.1 = add(%a, %in1) : f32[3]
      return %z.1
    }} : f32[3]
  return %z
}"""


@dataclass(frozen=True)
class _Record(GraphPass):
    """Records the graphs it is applied to; reports a change for the graphs named in ``changes``."""

    name: ClassVar[str] = "test-record"
    changes: frozenset[str] = frozenset()
    seen: list[str] = field(default_factory=list)

    def run_on(self, graph: Graph) -> bool:
        self.seen.append(graph.name)
        return graph.name in self.changes


def test_visits_top_graph_then_control_flow_regions_not_fused_bodies() -> None:
    p = _Record()
    result = p.run(parse_graph(TEXT))
    assert p.seen == ["main", "then_branch", "else_branch"]
    assert not result.changed


def test_changed_when_any_graph_changed() -> None:
    g = parse_graph(TEXT)
    result = _Record(changes=frozenset({"else_branch"})).run(g)
    assert result.changed and result.graph is g


def test_regions_built_by_the_pass_are_not_visited() -> None:
    g = parse_graph(TEXT)
    assert FuseElementwise().run(g).changed
    (then_fused,) = [n for n in g.nodes[0].attrs["then_branch"].nodes if n.op == "fused_elementwise"]
    p = _Record()
    p.run(g)
    # the region the fusion built inside then_branch is a fused op's: never visited
    assert p.seen == ["main", "then_branch", "else_branch"]
    assert [n.op for n in then_fused.attrs["body"].nodes] == ["abs", "sigmoid"]

