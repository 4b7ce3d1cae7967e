/* Cuvil CUDA runtime, device side: what generated kernels share.
 *
 * The elementwise ops' scalar expressions are the C backend's (cuvil/backends/c/kernels/
 * elementwise.py); the helpers they call are defined here for host and device with the semantics
 * of cuvil_math.h, and the float32 transcendental functions are cuvil_vmath.h itself, compiled for
 * the device too, so a CUDA build computes what the C build computes.  Also here: warp and block
 * reductions (shuffles across the 32 lanes of a warp, then one value per warp through shared
 * memory).  Everything is static: each model is one translation unit.
 */
#ifndef CUVIL_CUDA_KERNELS_H
#define CUVIL_CUDA_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define CUVIL_HD static inline __host__ __device__
#define CUVIL_VM_INLINE CUVIL_HD
#include "cuvil_vmath.h"

/* ---- the helpers of cuvil_math.h, for host and device ---------------------------------- */

CUVIL_HD float cuvil_max_f(float a, float b) { return (a > b || a != a) ? a : b; }
CUVIL_HD float cuvil_min_f(float a, float b) { return (a < b || a != a) ? a : b; }
CUVIL_HD double cuvil_max_d(double a, double b) { return (a > b || a != a) ? a : b; }
CUVIL_HD double cuvil_min_d(double a, double b) { return (a < b || a != a) ? a : b; }
CUVIL_HD float cuvil_max_nn_f(float a, float b) { return a <= b ? b : a; }
CUVIL_HD float cuvil_min_nn_f(float a, float b) { return a >= b ? b : a; }
CUVIL_HD double cuvil_max_nn_d(double a, double b) { return a <= b ? b : a; }
CUVIL_HD double cuvil_min_nn_d(double a, double b) { return a >= b ? b : a; }

CUVIL_HD int32_t cuvil_add_i32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
CUVIL_HD int32_t cuvil_sub_i32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a - (uint32_t)b); }
CUVIL_HD int32_t cuvil_mul_i32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a * (uint32_t)b); }
CUVIL_HD int32_t cuvil_neg_i32(int32_t a) { return (int32_t)(0u - (uint32_t)a); }
CUVIL_HD int64_t cuvil_add_i64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
CUVIL_HD int64_t cuvil_sub_i64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
CUVIL_HD int64_t cuvil_mul_i64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
CUVIL_HD int64_t cuvil_neg_i64(int64_t a) { return (int64_t)(0u - (uint64_t)a); }

CUVIL_HD int32_t cuvil_div_i32(int32_t a, int32_t b) { return b == 0 ? 0 : (b == -1 ? cuvil_neg_i32(a) : a / b); }
CUVIL_HD int64_t cuvil_div_i64(int64_t a, int64_t b) { return b == 0 ? 0 : (b == -1 ? cuvil_neg_i64(a) : a / b); }
CUVIL_HD uint32_t cuvil_div_u32(uint32_t a, uint32_t b) { return b ? a / b : 0u; }
CUVIL_HD uint64_t cuvil_div_u64(uint64_t a, uint64_t b) { return b ? a / b : 0u; }
CUVIL_HD int32_t cuvil_fmod_i32(int32_t a, int32_t b) { return (b == 0 || b == -1) ? 0 : a % b; }
CUVIL_HD int64_t cuvil_fmod_i64(int64_t a, int64_t b) { return (b == 0 || b == -1) ? 0 : a % b; }
CUVIL_HD int32_t cuvil_mod_i32(int32_t a, int32_t b) {
    if (b == 0 || b == -1) return 0;
    int32_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
CUVIL_HD int64_t cuvil_mod_i64(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
CUVIL_HD uint32_t cuvil_mod_u32(uint32_t a, uint32_t b) { return b ? a % b : 0u; }
CUVIL_HD uint64_t cuvil_mod_u64(uint64_t a, uint64_t b) { return b ? a % b : 0u; }
CUVIL_HD double cuvil_mod_d(double a, double b) {
    double r = fmod(a, b);
    if (b == 0) return r;
    if (r != 0) {
        if ((b < 0) != (r < 0)) r += b;
    } else {
        r = copysign(0.0, b);
    }
    return r;
}
CUVIL_HD float cuvil_mod_f(float a, float b) {
    float r = fmodf(a, b);
    if (b == 0) return r;
    if (r != 0) {
        if ((b < 0) != (r < 0)) r += b;
    } else {
        r = copysignf(0.0f, b);
    }
    return r;
}
CUVIL_HD int64_t cuvil_pow_i64(int64_t a, int64_t b) {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b % 2 == 0) ? 1 : -1) : 0);
    uint64_t base = (uint64_t)a, acc = 1u, e = (uint64_t)b;
    while (e) {
        if (e & 1u) acc *= base;
        base *= base;
        e >>= 1;
    }
    return (int64_t)acc;
}

