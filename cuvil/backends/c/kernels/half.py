"""Products of float16 / bfloat16 matrices for the ``matmul`` and ``gemm`` kernels.

The reference widens f16/bf16 operands to float32, multiplies with float32 accumulation and rounds
the result once; so does the generated code, without a scalar loop: the operands are widened into
float32 scratch (``cuvil_half.h``, vectorised conversions) and multiplied by ``cuvil_sgemm``.  When
the C compiler targets AVX512_BF16 (``CUVIL_HAVE_BF16_DOT``, decided when the C is compiled), bf16
products run ``cuvil_bf16_gemm`` on the bf16 operands directly (vdpbf16ps: exact products,
float32 accumulation).
"""

from __future__ import annotations

from dataclasses import dataclass

from cuvil.backends.c.kernel import CVal, KernelCtx
from cuvil.ir.dtypes import DType

HALF = (DType.f16, DType.bf16)


@dataclass
class HalfBuffers:
    """float32 scratch for one product's operands and result (reused across a batch loop)."""

    a: str
    b: str
    y: str

    def release(self, k: KernelCtx) -> None:
        for buf in (self.a, self.b, self.y):
            k.release(buf)


def half_buffers(k: KernelCtx, m: str, n: str, kd: str) -> HalfBuffers:
    k.include("cuvil_half.h")
    k.include("cuvil_gemm.h")

    def size(e: str) -> str:
        return f"((int64_t)({e}) > 0 ? (int64_t)({e}) : 1)"

    def uninit(count: str, hint: str) -> str:  # written whole before being read (when read at all): not zeroed
        name = k.tmp(hint)
        k.w.line(f"float *{name} = (float *)cuvil_alloc_uninit(call, (int64_t)sizeof(float) * (int64_t)({count}));")
        k.fail_if(f"!{name}", "out of memory")
        return name

    return HalfBuffers(uninit(size(f"(int64_t){m} * (int64_t){kd}"), "a32"),
                       uninit(size(f"(int64_t){kd} * (int64_t){n}"), "b32"),
                       k.scratch("float", size(f"(int64_t){m} * (int64_t){n}"), "y32"))


def half_product(k: KernelCtx, dt: DType, bufs: HalfBuffers, m: str, n: str, kd: str, alpha: str,
                 a: str, rsa: str, csa: str, b: str, rsb: str, csb: str, beta: str) -> None:
    """``bufs.y = alpha * A @ B + beta * bufs.y`` (float32, row-major ``[m, n]``) for f16/bf16 ``A``, ``B``."""
    w = k.w
    bf = "1" if dt is DType.bf16 else "0"
    if dt is DType.bf16:
        # vdpbf16ps on the bf16 operands; the scaling and the bias are applied to its float32 result.
        w.line("#if defined(CUVIL_HAVE_BF16_DOT)")
        w.line(f"if ({alpha} == 1.0f && {beta} == 0.0f) {{")
        k.fail_if(f"cuvil_bf16_gemm({m}, {n}, {kd}, {a}, {rsa}, {csa}, {b}, {rsb}, {csb}, {bufs.y}, {n}) != 0",
                  "out of memory")
        w.line("} else")
        w.line("#endif")
    with w.block(""):
        # A constant operand (a weight) is the model's cached widened copy, so the GEMM caches its panels.
        pa, pb, ra, ca, rb, cb = (k.tmp(h) for h in ("pa", "pb", "ra", "ca", "rb", "cb"))
        w.line(f"int64_t {ra}, {ca}, {rb}, {cb};")
        w.line(f"const float *{pa} = cuvil_half_matrix_operand({bf}, (const uint16_t *)({a}), {m}, {kd}, {rsa}, {csa}, "
               f"{bufs.a}, &{ra}, &{ca});")
        w.line(f"const float *{pb} = cuvil_half_matrix_operand({bf}, (const uint16_t *)({b}), {kd}, {n}, {rsb}, {csb}, "
               f"{bufs.b}, &{rb}, &{cb});")
        k.fail_if(f"cuvil_sgemm({m}, {n}, {kd}, {alpha}, {pa}, {ra}, {ca}, {pb}, {rb}, {cb}, {beta}, {bufs.y}, {n}) != 0",
                  "out of memory")


