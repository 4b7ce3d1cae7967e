/* Cuvil runtime: the instruction sets a model library was compiled for, checked against the
 * CPU it runs on.
 *
 * A library built for x86_avx2, x86_avx512 or -march=native holds instructions that an older
 * CPU cannot run: called there, it would die on an illegal instruction in the middle of a
 * kernel.  cuvil_load_from_memory calls cuvil_cpu_missing first and refuses to load, naming
 * every feature the compiler was told to use (its predefined macros) that this CPU lacks.
 *
 * The check uses the compiler's __builtin_cpu_supports (GCC, Clang); the feature names past
 * the AVX-512 foundation are GCC 12's, so other compilers check the foundation only.  On
 * other architectures, and for portable builds, nothing is missing. */
#ifndef CUVIL_CPU_H
#define CUVIL_CPU_H

#include <stddef.h>

#if defined(CUVIL_CPU_CHECKS)
/* set by the build: 0 for a library run on an emulator of the target's instructions */
#define CUVIL_CPU_CHECKS_EXTENDED 0
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CUVIL_CPU_CHECKS 1
#if defined(__clang__) || __GNUC__ < 12
#define CUVIL_CPU_CHECKS_EXTENDED 0
#else
#define CUVIL_CPU_CHECKS_EXTENDED 1
#endif
#else
#define CUVIL_CPU_CHECKS 0
#endif

#if CUVIL_CPU_CHECKS
/* Appends ", name" (or "name" first) to out[0..cap), truncating; a byte loop, so that nothing in
 * here can need the instructions it checks for. */
__attribute__((unused)) static void cuvil_cpu_note(char *out, size_t cap, size_t *len, const char *name) {
    if (*len && *len + 2 < cap) {
        out[(*len)++] = ',';
        out[(*len)++] = ' ';
    }
    for (; *name && *len + 1 < cap; name++) out[(*len)++] = *name;
    out[*len] = '\0';
}

#define CUVIL_CPU_NEED(name)                                                                  \
    do {                                                                                      \
        if (!__builtin_cpu_supports(name)) cuvil_cpu_note(out, cap, &len, name);              \
    } while (0)
#endif

/* Writes the features this library needs and the CPU lacks into out (comma-separated) and
 * returns how many bytes that took: 0 when the CPU runs everything here. */
__attribute__((noinline, unused)) static size_t cuvil_cpu_missing(char *out, size_t cap) {
    if (!out || !cap) return 0;
    out[0] = '\0';
#if CUVIL_CPU_CHECKS
    size_t len = 0;
    __builtin_cpu_init();
#ifdef __SSE4_2__
    CUVIL_CPU_NEED("sse4.2");
#endif
#ifdef __AVX__
    CUVIL_CPU_NEED("avx");
#endif
#ifdef __AVX2__
    CUVIL_CPU_NEED("avx2");
#endif
#ifdef __FMA__
    CUVIL_CPU_NEED("fma");
#endif
#ifdef __AVX512F__
    CUVIL_CPU_NEED("avx512f");
#endif
#ifdef __AVX512BW__
    CUVIL_CPU_NEED("avx512bw");
#endif
#ifdef __AVX512VL__
    CUVIL_CPU_NEED("avx512vl");
#endif
#ifdef __AVX512DQ__
    CUVIL_CPU_NEED("avx512dq");
#endif
#if CUVIL_CPU_CHECKS_EXTENDED
#ifdef __F16C__
    CUVIL_CPU_NEED("f16c");
#endif
#ifdef __BMI__
    CUVIL_CPU_NEED("bmi");
#endif
#ifdef __BMI2__
    CUVIL_CPU_NEED("bmi2");
#endif
#ifdef __AVX512CD__
    CUVIL_CPU_NEED("avx512cd");
#endif
#ifdef __AVX512VNNI__
    CUVIL_CPU_NEED("avx512vnni");
#endif
#ifdef __AVX512BF16__
    CUVIL_CPU_NEED("avx512bf16");
#endif
#ifdef __AVX512FP16__
    CUVIL_CPU_NEED("avx512fp16");
#endif
#ifdef __AVX512VBMI__
    CUVIL_CPU_NEED("avx512vbmi");
#endif
#ifdef __AVX512VBMI2__
    CUVIL_CPU_NEED("avx512vbmi2");
#endif
#ifdef __AVX512IFMA__
    CUVIL_CPU_NEED("avx512ifma");
#endif
#ifdef __AVX512BITALG__
    CUVIL_CPU_NEED("avx512bitalg");
#endif
#ifdef __AVX512VPOPCNTDQ__
    CUVIL_CPU_NEED("avx512vpopcntdq");
#endif
#ifdef __AVXVNNI__
    CUVIL_CPU_NEED("avxvnni");
#endif
#ifdef __GFNI__
    CUVIL_CPU_NEED("gfni");
#endif
#ifdef __VAES__
    CUVIL_CPU_NEED("vaes");
#endif
#ifdef __VPCLMULQDQ__
    CUVIL_CPU_NEED("vpclmulqdq");
#endif
#endif
    return len;
#else
    return 0;
#endif
}

#endif