CUVIL_HD int8_t cuvil_f2i_i8(double x) { return x != x ? 0 : (x >= 128.0 ? INT8_MAX : (x < -128.0 ? INT8_MIN : (int8_t)x)); }
CUVIL_HD int16_t cuvil_f2i_i16(double x) {
    return x != x ? 0 : (x >= 32768.0 ? INT16_MAX : (x < -32768.0 ? INT16_MIN : (int16_t)x));
}
CUVIL_HD int32_t cuvil_f2i_i32(double x) {
    return x != x ? 0 : (x >= 2147483648.0 ? INT32_MAX : (x < -2147483648.0 ? INT32_MIN : (int32_t)x));
}
CUVIL_HD int64_t cuvil_f2i_i64(double x) {
    return x != x ? 0 : (x >= 9223372036854775808.0 ? INT64_MAX : (x < -9223372036854775808.0 ? INT64_MIN : (int64_t)x));
}
CUVIL_HD uint8_t cuvil_f2i_u8(double x) { return (x != x || x <= -1.0) ? 0 : (x >= 256.0 ? UINT8_MAX : (uint8_t)x); }
CUVIL_HD uint16_t cuvil_f2i_u16(double x) { return (x != x || x <= -1.0) ? 0 : (x >= 65536.0 ? UINT16_MAX : (uint16_t)x); }
CUVIL_HD uint32_t cuvil_f2i_u32(double x) {
    return (x != x || x <= -1.0) ? 0 : (x >= 4294967296.0 ? UINT32_MAX : (uint32_t)x);
}
CUVIL_HD uint64_t cuvil_f2i_u64(double x) {
    return (x != x || x <= -1.0) ? 0 : (x >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)x);
}

