/* x86 intrinsics in portable C, for running code built for AVX-512 (VNNI, BF16) on a CPU without
 * it: tests put this folder first on the include path, define the ISA macros the target's flags
 * would (__AVX512F__, __AVX512VNNI__, ...) and SIMDE_NO_NATIVE, so that every intrinsic the
 * runtime calls is SIMDe's emulation.  Below: the few the runtime uses that SIMDe 0.8.2 lacks,
 * each written from Intel's definition.  Masked loads read enabled lanes only, as the instructions
 * do (their fault suppression is what lets kernels load a row's last partial vector). */
#ifndef CUVIL_AVX512_EMULATION_H
#define CUVIL_AVX512_EMULATION_H

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <stdint.h>

/* Masked loads and stores, lane by lane: SIMDe's load or store the whole vector and blend, which
 * reads (and for stores, writes back) the bytes past a row's end that the instructions leave alone. */
#define CUVIL_EMU_MASKZ_LOAD(name, V, lanes, field, T, K)                                         \
    static inline simde__##V cuvil_emu_##name(K k, const void *p) {                               \
        simde__##V##_private r;                                                                   \
        for (int i = 0; i < lanes; i++) r.field[i] = (k >> i) & 1 ? ((const T *)p)[i] : (T)0;     \
        return simde__##V##_from_private(r);                                                      \
    }
#define CUVIL_EMU_MASK_STORE(name, V, lanes, field, T, K)                                         \
    static inline void cuvil_emu_##name(void *p, K k, simde__##V a) {                             \
        simde__##V##_private v = simde__##V##_to_private(a);                                      \
        for (int i = 0; i < lanes; i++)                                                           \
            if ((k >> i) & 1) ((T *)p)[i] = v.field[i];                                           \
    }
CUVIL_EMU_MASKZ_LOAD(mm512_maskz_loadu_epi8, m512i, 64, i8, int8_t, simde__mmask64)
CUVIL_EMU_MASKZ_LOAD(mm512_maskz_loadu_epi32, m512i, 16, i32, int32_t, simde__mmask16)
CUVIL_EMU_MASKZ_LOAD(mm512_maskz_loadu_ps, m512, 16, f32, float, simde__mmask16)
CUVIL_EMU_MASKZ_LOAD(mm256_maskz_loadu_epi8, m256i, 32, i8, int8_t, simde__mmask32)
CUVIL_EMU_MASK_STORE(mm512_mask_storeu_epi8, m512i, 64, i8, int8_t, simde__mmask64)
CUVIL_EMU_MASK_STORE(mm512_mask_storeu_epi16, m512i, 32, i16, int16_t, simde__mmask32)
CUVIL_EMU_MASK_STORE(mm512_mask_storeu_epi32, m512i, 16, i32, int32_t, simde__mmask16)
CUVIL_EMU_MASK_STORE(mm512_mask_storeu_ps, m512, 16, f32, float, simde__mmask16)
CUVIL_EMU_MASK_STORE(mm256_mask_storeu_epi8, m256i, 32, i8, int8_t, simde__mmask32)
CUVIL_EMU_MASK_STORE(mm256_mask_storeu_epi16, m256i, 16, i16, int16_t, simde__mmask16)

/* AVX2 vpmaskmovd / vmaskmovps: a lane is enabled by its mask lane's sign bit */
static inline unsigned cuvil_emu_sign_bits8(simde__m256i m) {
    simde__m256i_private v = simde__m256i_to_private(m);
    unsigned k = 0;
    for (int i = 0; i < 8; i++) k |= (unsigned)(v.i32[i] < 0) << i;
    return k;
}
CUVIL_EMU_MASKZ_LOAD(mm256_maskz_loadu_epi32_k, m256i, 8, i32, int32_t, unsigned)
CUVIL_EMU_MASKZ_LOAD(mm256_maskz_loadu_ps_k, m256, 8, f32, float, unsigned)
CUVIL_EMU_MASK_STORE(mm256_mask_storeu_epi32_k, m256i, 8, i32, int32_t, unsigned)
CUVIL_EMU_MASK_STORE(mm256_mask_storeu_ps_k, m256, 8, f32, float, unsigned)
static inline simde__m256i cuvil_emu_mm256_maskload_epi32(const int *p, simde__m256i m) {
    return cuvil_emu_mm256_maskz_loadu_epi32_k(cuvil_emu_sign_bits8(m), p);
}
static inline simde__m256 cuvil_emu_mm256_maskload_ps(const float *p, simde__m256i m) {
    return cuvil_emu_mm256_maskz_loadu_ps_k(cuvil_emu_sign_bits8(m), p);
}
static inline void cuvil_emu_mm256_maskstore_epi32(int *p, simde__m256i m, simde__m256i a) {
    cuvil_emu_mm256_mask_storeu_epi32_k(p, cuvil_emu_sign_bits8(m), a);
}
static inline void cuvil_emu_mm256_maskstore_ps(float *p, simde__m256i m, simde__m256 a) {
    cuvil_emu_mm256_mask_storeu_ps_k(p, cuvil_emu_sign_bits8(m), a);
}

