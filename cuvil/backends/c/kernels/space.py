"""Kernels of ``depth_to_space`` and ``space_to_depth`` (``DCR`` and ``CRD`` modes).

Both are a fixed permutation of ``[N, C, H, W]``; the loops walk the space side (``[N, D, H, b,
W, b]`` in order) and compute the depth side's index, so rows of ``W`` stay unit-stride on one
side.  Elements are copied as stored, whatever their type.
"""

from __future__ import annotations

from cuvil.backends.c.kernel import KernelCtx, kernel


def _emit(k: KernelCtx, to_space: bool) -> None:
    """Copy between depth ``[N, C, H, W]`` and space ``[N, D, H*b, W*b]`` (C = D * b * b)."""
    b = int(k.attrs["blocksize"])
    dcr = str(k.attrs.get("mode", "DCR")) == "DCR"
    x, y = k.inp(0), k.out(0)
    depth, space = (x, y) if to_space else (y, x)
    w = k.w
    n, d, h, ww = k.tmp("n"), k.tmp("d"), k.tmp("h"), k.tmp("w")
    i, j = k.tmp("bi"), k.tmp("bj")
    N, D = depth.dim(0), f"(int64_t){space.dim(1)}"  # noqa: N806
    H, W = f"(int64_t){depth.dim(2)}", f"(int64_t){depth.dim(3)}"  # noqa: N806
    if to_space:
        k.require(depth.dim(1), f"{D} * {b * b}", "input channels vs output channels x blocksize^2")
    else:
        k.require(space.dim(2), f"{H} * {b}", "input height vs output height x blocksize")
        k.require(space.dim(3), f"{W} * {b}", "input width vs output width x blocksize")
    with w.block(f"for (int64_t {n} = 0; {n} < (int64_t){N}; {n}++)"), \
            w.block(f"for (int64_t {d} = 0; {d} < {D}; {d}++)"), \
            w.block(f"for (int64_t {h} = 0; {h} < {H}; {h}++)"), \
            w.block(f"for (int64_t {i} = 0; {i} < {b}; {i}++)"), \
            w.block(f"for (int64_t {ww} = 0; {ww} < {W}; {ww}++)"), \
            w.block(f"for (int64_t {j} = 0; {j} < {b}; {j}++)"):
        chan = f"({i} * {b} + {j}) * {D} + {d}" if dcr else f"({d} * {b} + {i}) * {b} + {j}"
        di = f"((({n} * {D} * {b * b} + {chan}) * {H} + {h}) * {W} + {ww})"
        si = f"((({n} * {D} + {d}) * {H} * {b} + {h} * {b} + {i}) * {W} * {b} + {ww} * {b} + {j})"
        if to_space:
            w.line(f"{y.ptr}[{si}] = {x.ptr}[{di}];")
        else:
            w.line(f"{y.ptr}[{di}] = {x.ptr}[{si}];")


@kernel("depth_to_space")
def _depth_to_space(k: KernelCtx) -> None:
    _emit(k, to_space=True)


@kernel("space_to_depth")
def _space_to_depth(k: KernelCtx) -> None:
    _emit(k, to_space=False)
