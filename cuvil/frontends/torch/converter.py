"""Turning a torch.export ExportedProgram (core ATen after decompositions, with linear and matmul
kept whole: see export.py) into Cuvil IR.

Each ATen overload has one mapping function, registered with :func:`aten`,
that receives a :class:`TorchCtx` for the FX node and returns the Cuvil
value(s) for its result.  Before anything is converted, the whole graph is
scanned for targets without a mapping, so the user sees every unsupported
op in one error, each with the source line (file:line) that produced it.

Symbolic sizes (``SymInt``) flow as 1-element int64 tensors: ``ctx.value``
of a SymInt node gives one, and ``ctx.ints`` turns a list of ints and
SymInts into an int64 shape tensor (a constant when every entry is static).

The converter keeps its op-mapping table as data: one :class:`OpMapping` per converted FX node
(ATen target, FX node name, source location, the Cuvil ops it became), in graph order, on
:attr:`Converter.mappings` and on the front end's ``TorchImport``. The verification suite's
``coverage`` check reads it; the DEBUG log line per node is a rendering of the same record.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import ModelError, ShapeError, UnsupportedOpError, UnsupportedUse
from cuvil.frontends.torch.symbols import SymbolTable
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Value
from cuvil.ir.types import TensorType

MappingFn = Callable[["TorchCtx"], "Value | Sequence[Value | None]"]
_log = logging.getLogger(__name__)
_ATEN: dict[str, MappingFn] = {}


def aten(*targets: str) -> Callable[[MappingFn], MappingFn]:
    """Register the mapping of one or more ATen overloads, named as ``str(node.target)``
    (``"aten.convolution.default"``); custom ops are ``"namespace.name.overload"``."""

    def wrap(fn: MappingFn) -> MappingFn:
        for t in targets:
            _ATEN[t] = fn
        return fn

    return wrap


# Lookups for targets no mapping is registered for (custom op namespaces: aten_custom.py).
_FALLBACKS: list[Callable[[str], MappingFn | None]] = []


def mapping_fallback(fn: Callable[[str], MappingFn | None]) -> Callable[[str], MappingFn | None]:
    """Register ``fn(target)``, asked when no mapping is registered for a target."""
    _FALLBACKS.append(fn)
    return fn


def find_mapping(target: str) -> MappingFn | None:
    found = _ATEN.get(target)
    for fallback in _FALLBACKS if found is None else ():
        if (found := fallback(target)) is not None:
            break
    return found


def supported_targets() -> list[str]:
    return sorted(_ATEN)


def torch_dtype(dtype: Any) -> DType:
    import torch

    table = {
        torch.float64: DType.f64, torch.float32: DType.f32, torch.float16: DType.f16, torch.bfloat16: DType.bf16,
        torch.int64: DType.i64, torch.int32: DType.i32, torch.int16: DType.i16, torch.int8: DType.i8,
        torch.uint8: DType.u8, torch.uint16: DType.u16, torch.uint32: DType.u32, torch.uint64: DType.u64,
        torch.bool: DType.bool,
    }
    try:
        return table[dtype]
    except KeyError:
        raise UnsupportedOpError([UnsupportedUse(f"dtype {dtype}", "torch", None, (), "element type not supported")]) from None


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """Folders whose frames are never the user's code: torch's and Cuvil's."""
    import torch

    torch_dir = Path(torch.__file__).resolve().parent
    cuvil_dir = Path(__file__).resolve().parents[2]
    return f"{torch_dir}/", f"{cuvil_dir}/"


def source_location(node: Any) -> str:
    """``file:line`` of the user code that produced an FX node (its innermost user frame)."""
    return _trace_location(node.meta.get("stack_trace") or "")


def _trace_location(trace: str) -> str:
    frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
    for f, line in reversed(frames):
        if "/site-packages/" not in f and not f.startswith(_library_dirs()):
            return f"{f}:{line}"
    cuvil_dir = _library_dirs()[1]
    # else the innermost library frame (a package's model code), but never Cuvil's own: a node torch
    # made while Cuvil exported the model (a graph module's run-time assertion) has no user source
    outside = [(f, line) for f, line in frames if not f.startswith(cuvil_dir)]
    return f"{outside[-1][0]}:{outside[-1][1]}" if outside else "<unknown location>"


@dataclass(frozen=True)
class OpMapping:
    """How one FX node was converted: its ATen target (``str(node.target)``), the FX node's name, its
    stack trace as torch.export recorded it and the ops of the Cuvil nodes its mapping added, in order
    (empty when it forwards an existing value).  ``location``, the user code that produced the node
    (``file:line``), is worked out from the trace when asked for: only reports read it."""

    aten: str
    node: str
    stack_trace: str
    cuvil_ops: tuple[str, ...]

    @property
    def location(self) -> str:
        return _trace_location(self.stack_trace)

    def describe(self) -> str:
        made = ", ".join(self.cuvil_ops) or "no node (it forwards an existing value)"
        return f"aten {self.aten} {self.node!r} at {self.location} -> {made}"


