// Hand-written CUDA programs that exercise the execution model: compiled by nvcc for a GPU, or by g++
// with -DCUVIL_CUDA_SIM against the CPU harness. Each check prints "PASS name" or "FAIL name: why".
//
// Planted bugs (compile-time, one source):
//   -DPLANT_MISSING_SYNC     the tiled matmul (between compute and the next tile's load) and the row
//                            softmax (between writing the warp sums and reading them) lose a
//                            __syncthreads()
//   -DPLANT_SHFL_WRONG_LANE  the block reduction's warp sum shuffles from the wrong lane
//   -DPLANT_TILE_OFF_BY_ONE  the tiled matmul's tile bound reads one element past the matrix
//
// Usage: sim_suite [checks|all-but-matmul|matmul|convert IN OUT|bench BLOCKS]
#include "cuvil_cuda.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#if CUVIL_HAS_WMMA
using namespace nvcuda;
#endif

#define CK(call)                                                                                    \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            std::printf("CUDA error %d at line %d: %s\n", (int)e_, __LINE__, cudaGetErrorString(e_)); \
            std::exit(2);                                                                           \
        }                                                                                           \
    } while (0)

static int g_failures = 0;
static void report(const char* name, bool ok, const char* why = "") {
    if (ok)
        std::printf("PASS %s\n", name);
    else {
        std::printf("FAIL %s: %s\n", name, why);
        ++g_failures;
    }
    std::fflush(stdout);
}

