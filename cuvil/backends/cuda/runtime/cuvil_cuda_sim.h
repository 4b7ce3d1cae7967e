/* cuvil_cuda_sim.h -- the CUDA execution model on the CPU (C++17, header-only).
 *
 * Included by cuvil_cuda.h when CUVIL_CUDA_SIM is defined: a .cu file written for nvcc compiles with
 * `g++ -std=c++17 -DCUVIL_CUDA_SIM -pthread` and runs its kernels on the host. Only the execution
 * model is emulated; the kernels, launch configurations and indexing are the program's own.
 *
 * Execution model
 *   - A launch runs its blocks on a small pool of OS worker threads (cuvilSimSetWorkerCount, default
 *     CUVIL_SIM_DEFAULT_WORKERS or fewer when the machine has fewer cores; the launching thread is one
 *     of them). Each worker runs one block at a time; a block's result never depends on which worker
 *     ran it or on how many there are (blocks interact only through atomics, as on a GPU).
 *   - Every thread of a block is a fiber on its worker's OS thread, so __syncthreads() is a real
 *     barrier. The scheduler runs thread 0 until it blocks (barrier or warp collective) or returns,
 *     then thread 1, ... : a thread reading shared memory another thread writes without a barrier in
 *     between sees the stale value. Context switches are a small x86-64 assembly routine (ucontext
 *     elsewhere); fiber stacks are CUVIL_SIM_STACK_BYTES (64 KiB; 256 KiB under ASan, settable with
 *     cuvilSimSetStackSize before the first launch), reused across blocks and launches, with a
 *     PROT_NONE guard page below each so a stack overflow faults instead of corrupting memory.
 *     threadIdx, blockIdx, blockDim and gridDim read the running fiber, found from the stack
 *     pointer: they are valid in device code only.
 *   - `__shared__` is `static thread_local`: one array per worker thread, i.e. per running block. Its
 *     contents carry over from the previous block run by that worker (stale data, never zeroed);
 *     dynamic shared memory (CUVIL_DYNAMIC_SHARED) is filled with 0xFF bytes (NaN as float) for
 *     every block. Static __shared__ arrays are not counted against the shared-memory limit.
 *   - A __syncthreads() that not every thread of the block reaches (threads exited, or waiting at a
 *     __syncthreads() on another source line, or at a warp collective) ends the launch with
 *     cudaErrorLaunchFailure and a message naming the block, the lines and the thread counts. Note:
 *     a thread that returns early while others still wait at a barrier is reported, although some
 *     GPUs tolerate it (it is undefined behaviour in CUDA).
 *   - Warp collectives (__shfl*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp, the
 *     __reduce_*_sync and the WMMA operations) are rendezvous of the lanes named in the mask (lane =
 *     linear thread index % 32; lanes past the end of a partial last warp are dropped from the mask).
 *     A collective that not all those lanes reach, a lane outside its own mask, or lanes of one mask
 *     calling different collectives are launch errors. Reading a lane that does not take part gives
 *     all-ones bits (NaN as float). __activemask() returns the lanes of the warp that have not exited.
 *   - Errors: launch-configuration errors (cudaErrorInvalidConfiguration, cudaErrorInvalidValue) are
 *     returned by cudaGetLastError/cudaPeekAtLastError and the kernel does not run. Errors while a
 *     kernel runs (barrier/collective errors, __trap(), a WMMA misuse) stop the launch, are printed
 *     to stderr, and are returned by cudaGetLastError and by the next synchronising call
 *     (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize, cudaMemcpy); they are not
 *     sticky: once returned, later calls succeed. cudaGetErrorString of the most recent error returns
 *     its message with the detail appended. cuvilSimLastErrorDetail() returns the detail alone.
 *   - Streams and events execute eagerly: every launch, copy and memset runs to completion before the
 *     call returns, in issue order, whatever the stream. Events record host time.
 *   - Graph capture (cudaStreamBeginCapture ... EndCapture) records the launches, cudaMemcpyAsync and
 *     cudaMemsetAsync issued on the capturing stream without running them; cudaGraphLaunch replays
 *     them in order with the argument values captured.
 *   - Device memory is host memory (any pointer works in any copy direction). Fresh cudaMalloc memory
 *     is filled with 0xFF bytes. Without AddressSanitizer each allocation is followed by a 64-byte
 *     guard zone of 0xFF bytes: a float read just past the end is NaN (and poisons what it feeds),
 *     and cudaFree checks the zone (a write past the end is reported as cudaErrorIllegalAddress).
 *     Under -fsanitize=address the guard zones are left out so ASan reports out-of-bounds reads and
 *     writes exactly where they happen. cudaMemGetInfo reports CUVIL_SIM_TOTAL_MEM minus the live
 *     allocations.
 *   - Math: the fast intrinsics (__expf, __logf, __fdividef, ...) are computed with the accurate
 *     <cmath> functions, so they may differ from a GPU's in the last bits. __half / __nv_bfloat16
 *     conversions round to nearest even bit-exactly as CUDA's; their arithmetic computes in float and
 *     rounds once (the exact result, as float has more than twice their precision).
 *   - WMMA: each lane's fragment holds the whole tile, x[] in row-major tile order (num_elements is
 *     the tile size): element-wise loops over x[] give the right result, code that depends on which
 *     element a lane holds on a GPU does not port and is not emulated. load/store/mma are warp
 *     rendezvous; every lane must pass the same pointer, ldm and layout (else a launch error).
 *   - Launches are serialised: host threads may launch at once (each on its own stream), one grid
 *     runs at a time.
 *
 * Not emulated (by design, or not yet)
 *   - Preemption: a fiber runs until it blocks. A thread that spins waiting for another thread of
 *     its block, or for a block that has not started (grid-wide barriers, cooperative groups'
 *     grid.sync()), never finishes; write kernels that synchronise with barriers and collectives.
 *   - cudaLaunchKernel (untyped arguments), cooperative launches, dynamic parallelism, textures,
 *     surfaces, cuda::pipeline/memcpy_async, mma.h shapes beyond what the fragment template covers,
 *     the fragment element mapping of real tensor cores.
 *   - A fault inside a kernel (a null pointer, a stack overflow into the guard page) ends the process
 *     as it would a C program; build with -fsanitize=address for a report.
 *
 * Build: `g++ -std=c++17 -O2 -pthread -DCUVIL_CUDA_SIM` (-O1 compiles faster; kernels then run
 * about 2.5x slower). Inside a shared library add -fvisibility=hidden; the harness's own symbols are
 * hidden in any case, so every library has its own worker pool and device state.
 */
#ifndef CUVIL_CUDA_SIM_H
#define CUVIL_CUDA_SIM_H

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <math.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define CUVIL_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUVIL_SIM_ASAN 1
#endif
#endif
#ifdef CUVIL_SIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#ifndef CUVIL_SIM_DEFAULT_WORKERS
#define CUVIL_SIM_DEFAULT_WORKERS 4
#endif
#ifndef CUVIL_SIM_STACK_BYTES
#ifdef CUVIL_SIM_ASAN
#define CUVIL_SIM_STACK_BYTES (256 * 1024)
#else
#define CUVIL_SIM_STACK_BYTES (64 * 1024)
#endif
#endif
#ifndef CUVIL_SIM_TOTAL_MEM
#define CUVIL_SIM_TOTAL_MEM (16ull << 30)
#endif
#define CUVIL_SIM_GUARD_BYTES 64

/* ------------------------------------------------------------------------------------------------ */
/* Qualifiers                                                                                        */
/* ------------------------------------------------------------------------------------------------ */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __grid_constant__

#pragma GCC visibility push(hidden)

/* ------------------------------------------------------------------------------------------------ */
/* Vector types and dim3                                                                             */
/* ------------------------------------------------------------------------------------------------ */
struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define CUVIL_SIM_VEC2(T, N, A) \
    struct alignas(A) N##2 { T x, y; }; \
    inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define CUVIL_SIM_VEC3(T, N) \
    struct N##3 { T x, y, z; }; \
    inline N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }
#define CUVIL_SIM_VEC4(T, N, A) \
    struct alignas(A) N##4 { T x, y, z, w; }; \
    inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
CUVIL_SIM_VEC2(float, float, 8)
CUVIL_SIM_VEC3(float, float)
CUVIL_SIM_VEC4(float, float, 16)
CUVIL_SIM_VEC2(int, int, 8)
CUVIL_SIM_VEC3(int, int)
CUVIL_SIM_VEC4(int, int, 16)
CUVIL_SIM_VEC2(unsigned int, uint, 8)
CUVIL_SIM_VEC4(unsigned int, uint, 16)
CUVIL_SIM_VEC2(double, double, 16)
CUVIL_SIM_VEC2(short, short, 4)
CUVIL_SIM_VEC4(short, short, 8)
CUVIL_SIM_VEC2(unsigned short, ushort, 4)
CUVIL_SIM_VEC4(signed char, char, 4)
CUVIL_SIM_VEC4(unsigned char, uchar, 4)
CUVIL_SIM_VEC2(long long, longlong, 16)
inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return uint3{x, y, z}; }
#undef CUVIL_SIM_VEC2
#undef CUVIL_SIM_VEC3
#undef CUVIL_SIM_VEC4

inline constexpr int warpSize = 32;

/* ------------------------------------------------------------------------------------------------ */
/* Errors                                                                                            */
/* ------------------------------------------------------------------------------------------------ */
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidSymbol = 13,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorAssert = 710,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorStreamCaptureWrongThread = 908,
    cudaErrorUnknown = 999,
};
typedef cudaError_t cudaError;

namespace cuvil_sim {

struct ErrorState {
    std::mutex m;
    cudaError_t pending = cudaSuccess;  // an execution error not yet returned by a synchronising call
    std::string pending_detail;
};
inline ErrorState& errors() {
    static ErrorState* e = new ErrorState();
    return *e;
}
struct ThreadErrors {
    cudaError_t last = cudaSuccess;
    cudaError_t recent = cudaSuccess;  // the code whose detail cudaGetErrorString appends
    std::string detail;
    std::string text;
};
inline thread_local ThreadErrors t_errors;

/* A launch-configuration or API error: returned by cudaGetLastError, the call's own result. */
inline cudaError_t api_error(cudaError_t code, const std::string& detail) {
    t_errors.last = code;
    t_errors.recent = code;
    t_errors.detail = detail;
    return code;
}
/* An error while a kernel ran: also returned by the next synchronising call, and printed. */
inline void execution_error(cudaError_t code, const std::string& detail) {
    api_error(code, detail);
    std::fprintf(stderr, "cuvil-sim: %s\n", detail.c_str());
    std::lock_guard<std::mutex> g(errors().m);
    if (errors().pending == cudaSuccess) {
        errors().pending = code;
        errors().pending_detail = detail;
    }
}
inline cudaError_t take_pending() {
    std::lock_guard<std::mutex> g(errors().m);
    cudaError_t e = errors().pending;
    errors().pending = cudaSuccess;
    return e;
}
inline std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string format(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return std::string(buf);
}

inline const char* error_name(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidSymbol: return "invalid device symbol";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorUnknown: return "unknown error";
    }
    return "unrecognized error code";
}

} // namespace cuvil_sim

