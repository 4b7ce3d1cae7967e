"""Checking inputs against a compiled model's contract before anything runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cuvil.errors import InputError
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import DimExpr, evaluate, format_dim, is_unknown
from cuvil.ir.types import SymbolInfo, TensorType


def bind_inputs(
    names: Sequence[str],
    types: Sequence[TensorType],
    arrays: Sequence[np.ndarray],
    symbols: Mapping[str, SymbolInfo],
) -> dict[str, int]:
    """Check dtypes, ranks, static dims and symbol constraints; return the symbol values.

    Every failure raises an :class:`InputError` naming the input, what was
    expected and what was given."""
    if len(arrays) != len(types):
        raise InputError(f"expected {len(types)} inputs ({', '.join(map(repr, names))}), got {len(arrays)}")
    env: dict[str, int] = {}
    where: dict[str, str] = {}
    deferred: list[tuple[str, int, DimExpr, int]] = []
    for name, t, a in zip(names, types, arrays):
        try:
            dt = DType.from_np(a.dtype)
        except TypeError:
            dt = None
        if dt is not t.dtype:
            raise InputError(f"input {name!r}: expected element type {t.dtype}, got {a.dtype}")
        if a.ndim != t.rank:
            raise InputError(f"input {name!r}: expected shape {_fmt(t)} (rank {t.rank}), got {list(a.shape)} (rank {a.ndim})")
        for axis, (d, n) in enumerate(zip(t.shape, a.shape)):
            if isinstance(d, int):
                if d != n:
                    raise InputError(f"input {name!r}: expected shape {_fmt(t)}, got {list(a.shape)} (dim {axis} must be {d})")
            elif is_unknown(d):
                continue
            elif len(d.symbols()) == 1 and d == DimExpr.symbol(next(iter(d.symbols()))):
                s = next(iter(d.symbols()))
                if s in env and env[s] != n:
                    raise InputError(
                        f"input {name!r}: dim {axis} is {s}={n}, but {where[s]} gave {s}={env[s]}"
                    )
                env[s] = int(n)
                where[s] = f"input {name!r} dim {axis}"
            else:
                deferred.append((name, axis, d, int(n)))
    for s, v in env.items():
        info = symbols.get(s)
        if info is not None:
            why = info.check(v)
            if why is not None:
                raise InputError(f"{where[s]}: {why}")
    for name, axis, d, n in deferred:
        try:
            want = evaluate(d, env)
        except (KeyError, ValueError):
            continue
        if want != n:
            raise InputError(f"input {name!r}: dim {axis} must be {format_dim(d)} = {want}, got {n}")
    return env


def _fmt(t: TensorType) -> str:
    return f"[{', '.join(format_dim(d) for d in t.shape)}]"
