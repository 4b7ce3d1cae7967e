"""Dim domains: where each symbolic dim of a graph's inputs makes the whole graph valid.

A symbol's declared constraint (``min``/``max``/``multiple_of``, from the front end or the
user) says what the input guard accepts; the graph itself often needs more. An OCR
recogniser whose width is symbolic cannot run at width 1: its pooling windows would not fit.
:func:`analyse_dims` collects what every node requires of the symbols (:class:`Requirement`),
each a predicate over symbol values read from the types inference gave the graph:

1. every extent of every node output is at least 0;
2. a convolution or pooling window fits its input after strides, dilation and padding: every
   output extent of ``conv``/``max_pool``/``average_pool`` (and their fused, NHWC, integer and
   transposed forms) is at least 1;
3. a reduction without an identity (``reduce_max``/``reduce_min``, ``arg_max``/``arg_min``,
   ``global_max_pool``) reads a non-empty input;
4. the relations inference recorded as run-time checks hold (``Concat``'s other dims, broadcasts,
   ``MatMul``'s inner dims: ``cuvil.ops.common.graph_assumptions``);
5. a ``reshape`` keeps the element count (a reshape to ``[-1, 8]`` needs a multiple of 8);
6. a ``split`` into given sizes partitions its axis.

:class:`DimAnalysis` then finds each symbol's smallest valid extent: every symbol starts at the
smallest value its declared constraint allows, and while a requirement fails, the one of its
symbols that needs the smallest increase is raised to the first value (a step of its
``multiple_of``, at most :data:`SCAN` steps) that satisfies it; the requirement that raised a
symbol is its reason. :meth:`DimAnalysis.solve` does the same with some symbols held at given
values (a check probing one symbol), and a typical value (an example's extent, a declared one)
is used for samples when the graph is valid there. Relations over a data-dependent extent are
not judged here (the kernels check those while they run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from cuvil.ir.assumptions import Assumption
from cuvil.ir.graph import Graph, Node
from cuvil.ir.symbolic import Dim, evaluate, format_dim, free_symbols, product
from cuvil.ir.types import SymbolInfo

#: Ops whose output extents count window positions: each must be at least 1 (the window fits).
WINDOW_OPS = frozenset({"conv", "conv_nhwc", "conv_integer", "conv_transpose", "fused_conv", "fused_conv_nhwc",
                        "qlinear_conv", "max_pool", "average_pool"})
#: Reductions with no identity element: their input must not be empty.
NONEMPTY_INPUT_OPS = frozenset({"reduce_max", "reduce_min", "arg_max", "arg_min", "global_max_pool"})
#: How many steps a symbol is raised by, at most, to satisfy one requirement.
SCAN = 4096


@dataclass(frozen=True)
class Requirement:
    """A condition on symbol values that the graph needs: ``holds(env)``, in words ``what``."""

    symbols: frozenset[str]
    what: str
    test: Callable[[Mapping[str, int]], bool]

    def holds(self, env: Mapping[str, int]) -> bool:
        try:
            return bool(self.test(env))
        except (ValueError, ZeroDivisionError, ArithmeticError):  # a broadcast that cannot match, x // 0
            return False


@dataclass(frozen=True)
class DimDomain:
    """What one symbol is drawn from: its smallest valid extent and why, its declared bounds, and
    the typical extent samples use (None: samples use the smallest)."""

    name: str
    min: int
    max: int | None = None
    multiple_of: int | None = None
    typical: int | None = None
    typical_source: str | None = None
    reasons: tuple[str, ...] = ()
    declared_min: int = 1
    #: Why no valid extent was found (the graph is then drawn at the declared smallest value).
    problem: str | None = None
    #: Why a typical extent that was given is not used.
    typical_problem: str | None = None

    @property
    def sample(self) -> int:
        """The extent generated samples use."""
        return self.typical if self.typical is not None else self.min

    def info(self) -> SymbolInfo:
        """The symbol's valid range as a constraint (the derived minimum over the declared one)."""
        return SymbolInfo(self.name, self.min, self.max, self.multiple_of)

    def describe(self) -> str:
        """In words: "smallest valid 10 (max_pool 'p' needs ...), at most 64; samples use 320 (the example's extent)"."""
        why = ("; ".join(self.reasons) if self.reasons else
               "its declared minimum" if self.min == self.declared_min and self.min > 1 else "the graph needs no more")
        text = f"smallest valid {self.min} ({why})"
        if self.problem:
            text = f"no valid extent found ({self.problem}); drawn at {self.min}"
        if self.max is not None:
            text += f", at most {self.max}"
        if self.multiple_of:
            text += f", a multiple of {self.multiple_of}"
        if self.typical is not None:
            text += f"; samples use {self.typical} ({self.typical_source})"
        elif self.typical_problem:
            text += f"; {self.typical_problem}"
        return text