inline const char* cudaGetErrorString(cudaError_t e) {
    using namespace cuvil_sim;
    if (e != cudaSuccess && e == t_errors.recent && !t_errors.detail.empty()) {
        t_errors.text = std::string(error_name(e)) + ": " + t_errors.detail;
        return t_errors.text.c_str();
    }
    return error_name(e);
}
inline const char* cudaGetErrorName(cudaError_t e) { return cuvil_sim::error_name(e); }
inline cudaError_t cudaGetLastError() {
    cudaError_t e = cuvil_sim::t_errors.last;
    cuvil_sim::t_errors.last = cudaSuccess;
    cudaError_t p = cuvil_sim::take_pending();
    return e != cudaSuccess ? e : p;
}
inline cudaError_t cudaPeekAtLastError() {
    if (cuvil_sim::t_errors.last != cudaSuccess) return cuvil_sim::t_errors.last;
    std::lock_guard<std::mutex> g(cuvil_sim::errors().m);
    return cuvil_sim::errors().pending;
}
/* The detail of the most recent error on this thread ("" if none). */
inline const char* cuvilSimLastErrorDetail() { return cuvil_sim::t_errors.detail.c_str(); }

/* ------------------------------------------------------------------------------------------------ */
/* Fibers and the block scheduler                                                                    */
/* ------------------------------------------------------------------------------------------------ */
#if defined(__x86_64__)
extern "C" void cuvil_sim_switch(void** save_sp, void* to_sp);
/* Saves the callee-saved registers on the current stack, stores the stack pointer in *save_sp and
   resumes the context whose stack pointer is to_sp. The x87 and SSE control words are not switched
   (saving them costs more than the rest of the switch): kernels must not change rounding modes. */
__asm__(
    ".text\n"
    ".weak cuvil_sim_switch\n"
    ".hidden cuvil_sim_switch\n"
    ".type cuvil_sim_switch,@function\n"
    "cuvil_sim_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size cuvil_sim_switch, .-cuvil_sim_switch\n");
#endif

namespace cuvil_sim {

enum class TState : unsigned char { Ready, Barrier, Warp, Done };

struct Fiber;
struct Worker;

/* One lane's part in a warp collective. */
struct WarpRec {
    unsigned mask;
    int kind;
    unsigned long long val;
    int arg;
    int width;
    unsigned long long result;
    const void* p;  // kind-specific (WMMA: memory pointer)
    void* q;        // kind-specific (WMMA: this lane's fragment)
    const void* r;
    const void* s;
    unsigned ldm;
    int layout;
    const char* (*fn)(WarpRec** recs, int n);  // custom collectives (WMMA): run once, by the last lane
};

struct Fiber {
    void* sp = nullptr;
    char* stack_lo = nullptr;
    size_t stack_size = 0;
    void* asan_fake = nullptr;
    size_t colour = 0;
    Worker* w = nullptr;
    void* span_base = nullptr;
    uint3 tid{0, 0, 0};
    unsigned linear = 0;
    TState state = TState::Ready;
    int bar_line = 0;
    int bar_pred = 0;
    WarpRec wr{};
#if !defined(__x86_64__)
    ucontext_t uc;
#endif
};

struct Job;

struct Worker {
    std::vector<Fiber*> fibers;
    void* sched_sp = nullptr;
    const void* sched_lo = nullptr;
    size_t sched_size = 0;
    void* sched_fake = nullptr;
#if !defined(__x86_64__)
    ucontext_t sched_uc;
#endif
    const Job* job = nullptr;
    uint3 bidx{0, 0, 0};
    dim3 bdim, gdim;
    unsigned nthreads = 0;
    std::vector<int> queue;
    unsigned qhead = 0, qcount = 0;
    unsigned bar_count = 0;
    int bar_line = 0;
    int bar_sum = 0;
    int bar_and = 0, bar_or = 0, bar_count_result = 0;
    unsigned done_count = 0;
    unsigned warp_arrived[32] = {};
    unsigned warp_exited[32] = {};
    bool failed = false;
    cudaError_t fail_code = cudaSuccess;
    std::string fail_msg;
    std::vector<char> dyn_smem;
    size_t dyn_bytes = 0;
};

struct Config {
    std::atomic<int> workers{0};
    std::atomic<size_t> stack_bytes{CUVIL_SIM_STACK_BYTES};
    std::once_flag span_once;
};
/* Every fiber stack lives in its own span of g_span bytes (a power of two) aligned to g_span: the
   running fiber is found from the stack pointer, with no thread-local access (thread-locals of a
   shared library cost a __tls_get_addr call). The top 64 bytes of a span hold its Fiber*. Fixed
   when the first fiber is made. */
inline size_t g_span = 0;
constexpr size_t kSpanHeader = 64;

/* The fiber running on this stack (device code only: host code has no current thread). */
__attribute__((always_inline)) inline Fiber* current_fiber() {
    uintptr_t sp;
#if defined(__x86_64__)
    __asm__("movq %%rsp, %0" : "=r"(sp));
#else
    sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
#endif
    size_t span = g_span;
    return *reinterpret_cast<Fiber**>((sp & ~(span - 1)) + span - kSpanHeader);
}
inline Config& config() {
    static Config* c = new Config();
    return *c;
}
inline int worker_count() {
    int w = config().workers.load();
    if (w <= 0) {
        unsigned hw = std::thread::hardware_concurrency();
        w = std::max(1, std::min<int>(CUVIL_SIM_DEFAULT_WORKERS, hw ? static_cast<int>(hw) : 1));
    }
    return w;
}

[[noreturn]] inline void fatal(const char* what) {
    std::fprintf(stderr, "cuvil-sim: fatal: %s\n", what);
    std::abort();
}

__attribute__((always_inline)) inline void raw_switch(void** save, void* to, Fiber* from_f, Fiber* to_f, Worker* w) {
#ifdef CUVIL_SIM_ASAN
    void** fake = from_f ? &from_f->asan_fake : &w->sched_fake;
    if (to_f)
        __sanitizer_start_switch_fiber(fake, to_f->stack_lo, to_f->stack_size);
    else
        __sanitizer_start_switch_fiber(fake, w->sched_lo, w->sched_size);
#endif
#if defined(__x86_64__)
    (void)to_f;
    cuvil_sim_switch(save, to);
#else
    (void)save;
    (void)to;
    ucontext_t* from_uc = from_f ? &from_f->uc : &w->sched_uc;
    ucontext_t* to_uc = to_f ? &to_f->uc : &w->sched_uc;
    if (swapcontext(from_uc, to_uc) != 0) fatal("swapcontext failed");
#endif
#ifdef CUVIL_SIM_ASAN
    __sanitizer_finish_switch_fiber(*fake, nullptr, nullptr);
#else
    (void)from_f;
    (void)w;
#endif
}

inline void fiber_main();

#if defined(__x86_64__)
extern "C" inline void cuvil_sim_fiber_entry() { fiber_main(); }
#else
inline void cuvil_sim_fiber_entry_uc() { fiber_main(); }
#endif

inline void fiber_reset(Fiber* f, Worker* w) {
#ifdef CUVIL_SIM_ASAN
    __asan_unpoison_memory_region(f->stack_lo, f->stack_size);
#endif
#if defined(__x86_64__)
    (void)w;
    /* The stack tops are staggered across fibers (f->colour) so that the hot top-of-stack lines of
       a block's fibers do not all fall into the same cache sets. */
    uintptr_t top = (reinterpret_cast<uintptr_t>(f->stack_lo) + f->stack_size - f->colour) & ~uintptr_t(15);
    void** s = reinterpret_cast<void**>(top - 16 - 48);
    /* [0..5] r15 r14 r13 r12 rbx rbp, [6] return address, [7] padding */
    for (int i = 0; i <= 5; ++i) s[i] = nullptr;
    s[6] = reinterpret_cast<void*>(&cuvil_sim_fiber_entry);
    s[7] = nullptr;
    f->sp = s;
#else
    if (getcontext(&f->uc) != 0) fatal("getcontext failed");
    f->uc.uc_stack.ss_sp = f->stack_lo;
    f->uc.uc_stack.ss_size = f->stack_size;
    f->uc.uc_link = &w->sched_uc;
    makecontext(&f->uc, cuvil_sim_fiber_entry_uc, 0);
#endif
}

inline Fiber* fiber_new(Worker* w) {
    Fiber* f = new Fiber();
    f->w = w;
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::call_once(config().span_once, [page] {
        size_t want = config().stack_bytes.load() + page + kSpanHeader, span = page;
        while (span < want) span *= 2;
        g_span = span;
    });
    size_t span = g_span;
    /* Map twice the span and keep the aligned span inside it. */
    void* raw = mmap(nullptr, 2 * span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) fatal("cannot map a fiber stack");
    uintptr_t lo = reinterpret_cast<uintptr_t>(raw), base = (lo + span - 1) & ~(span - 1);
    if (base > lo) munmap(raw, base - lo);
    if (base + span < lo + 2 * span) munmap(reinterpret_cast<void*>(base + span), lo + 2 * span - (base + span));
    if (mprotect(reinterpret_cast<void*>(base), page, PROT_NONE) != 0)
        fatal("cannot protect a fiber stack guard page");
    *reinterpret_cast<Fiber**>(base + span - kSpanHeader) = f;
    f->span_base = reinterpret_cast<void*>(base);
    f->stack_lo = reinterpret_cast<char*>(base + page);
    f->stack_size = span - page - kSpanHeader;
    /* The span is a power of two: the room above the requested size staggers the stack tops. */
    size_t spare = f->stack_size - std::min(f->stack_size, config().stack_bytes.load());
    size_t spread = std::min<size_t>(4096, spare & ~size_t(63));
    f->colour = spread ? (w->fibers.size() * 1088) % spread : 0;
    fiber_reset(f, w);
    return f;
}

/* A thread's worker state and fiber stacks, released when the thread exits. */
struct WorkerHolder {
    Worker* w = nullptr;
    ~WorkerHolder() {
        if (!w) return;
        for (Fiber* f : w->fibers) {
#ifdef CUVIL_SIM_ASAN
            __asan_unpoison_memory_region(f->stack_lo, f->stack_size);
#endif
            munmap(f->span_base, g_span);
            delete f;
        }
        delete w;
    }
};

inline Worker* this_worker() {
    static thread_local WorkerHolder holder;
    Worker*& w = holder.w;
    if (!w) {
        w = new Worker();
        pthread_attr_t attr;
        if (pthread_getattr_np(pthread_self(), &attr) == 0) {
            void* lo = nullptr;
            size_t size = 0;
            pthread_attr_getstack(&attr, &lo, &size);
            w->sched_lo = lo;
            w->sched_size = size;
            pthread_attr_destroy(&attr);
        }
    }
    return w;
}

/* The kernel of one launch, type-erased. */
struct Job {
    void (*invoke)(const void* closure) = nullptr;
    const void* closure = nullptr;
    const char* name = "";
    dim3 grid, block;
    size_t shmem = 0;
    unsigned long long nblocks = 0;
    std::atomic<unsigned long long> next{0};
    std::atomic<bool> abort{false};
    std::mutex err_m;
    cudaError_t err = cudaSuccess;
    std::string err_msg;
};

inline void queue_push(Worker* w, int i) {
    w->queue[(w->qhead + w->qcount) % w->nthreads] = i;
    ++w->qcount;
}
inline Fiber* queue_pop(Worker* w) {
    if (w->qcount == 0) return nullptr;
    int i = w->queue[w->qhead];
    w->qhead = (w->qhead + 1) % w->nthreads;
    --w->qcount;
    return w->fibers[static_cast<size_t>(i)];
}

/* The current fiber has stopped (blocked or done): run the next ready fiber, or return to the
   scheduler when none is ready or the block failed. Returns when this fiber is resumed. */
__attribute__((always_inline)) inline void park(Worker* w, Fiber* f) {
    Fiber* next = w->failed ? nullptr : queue_pop(w);
    if (next == f) return;  // released by its own arrival
    if (next)
        raw_switch(&f->sp, next->sp, f, next, w);
    else
        raw_switch(&f->sp, w->sched_sp, f, nullptr, w);
}

/* Stops the block from inside a fiber: the scheduler reports the error and resets the fibers. The
   fiber's frames are abandoned, never unwound, so the message is recorded by a call that returns
   (its temporaries are destroyed) before the switch: see CUVIL_SIM_FAIL. */
__attribute__((noinline, cold)) inline void record_failure(cudaError_t code, const std::string& msg) {
    Worker* w = current_fiber()->w;
    if (!w->failed) {
        w->failed = true;
        w->fail_code = code;
        w->fail_msg = msg;
    }
}
[[noreturn]] __attribute__((noinline, cold)) inline void abandon_fiber() {
    Fiber* f = current_fiber();
    Worker* w = f->w;
    raw_switch(&f->sp, w->sched_sp, f, nullptr, w);
    fatal("a failed block's fiber was resumed");
}
#define CUVIL_SIM_FAIL(code, msg)                \
    do {                                          \
        ::cuvil_sim::record_failure((code), msg); \
        ::cuvil_sim::abandon_fiber();             \
    } while (0)

inline void fiber_main() {
#ifdef CUVIL_SIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    for (;;) {
        Fiber* f = current_fiber();
        Worker* w = f->w;
        w->job->invoke(w->job->closure);
        f->state = TState::Done;
        ++w->done_count;
        w->warp_exited[f->linear >> 5] |= 1u << (f->linear & 31);
        park(w, f);
    }
}

