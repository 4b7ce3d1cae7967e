"""Checking inputs against a compiled model's contract before anything runs."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from cuvil.errors import InputError
from cuvil.ir.assumptions import Assumption
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import DimExpr, evaluate, format_dim, is_unknown, linear_form
from cuvil.ir.types import SymbolInfo, TensorType


def bind_inputs(
    names: Sequence[str],
    types: Sequence[TensorType],
    arrays: Sequence[np.ndarray],
    symbols: Mapping[str, SymbolInfo],
    checks: Sequence[Assumption] = (),
    dropped: str | None = None,
) -> dict[str, int]:
    """Check dtypes, ranks, static dims and symbol constraints, then the shape relations the
    model's ops need (``checks``, see cuvil/ir/assumptions.py); return the symbol values.

    Every failure raises an :class:`InputError` naming the input (or the node and
    relation), what was expected and what was given.  ``dropped``: a symbol whose upper bound is
    not checked (the planted fault "drop-guard", :func:`dropped_guard`)."""
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
            elif d == DimExpr.symbol(next(iter(d.symbols()), "")):
                s = next(iter(d.symbols()))
                if s in env and env[s] != n:
                    raise InputError(
                        f"input {name!r}: dim {axis} is {s}={n}, but {where[s]} gave {s}={env[s]}"
                    )
                env[s] = int(n)
                where[s] = f"input {name!r} dim {axis}"
            elif (lin := linear_form(d)) is not None and lin[0] not in env:
                s, k, c = lin  # a derived dim such as 32*h: solve for h
                if (n - c) % k != 0:
                    raise InputError(
                        f"input {name!r}: dim {axis} is {format_dim(d)}, so {n} is not allowed "
                        f"({n - c} is not a multiple of {k})" if c else
                        f"input {name!r}: dim {axis} is {format_dim(d)}, so it must be a multiple of {k}, got {n}"
                    )
                env[s] = (int(n) - c) // k
                where[s] = f"input {name!r} dim {axis}"
            else:
                deferred.append((name, axis, d, int(n)))
    for s, v in env.items():
        info = symbols.get(s)
        if info is not None:
            if s == dropped:
                info = SymbolInfo(info.name, info.min, None, info.multiple_of)
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
    for check in checks:
        why = check.check(env)
        if why is not None:
            raise InputError(why)
    return env


def dropped_guard(symbols: Mapping[str, SymbolInfo], planted: Collection[str]) -> str | None:
    """The symbol whose upper-bound guard is left out when the planted fault "drop-guard" is among
    ``planted`` (the first symbol with a maximum; cuvil/faults.py), else None. The compile records it
    in the model's Signature (the Python guard) and the C input checks ask too, so the bug is the
    same in every target."""
    from cuvil import faults

    if not faults.active("drop-guard", planted):
        return None
    return next((name for name, info in symbols.items() if info.max is not None), None)


def _fmt(t: TensorType) -> str:
    return f"[{', '.join(format_dim(d) for d in t.shape)}]"