template <class T>
static T* to_device(const std::vector<T>& h) {
    T* d = nullptr;
    CK(cudaMalloc(&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <class T>
static std::vector<T> to_host(const T* d, size_t n) {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
static unsigned lcg(unsigned& s) {
    s = s * 1664525u + 1013904223u;
    return s >> 8;
}

// ---------------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------------
__global__ void vadd(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) c[i] = a[i] + b[i];
}

#define TILE 32
__global__ void matmul_tiled(const float* A, const float* B, float* C, int n) {
    __shared__ float As[TILE][TILE + 1];
    __shared__ float Bs[TILE][TILE + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < (n + TILE - 1) / TILE; ++t) {
        int ac = t * TILE + tx, br = t * TILE + ty;
#ifdef PLANT_TILE_OFF_BY_ONE
        As[ty][tx] = (row < n && ac <= n) ? A[row * n + ac] : 0.0f;
#else
        As[ty][tx] = (row < n && ac < n) ? A[row * n + ac] : 0.0f;
#endif
        Bs[ty][tx] = (br < n && col < n) ? B[br * n + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
#ifndef PLANT_MISSING_SYNC
        __syncthreads();
#endif
    }
    if (row < n && col < n) C[row * n + col] = acc;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) {
#ifdef PLANT_SHFL_WRONG_LANE
        v += __shfl_down_sync(0xffffffffu, v, o + 1);
#else
        v += __shfl_down_sync(0xffffffffu, v, o);
#endif
    }
    return v;
}

// One partial sum per block: grid-stride accumulation, warp shuffles, shared memory across warps.
__global__ void block_reduce(const float* x, float* out, int n) {
    __shared__ float partial[32];
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) v += x[i];
    v = warp_sum(v);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? partial[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) out[blockIdx.x] = v;
    }
}

// One block per row: max and sum through warp shuffles (xor butterfly) and shared memory.
__global__ void row_softmax(const float* x, float* y, int cols) {
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < nw; ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(xr[c] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) red[warp] = s;
#ifndef PLANT_MISSING_SYNC
    __syncthreads();
#endif
    s = 0.0f;
    for (int w = 0; w < nw; ++w) s += red[w];
    float inv = 1.0f / s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __expf(xr[c] - m) * inv;
}

#define BINS 64
__global__ void histogram(const int* x, int n, unsigned* hist) {
    __shared__ unsigned local[BINS];
    for (int b = threadIdx.x; b < BINS; b += blockDim.x) local[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        atomicAdd(&local[x[i]], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < BINS; b += blockDim.x) atomicAdd(&hist[b], local[b]);
}

// out: [0] max, [1] min, [2] float sum, [3] CAS-counted, [4] exch count, [5] ull sum (low bits)
__global__ void atomics_mix(const int* x, int n, int* imax, int* imin, float* fsum, int* cas_count,
                            unsigned long long* ull_sum, unsigned* inc) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicMax(imax, x[i]);
    atomicMin(imin, x[i]);
    atomicAdd(fsum, 1.0f);
    int old = *cas_count, assumed;
    do {
        assumed = old;
        old = atomicCAS(cas_count, assumed, assumed + 1);
    } while (old != assumed);
    atomicAdd(ull_sum, (unsigned long long)x[i]);
    atomicInc(inc, 1000u);
    __threadfence();
}

// Dynamic shared memory: every thread writes a slot, the block reverses the whole buffer.
__global__ void dyn_reverse(const float* x, float* y, int per_block) {
    CUVIL_DYNAMIC_SHARED(float, dbuf);
    const float* xb = x + (size_t)blockIdx.x * per_block;
    for (int i = threadIdx.x; i < per_block; i += blockDim.x) dbuf[i] = xb[i];
    __syncthreads();
    for (int i = threadIdx.x; i < per_block; i += blockDim.x)
        y[(size_t)blockIdx.x * per_block + i] = dbuf[per_block - 1 - i];
}

// Warp votes and shuffle variants; out has 8 words per thread.
__global__ void warp_ops(unsigned* out) {
    int t = threadIdx.x, lane = t % 32;
    unsigned* o = out + t * 8;
    o[0] = __ballot_sync(0xffffffffu, lane & 1);
    o[1] = (unsigned)__any_sync(0xffffffffu, lane == 7);
    o[2] = (unsigned)__all_sync(0xffffffffu, lane < 31);
    o[3] = (unsigned)__shfl_up_sync(0xffffffffu, lane * 10, 3, 8);
    o[4] = (unsigned)__shfl_sync(0xffffffffu, lane * 10, 5, 16);
    int s = lane;
    for (int k = 1; k < 32; k <<= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    o[5] = (unsigned)s;
    o[6] = __activemask();
    unsigned half_mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    o[7] = __shfl_sync(half_mask, (unsigned)lane, 0, 16);
    __syncwarp();
}

// Block-wide barrier votes and the sm_80 warp reductions; out: 6 words per block.
__global__ void barrier_votes(int* out) {
    int t = threadIdx.x, lane = t % 32;
    int count = __syncthreads_count(t % 3 == 0);
    int all = __syncthreads_and(t < 1000);
    int any = __syncthreads_or(t == 77);
    int none = __syncthreads_or(0);
    unsigned rsum = __reduce_add_sync(0xffffffffu, (unsigned)lane);
    int rmax = __reduce_max_sync(0xffffffffu, lane == 9 ? 1000 : -lane);
    if (t == 0) {
        out[0] = count;
        out[1] = all;
        out[2] = any;
        out[3] = none;
        out[4] = (int)rsum;
        out[5] = rmax;
    }
}

// A thread with a 16 KiB local array (on its fiber's stack in the simulator).
__global__ void local_array(const float* x, float* y) {
    float buf[4096];
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = 0; i < 4096; ++i) buf[i] = x[t] + (float)i;
    __syncthreads();
    float s = 0.0f;
    for (int i = 4095; i >= 0; i -= 7) s += buf[i];
    y[t] = s;
}

__global__ void scale_add(const float* x, float* y, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

__global__ void set_flag(int* flag) { *flag = 1; }

// Early exit before a barrier the other threads wait at (undefined in CUDA).
__global__ void barrier_after_exit(float* x) {
    if (threadIdx.x >= 16) return;
    __syncthreads();
    x[threadIdx.x] = 1.0f;
}
// Two barriers on different lines taken by different threads.
__global__ void barrier_divergent(float* x) {
    if (threadIdx.x < 16) {
        __syncthreads();
        x[threadIdx.x] = 1.0f;
    } else {
        __syncthreads();
        x[threadIdx.x] = 2.0f;
    }
}
// A full-mask shuffle that half of the warp never reaches.
__global__ void shuffle_partial(float* x) {
    float v = x[threadIdx.x];
    if (threadIdx.x < 16) v = __shfl_sync(0xffffffffu, v, 0);
    x[threadIdx.x] = v;
}

// fp16/bf16: conversions and arithmetic, elementwise over pairs (a[i], b[i]).
__global__ void half_ops(const float* a, const float* b, int n, unsigned short* h, unsigned short* bf, float* hf,
                         float* bff, unsigned short* hadd, unsigned short* hmul, unsigned short* hfma,
                         unsigned short* badd, unsigned short* bmul, float* h2lo, float* h2hi) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half ha = __float2half_rn(a[i]), hb = __float2half(b[i]);
    __nv_bfloat16 ba = __float2bfloat16_rn(a[i]), bb = __float2bfloat16(b[i]);
    h[i] = __half_as_ushort(ha);
    bf[i] = __bfloat16_as_ushort(ba);
    hf[i] = __half2float(ha);
    bff[i] = __bfloat162float(ba);
    hadd[i] = __half_as_ushort(__hadd(ha, hb));
    hmul[i] = __half_as_ushort(__hmul(ha, hb));
    hfma[i] = __half_as_ushort(__hfma(ha, hb, hb));
    badd[i] = __bfloat16_as_ushort(__hadd(ba, bb));
    bmul[i] = __bfloat16_as_ushort(__hmul(ba, bb));
    __half2 p = __floats2half2_rn(a[i], b[i]);
    h2lo[i] = __low2float(p);
    h2hi[i] = __high2float(p);
}

#if CUVIL_HAS_WMMA
// C[M x N] = relu(A[M x K] (row-major) * B[K x N] (column-major)); one warp per 16x16 tile.
template <class T>
__device__ void wmma_tile(const T* A, const T* B, float* C, int M, int N, int K) {
    int warp = threadIdx.x / 32, tiles_n = N / 16;
    int tm = warp / tiles_n, tn = warp % tiles_n;
    if (tm * 16 >= M) return;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < K; k += 16) {
        wmma::load_matrix_sync(fa, A + tm * 16 * K + k, K);
        wmma::load_matrix_sync(fb, B + tn * 16 * K + k, K);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] = fmaxf(acc.x[i], 0.0f);
    wmma::store_matrix_sync(C + tm * 16 * N + tn * 16, acc, N, wmma::mem_row_major);
}
__global__ void wmma_half(const __half* A, const __half* B, float* C, int M, int N, int K) {
    wmma_tile(A, B, C, M, N, K);
}
__global__ void wmma_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C, int M, int N, int K) {
    wmma_tile(A, B, C, M, N, K);
}
#endif