inline std::string block_name(Worker* w) {
    return format("kernel %s block (%u,%u,%u)", w->job->name, w->bidx.x, w->bidx.y, w->bidx.z);
}

inline const char* collective_name(int kind);

inline std::string deadlock_message(Worker* w) {
    unsigned at_bar = 0, at_warp = 0, done = 0;
    int warp_kind = -1;
    unsigned warp_mask = 0, warp_lane = 0;
    for (unsigned i = 0; i < w->nthreads; ++i) {
        Fiber* f = w->fibers[i];
        if (f->state == TState::Barrier) ++at_bar;
        if (f->state == TState::Done) ++done;
        if (f->state == TState::Warp) {
            if (at_warp++ == 0) {
                warp_kind = f->wr.kind;
                warp_mask = f->wr.mask;
                warp_lane = i;
            }
        }
    }
    std::string m = block_name(w) + ": deadlock: ";
    if (at_bar)
        m += format("__syncthreads() at line %d reached by %u of %u threads; ", w->bar_line, at_bar, w->nthreads);
    if (at_warp)
        m += format("%u threads wait at a warp collective (first: thread %u in %s with mask 0x%08x); ", at_warp,
                    warp_lane, collective_name(warp_kind), warp_mask);
    m += format("%u threads exited", done);
    return m;
}

inline void run_block(Worker* w, const Job& job, unsigned long long linear_block) {
    unsigned n = job.block.x * job.block.y * job.block.z;
    while (w->fibers.size() < n) w->fibers.push_back(fiber_new(w));
    if (w->queue.size() < n) w->queue.resize(n);
    w->job = &job;
    w->nthreads = n;
    w->bdim = job.block;
    w->gdim = job.grid;
    unsigned long long gx = job.grid.x, gy = job.grid.y;
    w->bidx = uint3{static_cast<unsigned>(linear_block % gx), static_cast<unsigned>((linear_block / gx) % gy),
                    static_cast<unsigned>(linear_block / (gx * gy))};
    w->qhead = 0;
    w->qcount = 0;
    w->bar_count = 0;
    w->done_count = 0;
    w->failed = false;
    for (unsigned i = 0; i < 32; ++i) w->warp_arrived[i] = w->warp_exited[i] = 0;
    if (job.shmem) {
        if (w->dyn_smem.size() < job.shmem) w->dyn_smem.resize(job.shmem + 16);
        std::memset(w->dyn_smem.data(), 0xFF, job.shmem);
    }
    unsigned bx = job.block.x, bxy = job.block.x * job.block.y;
    for (unsigned i = 0; i < n; ++i) {
        Fiber* f = w->fibers[i];
        f->linear = i;
        f->tid = uint3{i % bx, (i / bx) % job.block.y, i / bxy};
        f->state = TState::Ready;
        w->queue[i] = static_cast<int>(i);
    }
    w->qcount = n;
    Fiber* first = queue_pop(w);
    raw_switch(&w->sched_sp, first->sp, nullptr, first, w);
    if (!w->failed && w->done_count != n) {
        w->failed = true;
        w->fail_code = cudaErrorLaunchFailure;
        w->fail_msg = deadlock_message(w);
    }
    if (w->failed) {
        for (unsigned i = 0; i < n; ++i)
            if (w->fibers[i]->state != TState::Done) fiber_reset(w->fibers[i], w);
        std::lock_guard<std::mutex> g(const_cast<Job&>(job).err_m);
        Job& j = const_cast<Job&>(job);
        if (j.err == cudaSuccess) {
            j.err = w->fail_code;
            j.err_msg = w->fail_msg;
        }
        j.abort.store(true);
    }
}

inline void run_blocks(Job& job) {
    Worker* w = this_worker();
    for (;;) {
        if (job.abort.load(std::memory_order_relaxed)) break;
        unsigned long long b = job.next.fetch_add(1, std::memory_order_relaxed);
        if (b >= job.nblocks) break;
        run_block(w, job, b);
    }
}

/* Worker threads, started on first use and kept for the life of the process. */
struct Pool {
    std::mutex m;
    std::condition_variable cv, done_cv;
    std::vector<std::thread> threads;
    unsigned long long gen = 0;
    Job* job = nullptr;
    int want = 0;       // helpers that take part in the current job
    int running = 0;    // helpers still working on it
    void loop(int index) {
        unsigned long long seen = 0;
        for (;;) {
            Job* j;
            {
                std::unique_lock<std::mutex> lk(m);
                cv.wait(lk, [&] { return gen != seen; });
                seen = gen;
                if (index >= want) continue;
                j = job;
            }
            run_blocks(*j);
            std::lock_guard<std::mutex> lk(m);
            if (--running == 0) done_cv.notify_all();
        }
    }
    void run(Job& j, int helpers) {
        {
            std::lock_guard<std::mutex> lk(m);
            while (static_cast<int>(threads.size()) < helpers) {
                int index = static_cast<int>(threads.size());
                threads.emplace_back([this, index] { loop(index); });
                threads.back().detach();
            }
            job = &j;
            want = helpers;
            running = helpers;
            ++gen;
        }
        cv.notify_all();
        run_blocks(j);
        std::unique_lock<std::mutex> lk(m);
        done_cv.wait(lk, [&] { return running == 0; });
        job = nullptr;
    }
};
inline Pool& pool() {
    static Pool* p = new Pool();
    return *p;
}
inline std::mutex& launch_mutex() {
    static std::mutex* m = new std::mutex();
    return *m;
}

inline void execute(Job& job) {
    std::lock_guard<std::mutex> g(launch_mutex());
    int workers = worker_count();
    unsigned long long helpers = std::min<unsigned long long>(static_cast<unsigned long long>(workers - 1),
                                                              job.nblocks ? job.nblocks - 1 : 0);
    if (helpers == 0)
        run_blocks(job);
    else
        pool().run(job, static_cast<int>(helpers));
    if (job.err != cudaSuccess) execution_error(job.err, job.err_msg);
}

/* ---- barriers ---------------------------------------------------------------------------------- */
[[noreturn]] __attribute__((noinline, cold)) inline void divergent_barrier(Worker* w, Fiber* f, int line) {
    CUVIL_SIM_FAIL(cudaErrorLaunchFailure,
               block_name(w) + format(": divergent __syncthreads(): thread %u waits at line %d while %u threads "
                                      "wait at line %d",
                                      f->linear, line, w->bar_count, w->bar_line));
}
inline int barrier(int line, int pred) {
    Fiber* f = current_fiber();
    Worker* w = f->w;
    if (w->bar_count == 0) {
        w->bar_line = line;
        w->bar_sum = 0;
    } else if (line != w->bar_line) {
        divergent_barrier(w, f, line);
    }
    f->state = TState::Barrier;
    w->bar_sum += pred ? 1 : 0;
    if (++w->bar_count == w->nthreads) {
        w->bar_count = 0;
        w->bar_count_result = w->bar_sum;
        /* Every thread waits here, so the ready queue is empty: refill it in thread order. */
        Fiber* const* fibers = w->fibers.data();
        int* q = w->queue.data();
        unsigned n = w->nthreads, k = 0, self = f->linear;
        for (unsigned i = 0; i < n; ++i) {
            fibers[i]->state = TState::Ready;
            if (i != self) q[k++] = static_cast<int>(i);
        }
        w->qhead = 0;
        w->qcount = k;
        return w->bar_count_result;
    }
    park(w, f);
    return w->bar_count_result;
}

/* ---- warp collectives -------------------------------------------------------------------------- */
enum Kind { K_SHFL, K_SHFL_UP, K_SHFL_DOWN, K_SHFL_XOR, K_BALLOT, K_ANY, K_ALL, K_SYNCWARP, K_REDUCE_ADD,
            K_REDUCE_MIN, K_REDUCE_MAX, K_REDUCE_AND, K_REDUCE_OR, K_REDUCE_XOR, K_MATCH_ANY, K_CUSTOM };

inline const char* collective_name(int kind) {
    switch (kind) {
    case K_SHFL: return "__shfl_sync";
    case K_SHFL_UP: return "__shfl_up_sync";
    case K_SHFL_DOWN: return "__shfl_down_sync";
    case K_SHFL_XOR: return "__shfl_xor_sync";
    case K_BALLOT: return "__ballot_sync";
    case K_ANY: return "__any_sync";
    case K_ALL: return "__all_sync";
    case K_SYNCWARP: return "__syncwarp";
    case K_REDUCE_ADD: return "__reduce_add_sync";
    case K_REDUCE_MIN: return "__reduce_min_sync";
    case K_REDUCE_MAX: return "__reduce_max_sync";
    case K_REDUCE_AND: return "__reduce_and_sync";
    case K_REDUCE_OR: return "__reduce_or_sync";
    case K_REDUCE_XOR: return "__reduce_xor_sync";
    case K_MATCH_ANY: return "__match_any_sync";
    case K_CUSTOM: return "a WMMA operation";
    }
    return "a warp collective";
}

inline unsigned warp_existing(Worker* w, unsigned warp) {
    unsigned first = warp * 32;
    unsigned count = w->nthreads - first >= 32 ? 32 : w->nthreads - first;
    return count == 32 ? 0xFFFFFFFFu : ((1u << count) - 1);
}

