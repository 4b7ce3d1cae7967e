"""Exporting a PyTorch model with ``torch.export``: its example inputs, its dynamic dims, and eval mode.

``cuvil.compile(model, input_spec=...)`` describes the inputs three ways:
example tensors (``[torch.randn(1, 3, 224, 224)]``), ``cuvil.TensorSpec``
objects whose dims may be symbol names or expressions (``("batch", 3, "32*h",
"32*w")``), or a dict of either for keyword inputs.  A TensorSpec turns into an
example tensor and a ``torch.export.Dim`` per symbol (ranges from ``dims=``);
example tensors take their dynamic dims from ``dynamic_shapes``, which follows
torch.export's own conventions.  The program is exported, then decomposed to
core ATen.  Whatever torch refuses (a constraint the model breaks, a size it
specialized) is reported as a :class:`ModelError` carrying torch's explanation.
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cuvil.errors import CuvilError, ModelError
from cuvil.frontends.torch.recurrent import recurrent_ops
from cuvil.ir.spec import TensorSpec
from cuvil.ir.symbolic import DimExpr, evaluate
from cuvil.ir.types import SymbolInfo

log = logging.getLogger("cuvil.frontends.torch")


@dataclass
class Exported:
    """A decomposed ExportedProgram, and the user's dynamic dims for each of its user inputs."""

    program: Any
    # per user input, in the program's order: {axis: torch Dim (plain or derived) or a hint}
    input_dims: list[dict[int, Any]]
    seconds: dict[str, float] = field(default_factory=dict)


def is_torch_model(model: object) -> bool:
    """An ``nn.Module`` (a TorchScript module among them), a TorchScript function or an
    ``ExportedProgram`` (only when torch is loaded: otherwise it cannot be one)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    from torch.export import ExportedProgram

    return isinstance(model, torch.nn.Module | torch.jit.ScriptFunction | ExportedProgram)


def is_torchscript(model: object) -> bool:
    """A TorchScript module (scripted, traced or loaded by ``torch.jit.load``) or function."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.jit.ScriptModule | torch.jit.ScriptFunction)


def check_eval_mode(model: Any) -> None:
    """Refuse a module with any submodule in training mode: it would be exported with training semantics."""
    training = [name or type(model).__name__ for name, m in model.named_modules() if m.training]
    if training:
        shown = ", ".join(repr(n) for n in training[:8]) + (f" and {len(training) - 8} more" if len(training) > 8 else "")
        raise ModelError(
            f"the model is in training mode ({len(training)} modules have .training=True: {shown}); "
            "in training mode Dropout is active and BatchNorm uses batch statistics. "
            "Call model.eval() before cuvil.compile"
        )