// Benchmark: a 1-D stencil through shared memory with four barriers per block.
__global__ void bench_stencil(const float* x, float* y, int n) {
    __shared__ float s[258];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int t = threadIdx.x + 1;
    s[t] = i < n ? x[i] : 0.0f;
    if (threadIdx.x == 0) s[0] = i > 0 ? x[i - 1] : 0.0f;
    if (threadIdx.x == blockDim.x - 1) s[t + 1] = i + 1 < n ? x[i + 1] : 0.0f;
    __syncthreads();
    float v = 0.25f * s[t - 1] + 0.5f * s[t] + 0.25f * s[t + 1];
    __syncthreads();
    s[t] = v;
    __syncthreads();
    v = s[blockDim.x - t + 1];
    __syncthreads();
    if (i < n) y[i] = v;
}

// ---------------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------------
static void check_vadd() {
    const int n = 100003;
    std::vector<float> a(n), b(n);
    for (int i = 0; i < n; ++i) {
        a[i] = (float)i;
        b[i] = (float)(2 * i + 1);
    }
    float *da = to_device(a), *db = to_device(b), *dc;
    CK(cudaMalloc(&dc, n * sizeof(float)));
    CUVIL_LAUNCH(vadd, 40, 256, 0, 0, da, db, dc, n);
    CK(cudaGetLastError());
    std::vector<float> c = to_host(dc, n);
    int bad = 0;
    for (int i = 0; i < n; ++i) bad += c[i] != a[i] + b[i];
    report("vadd", bad == 0, "wrong sums");
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
}

static std::vector<float> run_matmul(const std::vector<float>& A, const std::vector<float>& B, int n) {
    float *dA = to_device(A), *dB = to_device(B), *dC;
    CK(cudaMalloc(&dC, n * n * sizeof(float)));
    dim3 grid((n + TILE - 1) / TILE, (n + TILE - 1) / TILE), block(TILE, TILE);
    CUVIL_LAUNCH(matmul_tiled, grid, block, 0, 0, dA, dB, dC, n);
    CK(cudaGetLastError());
    std::vector<float> C = to_host(dC, n * n);
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dC));
    return C;
}

static void check_matmul() {
    const int n = 70;
    std::vector<float> A(n * n), B(n * n);
    unsigned s = 1;
    for (int i = 0; i < n * n; ++i) {
        A[i] = (float)(lcg(s) % 7) - 3.0f;
        B[i] = (float)(lcg(s) % 5) - 2.0f;
    }
    std::vector<float> C = run_matmul(A, B, n);
    int bad = 0;
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
            float ref = 0.0f;
            for (int k = 0; k < n; ++k) ref += A[i * n + k] * B[k * n + j];
            bad += C[i * n + j] != ref;  // small integers: exact in any order
        }
    char why[64];
    std::snprintf(why, sizeof why, "%d of %d elements wrong", bad, n * n);
    report("matmul_tiled", bad == 0, why);