inline void warp_compute(Worker* w, unsigned warp, unsigned eff, int kind) {
    WarpRec* recs[32];
    int n = 0;
    for (unsigned l = 0; l < 32; ++l) recs[l] = (eff >> l & 1) ? &w->fibers[warp * 32 + l]->wr : nullptr;
    const unsigned long long poison = ~0ull;
    switch (kind) {
    case K_SHFL:
    case K_SHFL_UP:
    case K_SHFL_DOWN:
    case K_SHFL_XOR:
        for (unsigned l = 0; l < 32; ++l) {
            WarpRec* r = recs[l];
            if (!r) continue;
            int width = r->width;
            if (width <= 0 || width > 32 || (width & (width - 1)))
                CUVIL_SIM_FAIL(cudaErrorLaunchFailure,
                           block_name(w) + format(": %s with width %d (must be a power of two up to 32)",
                                                  collective_name(kind), width));
            int lane = static_cast<int>(l), base = lane / width * width, src;
            if (kind == K_SHFL)
                src = base + ((r->arg % width) + width) % width;
            else if (kind == K_SHFL_UP)
                src = lane - r->arg < base ? lane : lane - r->arg;
            else if (kind == K_SHFL_DOWN)
                src = lane + r->arg >= base + width ? lane : lane + r->arg;
            else {
                src = lane ^ r->arg;
                if (src >= base + width) src = lane;
            }
            r->result = (src >= 0 && src < 32 && recs[src]) ? recs[src]->val : poison;
        }
        break;
    case K_BALLOT:
    case K_ANY:
    case K_ALL: {
        unsigned bits = 0;
        for (unsigned l = 0; l < 32; ++l)
            if (recs[l] && recs[l]->val) bits |= 1u << l;
        unsigned long long res = kind == K_BALLOT ? bits : kind == K_ANY ? (bits != 0) : (bits == eff);
        for (unsigned l = 0; l < 32; ++l)
            if (recs[l]) recs[l]->result = res;
        break;
    }
    case K_SYNCWARP: break;
    case K_REDUCE_ADD:
    case K_REDUCE_MIN:
    case K_REDUCE_MAX:
    case K_REDUCE_AND:
    case K_REDUCE_OR:
    case K_REDUCE_XOR: {
        bool is_signed = false;
        unsigned long long acc = 0;
        bool first = true;
        for (unsigned l = 0; l < 32; ++l) {
            if (!recs[l]) continue;
            unsigned long long v = recs[l]->val;
            is_signed = recs[l]->arg != 0;
            if (first) {
                acc = v;
                first = false;
                continue;
            }
            unsigned a32 = static_cast<unsigned>(acc), v32 = static_cast<unsigned>(v);
            int as = static_cast<int>(a32), vs = static_cast<int>(v32);
            switch (kind) {
            case K_REDUCE_ADD: acc = a32 + v32; break;
            case K_REDUCE_MIN: acc = is_signed ? static_cast<unsigned>(std::min(as, vs)) : std::min(a32, v32); break;
            case K_REDUCE_MAX: acc = is_signed ? static_cast<unsigned>(std::max(as, vs)) : std::max(a32, v32); break;
            case K_REDUCE_AND: acc = a32 & v32; break;
            case K_REDUCE_OR: acc = a32 | v32; break;
            default: acc = a32 ^ v32; break;
            }
        }
        for (unsigned l = 0; l < 32; ++l)
            if (recs[l]) recs[l]->result = acc;
        break;
    }
    case K_MATCH_ANY:
        for (unsigned l = 0; l < 32; ++l) {
            if (!recs[l]) continue;
            unsigned bits = 0;
            for (unsigned k = 0; k < 32; ++k)
                if (recs[k] && recs[k]->val == recs[l]->val) bits |= 1u << k;
            recs[l]->result = bits;
        }
        break;
    case K_CUSTOM: {
        WarpRec* list[32];
        for (unsigned l = 0; l < 32; ++l)
            if (recs[l]) list[n++] = recs[l];
        if (const char* err = list[0]->fn(list, n))
            CUVIL_SIM_FAIL(cudaErrorLaunchFailure, block_name(w) + format(" warp %u: %s", warp, err));
        break;
    }
    }
}

/* The calling lane takes part in collective `kind` over `mask`; returns its result once every lane
   of the mask has arrived. */
inline unsigned long long warp_collective(unsigned mask, int kind, WarpRec rec) {
    Fiber* f = current_fiber();
    Worker* w = f->w;
    unsigned lane = f->linear & 31, warp = f->linear >> 5;
    if (!(mask >> lane & 1))
        CUVIL_SIM_FAIL(cudaErrorLaunchFailure,
                   block_name(w) + format(": thread %u (lane %u) calls %s with mask 0x%08x, which excludes it",
                                          f->linear, lane, collective_name(kind), mask));
    unsigned eff = mask & warp_existing(w, warp);
    rec.mask = mask;
    rec.kind = kind;
    f->wr = rec;
    f->state = TState::Warp;
    w->warp_arrived[warp] |= 1u << lane;
    if ((w->warp_arrived[warp] & eff) == eff) {
        bool same = true;
        for (unsigned l = 0; l < 32; ++l) {
            if (!(eff >> l & 1)) continue;
            const WarpRec& o = w->fibers[warp * 32 + l]->wr;
            if (o.mask != mask) same = false;
            else if (o.kind != kind)
                CUVIL_SIM_FAIL(cudaErrorLaunchFailure,
                           block_name(w) + format(": lanes of warp %u with mask 0x%08x call different collectives "
                                                  "(%s and %s)",
                                                  warp, mask, collective_name(kind), collective_name(o.kind)));
        }
        if (same) {
            warp_compute(w, warp, eff, kind);
            w->warp_arrived[warp] &= ~eff;
            for (unsigned l = 0; l < 32; ++l) {
                if (!(eff >> l & 1) || l == lane) continue;
                Fiber* g = w->fibers[warp * 32 + l];
                g->state = TState::Ready;
                queue_push(w, static_cast<int>(warp * 32 + l));
            }
            f->state = TState::Ready;
            return f->wr.result;
        }
    }
    park(w, f);
    return f->wr.result;
}

template <class T>
inline unsigned long long to_bits(T v) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffled values are at most 8 bytes");
    unsigned long long b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T>
inline T from_bits(unsigned long long b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}
template <class T>
inline T shfl(unsigned mask, T var, int arg, int width, int kind) {
    WarpRec r{};
    r.val = to_bits(var);
    r.arg = arg;
    r.width = width;
    return from_bits<T>(warp_collective(mask, kind, r));
}
inline unsigned vote(unsigned mask, int pred, int kind) {
    WarpRec r{};
    r.val = pred != 0;
    return static_cast<unsigned>(warp_collective(mask, kind, r));
}
template <class T>
inline T reduce(unsigned mask, T v, int kind) {
    WarpRec r{};
    r.val = static_cast<unsigned>(v);
    r.arg = std::is_signed<T>::value;
    return static_cast<T>(static_cast<unsigned>(warp_collective(mask, kind, r)));
}

inline void* dynamic_shared() {
    Worker* w = current_fiber()->w;
    return w->dyn_smem.empty() ? nullptr : static_cast<void*>(w->dyn_smem.data());
}

[[noreturn]] inline void trap(const char* what) {
    Fiber* f = current_fiber();
    Worker* w = f->w;
    CUVIL_SIM_FAIL(cudaErrorLaunchFailure, block_name(w) + format(" thread (%u,%u,%u): %s", f->tid.x, f->tid.y,
                                                              f->tid.z, what));
}

} // namespace cuvil_sim

#define threadIdx (::cuvil_sim::current_fiber()->tid)
#define blockIdx (::cuvil_sim::current_fiber()->w->bidx)
#define blockDim (::cuvil_sim::current_fiber()->w->bdim)
#define gridDim (::cuvil_sim::current_fiber()->w->gdim)

#define __syncthreads() ((void)::cuvil_sim::barrier(__LINE__, 0))
#define __syncthreads_count(p) ::cuvil_sim::barrier(__LINE__, (p))
#define __syncthreads_and(p) (::cuvil_sim::barrier(__LINE__, (p)) == static_cast<int>(::cuvil_sim::current_fiber()->w->nthreads))
#define __syncthreads_or(p) (::cuvil_sim::barrier(__LINE__, (p)) != 0)

template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
    return cuvil_sim::shfl(mask, var, srcLane, width, cuvil_sim::K_SHFL);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {
    return cuvil_sim::shfl(mask, var, static_cast<int>(delta), width, cuvil_sim::K_SHFL_UP);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {
    return cuvil_sim::shfl(mask, var, static_cast<int>(delta), width, cuvil_sim::K_SHFL_DOWN);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
    return cuvil_sim::shfl(mask, var, laneMask, width, cuvil_sim::K_SHFL_XOR);
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return cuvil_sim::vote(mask, pred, cuvil_sim::K_BALLOT); }
inline int __any_sync(unsigned mask, int pred) { return static_cast<int>(cuvil_sim::vote(mask, pred, cuvil_sim::K_ANY)); }
inline int __all_sync(unsigned mask, int pred) { return static_cast<int>(cuvil_sim::vote(mask, pred, cuvil_sim::K_ALL)); }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) { (void)cuvil_sim::vote(mask, 0, cuvil_sim::K_SYNCWARP); }
inline unsigned __activemask() {
    cuvil_sim::Fiber* f = cuvil_sim::current_fiber();
    cuvil_sim::Worker* w = f->w;
    unsigned warp = f->linear >> 5;
    return cuvil_sim::warp_existing(w, warp) & ~w->warp_exited[warp];
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) { return cuvil_sim::reduce(mask, v, cuvil_sim::K_REDUCE_ADD); }
inline int __reduce_add_sync(unsigned mask, int v) { return cuvil_sim::reduce(mask, v, cuvil_sim::K_REDUCE_ADD); }
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) { return cuvil_sim::reduce(mask, v, cuvil_sim::K_REDUCE_MIN); }
inline int __reduce_min_sync(unsigned mask, int v) { return cuvil_sim::reduce(mask, v, cuvil_sim::K_REDUCE_MIN); }
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) { return cuvil_sim::reduce(mask, v, cuvil_sim::K_REDUCE_MAX); }
inline int __reduce_max_sync(unsigned mask, int v) { return cuvil_sim::reduce(mask, v, cuvil_sim::K_REDUCE_MAX); }
inline unsigned __reduce_and_sync(unsigned mask, unsigned v) { return cuvil_sim::reduce(mask, v, cuvil_sim::K_REDUCE_AND); }
inline unsigned __reduce_or_sync(unsigned mask, unsigned v) { return cuvil_sim::reduce(mask, v, cuvil_sim::K_REDUCE_OR); }
inline unsigned __reduce_xor_sync(unsigned mask, unsigned v) { return cuvil_sim::reduce(mask, v, cuvil_sim::K_REDUCE_XOR); }
template <class T>
inline unsigned __match_any_sync(unsigned mask, T v) {
    cuvil_sim::WarpRec r{};
    r.val = cuvil_sim::to_bits(v);
    return static_cast<unsigned>(cuvil_sim::warp_collective(mask, cuvil_sim::K_MATCH_ANY, r));
}

[[noreturn]] inline void __trap() { cuvil_sim::trap("__trap() called"); }
inline void __brkpt() { cuvil_sim::trap("__brkpt() called"); }
inline void __nanosleep(unsigned) {}
inline long long clock64() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/* ------------------------------------------------------------------------------------------------ */
/* Atomics (real atomics: blocks run on several OS threads)                                          */
/* ------------------------------------------------------------------------------------------------ */
namespace cuvil_sim {
template <class T, class F>
inline T atomic_update(T* p, F f) {
    T old;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    T desired;
    do {
        desired = f(old);
    } while (!__atomic_compare_exchange(p, &old, &desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
} // namespace cuvil_sim

#define CUVIL_SIM_ATOMIC_INT(T) \
    inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
    inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); } \
    inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
    inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); } \
    inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); } \
    inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); } \
    inline T atomicMin(T* p, T v) { return cuvil_sim::atomic_update(p, [v](T o) { return v < o ? v : o; }); } \
    inline T atomicMax(T* p, T v) { return cuvil_sim::atomic_update(p, [v](T o) { return v > o ? v : o; }); } \
    inline T atomicCAS(T* p, T compare, T v) { \
        __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); \
        return compare; \
    }
