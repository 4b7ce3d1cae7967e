"""Kernels of the core ops: identity."""

from __future__ import annotations

from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.common import copy


@kernel("identity")
def _identity(k: KernelCtx) -> None:
    copy(k, k.inp(0), k.out(0))