#ifdef CUVIL_CUDA_SIM
    CK(cuvilSimSetWorkerCount(1));
    std::vector<float> C1 = run_matmul(A, B, n);
    CK(cuvilSimSetWorkerCount(3));
    std::vector<float> C3 = run_matmul(A, B, n);
    CK(cuvilSimSetWorkerCount(0));
    report("deterministic_across_workers", std::memcmp(C1.data(), C3.data(), C1.size() * 4) == 0 &&
                                               std::memcmp(C1.data(), C.data(), C1.size() * 4) == 0,
           "results depend on the worker count");
#endif
}

static void check_reduce() {
    const int n = 1 << 17, blocks = 24, threads = 256;
    std::vector<float> x(n);
    unsigned s = 7;
    double ref = 0;
    for (int i = 0; i < n; ++i) {
        x[i] = (float)(lcg(s) % 9);
        ref += x[i];
    }
    float *dx = to_device(x), *dp;
    CK(cudaMalloc(&dp, blocks * sizeof(float)));
    CUVIL_LAUNCH(block_reduce, blocks, threads, 0, 0, dx, dp, n);
    CK(cudaGetLastError());
    std::vector<float> p = to_host(dp, blocks);
    double got = 0;
    for (float v : p) got += v;
    char why[96];
    std::snprintf(why, sizeof why, "sum %.1f, expected %.1f", got, ref);
    report("block_reduce", got == ref, why);
    CK(cudaFree(dx));
    CK(cudaFree(dp));
}

static void check_softmax() {
    const int rows = 33, cols = 1000;
    std::vector<float> x(rows * cols);
    unsigned s = 3;
    for (auto& v : x) v = (float)(lcg(s) % 20000) / 1000.0f - 10.0f;
    float *dx = to_device(x), *dy;
    CK(cudaMalloc(&dy, x.size() * sizeof(float)));
    CUVIL_LAUNCH(row_softmax, rows, 128, 0, 0, dx, dy, cols);
    CK(cudaGetLastError());
    std::vector<float> y = to_host(dy, x.size());
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
        double m = -1e30, sum = 0;
        for (int c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
        for (int c = 0; c < cols; ++c) sum += std::exp(x[r * cols + c] - m);
        for (int c = 0; c < cols; ++c) {
            double ref = std::exp(x[r * cols + c] - m) / sum;
            worst = std::fmax(worst, std::fabs(y[r * cols + c] - ref) / ref);
        }
    }
    char why[64];
    std::snprintf(why, sizeof why, "max relative error %g", worst);
    report("row_softmax", worst < 1e-5, why);
    CK(cudaFree(dx));
    CK(cudaFree(dy));
}

static void check_atomics() {
    const int n = 50000;
    std::vector<int> x(n);
    unsigned s = 11;
    std::vector<unsigned> ref(BINS, 0);
    long long sum = 0;
    int mx = -1000, mn = 1000;
    for (int i = 0; i < n; ++i) {
        x[i] = (int)(lcg(s) % BINS);
        ++ref[x[i]];
        sum += x[i];
        mx = x[i] > mx ? x[i] : mx;
        mn = x[i] < mn ? x[i] : mn;
    }
    int* dx = to_device(x);
    unsigned* dh;
    CK(cudaMalloc(&dh, BINS * sizeof(unsigned)));
    CK(cudaMemset(dh, 0, BINS * sizeof(unsigned)));
    CUVIL_LAUNCH(histogram, 16, 256, 0, 0, dx, n, dh);
    CK(cudaGetLastError());
    std::vector<unsigned> h = to_host(dh, BINS);
    report("atomics_histogram", h == ref, "histogram differs");

    std::vector<int> init = {-1000, 1000, 0};
    int* di = to_device(init);
    float* df;
    unsigned long long* du;
    unsigned* dinc;
    CK(cudaMalloc(&df, sizeof(float)));
    CK(cudaMalloc(&du, sizeof(unsigned long long)));
    CK(cudaMalloc(&dinc, sizeof(unsigned)));
    CK(cudaMemset(df, 0, sizeof(float)));
    CK(cudaMemset(du, 0, sizeof(unsigned long long)));
    CK(cudaMemset(dinc, 0, sizeof(unsigned)));
    CUVIL_LAUNCH(atomics_mix, (n + 255) / 256, 256, 0, 0, dx, n, di, di + 1, df, di + 2, du, dinc);
    CK(cudaGetLastError());
    std::vector<int> got = to_host(di, 3);
    float fsum = to_host(df, 1)[0];
    unsigned long long usum = to_host(du, 1)[0];
    unsigned inc = to_host(dinc, 1)[0];
    bool ok = got[0] == mx && got[1] == mn && fsum == (float)n && got[2] == n && usum == (unsigned long long)sum &&
              inc == (unsigned)(n % 1001);
    report("atomics_mix", ok, "atomicMax/Min/CAS/Add/Inc results differ");
    CK(cudaFree(dx));
    CK(cudaFree(dh));
    CK(cudaFree(di));
    CK(cudaFree(df));
    CK(cudaFree(du));
    CK(cudaFree(dinc));
}