CUVIL_SIM_ATOMIC_INT(int)
CUVIL_SIM_ATOMIC_INT(unsigned int)
CUVIL_SIM_ATOMIC_INT(unsigned long long)
CUVIL_SIM_ATOMIC_INT(long long)
#undef CUVIL_SIM_ATOMIC_INT
inline unsigned short atomicCAS(unsigned short* p, unsigned short compare, unsigned short v) {
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}
inline float atomicAdd(float* p, float v) { return cuvil_sim::atomic_update(p, [v](float o) { return o + v; }); }
inline double atomicAdd(double* p, double v) { return cuvil_sim::atomic_update(p, [v](double o) { return o + v; }); }
inline float atomicExch(float* p, float v) {
    float old;
    __atomic_exchange(p, &v, &old, __ATOMIC_RELAXED);
    return old;
}
inline unsigned atomicInc(unsigned* p, unsigned limit) {
    return cuvil_sim::atomic_update(p, [limit](unsigned o) { return o >= limit ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned* p, unsigned limit) {
    return cuvil_sim::atomic_update(p, [limit](unsigned o) { return (o == 0 || o > limit) ? limit : o - 1; });
}
#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd
#define atomicMax_block atomicMax
#define atomicMin_block atomicMin
#define atomicCAS_block atomicCAS
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ------------------------------------------------------------------------------------------------ */
/* Math and bit intrinsics                                                                           */
/* ------------------------------------------------------------------------------------------------ */
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned min(int a, unsigned b) { return min(static_cast<unsigned>(a), b); }
inline unsigned max(int a, unsigned b) { return max(static_cast<unsigned>(a), b); }
inline unsigned min(unsigned a, int b) { return min(a, static_cast<unsigned>(b)); }
inline unsigned max(unsigned a, int b) { return max(a, static_cast<unsigned>(b)); }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline unsigned long min(long a, unsigned long b) { return min(static_cast<unsigned long>(a), b); }
inline unsigned long max(long a, unsigned long b) { return max(static_cast<unsigned long>(a), b); }
inline unsigned long min(unsigned long a, long b) { return min(a, static_cast<unsigned long>(b)); }
inline unsigned long max(unsigned long a, long b) { return max(a, static_cast<unsigned long>(b)); }
inline unsigned long long min(long long a, unsigned long long b) { return min(static_cast<unsigned long long>(a), b); }
inline unsigned long long max(long long a, unsigned long long b) { return max(static_cast<unsigned long long>(a), b); }
inline unsigned long long min(unsigned long long a, long long b) { return min(a, static_cast<unsigned long long>(b)); }
inline unsigned long long max(unsigned long long a, long long b) { return max(a, static_cast<unsigned long long>(b)); }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(a, b); }
inline double max(float a, double b) { return fmax(a, b); }
inline double min(double a, float b) { return fmin(a, b); }
inline double max(double a, float b) { return fmax(a, b); }

inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline float exp10f(float x) { return powf(10.0f, x); }
inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
inline float sinpif(float x) { return sinf(x * 3.14159265358979323846f); }
inline float cospif(float x) { return cosf(x * 3.14159265358979323846f); }

inline int __float_as_int(float x) { int r; std::memcpy(&r, &x, 4); return r; }
inline unsigned __float_as_uint(float x) { unsigned r; std::memcpy(&r, &x, 4); return r; }
inline float __int_as_float(int x) { float r; std::memcpy(&r, &x, 4); return r; }
inline float __uint_as_float(unsigned x) { float r; std::memcpy(&r, &x, 4); return r; }
inline long long __double_as_longlong(double x) { long long r; std::memcpy(&r, &x, 8); return r; }
inline double __longlong_as_double(long long x) { double r; std::memcpy(&r, &x, 8); return r; }

namespace cuvil_sim {
template <class I>
inline I sat_round(float x, int mode) {
    if (x != x) return 0;
    float r = mode == 0 ? nearbyintf(x) : mode == 1 ? truncf(x) : mode == 2 ? floorf(x) : ceilf(x);
    if (r <= static_cast<float>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
    if (r >= static_cast<float>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
    return static_cast<I>(r);
}
} // namespace cuvil_sim
inline int __float2int_rn(float x) { return cuvil_sim::sat_round<int>(x, 0); }
inline int __float2int_rz(float x) { return cuvil_sim::sat_round<int>(x, 1); }
inline int __float2int_rd(float x) { return cuvil_sim::sat_round<int>(x, 2); }
inline int __float2int_ru(float x) { return cuvil_sim::sat_round<int>(x, 3); }
inline unsigned __float2uint_rn(float x) { return cuvil_sim::sat_round<unsigned>(x, 0); }
inline unsigned __float2uint_rz(float x) { return cuvil_sim::sat_round<unsigned>(x, 1); }
inline long long __float2ll_rn(float x) { return cuvil_sim::sat_round<long long>(x, 0); }
inline long long __float2ll_rz(float x) { return cuvil_sim::sat_round<long long>(x, 1); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline float __uint2float_rn(unsigned x) { return static_cast<float>(x); }
inline float __ll2float_rn(long long x) { return static_cast<float>(x); }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
    x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
    return (x >> 16) | (x << 16);
}
inline int __mul24(int a, int b) { return (a << 8 >> 8) * (b << 8 >> 8); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xFFFFFFu) * (b & 0xFFFFFFu); }
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
    return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
    unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return static_cast<unsigned>((v << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return static_cast<unsigned>(v >> (s & 31));
}
template <class T>
inline T __ldg(const T* p) { return *p; }
template <class T>
inline T __ldcs(const T* p) { return *p; }
template <class T>
inline T __ldcg(const T* p) { return *p; }
template <class T>
inline T __ldca(const T* p) { return *p; }
template <class T>
inline T __ldlu(const T* p) { return *p; }
template <class T>
inline void __stcs(T* p, T v) { *p = v; }
template <class T>
inline void __stcg(T* p, T v) { *p = v; }
template <class T>
inline void __stwt(T* p, T v) { *p = v; }

/* ------------------------------------------------------------------------------------------------ */
/* __half and __nv_bfloat16                                                                          */
/* ------------------------------------------------------------------------------------------------ */
namespace cuvil_sim {
inline unsigned short f2h(float f) {
    unsigned x;
    std::memcpy(&x, &f, 4);
    unsigned sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return 0x7FFFu;
    if (ax >= 0x477FF000u) return static_cast<unsigned short>(sign | 0x7C00u);
    if (ax >= 0x38800000u) {
        unsigned r = (ax >> 13) - ((127u - 15u) << 10), rem = ax & 0x1FFFu;
        if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
        return static_cast<unsigned short>(sign | r);
    }
    if (ax <= 0x33000000u) return static_cast<unsigned short>(sign);
    unsigned e = ax >> 23, mant = (ax & 0x7FFFFFu) | 0x800000u, shift = 126u - e;
    unsigned r = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<unsigned short>(sign | r);
}
inline float h2f(unsigned short h) {
    unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu, x;
    if (e == 0x1F) x = sign | 0x7F800000u | (m << 13);
    else if (e) x = sign | ((e + 112u) << 23) | (m << 13);
    else if (!m) x = sign;
    else {
        int sh = 0;
        while (!(m & 0x400u)) { m <<= 1; ++sh; }
        x = sign | ((113u - static_cast<unsigned>(sh)) << 23) | ((m & 0x3FFu) << 13);
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
inline unsigned short f2bf(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
    return static_cast<unsigned short>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float bf2f(unsigned short b) {
    unsigned u = static_cast<unsigned>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
} // namespace cuvil_sim

struct __half_raw { unsigned short x; };
struct __nv_bfloat16_raw { unsigned short x; };

#define CUVIL_SIM_HALF_TYPE(H, RAW, TOF, FROMF) \
    struct H { \
        unsigned short __x; \
        H() = default; \
        constexpr H(const RAW& r) : __x(r.x) {} \
        H(float f) : __x(cuvil_sim::FROMF(f)) {} \
        H(double d) : __x(cuvil_sim::FROMF(static_cast<float>(d))) {} \
        H(int i) : __x(cuvil_sim::FROMF(static_cast<float>(i))) {} \
        H(unsigned i) : __x(cuvil_sim::FROMF(static_cast<float>(i))) {} \
        H(long long i) : __x(cuvil_sim::FROMF(static_cast<float>(i))) {} \
        H(unsigned long long i) : __x(cuvil_sim::FROMF(static_cast<float>(i))) {} \
        H(short i) : __x(cuvil_sim::FROMF(static_cast<float>(i))) {} \
        H(unsigned short i) : __x(cuvil_sim::FROMF(static_cast<float>(i))) {} \
        operator float() const { return cuvil_sim::TOF(__x); } \
        operator RAW() const { return RAW{__x}; } \
        H& operator=(float f) { __x = cuvil_sim::FROMF(f); return *this; } \
        H& operator=(const RAW& r) { __x = r.x; return *this; } \
        H& operator+=(const H& o) { *this = H(float(*this) + float(o)); return *this; } \
        H& operator-=(const H& o) { *this = H(float(*this) - float(o)); return *this; } \
        H& operator*=(const H& o) { *this = H(float(*this) * float(o)); return *this; } \
        H& operator/=(const H& o) { *this = H(float(*this) / float(o)); return *this; } \
    }; \
    inline H operator+(const H& a, const H& b) { return H(float(a) + float(b)); } \
    inline H operator-(const H& a, const H& b) { return H(float(a) - float(b)); } \
    inline H operator*(const H& a, const H& b) { return H(float(a) * float(b)); } \
    inline H operator/(const H& a, const H& b) { return H(float(a) / float(b)); } \
    inline H operator-(const H& a) { H r; r.__x = static_cast<unsigned short>(a.__x ^ 0x8000u); return r; } \
    inline H operator+(const H& a) { return a; } \
    inline bool operator==(const H& a, const H& b) { return float(a) == float(b); } \
    inline bool operator!=(const H& a, const H& b) { return float(a) != float(b); } \
    inline bool operator<(const H& a, const H& b) { return float(a) < float(b); } \
    inline bool operator>(const H& a, const H& b) { return float(a) > float(b); } \
    inline bool operator<=(const H& a, const H& b) { return float(a) <= float(b); } \
    inline bool operator>=(const H& a, const H& b) { return float(a) >= float(b); } \
    inline H __hadd(H a, H b) { return a + b; } \
    inline H __hsub(H a, H b) { return a - b; } \
    inline H __hmul(H a, H b) { return a * b; } \
    inline H __hdiv(H a, H b) { return a / b; } \
    inline H __hfma(H a, H b, H c) { return H(fmaf(float(a), float(b), float(c))); } \
    inline H __hneg(H a) { return -a; } \
    inline H __habs(H a) { H r; r.__x = static_cast<unsigned short>(a.__x & 0x7FFFu); return r; } \
    inline H __hmax(H a, H b) { return H(fmaxf(float(a), float(b))); } \
    inline H __hmin(H a, H b) { return H(fminf(float(a), float(b))); } \
    inline bool __heq(H a, H b) { return float(a) == float(b); } \
    inline bool __hne(H a, H b) { return float(a) < float(b) || float(a) > float(b); } \
    inline bool __hlt(H a, H b) { return float(a) < float(b); } \
    inline bool __hle(H a, H b) { return float(a) <= float(b); } \
    inline bool __hgt(H a, H b) { return float(a) > float(b); } \
    inline bool __hge(H a, H b) { return float(a) >= float(b); } \
    inline bool __hisnan(H a) { return float(a) != float(a); } \
    inline int __hisinf(H a) { float f = float(a); return std::isinf(f) ? (f < 0 ? -1 : 1) : 0; } \
    inline H hsqrt(H a) { return H(sqrtf(float(a))); } \
    inline H hrsqrt(H a) { return H(1.0f / sqrtf(float(a))); } \
    inline H hexp(H a) { return H(expf(float(a))); } \
    inline H hlog(H a) { return H(logf(float(a))); } \
    inline H htanh(H a) { return H(tanhf(float(a))); }

CUVIL_SIM_HALF_TYPE(__half, __half_raw, h2f, f2h)
CUVIL_SIM_HALF_TYPE(__nv_bfloat16, __nv_bfloat16_raw, bf2f, f2bf)
#undef CUVIL_SIM_HALF_TYPE
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline float __half2float(__half h) { return cuvil_sim::h2f(h.__x); }
inline __half __int2half_rn(int i) { return __half(static_cast<float>(i)); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return static_cast<short>(h.__x); }
inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
inline __half __short_as_half(short s) { return __half(__half_raw{static_cast<unsigned short>(s)}); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline float __bfloat162float(__nv_bfloat16 h) { return cuvil_sim::bf2f(h.__x); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16(__nv_bfloat16_raw{u}); }
inline __nv_bfloat16 __half2bfloat16(__half h) { return __nv_bfloat16(__half2float(h)); }

#define CUVIL_SIM_HALF2_TYPE(H2, H, PREFIX) \
    struct alignas(4) H2 { \
        H x, y; \
    }; \
    inline H2 __floats2##PREFIX##2_rn(float a, float b) { return H2{H(a), H(b)}; } \
    inline H2 __float2##PREFIX##2_rn(float a) { return H2{H(a), H(a)}; } \
    inline H2 __float22##PREFIX##2_rn(float2 v) { return H2{H(v.x), H(v.y)}; } \
    inline float2 __##PREFIX##22float2(H2 v) { return float2{float(v.x), float(v.y)}; } \
    inline float __low2float(H2 v) { return float(v.x); } \
    inline float __high2float(H2 v) { return float(v.y); } \
    inline H2 __hadd2(H2 a, H2 b) { return H2{a.x + b.x, a.y + b.y}; } \
    inline H2 __hsub2(H2 a, H2 b) { return H2{a.x - b.x, a.y - b.y}; } \
    inline H2 __hmul2(H2 a, H2 b) { return H2{a.x * b.x, a.y * b.y}; } \
    inline H2 __hfma2(H2 a, H2 b, H2 c) { return H2{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; } \
    inline H2 operator+(const H2& a, const H2& b) { return __hadd2(a, b); } \
    inline H2 operator-(const H2& a, const H2& b) { return __hsub2(a, b); } \
    inline H2 operator*(const H2& a, const H2& b) { return __hmul2(a, b); }

CUVIL_SIM_HALF2_TYPE(__half2, __half, half)
CUVIL_SIM_HALF2_TYPE(__nv_bfloat162, __nv_bfloat16, bfloat16)
#undef CUVIL_SIM_HALF2_TYPE
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;
inline __half __low2half(__half2 v) { return v.x; }
inline __half __high2half(__half2 v) { return v.y; }
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 v) { return v.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 v) { return v.y; }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162{a, b}; }

/* ------------------------------------------------------------------------------------------------ */
/* WMMA                                                                                              */
/* ------------------------------------------------------------------------------------------------ */
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K>
struct fragment_shape;
template <int M, int N, int K>
struct fragment_shape<matrix_a, M, N, K> { enum { rows = M, cols = K }; };
template <int M, int N, int K>
struct fragment_shape<matrix_b, M, N, K> { enum { rows = K, cols = N }; };
template <int M, int N, int K>
struct fragment_shape<accumulator, M, N, K> { enum { rows = M, cols = N }; };

/* Every lane holds the whole tile, row-major: x[r * cols + c]. */
template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  public:
    enum { rows = fragment_shape<Use, M, N, K>::rows, cols = fragment_shape<Use, M, N, K>::cols };
    enum { num_elements = rows * cols };
    typedef T element_type;
    T x[num_elements];
};

template <class Use, int M, int N, int K, class T, class Layout, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const V& v) {
    T t = T(v);
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = t;
}

namespace detail {
inline const char* same_args(cuvil_sim::WarpRec** recs, int n, const char* what) {
    for (int i = 1; i < n; ++i)
        if (recs[i]->p != recs[0]->p || recs[i]->ldm != recs[0]->ldm || recs[i]->layout != recs[0]->layout)
            return what;
    return nullptr;
}
template <class Frag, class T>
inline const char* load_fn(cuvil_sim::WarpRec** recs, int n) {
    if (const char* e = same_args(recs, n, "load_matrix_sync called with different pointers, ldm or layouts by the "
                                           "lanes of one warp"))
        return e;
    const T* p = static_cast<const T*>(recs[0]->p);
    Frag& f = *static_cast<Frag*>(recs[0]->q);
    unsigned ldm = recs[0]->ldm;
    bool col = recs[0]->layout != 0;
    for (int r = 0; r < Frag::rows; ++r)
        for (int c = 0; c < Frag::cols; ++c)
            f.x[r * Frag::cols + c] = col ? p[static_cast<size_t>(c) * ldm + r] : p[static_cast<size_t>(r) * ldm + c];
    for (int i = 1; i < n; ++i) *static_cast<Frag*>(recs[i]->q) = f;
    return nullptr;
}
template <class Frag, class T>
inline const char* store_fn(cuvil_sim::WarpRec** recs, int n) {
    if (const char* e = same_args(recs, n, "store_matrix_sync called with different pointers, ldm or layouts by "
                                           "the lanes of one warp"))
        return e;
    const Frag& f = *static_cast<const Frag*>(recs[0]->r);
    for (int i = 1; i < n; ++i)
        if (std::memcmp(&f, recs[i]->r, sizeof(Frag)) != 0)
            return "store_matrix_sync: the lanes of one warp hold different accumulator fragments (lane-dependent "
                   "use of fragment.x[] is not portable)";
    T* p = static_cast<T*>(const_cast<void*>(recs[0]->p));
    unsigned ldm = recs[0]->ldm;
    bool col = recs[0]->layout != 0;
    for (int r = 0; r < Frag::rows; ++r)
        for (int c = 0; c < Frag::cols; ++c)
            (col ? p[static_cast<size_t>(c) * ldm + r] : p[static_cast<size_t>(r) * ldm + c]) = f.x[r * Frag::cols + c];
    return nullptr;
}
template <class FD, class FA, class FB, class FC>
inline const char* mma_fn(cuvil_sim::WarpRec** recs, int n) {
    for (int i = 1; i < n; ++i)
        if (std::memcmp(recs[0]->p, recs[i]->p, sizeof(FA)) != 0 ||
            std::memcmp(recs[0]->r, recs[i]->r, sizeof(FB)) != 0 ||
            std::memcmp(recs[0]->s, recs[i]->s, sizeof(FC)) != 0)
            return "mma_sync: the lanes of one warp pass different fragments";
    const FA& a = *static_cast<const FA*>(recs[0]->p);
    const FB& b = *static_cast<const FB*>(recs[0]->r);
    const FC& c = *static_cast<const FC*>(recs[0]->s);
    FD d;
    for (int i = 0; i < FD::rows; ++i)
        for (int j = 0; j < FD::cols; ++j) {
            float acc = static_cast<float>(c.x[i * FC::cols + j]);
            for (int k = 0; k < FA::cols; ++k)
                acc += static_cast<float>(a.x[i * FA::cols + k]) * static_cast<float>(b.x[k * FB::cols + j]);
            d.x[i * FD::cols + j] = typename FD::element_type(acc);
        }
    for (int i = 0; i < n; ++i) *static_cast<FD*>(recs[i]->q) = d;
    return nullptr;
}
inline void collective(cuvil_sim::WarpRec& r) { (void)cuvil_sim::warp_collective(0xFFFFFFFFu, cuvil_sim::K_CUSTOM, r); }
} // namespace detail

template <class Use, int M, int N, int K, class T, class Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator load needs a layout_t");
    cuvil_sim::WarpRec r{};
    r.p = p;
    r.q = &f;
    r.ldm = ldm;
    r.layout = std::is_same<Layout, col_major>::value ? 1 : 0;
    r.fn = &detail::load_fn<fragment<Use, M, N, K, T, Layout>, T>;
    detail::collective(r);
}
template <int M, int N, int K, class T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T, void>& f, const T* p, unsigned ldm, layout_t layout) {
    cuvil_sim::WarpRec r{};
    r.p = p;
    r.q = &f;
    r.ldm = ldm;
    r.layout = layout == mem_col_major ? 1 : 0;
    r.fn = &detail::load_fn<fragment<accumulator, M, N, K, T, void>, T>;
    detail::collective(r);
}
template <int M, int N, int K, class T>
inline void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T, void>& f, unsigned ldm, layout_t layout) {
    cuvil_sim::WarpRec r{};
    r.p = p;
    r.r = &f;
    r.ldm = ldm;
    r.layout = layout == mem_col_major ? 1 : 0;
    r.fn = &detail::store_fn<fragment<accumulator, M, N, K, T, void>, T>;
    detail::collective(r);
}
template <int M, int N, int K, class TA, class LA, class TB, class LB, class TC, class TD>
inline void mma_sync(fragment<accumulator, M, N, K, TD, void>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
                     const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, TC, void>& c) {
    cuvil_sim::WarpRec r{};
    r.p = &a;
    r.r = &b;
    r.s = &c;
    r.q = &d;
    r.fn = &detail::mma_fn<fragment<accumulator, M, N, K, TD, void>, fragment<matrix_a, M, N, K, TA, LA>,
                           fragment<matrix_b, M, N, K, TB, LB>, fragment<accumulator, M, N, K, TC, void>>;
    detail::collective(r);
}
} // namespace wmma
} // namespace nvcuda
/* ------------------------------------------------------------------------------------------------ */
/* Host API: device, memory, streams, events, graphs, launches                                       */
/* ------------------------------------------------------------------------------------------------ */
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxBlockDimY = 3,
    cudaDevAttrMaxBlockDimZ = 4,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxGridDimZ = 7,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04

struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;
typedef CUgraph_st* cudaGraph_t;
typedef CUgraphExec_st* cudaGraphExec_t;
#define cudaStreamLegacy (reinterpret_cast<cudaStream_t>(0x1))
#define cudaStreamPerThread (reinterpret_cast<cudaStream_t>(0x2))

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    size_t textureAlignment;
    int multiProcessorCount;
    int integrated;
    int concurrentKernels;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryBusWidth;
    int l2CacheSize;
    int maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    size_t sharedMemPerBlockOptin;
    int maxBlocksPerMultiProcessor;
};

namespace cuvil_sim {
constexpr int kSharedPerBlock = 48 * 1024;
constexpr int kSharedOptin = 232448;  // 227 KiB, as sm_90
constexpr int kMultiprocessors = 132;

struct Op {
    std::function<void()> run;
};
} // namespace cuvil_sim

struct CUgraph_st {
    std::vector<cuvil_sim::Op> ops;
};
struct CUgraphExec_st {
    std::vector<cuvil_sim::Op> ops;
};
struct CUstream_st {
    unsigned flags = 0;
    bool capturing = false;
    bool invalidated = false;
    CUgraph_st* graph = nullptr;
};
struct CUevent_st {
    unsigned flags = 0;
    bool recorded = false;
    std::chrono::steady_clock::time_point t;
};