def round_out(k: KernelCtx, dt: DType, src: str, dst: str, count: str) -> None:
    """``count`` float32 values of ``src`` rounded once into ``dst`` of type ``dt``."""
    fn = "cuvil_f32_to_bf16_n" if dt is DType.bf16 else "cuvil_f32_to_f16_n"
    k.w.line(f"{fn}({src}, {dst}, {count});")


CONV_KINDS = {"conv": "CUVIL_HALF_CONV", "depthwise": "CUVIL_HALF_CONV_DEPTHWISE",
              "transpose": "CUVIL_HALF_CONV_TRANSPOSE"}


def half_conv(k: KernelCtx, kind: str, geom: str, x: CVal, w: CVal, y: CVal, winograd: int = 0) -> str:
    """Emit the convolution ``kind`` (a key of ``CONV_KINDS``) of f16/bf16 operands described by the
    ``cuvil_conv_geom`` named ``geom``; returns how it runs, for the kernel's note.

    A forward convolution that float32 would run by Winograd F(m x m, 3 x 3) (``winograd`` is m > 0,
    the float32 choice for its shape) runs it on widened operands, bf16 included: it takes 2.25 to 4
    times fewer multiply-adds than a direct product, while vdpbf16ps runs no more multiply-adds per
    cycle than a float32 FMA (measured on an AMD EPYC core: 108 against 104 per ns), so the direct
    product is slower.  Other forward bf16 convolutions run ``cuvil_conv_bf16`` (vdpbf16ps) when
    the C compiler targets AVX512_BF16.  Otherwise, and for f16, depthwise and transposed ones, the float32 algorithm runs
    on widened operands (``cuvil_conv_half``: the weights widened once per loaded model).  A fused
    clamp (``KernelCtx.clamp``: relu or clip) is applied as the result is rounded, and reported
    applied."""
    k.include("cuvil_half.h")
    if winograd and kind == "conv":
        k.enable("CUVIL_WINO_TILES", winograd)
    b = k.inp(2) if k.has(2) else None
    bptr = f"(const uint16_t *){b.ptr}" if b is not None else "NULL"
    bn = b.numel() if b is not None else "0"
    is_bf16 = x.dtype is DType.bf16
    lo, hi = k.clamp or ("-INFINITY", "INFINITY")
    ops = f"(const uint16_t *){x.ptr}, (const uint16_t *){w.ptr}, {bptr}, (uint16_t *){y.ptr}, {lo}, {hi}"
    rc = k.tmp("rc")
    w_ = k.w
    dot = is_bf16 and kind == "conv" and not winograd
    w_.line(f"int {rc};")
    if dot:
        w_.line("#if defined(CUVIL_HAVE_BF16_DOT)")
        w_.line(f"{rc} = cuvil_conv_bf16(&{geom}, {ops});")
        w_.line("#else")
    with w_.block(""):
        x32, y32 = k.tmp("x32"), k.tmp("y32")
        for buf, v in ((x32, x), (y32, y)):  # written whole before being read: not zeroed
            w_.line(f"float *{buf} = (float *)cuvil_alloc_uninit(call, (int64_t)sizeof(float) * (int64_t)({v.numel()}));")
            k.fail_if(f"!{buf}", "out of memory")
        w_.line(f"{rc} = cuvil_conv_half(&{geom}, {CONV_KINDS[kind]}, {int(is_bf16)}, (const uint16_t *){x.ptr}, "
                f"{x.numel()}, (const uint16_t *){w.ptr}, {w.numel()}, {bptr}, {bn}, (uint16_t *){y.ptr}, "
                f"{y.numel()}, {winograd if kind == 'conv' else 0}, {x32}, {y32}, {lo}, {hi});")
        k.release(x32)
        k.release(y32)
    if dot:
        w_.line("#endif")
    k.fail_if(f"{rc} != 0", "out of memory")
    k.epilogue_applied = k.clamp is not None
    widened = (f"Winograd F({winograd}x{winograd},3x3)" if winograd and kind == "conv" else "the float32 algorithm")
    widened += " on widened operands (weights widened once per model)"
    clamp = "; its clamp (relu or clip) applied as the result is rounded" if k.clamp else ""
    return ("bf16 dot products (cuvil_conv_bf16, where the target has AVX512_BF16; else " + widened + ")"
            if dot else widened) + clamp