def _symbolic(d: Dim) -> bool:
    return bool(free_symbols(d)) and "?" not in format_dim(d)


def _label(node: Node) -> str:
    return f"{node.op} {node.name!r}" if node.name else node.op


def _at_least(d: Dim, lo: int) -> Callable[[Mapping[str, int]], bool]:
    return lambda env: evaluate(d, env) >= lo


def _equal(a: Dim, b: Dim) -> Callable[[Mapping[str, int]], bool]:
    return lambda env: evaluate(a, env) == evaluate(b, env)


def _relation(a: Assumption) -> Callable[[Mapping[str, int]], bool]:
    return lambda env: a.holds_for(evaluate(a.lhs, env), evaluate(a.rhs, env))


def requirements(graph: Graph) -> list[Requirement]:
    """What ``graph``'s nodes require of its symbols (rules 1-6 of the module docstring), each once."""
    from cuvil.ops.common import graph_assumptions

    out: list[Requirement] = []
    seen: set[str] = set()

    def add(dims: Iterable[Dim], what: str, test: Callable[[Mapping[str, int]], bool], key: str) -> None:
        syms = frozenset(s for d in dims for s in free_symbols(d))
        if key not in seen and syms:
            seen.add(key)
            out.append(Requirement(syms, what, test))

    for node in graph.walk():
        for o in node.outputs:
            for k, d in enumerate(o.type.shape):
                if not _symbolic(d):
                    continue
                if node.op in WINDOW_OPS:
                    add([d], f"{_label(node)} needs its output dim {k} = {format_dim(d)} >= 1 (its window must fit "
                        "its input)", _at_least(d, 1), f"{d} >= 1")
                else:
                    add([d], f"{_label(node)} needs its output dim {k} = {format_dim(d)} >= 0", _at_least(d, 0),
                        f"{d} >= 0")
        if node.op in NONEMPTY_INPUT_OPS and node.inputs and node.inputs[0] is not None:
            for k, d in enumerate(node.inputs[0].type.shape):
                if _symbolic(d):
                    add([d], f"{_label(node)} needs a non-empty input (dim {k} = {format_dim(d)} >= 1)",
                        _at_least(d, 1), f"{d} >= 1")
        if node.op == "reshape" and node.inputs and node.inputs[0] is not None and node.outputs:
            src, dst = product(node.inputs[0].type.shape), product(node.outputs[0].type.shape)
            if (_symbolic(src) or _symbolic(dst)) and "?" not in format_dim(src) + format_dim(dst):
                add([src, dst], f"{_label(node)} needs {format_dim(src)} elements to fill {node.outputs[0].type} "
                    "(the element count must divide evenly)", _equal(src, dst), f"{src} == {dst}")
        if node.op == "split" and node.inputs and node.inputs[0] is not None and node.outputs:
            rank = node.inputs[0].type.rank
            axis = int(node.attrs.get("axis", 0))
            axis = axis + rank if axis < 0 else axis
            whole = node.inputs[0].type.shape[axis]
            parts: Dim = sum((o.type.shape[axis] for o in node.outputs), start=0)
            if (_symbolic(whole) or _symbolic(parts)) and "?" not in format_dim(whole) + format_dim(parts):
                add([whole, parts], f"{_label(node)} needs dim {axis} = {format_dim(whole)} to equal the sum of its "
                    f"split sizes ({format_dim(parts)})", _equal(whole, parts), f"{whole} == {parts}")
    for a in graph_assumptions(graph):
        if "?" in format_dim(a.lhs) + format_dim(a.rhs):
            continue
        where = f"{a.op} {a.node!r}" if a.node else a.op
        add([a.lhs, a.rhs], f"{where} needs {a.describe()} ({a.what})", _relation(a), a.describe())
    return out


