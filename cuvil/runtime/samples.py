"""Seeded sample inputs that fit a model's input contract."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import evaluate, free_symbols
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.runtime.compiled import TensorSpec


def default_symbol_value(info: SymbolInfo | None) -> int:
    """A small valid value for a symbol: its minimum, or 1, rounded up to its multiple."""
    lo = 1
    if info is not None and info.min is not None:
        lo = max(info.min, 0)
    if info is not None and info.multiple_of:
        m = info.multiple_of
        lo = max(m, -(-lo // m) * m)
    return lo


def random_array(t: TensorType, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    if t.dtype.is_float:
        return rng.standard_normal(shape).astype(t.dtype.np)
    if t.dtype is DType.bool:
        return rng.random(shape) < 0.5
    info = np.iinfo(t.dtype.np)
    lo, hi = max(int(info.min), -10), min(int(info.max), 10)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(t.dtype.np)


def random_inputs(
    specs: Sequence[TensorSpec],
    symbols: Mapping[str, SymbolInfo],
    seed: int = 0,
    values: Mapping[str, int] | None = None,
) -> list[np.ndarray]:
    """One seeded random array per input; symbols take ``values`` or a small valid value."""
    rng = np.random.default_rng(seed)
    env: dict[str, int] = dict(values or {})
    for s in specs:
        for d in s.type.shape:
            for name in free_symbols(d):
                env.setdefault(name, default_symbol_value(symbols.get(name)))
    return [random_array(s.type, [evaluate(d, env) for d in s.type.shape], rng) for s in specs]