class TorchCtx:
    """What a mapping function sees for one FX node."""

    def __init__(self, conv: Converter, node: Any) -> None:
        self._conv = conv
        self.node = node
        self.name = node.name
        self.target = str(node.target)
        self.args = node.args
        self.kwargs = dict(node.kwargs)
        self.builder = conv.builder

    # arguments ---------------------------------------------------------------
    def arg(self, i: int, name: str | None = None, default: Any = None) -> Any:
        """Positional argument ``i`` (or keyword ``name``), else ``default``."""
        if i < len(self.args):
            return self.args[i]
        if name is not None and name in self.kwargs:
            return self.kwargs[name]
        return default

    def value(self, arg: Any) -> Value:
        """The Cuvil value of an FX node argument (a tensor, or a SymInt as int64[1])."""
        v = self._conv.values.get(arg) if hasattr(arg, "op") else None
        if v is None:
            raise self.fail(f"argument {arg!r} is not a tensor computed earlier")
        return v

    def tensor(self, arg: Any, like: Value | None = None) -> Value:
        """A tensor argument, or a Python scalar as a constant (in ``like``'s dtype when given)."""
        if hasattr(arg, "op"):
            return self.value(arg)
        dtype = like.type.dtype if like is not None else None
        if isinstance(arg, bool):
            return self.constant(np.array(arg, dtype=dtype.np if dtype else np.bool_))
        if isinstance(arg, int):
            return self.constant(np.array(arg, dtype=dtype.np if dtype else np.int64))
        if isinstance(arg, float):
            return self.constant(np.array(arg, dtype=dtype.np if dtype else np.float32))
        raise self.fail(f"cannot use {arg!r} as a tensor")

    def ints(self, items: Sequence[Any]) -> Value:
        """A list of ints and SymInts as a 1-D int64 tensor (constant when all are static)."""
        if all(isinstance(x, int) for x in items):
            return self.constant(np.array(list(items), dtype=np.int64).reshape(len(items)))
        parts = []
        for x in items:
            if isinstance(x, int):
                parts.append(self.constant(np.array([x], dtype=np.int64)))
            else:
                parts.append(self.value(x))
        return self.emit1("concat", parts, {"axis": 0})

    def sym_dim(self, x: Any) -> Any:
        """A size argument (int or SymInt node) as a Cuvil dim."""
        if isinstance(x, int):
            return x
        return self._conv.symbols.dim(x.meta["val"])

    def meta(self, node: Any | None = None) -> Any:
        """The example value (FakeTensor / SymInt) torch.export recorded for a node."""
        return (node or self.node).meta.get("val")

    def out_type(self, index: int | None = None) -> TensorType:
        """The type torch.export recorded for this node's result (or result ``index``)."""
        val = self.meta()
        if index is not None:
            val = val[index]
        return TensorType(torch_dtype(val.dtype), tuple(self._conv.symbols.dim(d) for d in val.shape))

    # building ------------------------------------------------------------------
    def emit(self, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None, *,
             num_outputs: int = 1) -> list[Value]:
        names = [self.builder.fresh_name(f"{self.name}/") for _ in range(num_outputs)]
        try:
            return self.builder.add(op, inputs, attrs or {}, num_outputs=num_outputs, names=names, node_name=self.name)
        except ShapeError as exc:
            raise ModelError(f"{self.name} ({self.target}) at {source_location(self.node)}: {exc}") from None

    def emit1(self, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None) -> Value:
        return self.emit(op, inputs, attrs)[0]

    def constant(self, value: Any, dtype: DType | None = None) -> Value:
        arr = np.asarray(value, dtype=dtype.np if dtype else None)
        return self.emit1("constant", [], {"value": arr})

    def fail(self, message: str) -> ModelError:
        return ModelError(f"{self.name} ({self.target}) at {source_location(self.node)}: {message}")

    def unsupported(self, detail: str) -> UnsupportedOpError:
        return UnsupportedOpError([UnsupportedUse(self.target, "aten", None, (f"{self.name} at {source_location(self.node)}",), detail)])