namespace cuvil_sim {
struct Alloc {
    size_t size;
    bool device;
};
struct State {
    std::mutex m;
    std::map<uintptr_t, Alloc> allocs;
    size_t device_used = 0;
    std::vector<CUstream_st*> streams;
    std::map<const void*, int> max_dyn_smem;
    int capturing = 0;
};
inline State& state() {
    static State* s = new State();
    return *s;
}

inline bool stream_ok(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
    std::lock_guard<std::mutex> g(state().m);
    return std::find(state().streams.begin(), state().streams.end(), s) != state().streams.end();
}
inline CUstream_st* capturing(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return nullptr;
    return s->capturing ? s : nullptr;
}
/* A synchronous operation while a stream captures in global mode invalidates the capture. */
inline bool sync_forbidden() {
    std::lock_guard<std::mutex> g(state().m);
    if (state().capturing == 0) return false;
    for (CUstream_st* s : state().streams)
        if (s->capturing) s->invalidated = true;
    return true;
}

/* Checks that [p, p + n) stays inside the device allocation p points into (pointers outside every
   device allocation are host memory or symbols and are not checked). */
inline cudaError_t check_range(const void* p, size_t n, const char* what) {
    if (n == 0) return cudaSuccess;
    if (!p) return api_error(cudaErrorInvalidValue, format("%s: null pointer", what));
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> g(state().m);
    auto it = state().allocs.upper_bound(a);
    if (it == state().allocs.begin()) return cudaSuccess;
    --it;
    if (a >= it->first + it->second.size + (it->second.size == 0 ? 1 : 0)) return cudaSuccess;
    if (a + n > it->first + it->second.size)
        return api_error(cudaErrorInvalidValue,
                         format("%s: %zu bytes at offset %zu overrun the allocation of %zu bytes", what, n,
                                static_cast<size_t>(a - it->first), it->second.size));
    return cudaSuccess;
}

inline void* raw_alloc(size_t size) {
#ifdef CUVIL_SIM_ASAN
    size_t guard = 0;
#else
    size_t guard = CUVIL_SIM_GUARD_BYTES;
#endif
    void* p = nullptr;
    if (posix_memalign(&p, 256, size + guard) != 0) return nullptr;
    std::memset(p, 0xFF, size);
    if (guard) std::memset(static_cast<char*>(p) + size, 0xFF, guard);
    return p;
}
inline bool guard_intact(const void* p, size_t size) {
#ifdef CUVIL_SIM_ASAN
    (void)p;
    (void)size;
    return true;
#else
    const unsigned char* g = static_cast<const unsigned char*>(p) + size;
    for (int i = 0; i < CUVIL_SIM_GUARD_BYTES; ++i)
        if (g[i] != 0xFF) return false;
    return true;
#endif
}

inline cudaError_t do_malloc(void** ptr, size_t size, bool device) {
    if (!ptr) return api_error(cudaErrorInvalidValue, "cudaMalloc: null result pointer");
    *ptr = nullptr;
    if (size == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> g(state().m);
        if (device && state().device_used + size > CUVIL_SIM_TOTAL_MEM)
            return api_error(cudaErrorMemoryAllocation,
                             format("cudaMalloc of %zu bytes: %zu of %llu bytes in use", size, state().device_used,
                                    static_cast<unsigned long long>(CUVIL_SIM_TOTAL_MEM)));
    }
    void* p = raw_alloc(size);
    if (!p) return api_error(cudaErrorMemoryAllocation, format("cudaMalloc of %zu bytes: host out of memory", size));
    std::lock_guard<std::mutex> g(state().m);
    state().allocs[reinterpret_cast<uintptr_t>(p)] = Alloc{size, device};
    if (device) state().device_used += size;
    *ptr = p;
    return cudaSuccess;
}
inline cudaError_t do_free(void* p, bool device) {
    if (!p) return cudaSuccess;
    Alloc a;
    {
        std::lock_guard<std::mutex> g(state().m);
        auto it = state().allocs.find(reinterpret_cast<uintptr_t>(p));
        if (it == state().allocs.end() || it->second.device != device)
            return api_error(cudaErrorInvalidValue,
                             format("%s(%p): not a live %s allocation", device ? "cudaFree" : "cudaFreeHost", p,
                                    device ? "device" : "pinned host"));
        a = it->second;
        state().allocs.erase(it);
        if (device) state().device_used -= a.size;
    }
    bool intact = guard_intact(p, a.size);
    std::string where = format("%p", p);
    std::free(p);
    if (!intact)
        return api_error(cudaErrorIllegalAddress,
                         format("cudaFree(%s): memory just past the end of the %zu-byte allocation was written "
                                "(out-of-bounds write)",
                                where.c_str(), a.size));
    return cudaSuccess;
}

inline cudaError_t do_copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, const char* what) {
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return api_error(cudaErrorInvalidMemcpyDirection, format("%s: copy kind %d", what, static_cast<int>(kind)));
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return api_error(cudaErrorInvalidValue, format("%s: null pointer", what));
    if (cudaError_t e = check_range(dst, n, what)) return e;
    if (cudaError_t e = check_range(src, n, what)) return e;
    std::memcpy(dst, src, n);
    return cudaSuccess;
}
inline cudaError_t do_set(void* dst, int value, size_t n, const char* what) {
    if (n == 0) return cudaSuccess;
    if (cudaError_t e = check_range(dst, n, what)) return e;
    std::memset(dst, value, n);
    return cudaSuccess;
}

inline int max_dyn_smem(const void* f) {
    std::lock_guard<std::mutex> g(state().m);
    auto it = state().max_dyn_smem.find(f);
    return it == state().max_dyn_smem.end() ? kSharedPerBlock : it->second;
}

template <class... P>
struct Closure {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> args;
};
template <class... P>
inline void invoke_closure(const void* c) {
    const Closure<P...>* cl = static_cast<const Closure<P...>*>(c);
    std::apply(cl->kernel, cl->args);
}

template <class... P>
inline void run_launch(const std::shared_ptr<const Closure<P...>>& cl, const char* name, dim3 g, dim3 b, size_t shmem) {
    Job job;
    job.invoke = &invoke_closure<P...>;
    job.closure = cl.get();
    job.name = name;
    job.grid = g;
    job.block = b;
    job.shmem = shmem;
    job.nblocks = static_cast<unsigned long long>(g.x) * g.y * g.z;
    execute(job);
}

inline cudaError_t check_config(const void* kernel, const char* name, dim3 g, dim3 b, size_t shmem) {
    unsigned long long threads = static_cast<unsigned long long>(b.x) * b.y * b.z;
    if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024)
        return api_error(cudaErrorInvalidConfiguration,
                         format("launch of %s: block (%u,%u,%u) (at most 1024 threads, 1024 x 1024 x 64)", name, b.x,
                                b.y, b.z));
    if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535)
        return api_error(cudaErrorInvalidConfiguration,
                         format("launch of %s: grid (%u,%u,%u) (at most 2^31-1 x 65535 x 65535)", name, g.x, g.y, g.z));
    int limit = max_dyn_smem(kernel);
    if (shmem > static_cast<size_t>(limit))
        return api_error(cudaErrorInvalidValue,
                         format("launch of %s: %zu bytes of dynamic shared memory, more than the kernel's limit of %d "
                                "(raise it with cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize))",
                                name, shmem, limit));
    return cudaSuccess;
}

/* CUVIL_LAUNCH: checks the configuration as the driver does, then runs the grid (or records it when
   the stream captures). The arguments are taken by value, as <<<>>> does, and converted to the kernel's
   parameter types once. */
template <class... P, class... A>
inline void launch(void (*kernel)(P...), const char* name, dim3 g, dim3 b, size_t shmem, cudaStream_t stream,
                   A... args) {
    static_assert(sizeof...(P) == sizeof...(A), "CUVIL_LAUNCH: the argument count differs from the kernel's");
    if (!kernel) {
        api_error(cudaErrorInvalidDeviceFunction, format("launch of %s: null kernel", name));
        return;
    }
    if (check_config(reinterpret_cast<const void*>(kernel), name, g, b, shmem)) return;
    if (!stream_ok(stream)) {
        api_error(cudaErrorInvalidResourceHandle, format("launch of %s: not a live stream", name));
        return;
    }
    auto cl = std::make_shared<const Closure<P...>>(
        Closure<P...>{kernel, std::tuple<std::decay_t<P>...>(args...)});
    if (CUstream_st* s = capturing(stream)) {
        s->graph->ops.push_back(Op{[cl, name, g, b, shmem] { run_launch<P...>(cl, name, g, b, shmem); }});
        return;
    }
    run_launch<P...>(cl, name, g, b, shmem);
}
} // namespace cuvil_sim

inline cudaError_t cudaGetDeviceCount(int* n) {
    if (!n) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaGetDeviceCount: null pointer");
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
    return d == 0 ? cudaSuccess : cuvil_sim::api_error(cudaErrorInvalidDevice, cuvil_sim::format("cudaSetDevice(%d)", d));
}
inline cudaError_t cudaGetDevice(int* d) {
    if (!d) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaGetDevice: null pointer");
    *d = 0;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceReset() { return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
    if (!p) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaGetDeviceProperties: null pointer");
    if (device != 0)
        return cuvil_sim::api_error(cudaErrorInvalidDevice, cuvil_sim::format("cudaGetDeviceProperties(%d)", device));
    std::memset(p, 0, sizeof *p);
    std::snprintf(p->name, sizeof p->name, "cuvil-sim");
    p->totalGlobalMem = CUVIL_SIM_TOTAL_MEM;
    p->sharedMemPerBlock = cuvil_sim::kSharedPerBlock;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = SIZE_MAX;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->textureAlignment = 512;
    p->multiProcessorCount = cuvil_sim::kMultiprocessors;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 * 1024 * 1024;
    p->maxThreadsPerMultiProcessor = 2048;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->sharedMemPerBlockOptin = cuvil_sim::kSharedOptin;
    p->maxBlocksPerMultiProcessor = 32;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int device) {
    if (!v || device != 0) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaDeviceGetAttribute");
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxBlockDimX: *v = 1024; break;
    case cudaDevAttrMaxBlockDimY: *v = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *v = 64; break;
    case cudaDevAttrMaxGridDimX: *v = 2147483647; break;
    case cudaDevAttrMaxGridDimY: *v = 65535; break;
    case cudaDevAttrMaxGridDimZ: *v = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = cuvil_sim::kSharedPerBlock; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMultiProcessorCount: *v = cuvil_sim::kMultiprocessors; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = cuvil_sim::kSharedOptin; break;
    default: return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute not emulated");
    }
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
    if (cuvil_sim::sync_forbidden())
        return cuvil_sim::api_error(cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize while a stream captures");
    return cuvil_sim::take_pending();
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    if (!free_bytes || !total_bytes) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaMemGetInfo: null pointer");
    std::lock_guard<std::mutex> g(cuvil_sim::state().m);
    *total_bytes = CUVIL_SIM_TOTAL_MEM;
    *free_bytes = CUVIL_SIM_TOTAL_MEM - cuvil_sim::state().device_used;
    return cudaSuccess;
}

inline cudaError_t cudaMalloc(void** p, size_t size) { return cuvil_sim::do_malloc(p, size, true); }
template <class T>
inline cudaError_t cudaMalloc(T** p, size_t size) {
    return cuvil_sim::do_malloc(reinterpret_cast<void**>(p), size, true);
}
inline cudaError_t cudaMallocAsync(void** p, size_t size, cudaStream_t) { return cuvil_sim::do_malloc(p, size, true); }
template <class T>
inline cudaError_t cudaMallocAsync(T** p, size_t size, cudaStream_t) {
    return cuvil_sim::do_malloc(reinterpret_cast<void**>(p), size, true);
}
inline cudaError_t cudaFree(void* p) { return cuvil_sim::do_free(p, true); }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cuvil_sim::do_free(p, true); }
inline cudaError_t cudaMallocHost(void** p, size_t size) { return cuvil_sim::do_malloc(p, size, false); }
template <class T>
inline cudaError_t cudaMallocHost(T** p, size_t size) {
    return cuvil_sim::do_malloc(reinterpret_cast<void**>(p), size, false);
}
inline cudaError_t cudaHostAlloc(void** p, size_t size, unsigned) { return cuvil_sim::do_malloc(p, size, false); }
inline cudaError_t cudaFreeHost(void* p) { return cuvil_sim::do_free(p, false); }

inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    if (cuvil_sim::sync_forbidden())
        return cuvil_sim::api_error(cudaErrorStreamCaptureUnsupported, "cudaMemcpy while a stream captures");
    if (cudaError_t e = cuvil_sim::take_pending()) return e;
    return cuvil_sim::do_copy(dst, src, n, kind, "cudaMemcpy");
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s = 0) {
    if (!cuvil_sim::stream_ok(s)) return cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: stream");
    if (CUstream_st* c = cuvil_sim::capturing(s)) {
        c->graph->ops.push_back(cuvil_sim::Op{[=] { cuvil_sim::do_copy(dst, src, n, kind, "cudaMemcpyAsync (graph)"); }});
        return cudaSuccess;
    }
    return cuvil_sim::do_copy(dst, src, n, kind, "cudaMemcpyAsync");
}
inline cudaError_t cudaMemset(void* dst, int value, size_t n) {
    if (cuvil_sim::sync_forbidden())
        return cuvil_sim::api_error(cudaErrorStreamCaptureUnsupported, "cudaMemset while a stream captures");
    return cuvil_sim::do_set(dst, value, n, "cudaMemset");
}
inline cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t s = 0) {
    if (!cuvil_sim::stream_ok(s)) return cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: stream");
    if (CUstream_st* c = cuvil_sim::capturing(s)) {
        c->graph->ops.push_back(cuvil_sim::Op{[=] { cuvil_sim::do_set(dst, value, n, "cudaMemsetAsync (graph)"); }});
        return cudaSuccess;
    }
    return cuvil_sim::do_set(dst, value, n, "cudaMemsetAsync");
}
template <class T>
inline cudaError_t cudaMemcpyToSymbol(T& symbol, const void* src, size_t n, size_t offset = 0,
                                      cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
    if (offset + n > sizeof(T)) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaMemcpyToSymbol: past the symbol");
    return cuvil_sim::do_copy(reinterpret_cast<char*>(&symbol) + offset, src, n, kind, "cudaMemcpyToSymbol");
}
template <class T>
inline cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, size_t n, size_t offset = 0,
                                        cudaMemcpyKind kind = cudaMemcpyDeviceToHost) {
    if (offset + n > sizeof(T)) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaMemcpyFromSymbol: past the symbol");
    return cuvil_sim::do_copy(dst, reinterpret_cast<const char*>(&symbol) + offset, n, kind, "cudaMemcpyFromSymbol");
}
template <class T>
inline cudaError_t cudaGetSymbolAddress(void** p, T& symbol) {
    if (!p) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaGetSymbolAddress: null pointer");
    *p = reinterpret_cast<void*>(&symbol);
    return cudaSuccess;
}

template <class T>
inline cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
    if (!func) return cuvil_sim::api_error(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute: null function");
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > cuvil_sim::kSharedOptin)
            return cuvil_sim::api_error(cudaErrorInvalidValue,
                                        cuvil_sim::format("cudaFuncSetAttribute: %d bytes of dynamic shared memory "
                                                          "(at most %d)",
                                                          value, cuvil_sim::kSharedOptin));
        std::lock_guard<std::mutex> g(cuvil_sim::state().m);
        cuvil_sim::state().max_dyn_smem[reinterpret_cast<const void*>(func)] = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
        return value >= -1 && value <= 100 ? cudaSuccess
                                           : cuvil_sim::api_error(cudaErrorInvalidValue, "cudaFuncSetAttribute: carveout");
    return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute not emulated");
}
template <class T>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, T* func, int block_size, size_t dyn_smem) {
    if (!n || !func || block_size <= 0) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaOccupancy...");
    int by_threads = 2048 / block_size;
    int by_smem = dyn_smem ? static_cast<int>(233472 / dyn_smem) : 32;
    *n = std::max(0, std::min(std::min(by_threads, by_smem), 32));
    return cudaSuccess;
}

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    if (!s) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaStreamCreate: null pointer");
    CUstream_st* st = new CUstream_st();
    st->flags = flags;
    std::lock_guard<std::mutex> g(cuvil_sim::state().m);
    cuvil_sim::state().streams.push_back(st);
    *s = st;
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int) {
    return cudaStreamCreateWithFlags(s, flags);
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::lock_guard<std::mutex> g(cuvil_sim::state().m);
    auto& v = cuvil_sim::state().streams;
    auto it = std::find(v.begin(), v.end(), s);
    if (it == v.end()) return cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: not a live stream");
    if (s->capturing) {
        --cuvil_sim::state().capturing;
        delete s->graph;
    }
    v.erase(it);
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!cuvil_sim::stream_ok(s))
        return cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: not a live stream");
    if (cuvil_sim::capturing(s)) {
        s->invalidated = true;
        return cuvil_sim::api_error(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize on a capturing stream");
    }
    return cuvil_sim::take_pending();
}
inline cudaError_t cudaStreamQuery(cudaStream_t s) {
    return cuvil_sim::stream_ok(s) ? cudaSuccess
                                   : cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaStreamQuery");
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0) {
    (void)flags;
    if (!cuvil_sim::stream_ok(s) || !e)
        return cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent");
    return cudaSuccess;
}
inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    (void)mode;
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return cuvil_sim::api_error(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture on the default stream");
    if (!cuvil_sim::stream_ok(s))
        return cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture: not a live stream");
    if (s->capturing) return cuvil_sim::api_error(cudaErrorIllegalState, "cudaStreamBeginCapture: already capturing");
    std::lock_guard<std::mutex> g(cuvil_sim::state().m);
    s->capturing = true;
    s->invalidated = false;
    s->graph = new CUgraph_st();
    ++cuvil_sim::state().capturing;
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
    if (!graph) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaStreamEndCapture: null pointer");
    *graph = nullptr;
    if (!cuvil_sim::stream_ok(s) || !cuvil_sim::capturing(s))
        return cuvil_sim::api_error(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not capturing");
    std::lock_guard<std::mutex> g(cuvil_sim::state().m);
    --cuvil_sim::state().capturing;
    s->capturing = false;
    if (s->invalidated) {
        delete s->graph;
        s->graph = nullptr;
        return cuvil_sim::api_error(cudaErrorStreamCaptureInvalidated,
                                    "cudaStreamEndCapture: a synchronous call invalidated the capture");
    }
    *graph = s->graph;
    s->graph = nullptr;
    return cudaSuccess;
}
inline cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
    if (!status) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaStreamIsCapturing: null pointer");
    CUstream_st* c = cuvil_sim::capturing(s);
    *status = !c ? cudaStreamCaptureStatusNone
                 : c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0) {
    (void)flags;
    if (!exec || !graph) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaGraphInstantiate: null pointer");
    CUgraphExec_st* e = new CUgraphExec_st();
    e->ops = graph->ops;
    *exec = e;
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
    return cudaGraphInstantiate(exec, graph, flags);
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaGraphLaunch: null graph");
    if (!cuvil_sim::stream_ok(s)) return cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: stream");
    if (CUstream_st* c = cuvil_sim::capturing(s)) {
        for (const cuvil_sim::Op& op : exec->ops) c->graph->ops.push_back(op);
        return cudaSuccess;
    }
    for (const cuvil_sim::Op& op : exec->ops) op.run();
    return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    if (!e) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaEventCreate: null pointer");
    *e = new CUevent_st();
    (*e)->flags = flags;
    return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0) {
    if (!e || !cuvil_sim::stream_ok(s)) return cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaEventRecord");
    if (CUstream_st* c = cuvil_sim::capturing(s)) {
        c->graph->ops.push_back(cuvil_sim::Op{[e] {
            e->recorded = true;
            e->t = std::chrono::steady_clock::now();
        }});
        return cudaSuccess;
    }
    e->recorded = true;
    e->t = std::chrono::steady_clock::now();
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: null event");
    return cuvil_sim::take_pending();
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
    return e ? cudaSuccess : cuvil_sim::api_error(cudaErrorInvalidResourceHandle, "cudaEventQuery: null event");
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms) return cuvil_sim::api_error(cudaErrorInvalidValue, "cudaEventElapsedTime: null pointer");
    if (!start || !end || !start->recorded || !end->recorded || (start->flags & cudaEventDisableTiming) ||
        (end->flags & cudaEventDisableTiming))
        return cuvil_sim::api_error(cudaErrorInvalidResourceHandle,
                                    "cudaEventElapsedTime: events not recorded or created without timing");
    *ms = std::chrono::duration<float, std::milli>(end->t - start->t).count();
    return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}

/* Harness controls (not CUDA API). */
inline cudaError_t cuvilSimSetWorkerCount(int n) {
    if (n < 0) return cuvil_sim::api_error(cudaErrorInvalidValue, "cuvilSimSetWorkerCount: negative count");
    cuvil_sim::config().workers.store(n);
    return cudaSuccess;
}
inline int cuvilSimWorkerCount() { return cuvil_sim::worker_count(); }
inline cudaError_t cuvilSimSetStackSize(size_t bytes) {
    if (bytes < 16384) return cuvil_sim::api_error(cudaErrorInvalidValue, "cuvilSimSetStackSize: under 16 KiB");
    if (cuvil_sim::g_span != 0)
        return cuvil_sim::api_error(cudaErrorInvalidValue, "cuvilSimSetStackSize: fiber stacks already exist "
                                                           "(call it before the first launch)");
    cuvil_sim::config().stack_bytes.store(bytes);
    return cudaSuccess;
}

#define CUVIL_SIM_LAUNCH(kernel, grid, block, shmem, stream, ...) \
    ::cuvil_sim::launch(kernel, #kernel, ::dim3(grid), ::dim3(block), static_cast<size_t>(shmem), (stream), ##__VA_ARGS__)
#define CUVIL_SIM_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::cuvil_sim::dynamic_shared())

#pragma GCC visibility pop

#define __noinline__ __attribute__((noinline))

#endif /* CUVIL_CUDA_SIM_H */