def merge_info(name: str, *infos: SymbolInfo | None) -> SymbolInfo:
    """One constraint holding every given one: the largest minimum, the smallest maximum, the lcm of the multiples."""
    lo: int | None = None
    hi: int | None = None
    step: int | None = None
    for i in infos:
        if i is None:
            continue
        if i.min is not None:
            lo = i.min if lo is None else max(lo, i.min)
        if i.max is not None:
            hi = i.max if hi is None else min(hi, i.max)
        if i.multiple_of:
            step = i.multiple_of if step is None else math.lcm(step, i.multiple_of)
    return SymbolInfo(name, lo, hi, step)


def smallest_allowed(info: SymbolInfo) -> int:
    """The smallest value a constraint allows: its minimum (at least 0), else 1, rounded up to its multiple."""
    lo = max(info.min, 0) if info.min is not None else 1
    if info.multiple_of:
        m = info.multiple_of
        lo = max(m, -(-lo // m) * m)
    return lo


@dataclass
class DimAnalysis:
    """The requirements of a graph on its input symbols, and the search for values that meet them.

    ``declared``: per symbol, its constraint (the graph's merged with the user's); ``typical``:
    per symbol, an extent samples should use where the graph is valid, and where it came from."""

    symbols: tuple[str, ...]
    declared: dict[str, SymbolInfo]
    reqs: list[Requirement]
    typical: dict[str, tuple[int, str]] = field(default_factory=dict)
    _domains: dict[str, DimDomain] | None = None

    def violation(self, env: Mapping[str, int]) -> str | None:
        """The first requirement ``env`` fails, in words, or None when the graph is valid there."""
        for name in self.symbols:
            why = self.declared[name].check(env[name]) if name in env else None
            if why is not None:
                return why
        for r in self.reqs:
            if r.symbols <= env.keys() and not r.holds(env):
                return r.what
        return None

    def solve(self, fixed: Mapping[str, int] | None = None, start: Mapping[str, int] | None = None,
              reasons: dict[str, list[str]] | None = None) -> tuple[dict[str, int], str | None]:
        """Values of every symbol that meet every requirement, with ``fixed`` ones held, the others
        raised from ``start`` (default: their smallest allowed values) as little as the search can;
        and None, or the requirement that could not be met (the values are then the best found)."""
        fixed = dict(fixed or {})
        env = {s: smallest_allowed(self.declared[s]) for s in self.symbols}
        env.update({k: v for k, v in (start or {}).items() if k in env})
        env.update(fixed)
        for name, v in fixed.items():
            if name in self.declared and (why := self.declared[name].check(v)) is not None:
                return env, why
        for _ in range(64 * (len(self.symbols) + 1)):
            bad = next((r for r in self.reqs if r.symbols <= env.keys() and not r.holds(env)), None)
            if bad is None:
                return env, None
            best: tuple[int, str, int] | None = None  # (steps, symbol, value)
            for s in sorted(bad.symbols - fixed.keys()):
                info = self.declared[s]
                step = info.multiple_of or 1
                trial = dict(env)
                for k in range(1, SCAN + 1):
                    v = env[s] + k * step
                    if info.max is not None and v > info.max:
                        break
                    trial[s] = v
                    if bad.holds(trial):
                        if best is None or k < best[0]:
                            best = (k, s, v)
                        break
            if best is None:
                return env, bad.what
            env[best[1]] = best[2]
            if reasons is not None:
                reasons.setdefault(best[1], []).append(bad.what)
        return env, "the search for valid values did not settle"

    def domains(self) -> dict[str, DimDomain]:
        """Per symbol: its smallest valid extent (with the others at theirs), the requirements that set
        it, and the typical extent samples use when the graph is valid there."""
        if self._domains is not None:
            return self._domains
        reasons: dict[str, list[str]] = {}
        env, problem = self.solve(reasons=reasons)
        held: dict[str, int] = {}  # the typical extents, each kept when the graph stays valid with it
        dropped: dict[str, str] = {}
        for s, (v, _) in sorted(self.typical.items()):
            _, why = self.solve(fixed={**held, s: v}, start=env)
            if why is None:
                held[s] = v
            else:
                dropped[s] = why
        out: dict[str, DimDomain] = {}
        for s in self.symbols:
            info = self.declared[s]
            t = self.typical[s] if s in held else None
            out[s] = DimDomain(s, env[s], info.max, info.multiple_of, t[0] if t else None, t[1] if t else None,
                               tuple(dict.fromkeys(reasons.get(s, [])))[-1:], smallest_allowed(info),
                               problem if problem is not None and s in _symbols_of(problem, self.reqs) else None,
                               f"the typical {self.typical[s][0]} ({self.typical[s][1]}) is not valid: {dropped[s]}"
                               if s in dropped else None)
        self._domains = out
        return out

    def sample_env(self) -> dict[str, int]:
        """The symbol values generated samples use: typical extents where valid, else the smallest valid."""
        doms = self.domains()
        env, why = self.solve(fixed={s: d.typical for s, d in doms.items() if d.typical is not None},
                              start={s: d.min for s, d in doms.items()})
        return env if why is None else {s: d.min for s, d in doms.items()}

    def values(self, fixed: Mapping[str, int]) -> tuple[dict[str, int], str | None]:
        """Symbol values with ``fixed`` held and the others at their smallest valid extents (raised where
        a requirement ties them to the fixed ones); the failed requirement, or None."""
        return self.solve(fixed=fixed, start={s: d.min for s, d in self.domains().items()})

    def next_valid(self, name: str, value: int, limit: int | None = None,
                   others: Mapping[str, int] | None = None) -> int | None:
        """The smallest value of ``name`` at least ``value`` (at most ``limit``) at which the graph is valid."""
        info = self.declared[name]
        step = info.multiple_of or 1
        v = max(value, smallest_allowed(info))
        v = -(-v // step) * step
        top = min(x for x in (limit, info.max, v + SCAN * step) if x is not None)
        while v <= top:
            if self.solve(fixed={**(others or {}), name: v}, start=self._mins())[1] is None:
                return v
            v += step
        return None

    def _mins(self) -> dict[str, int]:
        return {s: d.min for s, d in self.domains().items()}


def _symbols_of(what: str, reqs: list[Requirement]) -> frozenset[str]:
    return next((r.symbols for r in reqs if r.what == what), frozenset())


def analyse_dims(graph: Graph, declared: Mapping[str, SymbolInfo] | None = None,
                 typical: Mapping[str, tuple[int, str]] | None = None) -> DimAnalysis:
    """The dim analysis of ``graph``'s input symbols: their constraints (the graph's, merged with
    ``declared``), what the nodes require of them, and ``typical`` extents (value, where it came from)."""
    names = sorted({s for v in graph.inputs for d in v.type.shape for s in free_symbols(d)})
    info = {s: merge_info(s, graph.symbols.get(s), (declared or {}).get(s)) for s in names}
    reqs = [r for r in requirements(graph) if r.symbols <= set(names)]
    return DimAnalysis(tuple(names), info, reqs, {k: v for k, v in (typical or {}).items() if k in info})