static void check_dynamic_shared() {
    const int per_block = 16384, blocks = 5;  // 64 KiB of dynamic shared memory: needs the attribute
    std::vector<float> x(per_block * blocks);
    for (size_t i = 0; i < x.size(); ++i) x[i] = (float)i;
    float *dx = to_device(x), *dy;
    CK(cudaMalloc(&dy, x.size() * sizeof(float)));
    size_t bytes = per_block * sizeof(float);
    CUVIL_LAUNCH(dyn_reverse, blocks, 256, bytes, 0, dx, dy, per_block);
    cudaError_t without = cudaGetLastError();
    CK(cudaFuncSetAttribute(dyn_reverse, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    CUVIL_LAUNCH(dyn_reverse, blocks, 256, bytes, 0, dx, dy, per_block);
    CK(cudaGetLastError());
    std::vector<float> y = to_host(dy, x.size());
    int bad = 0;
    for (int b = 0; b < blocks; ++b)
        for (int i = 0; i < per_block; ++i) bad += y[b * per_block + i] != x[b * per_block + per_block - 1 - i];
    report("dynamic_shared_needs_attribute", without == cudaErrorInvalidValue, cudaGetErrorName(without));
    report("dynamic_shared", bad == 0, "reversal wrong");
    CK(cudaFree(dx));
    CK(cudaFree(dy));
}

static void check_warp_ops() {
    const int threads = 64;
    unsigned* d;
    CK(cudaMalloc(&d, threads * 8 * sizeof(unsigned)));
    CUVIL_LAUNCH(warp_ops, 1, threads, 0, 0, d);
    CK(cudaGetLastError());
    std::vector<unsigned> o = to_host(d, threads * 8);
    int bad = 0;
    for (int t = 0; t < threads; ++t) {
        unsigned lane = t % 32, *r = &o[t * 8];
        unsigned up = (lane % 8) >= 3 ? (lane - 3) * 10 : lane * 10;
        unsigned bc = ((lane / 16) * 16 + 5) * 10;
        bad += r[0] != 0xAAAAAAAAu;
        bad += r[1] != 1u;
        bad += r[2] != 0u;
        bad += r[3] != up;
        bad += r[4] != bc;
        bad += r[5] != 496u;
        bad += r[6] != 0xFFFFFFFFu;
        bad += r[7] != (lane < 16 ? 0u : 16u);
    }
    report("warp_votes_and_shuffles", bad == 0, "a vote or shuffle result differs");
    CK(cudaFree(d));
}

static void check_barrier_votes_and_locals() {
    int* d;
    CK(cudaMalloc(&d, 6 * sizeof(int)));
    CUVIL_LAUNCH(barrier_votes, 1, 160, 0, 0, d);
    CK(cudaGetLastError());
    std::vector<int> o = to_host(d, 6);
    report("barrier_votes_and_warp_reduce",
           o[0] == 54 && o[1] == 1 && o[2] == 1 && o[3] == 0 && o[4] == 496 && o[5] == 1000, "wrong vote results");
    CK(cudaFree(d));
    const int threads = 64, blocks = 3, n = threads * blocks;
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = (float)(i % 5);
    float *dx = to_device(x), *dy;
    CK(cudaMalloc(&dy, n * sizeof(float)));
    CUVIL_LAUNCH(local_array, blocks, threads, 0, 0, dx, dy);
    CK(cudaGetLastError());
    std::vector<float> y = to_host(dy, n);
    int bad = 0;
    for (int t = 0; t < n; ++t) {
        float s = 0.0f;
        for (int i = 4095; i >= 0; i -= 7) s += x[t] + (float)i;
        bad += y[t] != s;
    }
    report("large_local_arrays", bad == 0, "wrong sums");
    CK(cudaFree(dx));
    CK(cudaFree(dy));
}

// Several host threads, each with its own stream and buffers, launching at once.
static void check_host_threads() {
    const int n = 20000, nthreads = 4;
    std::vector<int> ok(nthreads, 0);
    std::vector<std::thread> pool;
    for (int t = 0; t < nthreads; ++t)
        pool.emplace_back([t, &ok] {
            cudaStream_t s;
            if (cudaStreamCreate(&s) != cudaSuccess) return;
            std::vector<float> hx(n);
            for (int i = 0; i < n; ++i) hx[i] = (float)(i + t);
            float *dx, *dy;
            cudaMalloc(&dx, n * sizeof(float));
            cudaMalloc(&dy, n * sizeof(float));
            bool good = true;
            for (int rep = 0; rep < 5; ++rep) {
                cudaMemcpyAsync(dx, hx.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);
                CUVIL_LAUNCH(scale_add, (n + 255) / 256, 256, 0, s, dx, dy, (float)(t + 1), (float)rep, n);
                good = good && cudaGetLastError() == cudaSuccess;
                std::vector<float> hy(n);
                cudaMemcpyAsync(hy.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost, s);
                good = good && cudaStreamSynchronize(s) == cudaSuccess;
                for (int i = 0; i < n; ++i) good = good && hy[i] == (float)(t + 1) * hx[i] + (float)rep;
            }
            cudaFree(dx);
            cudaFree(dy);
            cudaStreamDestroy(s);
            ok[t] = good;
        });
    for (auto& th : pool) th.join();
    int good = 0;
    for (int v : ok) good += v;
    report("host_threads_with_streams", good == nthreads, "a host thread's results differ");
}

static void check_graph() {
    const int n = 1000;
    std::vector<float> hx(n, 1.0f), hy(n, -7.0f);
    float *dx, *dy;
    CK(cudaMalloc(&dx, n * sizeof(float)));
    CK(cudaMalloc(&dy, n * sizeof(float)));
    CK(cudaMemset(dy, 0, n * sizeof(float)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaMemcpyAsync(dx, hx.data(), n * sizeof(float), cudaMemcpyHostToDevice, s));
    CUVIL_LAUNCH(scale_add, (n + 127) / 128, 128, 0, s, dx, dy, 2.0f, 1.0f, n);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(hy.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamEndCapture(s, &g));
    bool not_run = hy[0] == -7.0f;
    CK(cudaGraphInstantiate(&ge, g, 0));
    bool ok = true;
    for (int rep = 0; rep < 3; ++rep) {
        for (int i = 0; i < n; ++i) hx[i] = (float)(i + rep);
        CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; ++i) ok = ok && hy[i] == 2.0f * (float)(i + rep) + 1.0f;
    }
    report("graph_capture_records_without_running", not_run, "captured work ran during capture");
    report("graph_replay", ok, "replayed results differ");
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
}

static void check_launch_errors() {
    int* flag;
    CK(cudaMalloc(&flag, sizeof(int)));
    CK(cudaMemset(flag, 0, sizeof(int)));
    struct Case {
        const char* name;
        dim3 grid, block;
        size_t shmem;
        cudaError_t want;
    } cases[] = {
        {"block_1025", dim3(1), dim3(1025), 0, cudaErrorInvalidConfiguration},
        {"block_z_65", dim3(1), dim3(1, 1, 65), 0, cudaErrorInvalidConfiguration},
        {"block_32x33", dim3(1), dim3(32, 33), 0, cudaErrorInvalidConfiguration},
        {"grid_y_65536", dim3(1, 65536), dim3(32), 0, cudaErrorInvalidConfiguration},
        {"grid_zero", dim3(0), dim3(32), 0, cudaErrorInvalidConfiguration},
        {"shmem_over_limit", dim3(1), dim3(32), 49 * 1024, cudaErrorInvalidValue},
    };
    bool ok = true;
    for (const Case& c : cases) {
        CUVIL_LAUNCH(set_flag, c.grid, c.block, c.shmem, 0, flag);
        cudaError_t e = cudaGetLastError();
        if (e != c.want) {
            std::printf("  %s: got %s\n", c.name, cudaGetErrorName(e));
            ok = false;
        }
        ok = ok && cudaGetLastError() == cudaSuccess;
    }
    int ran = to_host(flag, 1)[0];
    report("launch_config_errors", ok && ran == 0, "wrong error codes, or a rejected kernel ran");
    CUVIL_LAUNCH(set_flag, 1, 1, 0, 0, flag);
    CK(cudaGetLastError());
    report("launch_after_errors", to_host(flag, 1)[0] == 1, "a valid launch after errors did not run");
    CK(cudaFree(flag));
}

static void check_execution_errors() {
    float* x;
    CK(cudaMalloc(&x, 64 * sizeof(float)));
    CK(cudaMemset(x, 0, 64 * sizeof(float)));
    struct {
        const char* name;
        void (*kernel)(float*);
    } cases[] = {{"barrier_after_exit", barrier_after_exit},
                 {"barrier_divergent", barrier_divergent},
                 {"shuffle_partial", shuffle_partial}};
    for (auto& c : cases) {
        // The kernel pointer goes through a local: CUVIL_LAUNCH takes a kernel expression.
        void (*k)(float*) = c.kernel;
        CUVIL_LAUNCH(k, 2, 32, 0, 0, x);
        cudaError_t sync = cudaDeviceSynchronize();
        cudaError_t last = cudaGetLastError();
        char name[64];
        std::snprintf(name, sizeof name, "reports_%s", c.name);
        report(name, sync != cudaSuccess || last != cudaSuccess, "no error reported");
        std::printf("  message: %s\n", cudaGetErrorString(sync != cudaSuccess ? sync : last));
        CK(cudaGetLastError());
    }
    CK(cudaFree(x));
    check_vadd();  // the device still works
}

static void check_memory_api() {
    size_t free0, total, free1;
    CK(cudaMemGetInfo(&free0, &total));
    void* p;
    CK(cudaMalloc(&p, 1 << 20));
    CK(cudaMemGetInfo(&free1, &total));
    bool ok = free1 + (1 << 20) <= free0 && total >= free0;
    CK(cudaFree(p));
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    ok = ok && count >= 1 && prop.warpSize == 32 && prop.maxThreadsPerBlock == 1024;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, 0));
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    float ms = -1;
    CK(cudaEventElapsedTime(&ms, a, b));
    ok = ok && ms >= 0;
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    float* h;
    CK(cudaMallocHost(&h, 64));
    CK(cudaFreeHost(h));
#ifdef CUVIL_CUDA_SIM
    ok = ok && std::strcmp(prop.name, "cuvil-sim") == 0 && prop.major == 9 && prop.minor == 0;
    // Fresh device memory is poisoned: NaN as float.
    float* d;
    CK(cudaMalloc(&d, 16 * sizeof(float)));
    std::vector<float> fresh = to_host(d, 16);
    ok = ok && std::isnan(fresh[0]) && std::isnan(fresh[15]);
    // A copy overrunning an allocation is rejected.
    std::vector<float> big(32, 0.0f);
    ok = ok && cudaMemcpy(d, big.data(), 32 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue;
    CK(cudaFree(d));
#endif
    report("memory_events_properties", ok, "memory info, properties or events wrong");
}

#if CUVIL_HAS_WMMA
template <class T, class K>
static void check_wmma(const char* name, K kernel, T (*from_float)(float), float (*to_float)(T)) {
    const int M = 32, N = 32, Kd = 48;
    std::vector<T> A(M * Kd), B(Kd * N);  // B column-major: B[n * K + k]
    std::vector<float> Af(M * Kd), Bf(Kd * N);
    unsigned s = 5;
    for (int i = 0; i < M * Kd; ++i) {
        A[i] = from_float((float)(lcg(s) % 17) / 8.0f - 1.0f);
        Af[i] = to_float(A[i]);
    }
    for (int i = 0; i < Kd * N; ++i) {
        B[i] = from_float((float)(lcg(s) % 13) / 4.0f - 1.5f);
        Bf[i] = to_float(B[i]);
    }
    T *dA = to_device(A), *dB = to_device(B);
    float* dC;
    CK(cudaMalloc(&dC, M * N * sizeof(float)));
    CUVIL_LAUNCH(kernel, 1, 128, 0, 0, dA, dB, dC, M, N, Kd);
    CK(cudaGetLastError());
    std::vector<float> C = to_host(dC, M * N);
    double worst = 0;
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            double ref = 0;
            for (int k = 0; k < Kd; ++k) ref += (double)Af[i * Kd + k] * Bf[j * Kd + k];
            ref = ref > 0 ? ref : 0;
            worst = std::fmax(worst, std::fabs(C[i * N + j] - ref));
        }
    char why[64];
    std::snprintf(why, sizeof why, "max abs error %g", worst);
    report(name, worst < 1e-4, why);
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dC));
}
static __half h_from(float f) { return __float2half(f); }
static float h_to(__half h) { return __half2float(h); }
static __nv_bfloat16 b_from(float f) { return __float2bfloat16(f); }
static float b_to(__nv_bfloat16 h) { return __bfloat162float(h); }
#endif