def export_model(model: Any, input_spec: Any, dynamic_shapes: Any = None,
                 dims: Mapping[str, SymbolInfo] | None = None, *, check_mode: bool = True) -> Exported:
    """Export ``model`` (in eval mode) for the described inputs and decompose it to core ATen.

    ``check_mode=False`` skips the eval-mode check, for a module torch made from a model that was
    checked already (a TorchScript model's graph module: torch marks those as training)."""
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        if input_spec is not None or dynamic_shapes is not None:
            raise CuvilError("an ExportedProgram already fixes its inputs: pass no input_spec or dynamic_shapes")
        return _decompose(model, [{} for _ in _user_inputs(model)], {})
    if check_mode:
        check_eval_mode(model)
    if input_spec is None:
        raise CuvilError("compiling a PyTorch model needs input_spec: example tensors or cuvil.TensorSpec objects")
    args, kwargs, spec_shapes = example_inputs(input_spec, dims or {})
    if spec_shapes is not None:
        if dynamic_shapes is not None:
            raise CuvilError("give symbolic dims either in cuvil.TensorSpec shapes or in dynamic_shapes, not both")
        dynamic_shapes = spec_shapes
    t0 = time.perf_counter()
    try:
        with recurrent_ops(model):  # nn.LSTM / GRU / RNN as ops whose sequence length may be dynamic
            program = torch.export.export(model, tuple(args), kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except CuvilError:
        raise
    except Exception as exc:
        raise ModelError(f"torch.export could not export the model: {explain(exc)}") from exc
    seconds = {"export": time.perf_counter() - t0}
    log.debug("torch.export took %.3f s", seconds["export"])
    leaf_dims = _dims_per_leaf(model, args, kwargs, dynamic_shapes)
    return _decompose(program, leaf_dims, seconds)


def _decompose(program: Any, input_dims: list[dict[int, Any]], seconds: dict[str, float]) -> Exported:
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # torch's own use of its deprecated pytree API while decomposing: nothing a user can act on
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
            program = program.run_decompositions(_decomposition_table())
    except Exception as exc:
        raise ModelError(f"torch.export could not decompose the model to core ATen: {explain(exc)}") from exc
    seconds["decompose"] = time.perf_counter() - t0
    log.debug("decomposition to core ATen took %.3f s", seconds["decompose"])
    n = len(_user_inputs(program))
    if len(input_dims) != n:
        raise ModelError(f"the exported program has {n} user inputs, but the example inputs have {len(input_dims)} leaves")
    return Exported(program, input_dims, seconds)


# Composite ops kept whole instead of decomposed to core ATen: a matrix product of tensors of
# more than two dims decomposes into a reshape to 2-D, mm/addmm/bmm and a reshape back, and the
# reshapes hide the product from the fusion passes (bias, activation and residual epilogues,
# attention).  Kept, they convert to Cuvil's own matmul, the ONNX MatMul's semantics.
# scaled_dot_product_attention converts to Cuvil's attention op, with the semantics of torch's
# decomposition of it (the scale split over Q and K, fully masked rows giving zeros).  The
# recurrent layers convert to Cuvil's recurrence (a loop over the sequence when it is long or
# dynamic: cuvil/frontends/recurrent.py) rather than to torch's unrolling of their steps.
_KEPT_WHOLE = ("linear", "matmul", "scaled_dot_product_attention", "lstm.input", "gru.input", "rnn_tanh.input",
               "rnn_relu.input")


def _decomposition_table() -> Any:
    import torch

    table: Any = torch.export.default_decompositions()
    for name in _KEPT_WHOLE:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        if op in table:
            del table[op]
    return table


def _user_inputs(program: Any) -> list[Any]:
    from torch.export.graph_signature import InputKind

    return [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]


def explain(exc: BaseException) -> str:
    """torch's message without its generic trailer, plus what to do about 0/1 specialization."""
    text = str(exc).strip()
    for trailer in ("\n\nThe error above occurred when calling torch.export.export.",
                    "\nFor more information about this error, see"):
        if trailer in text:
            text = text[: text.index(trailer)].rstrip()
    msg = f"{type(exc).__name__}: {text}"
    if re.search(r"specialized it to be a constant \([01]\)", text):
        msg += (" (torch.export treats an example size of 0 or 1 as a constant: give example inputs whose "
                "dynamic dims are at least 2, or a cuvil.TensorSpec)")
    return msg


# input specs ---------------------------------------------------------------------------------


def example_inputs(input_spec: Any, dims: Mapping[str, SymbolInfo]) -> tuple[list[Any], dict[str, Any], Any]:
    """Positional and keyword example inputs, and the dynamic_shapes the TensorSpecs among them imply
    (None when no spec has a symbolic dim)."""
    import torch

    maker = _SpecExamples(dims)
    if isinstance(input_spec, Mapping):
        kwargs = {str(k): maker.example(v, repr(k)) for k, v in input_spec.items()}
        shapes: Any = {k: maker.shapes_of(v) for k, v in input_spec.items()}
        args: list[Any] = []
    else:
        items = [input_spec] if isinstance(input_spec, torch.Tensor | TensorSpec) else list(input_spec)
        args = [maker.example(v, f"input {i}") for i, v in enumerate(items)]
        shapes = tuple(maker.shapes_of(v) for v in items)
        kwargs = {}
    return args, kwargs, shapes if maker.used else None


class _SpecExamples:
    """Example tensors and torch Dims for TensorSpecs, one Dim object per symbol name."""

    def __init__(self, dims: Mapping[str, SymbolInfo]) -> None:
        self.dims = dims
        self.roots: dict[str, Any] = {}
        self.values: dict[str, int] = {}
        self.used = False

    def example(self, v: Any, where: str) -> Any:
        import numpy as np
        import torch

        if isinstance(v, torch.Tensor):
            return v
        if isinstance(v, np.ndarray):
            return torch.from_numpy(v)
        if isinstance(v, TensorSpec):
            shape = [d if isinstance(d, int) else evaluate(d, self._env(d)) for d in v.type.shape]
            dtype = _torch_dtype(v.type.dtype)
            if dtype.is_floating_point:
                return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
            return torch.zeros(shape, dtype=dtype)
        raise CuvilError(f"input_spec {where}: expected a torch.Tensor, a NumPy array or a cuvil.TensorSpec, "
                         f"got {type(v).__name__}")

    def shapes_of(self, v: Any) -> Any:
        if not isinstance(v, TensorSpec):
            return None
        out: dict[int, Any] = {}
        for axis, d in enumerate(v.type.shape):
            if isinstance(d, DimExpr):
                self.used = True
                out[axis] = self._torch_dim(d)
        return out or None

    def _torch_dim(self, d: DimExpr) -> Any:
        """``a*s + b`` as torch's derived dim of the root Dim ``s`` (torch allows only such forms)."""
        syms = d.symbols()
        if len(syms) != 1:
            raise CuvilError(f"TensorSpec dim {d}: torch.export dims depend on exactly one symbol")
        (s,) = syms
        root = self._root(s)
        b = evaluate(d, {s: 0})
        a = evaluate(d, {s: 1}) - b
        if a <= 0 or evaluate(d, {s: 2}) != 2 * a + b:
            raise CuvilError(f"TensorSpec dim {d}: torch.export allows only a*{s} + b with a > 0")
        if a == 1 and b == 0:
            return root
        return a * root + b if b else a * root

    def _root(self, s: str) -> Any:
        from torch.export import Dim

        if s not in self.roots:
            info = self.dims.get(s, SymbolInfo(s))
            lo = info.min if info.min is not None else 0
            hi = info.max
            if hi is not None and hi <= lo:
                raise CuvilError(f"dims: {s} has one value ({lo}); give it as a number in the TensorSpec")
            self.roots[s] = Dim(s, min=lo, max=hi)
        return self.roots[s]

    def _env(self, d: DimExpr) -> dict[str, int]:
        for s in sorted(d.symbols()):
            if s not in self.values:
                self.values[s] = self._example_value(s)
        return self.values

    def _example_value(self, s: str) -> int:
        """A valid size for ``s``, at least 2 (torch specializes 0 and 1) and unlike the other symbols'."""
        info = self.dims.get(s, SymbolInfo(s))
        v = max(info.min or 0, 2)
        if info.multiple_of:
            v = -(-v // info.multiple_of) * info.multiple_of
        step = info.multiple_of or 1
        taken = set(self.values.values())
        while v in taken and (info.max is None or v + step <= info.max):
            v += step
        if info.max is not None and v > info.max:
            raise CuvilError(f"dims: no size of {s} is both at least 2 and allowed by {info.describe()}")
        return v


def _torch_dtype(dtype: Any) -> Any:
    import torch

    from cuvil.ir.dtypes import DType

    table = {DType.f64: torch.float64, DType.f32: torch.float32, DType.f16: torch.float16, DType.bf16: torch.bfloat16,
             DType.i64: torch.int64, DType.i32: torch.int32, DType.i16: torch.int16, DType.i8: torch.int8,
             DType.u8: torch.uint8, DType.u16: torch.uint16, DType.u32: torch.uint32, DType.u64: torch.uint64,
             DType.bool: torch.bool}
    return table[dtype]


# matching dynamic_shapes to the program's user inputs ------------------------------------------


def _dims_per_leaf(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], dynamic_shapes: Any) -> list[dict[int, Any]]:
    """For each input leaf, in the order torch flattens ``(args, kwargs)`` (the program's user-input
    order), the dynamic dims the user gave for it: ``{axis: Dim}``."""
    import torch.utils._pytree as pytree
    from torch.export.dynamic_shapes import _combine_args, _tree_map_with_path

    leaves = pytree.tree_leaves((tuple(args), dict(kwargs)))
    if dynamic_shapes is None:
        return [{} for _ in leaves]
    combined: Any = _combine_args(model, tuple(args), dict(kwargs))
    if isinstance(dynamic_shapes, tuple | list):
        combined = type(dynamic_shapes)(combined.values())
    by_id: dict[int, dict[int, Any]] = {}

    def record(path: Any, leaf: Any, spec: Any) -> None:
        by_id[id(leaf)] = axes_of(spec)

    # the same tree walk torch.export used to validate dynamic_shapes against the inputs
    _tree_map_with_path(record, combined, dynamic_shapes, tree_name="inputs")
    return [by_id.get(id(leaf), {}) for leaf in leaves]


def axes_of(spec: Any) -> dict[int, Any]:
    """The dynamic dims one input's entry of dynamic_shapes gives: ``{axis: Dim}`` (fixed sizes left out)."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        return {int(k): v for k, v in spec.items() if v is not None and not isinstance(v, int)}
    if isinstance(spec, tuple | list):
        return {i: v for i, v in enumerate(spec) if v is not None and not isinstance(v, int)}
    return {}