/* vpmovzxbw: 32 unsigned bytes widened to 16-bit lanes */
static inline simde__m512i cuvil_emu_mm512_cvtepu8_epi16(simde__m256i a) {
    simde__m256i_private v = simde__m256i_to_private(a);
    simde__m512i_private r;
    for (int i = 0; i < 32; i++) r.i16[i] = (int16_t)v.u8[i];
    return simde__m512i_from_private(r);
}
/* vpmovdb: each 32-bit lane's low byte (truncation, no saturation) */
static inline simde__m128i cuvil_emu_mm512_cvtepi32_epi8(simde__m512i a) {
    simde__m512i_private v = simde__m512i_to_private(a);
    simde__m128i_private r;
    for (int i = 0; i < 16; i++) r.u8[i] = (uint8_t)(uint32_t)v.i32[i];
    return simde__m128i_from_private(r);
}
/* vpmovdw: each 32-bit lane's low 16 bits */
static inline simde__m256i cuvil_emu_mm512_cvtepi32_epi16(simde__m512i a) {
    simde__m512i_private v = simde__m512i_to_private(a);
    simde__m256i_private r;
    for (int i = 0; i < 16; i++) r.u16[i] = (uint16_t)(uint32_t)v.i32[i];
    return simde__m256i_from_private(r);
}
/* vcvtps2ph to nearest even (the only rounding the runtime asks for) */
static inline simde__m256i cuvil_emu_mm512_cvtps_ph(simde__m512 a, int rounding) {
    (void)rounding;
    simde__m512_private v = simde__m512_to_private(a);
    simde__m256i_private r;
    for (int i = 0; i < 16; i++) r.u16[i] = simde_float16_as_uint16(simde_float16_from_float32(v.f32[i]));
    return simde__m256i_from_private(r);
}
static inline unsigned short cuvil_emu_cvtss_sh(float x, int rounding) {
    (void)rounding;
    return simde_float16_as_uint16(simde_float16_from_float32(x));
}
static inline float cuvil_emu_cvtsh_ss(unsigned short h) { return simde_float16_to_float32(simde_uint16_as_float16(h)); }

#undef _mm512_maskz_loadu_epi8
#define _mm512_maskz_loadu_epi8 cuvil_emu_mm512_maskz_loadu_epi8
#undef _mm512_maskz_loadu_epi32
#define _mm512_maskz_loadu_epi32 cuvil_emu_mm512_maskz_loadu_epi32
#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps cuvil_emu_mm512_maskz_loadu_ps
#undef _mm256_maskz_loadu_epi8
#define _mm256_maskz_loadu_epi8 cuvil_emu_mm256_maskz_loadu_epi8
#undef _mm512_mask_storeu_epi8
#define _mm512_mask_storeu_epi8 cuvil_emu_mm512_mask_storeu_epi8
#undef _mm512_mask_storeu_epi16
#define _mm512_mask_storeu_epi16 cuvil_emu_mm512_mask_storeu_epi16
#undef _mm512_mask_storeu_epi32
#define _mm512_mask_storeu_epi32 cuvil_emu_mm512_mask_storeu_epi32
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps cuvil_emu_mm512_mask_storeu_ps
#undef _mm256_mask_storeu_epi8
#define _mm256_mask_storeu_epi8 cuvil_emu_mm256_mask_storeu_epi8
#undef _mm256_mask_storeu_epi16
#define _mm256_mask_storeu_epi16 cuvil_emu_mm256_mask_storeu_epi16
#undef _mm256_maskload_epi32
#define _mm256_maskload_epi32 cuvil_emu_mm256_maskload_epi32
#undef _mm256_maskload_ps
#define _mm256_maskload_ps cuvil_emu_mm256_maskload_ps
#undef _mm256_maskstore_epi32
#define _mm256_maskstore_epi32 cuvil_emu_mm256_maskstore_epi32
#undef _mm256_maskstore_ps
#define _mm256_maskstore_ps cuvil_emu_mm256_maskstore_ps
#undef _mm512_cvtepu8_epi16
#define _mm512_cvtepu8_epi16 cuvil_emu_mm512_cvtepu8_epi16
#undef _mm512_cvtepi32_epi8
#define _mm512_cvtepi32_epi8 cuvil_emu_mm512_cvtepi32_epi8
#undef _mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi16 cuvil_emu_mm512_cvtepi32_epi16
#undef _mm512_cvtps_ph
#define _mm512_cvtps_ph cuvil_emu_mm512_cvtps_ph
#undef _cvtss_sh
#define _cvtss_sh cuvil_emu_cvtss_sh
#undef _cvtsh_ss
#define _cvtsh_ss cuvil_emu_cvtsh_ss
#endif