// ---------------------------------------------------------------------------------------------------
// Modes
// ---------------------------------------------------------------------------------------------------
static int convert(const char* in_path, const char* out_path) {
    FILE* f = std::fopen(in_path, "rb");
    if (!f) return 3;
    std::vector<float> v;
    float buf[1024];
    size_t got;
    while ((got = std::fread(buf, 4, 1024, f)) > 0) v.insert(v.end(), buf, buf + got);
    std::fclose(f);
    int n = (int)v.size() / 2;
    std::vector<float> a(v.begin(), v.begin() + n), b(v.begin() + n, v.begin() + 2 * n);
    float *da = to_device(a), *db = to_device(b);
    unsigned short* u[7];
    float* fl[4];
    for (auto& p : u) CK(cudaMalloc(&p, n * sizeof(unsigned short)));
    for (auto& p : fl) CK(cudaMalloc(&p, n * sizeof(float)));
    CUVIL_LAUNCH(half_ops, (n + 255) / 256, 256, 0, 0, da, db, n, u[0], u[1], fl[0], fl[1], u[2], u[3], u[4], u[5],
                 u[6], fl[2], fl[3]);
    CK(cudaGetLastError());
    FILE* o = std::fopen(out_path, "wb");
    if (!o) return 3;
    // Order: h, bf, hadd, hmul, hfma, badd, bmul (uint16), then hf, bff, h2lo, h2hi (float32).
    for (auto p : u) {
        std::vector<unsigned short> h = to_host(p, n);
        std::fwrite(h.data(), 2, n, o);
    }
    for (auto p : fl) {
        std::vector<float> h = to_host(p, n);
        std::fwrite(h.data(), 4, n, o);
    }
    std::fclose(o);
    return 0;
}