CUVIL_HD float cuvil_sigmoid_f(float x) {
    float e = expf(-fabsf(x));
    return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
CUVIL_HD double cuvil_sigmoid_d(double x) {
    double e = exp(-fabs(x));
    return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}
CUVIL_HD float cuvil_softplus_f(float x) { return cuvil_max_f(x, 0.0f) + cuvil_log1p_f(cuvil_exp_f(-fabsf(x))); }
CUVIL_HD double cuvil_softplus_d(double x) { return cuvil_max_d(x, 0.0) + log1p(exp(-fabs(x))); }
CUVIL_HD float cuvil_clamp_f(float x, float lo, float hi) { return cuvil_min_f(cuvil_max_f(x, lo), hi); }
CUVIL_HD double cuvil_clamp_d(double x, double lo, double hi) { return cuvil_min_d(cuvil_max_d(x, lo), hi); }

/* ---- half precision storage (uint16_t bits), as cuvil_rt.h converts it: round to nearest even ------- */

CUVIL_HD float cuvil_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

CUVIL_HD uint16_t cuvil_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0));
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) { /* subnormal or zero in f16: units of 2^-24 */
        if (absx < 0x33000000u) return (uint16_t)sign;
        const uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    const uint32_t e = (absx >> 23) - 127 + 15, m = absx & 0x7fffffu, rem = m & 0x1fffu;
    uint32_t r = (e << 10) | (m >> 13);
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

CUVIL_HD float cuvil_f16_round_f(float x) { return cuvil_f16_to_f32(cuvil_f32_to_f16(x)); }

CUVIL_HD float cuvil_bf16_to_f32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

CUVIL_HD uint16_t cuvil_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- indices read from tensors ------------------------------------------------------------ */

/* A kernel that reads at an index held in a tensor records the first index out of range in the
 * call's status words ({check, index, size}; check is the 1-based number generated code gives the
 * node); the host fails the call with it once the kernels have run (cuvil_cuda_host.h). */
__device__ static inline void cuvil_index_fault(unsigned long long *status, unsigned long long check, int64_t index,
                                                int64_t size) {
    if (atomicCAS(status, 0ull, check) == 0ull) {
        status[1] = (unsigned long long)index;
        status[2] = (unsigned long long)size;
    }
}

/* ---- reductions across a warp and a block ------------------------------------------------ */

#define CUVIL_WARP 32
#define CUVIL_FULL_MASK 0xffffffffu

/* The lane mask each step of the butterfly exchanges over: lane ^ offset (a build with the planted
 * fault cuda-shuffle-lane defines it first). */
#ifndef CUVIL_SHFL_LANE
#define CUVIL_SHFL_LANE(off) (off)
#endif

__device__ static inline float cuvil_warp_sum_f(float v) {
    for (int off = CUVIL_WARP / 2; off > 0; off >>= 1) v += __shfl_xor_sync(CUVIL_FULL_MASK, v, CUVIL_SHFL_LANE(off));
    return v;
}
__device__ static inline float cuvil_warp_max_f(float v) {
    for (int off = CUVIL_WARP / 2; off > 0; off >>= 1) v = cuvil_max_f(v, __shfl_xor_sync(CUVIL_FULL_MASK, v, CUVIL_SHFL_LANE(off)));
    return v;
}
__device__ static inline float cuvil_warp_min_f(float v) {
    for (int off = CUVIL_WARP / 2; off > 0; off >>= 1) v = cuvil_min_f(v, __shfl_xor_sync(CUVIL_FULL_MASK, v, CUVIL_SHFL_LANE(off)));
    return v;
}
__device__ static inline float cuvil_warp_prod_f(float v) {
    for (int off = CUVIL_WARP / 2; off > 0; off >>= 1) v *= __shfl_xor_sync(CUVIL_FULL_MASK, v, CUVIL_SHFL_LANE(off));
    return v;
}

/* The reduction of `v` over the block (blockDim.x a multiple of 32, at most 1024), given to every
 * thread; `scratch` is 32 floats of shared memory, free again when it returns. */
#define CUVIL_BLOCK_REDUCE(NAME, WARP_OP, IDENTITY)                                   \
    __device__ static inline float NAME(float v, float *scratch) {                    \
        const int lane = (int)(threadIdx.x % CUVIL_WARP), warp = (int)(threadIdx.x / CUVIL_WARP); \
        v = WARP_OP(v);                                                               \
        if (lane == 0) scratch[warp] = v;                                             \
        __syncthreads();                                                              \
        const int nwarps = (int)((blockDim.x + CUVIL_WARP - 1) / CUVIL_WARP);         \
        float r = lane < nwarps ? scratch[lane] : (IDENTITY);                         \
        r = WARP_OP(r);                                                               \
        __syncthreads();                                                              \
        return r;                                                                     \
    }
CUVIL_BLOCK_REDUCE(cuvil_block_sum_f, cuvil_warp_sum_f, 0.0f)
CUVIL_BLOCK_REDUCE(cuvil_block_max_f, cuvil_warp_max_f, -INFINITY)
CUVIL_BLOCK_REDUCE(cuvil_block_min_f, cuvil_warp_min_f, INFINITY)
CUVIL_BLOCK_REDUCE(cuvil_block_prod_f, cuvil_warp_prod_f, 1.0f)

#endif /* CUVIL_CUDA_KERNELS_H */