class Converter:
    """Walks an ExportedProgram's graph and builds the Cuvil graph."""

    def __init__(self, program: Any, symbols: SymbolTable) -> None:
        self.program = program
        self.symbols = symbols
        self.builder = Builder(Graph(name="main"))
        self.values: dict[Any, Value] = {}
        # provenance: the FX node whose result each value is (values a mapping makes on the way are not)
        self._results: dict[Value, str] = {}
        self.value_sources: dict[str, str] = {}  # value name -> FX node name, filled in by convert()
        self.mappings: list[OpMapping] = []  # one per converted FX node, in graph order (convert())

    def check_supported(self) -> None:
        found: dict[str, list[str]] = {}
        for node in self.program.graph.nodes:
            if node.op == "call_function" and find_mapping(str(node.target)) is None:
                found.setdefault(str(node.target), []).append(f"{node.name} at {source_location(node)}")
        if found:
            raise UnsupportedOpError([UnsupportedUse(t, "aten", None, tuple(uses)) for t, uses in sorted(found.items())])

    def convert(self, constants: dict[str, np.ndarray], user_inputs: Sequence[str],
                output_names: Sequence[str] | None = None) -> Graph:
        """``constants`` maps placeholder names of parameters, buffers and lifted constants to arrays;
        ``output_names`` names the graph's outputs (default: the FX nodes' names)."""
        self.check_supported()
        b = self.builder
        # the symbols' ranges from the start: inference while building must derive the types the verifier
        # derives later (x[:, :-1] is seq - 1 only where seq >= 1 is known)
        b.graph.symbols = dict(self.symbols.infos)
        user = set(user_inputs)
        for node in self.program.graph.nodes:
            if node.op == "placeholder":
                if node.name in constants:
                    self.values[node] = b.add1("constant", [], {"value": constants[node.name]}, names=[node.name],
                                               node_name=node.name)
                elif node.name in user:
                    val = node.meta.get("val")
                    if not hasattr(val, "dtype"):
                        # a non-tensor argument: torch.export specialized the graph to its value
                        if node.users:
                            raise ModelError(f"input {node.name!r} is not a tensor ({val!r}) but the graph reads it")
                        continue
                    t = TensorType(torch_dtype(val.dtype), tuple(self.symbols.dim(d) for d in val.shape))
                    self.values[node] = b.input(node.name, t)
                else:
                    raise ModelError(f"exported input {node.name!r} is neither a user input nor a constant")
            elif node.op == "call_function":
                ctx = TorchCtx(self, node)
                fn = find_mapping(str(node.target))
                assert fn is not None
                first = len(b.graph.nodes)
                result = fn(ctx)
                mapping = OpMapping(str(node.target), node.name, node.meta.get("stack_trace") or "",
                                    tuple(n.op for n in b.graph.nodes[first:]))
                self.mappings.append(mapping)
                if _log.isEnabledFor(logging.DEBUG):  # the mapping decision (cuvil/log.py)
                    _log.debug("%s", mapping.describe())
                if isinstance(result, Value):
                    self.values[node] = result
                    self._results.setdefault(result, node.name)
                else:
                    # multi-output ops: getitem nodes pick the pieces
                    self.values[node] = _Tuple(list(result))  # type: ignore[assignment]
            elif node.op == "output":
                outs = node.args[0]
                outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
                names = list(output_names) if output_names is not None else [getattr(o, "name", "") for o in outs]
                if len(names) != len(outs):
                    raise ModelError(f"the model has {len(outs)} outputs, but {len(names)} output names were given")
                taken = {v.name for v in b.graph.inputs} | set(constants)
                for o, name in zip(outs, names):
                    v = self.values.get(o) if hasattr(o, "op") else None
                    if not isinstance(v, Value):
                        raise ModelError(f"model output {name!r} ({o!r}) is not a tensor computed by the graph")
                    name = _unique(name or "output", taken)
                    taken.add(name)
                    if v in b.graph.outputs or v.producer is None or v.producer.op == "constant":
                        v = b.add1("identity", [v], names=[name], node_name=getattr(o, "name", name))
                    else:
                        v.name = name  # computed values are named "node/N": the user's name cannot clash
                    b.graph.outputs.append(v)
            elif node.op == "get_attr":
                raise ModelError(f"unexpected get_attr node {node.name!r} in an exported program")
        g = b.graph
        g.symbols = dict(self.symbols.infos)
        g.share_symbols()
        self.value_sources = {v.name: fx for v, fx in self._results.items()}  # after outputs took the user's names
        return g


def _unique(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    return out


class _Tuple(list):  # type: ignore[type-arg]
    """The results of a multi-output ATen op, before getitem picks one."""


@aten("getitem", "<built-in function getitem>", "_operator.getitem")
def _getitem(ctx: TorchCtx) -> Value:
    seq = ctx._conv.values.get(ctx.arg(0))
    idx = ctx.arg(1)
    if not isinstance(seq, _Tuple) or not isinstance(idx, int) or not 0 <= idx < len(seq) or seq[idx] is None:
        raise ctx.fail(f"cannot take item {idx!r} of this result")
    v: Value = seq[idx]
    return v


@aten("aten.sym_size.int")
def _sym_size(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    d = int(ctx.arg(1)) % max(x.type.rank, 1)
    return ctx.emit1("shape", [x], {"start": d, "end": d + 1})