static int bench(int blocks) {
    const int threads = 256, n = blocks * threads;
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = (float)(i % 97);
    float *dx = to_device(x), *dy;
    CK(cudaMalloc(&dy, n * sizeof(float)));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CUVIL_LAUNCH(bench_stencil, 8, threads, 0, 0, dx, dy, n);  // warm up fibers and workers
    CK(cudaEventRecord(a, 0));
    CUVIL_LAUNCH(bench_stencil, blocks, threads, 0, 0, dx, dy, n);
    CK(cudaEventRecord(b, 0));
    CK(cudaGetLastError());
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    std::vector<float> y = to_host(dy, n);
    int bad = 0;
    for (int blk = 0; blk < blocks; ++blk)
        for (int t = 0; t < threads; ++t) {
            int src = blk * threads + (threads - 1 - t);
            float l = src > 0 ? x[src - 1] : 0.0f, r = src + 1 < n ? x[src + 1] : 0.0f;
            bad += y[blk * threads + t] != 0.25f * l + 0.5f * x[src] + 0.25f * r;
        }
    std::printf("bench: %d blocks of %d threads, 4 barriers each: %.3f ms, %.0f blocks/s\n", blocks, threads, ms,
                blocks / (ms / 1000.0));
    report("bench_stencil", bad == 0, "stencil wrong");
    return g_failures != 0;
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "checks";
    if (std::strcmp(mode, "convert") == 0 && argc == 4) return convert(argv[2], argv[3]);
    if (std::strcmp(mode, "bench") == 0) return bench(argc > 2 ? std::atoi(argv[2]) : 2000);
    if (std::strcmp(mode, "matmul") == 0) {
        check_matmul();
        return g_failures != 0;
    }
    check_vadd();
    if (std::strcmp(mode, "all-but-matmul") != 0) check_matmul();
    check_reduce();
    check_softmax();
    check_atomics();
    check_dynamic_shared();
    check_warp_ops();
#if CUVIL_HAS_WMMA
    check_wmma("wmma_half", wmma_half, h_from, h_to);
    check_wmma("wmma_bf16", wmma_bf16, b_from, b_to);
#endif
    check_barrier_votes_and_locals();
    check_graph();
    check_host_threads();
    check_launch_errors();
    check_execution_errors();
    check_memory_api();
    return g_failures != 0;
}
