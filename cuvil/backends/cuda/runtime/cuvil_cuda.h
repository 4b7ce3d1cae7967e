/* cuvil_cuda.h -- the portable prologue of every generated .cu file (included first).
 *
 * One source, three compilers:
 *   nvcc   (__CUDACC__)      the CUDA runtime, cuda_fp16.h, cuda_bf16.h and mma.h (WMMA);
 *   hipcc  (__HIPCC__)       the HIP runtime, hip_fp16.h and hip_bf16.h, with the cuda* names the
 *                            generated code uses mapped to their hip* equivalents (list below);
 *   g++    (CUVIL_CUDA_SIM)  cuvil_cuda_sim.h, the CUDA execution model on the CPU (C++17).
 *
 * Contract for the generated code: where CUDA syntax is not C++, use the two macros below.
 *
 *   CUVIL_LAUNCH(kernel, grid, block, shmem_bytes, stream, args...)
 *       Launches `kernel` (a __global__ function name, not a template-id with commas: give a
 *       template instance a name first) with `grid` and `block` (dim3 or integers), `shmem_bytes` of
 *       dynamic shared memory and `stream` (0 for the default stream). nvcc/hipcc:
 *       kernel<<<grid, block, shmem_bytes, stream>>>(args...). It is a statement; its errors come back
 *       through cudaGetLastError(), as for <<<>>>. Arguments are evaluated once, on the host.
 *   CUVIL_DYNAMIC_SHARED(type, name)
 *       Inside a kernel, declares `name` as the block's dynamic shared memory viewed as `type`
 *       elements. nvcc/hipcc: extern __shared__ type name[] (one declaration per kernel; use the same
 *       element type, or one byte array carved by hand, as CUDA requires); under the simulator a
 *       `type* name` pointing at it. Never write `extern __shared__` directly.
 *
 *   CUVIL_HAS_WMMA is 1 where nvcuda::wmma exists (nvcc, the simulator), 0 under HIP.
 *   CUVIL_CUDA_TARGET names the compiler: "nvcc", "hip" or "sim".
 *
 * Everything else is ordinary CUDA C++: __global__/__device__/__shared__/__constant__, threadIdx
 * and friends, the warp intrinsics, atomics, __half/__nv_bfloat16, the runtime API. The simulator
 * supports the subset listed in cuvil_cuda_sim.h; HIP supports what hipcc supports (note: the warp
 * is 64 lanes wide on most AMD GPUs).
 */
#ifndef CUVIL_CUDA_H
#define CUVIL_CUDA_H

#if defined(CUVIL_CUDA_SIM)

#include "cuvil_cuda_sim.h"
#define CUVIL_CUDA_TARGET "sim"
#define CUVIL_HAS_WMMA 1
#define CUVIL_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
    CUVIL_SIM_LAUNCH(kernel, grid, block, shmem_bytes, stream, ##__VA_ARGS__)
#define CUVIL_DYNAMIC_SHARED(type, name) CUVIL_SIM_DYNAMIC_SHARED(type, name)

#elif defined(__HIPCC__)

#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <hip/hip_bf16.h>
#define CUVIL_CUDA_TARGET "hip"
#define CUVIL_HAS_WMMA 0
typedef __hip_bfloat16 __nv_bfloat16;
typedef __hip_bfloat162 __nv_bfloat162;
typedef __hip_bfloat16 nv_bfloat16;
typedef __hip_bfloat162 nv_bfloat162;
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaErrorInvalidConfiguration hipErrorInvalidConfiguration
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorLaunchFailure hipErrorLaunchFailure
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName
#define cudaGetLastError hipGetLastError
#define cudaPeekAtLastError hipPeekAtLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrMaxSharedMemoryPerBlockOptin hipDeviceAttributeSharedMemPerBlockOptin
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaMemGetInfo hipMemGetInfo
#define cudaMalloc hipMalloc
#define cudaMallocAsync hipMallocAsync
#define cudaFree hipFree
#define cudaFreeAsync hipFreeAsync
#define cudaMallocHost hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyKind hipMemcpyKind
#define cudaMemcpyHostToHost hipMemcpyHostToHost
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemcpyDefault hipMemcpyDefault
#define cudaMemcpyToSymbol hipMemcpyToSymbol
#define cudaFuncSetAttribute(f, attr, value) hipFuncSetAttribute(reinterpret_cast<const void*>(f), attr, value)
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaStream_t hipStream_t
#define cudaStreamCreate hipStreamCreate
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventDestroy hipEventDestroy
#define cudaGraph_t hipGraph_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamEndCapture hipStreamEndCapture
#define cudaStreamCaptureModeGlobal hipStreamCaptureModeGlobal
#define cudaStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaGraphInstantiate(exec, graph, flags) hipGraphInstantiate(exec, graph, nullptr, nullptr, 0)
#define cudaGraphLaunch hipGraphLaunch
#define cudaGraphExecDestroy hipGraphExecDestroy
#define cudaGraphDestroy hipGraphDestroy
#define CUVIL_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
    kernel<<<(grid), (block), (shmem_bytes), (stream)>>>(__VA_ARGS__)
#define CUVIL_DYNAMIC_SHARED(type, name) extern __shared__ type name[]

#elif defined(__CUDACC__)

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#define CUVIL_CUDA_TARGET "nvcc"
#define CUVIL_HAS_WMMA 1
#define CUVIL_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
    kernel<<<(grid), (block), (shmem_bytes), (stream)>>>(__VA_ARGS__)
#define CUVIL_DYNAMIC_SHARED(type, name) extern __shared__ type name[]

#else
#error "cuvil_cuda.h: compile with nvcc, hipcc, or a C++17 compiler with -DCUVIL_CUDA_SIM"
#endif

#endif /* CUVIL_CUDA_H */
