"""Seeded sample inputs that fit a model's input contract."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cuvil.ir.domains import Domain
from cuvil.ir.dtypes import DType, int_bounds
from cuvil.ir.spec import TensorSpec
from cuvil.ir.symbolic import evaluate, free_symbols
from cuvil.ir.types import SymbolInfo, TensorType


def default_symbol_value(info: SymbolInfo | None) -> int:
    """A small valid value for a symbol: its minimum, or 1, rounded up to its multiple."""
    lo = 1
    if info is not None and info.min is not None:
        lo = max(info.min, 0)
    if info is not None and info.multiple_of:
        m = info.multiple_of
        lo = max(m, -(-lo // m) * m)
    return lo


def random_array(t: TensorType, shape: Sequence[int], rng: np.random.Generator,
                 int_range: tuple[int, int] | None = None) -> np.ndarray:
    """Standard normal floats, fair booleans, and integers uniform in ``int_range`` (both ends
    included; default -10..10, within the type)."""
    if t.dtype.holds_floats:  # float8/float4 hold these (saturating)
        return rng.standard_normal(shape).astype(t.dtype.np)
    if t.dtype is DType.bool:
        return rng.random(shape) < 0.5
    tmin, tmax = int_bounds(t.dtype)
    lo, hi = int_range if int_range is not None else (-10, 10)
    lo, hi = max(tmin, lo), min(tmax, hi)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(t.dtype.np)


def random_inputs(
    specs: Sequence[TensorSpec],
    symbols: Mapping[str, SymbolInfo],
    seed: int = 0,
    values: Mapping[str, int] | None = None,
    int_ranges: Sequence[tuple[int, int] | None] | None = None,
    domains: Sequence[Domain | None] | None = None,
) -> list[np.ndarray]:
    """One seeded random array per input; symbols take ``values`` or a small valid value.
    ``int_ranges`` gives, per input, the values an integer input is drawn from (token ids, masks);
    ``domains`` (cuvil.ir.domains), per input, what it is drawn from, over ``int_ranges``."""
    rng = np.random.default_rng(seed)
    ranges = list(int_ranges or []) + [None] * (len(specs) - len(int_ranges or []))
    doms = list(domains or []) + [None] * (len(specs) - len(domains or []))
    shapes = sample_shapes(specs, symbols, values)
    return [d.draw(s.type, shape, rng) if d is not None else random_array(s.type, shape, rng, r)
            for s, shape, r, d in zip(specs, shapes, ranges, doms)]


def sample_shapes(specs: Sequence[TensorSpec], symbols: Mapping[str, SymbolInfo],
                  values: Mapping[str, int] | None = None) -> list[list[int]]:
    """The shape of each input :func:`random_inputs` makes: symbols take ``values`` or a small valid value."""
    env: dict[str, int] = dict(values or {})
    for s in specs:
        for d in s.type.shape:
            for name in free_symbols(d):
                env.setdefault(name, default_symbol_value(symbols.get(name)))
    return [[evaluate(d, env) for d in s.type.shape] for s in specs]
