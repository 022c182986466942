/* Internal helpers shared by the CUDA kernels: 16-bit conversions, the CUDA
 * status mapping, a deterministic block sum, and the multi-tensor-apply
 * packing (chunk prefixes in a __grid_constant__ kernel argument). Included
 * only by the .cu files of kernels/; every name starts with mixprec__. */
#ifndef MIXPREC_KERNELS_COMMON_CUH
#define MIXPREC_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "compiler.h"
#include "dispatch.h"
#include "mixprec/mixprec.h"

/* ---- values ------------------------------------------------------------- */

/* Bit tests rather than isfinite(): they cannot be folded away by any
 * floating-point optimisation mode. */
MIXPREC__HD int mixprec__f32_is_finite(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (u & 0x7f800000u) != 0x7f800000u;
}

/* Widening is exact. Narrowing uses the hardware's round-to-nearest-even
 * conversions, which keep subnormals and overflow to inf like the CPU
 * converters. A NaN stays a NaN, but its payload and sign are the hardware's:
 * GPU arithmetic already replaces every NaN by its canonical one, so only
 * NaN-ness can match the CPU, never the bits. */
MIXPREC__DEVICE float mixprec__f16_to_f32(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

MIXPREC__DEVICE uint16_t mixprec__f32_to_f16(float f) {
  return __half_as_ushort(__float2half_rn(f));
}

MIXPREC__DEVICE float mixprec__bf16_to_f32(uint16_t bits) {
  return __uint_as_float((uint32_t)bits << 16);
}

MIXPREC__DEVICE uint16_t mixprec__f32_to_bf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

/* mixprec__load_f32 / mixprec__store_f32 and the other element accesses by
 * dtype, on the converters above (the CPU's too, on its own). */
#include "element.h"

/* A device load of an element that is not aligned to its size faults and
 * ruins the CUDA context, so such a pointer is refused up front rather than
 * trusted (the C API requires element alignment; the CPU never faults). */
MIXPREC__INLINE mixprec_status mixprec__check_tensor_alignment(
    const mixprec_tensor *tensors, int64_t n_tensors) {
  for (int64_t i = 0; i < n_tensors; i++) {
    if (tensors[i].numel > 0 &&
        (uintptr_t)tensors[i].data % (uintptr_t)mixprec_dtype_size(tensors[i].dtype) != 0)
      return MIXPREC_ERR_BAD_ARGUMENT;
  }
  return MIXPREC_OK;
}

/* ---- CUDA status ------------------------------------------------------- */

MIXPREC__HD mixprec_status mixprec__cuda_status(cudaError_t err) {
  return err == cudaSuccess ? MIXPREC_OK : MIXPREC_ERR_CUDA;
}

/* After a <<<>>> launch: a bad configuration or a missing kernel image is
 * only reported through cudaGetLastError. */
MIXPREC__INLINE mixprec_status mixprec__cuda_launch_status(void) {
  return mixprec__cuda_status(cudaGetLastError());
}

/* ---- deterministic block reduction -------------------------------------- */

#define MIXPREC__WARP 32

/* Sum of one double per thread over the block, in a fixed order (warp
 * shuffle tree, then warps in index order), so the result is bit-identical
 * from run to run. blockDim.x must be a multiple of 32 and at most 1024;
 * every thread of the block must call it; `scratch` is shared memory of at
 * least blockDim.x / 32 doubles, reusable as soon as this returns. The
 * result is valid in thread 0 only. */
MIXPREC__DEVICE double mixprec__block_sum_f64(double v, double *scratch) {
  const int lane = threadIdx.x % MIXPREC__WARP;
  const int warp = threadIdx.x / MIXPREC__WARP;
  for (int offset = MIXPREC__WARP / 2; offset > 0; offset /= 2)
    v += __shfl_down_sync(0xffffffffu, v, offset);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double sum = 0.0;
  if (threadIdx.x == 0) {
    const int n_warps = blockDim.x / MIXPREC__WARP;
    for (int w = 0; w < n_warps; w++) sum += scratch[w];
  }
  __syncthreads();
  return sum;
}

/* ---- multi-tensor apply --------------------------------------------------
 *
 * A list of tensors is cut into chunks of a fixed number of elements; chunk
 * boundaries are at multiples of the chunk size from each tensor's start, so
 * a chunk never spans two tensors and its place does not depend on how the
 * list is split into launches. Each launch takes a group of consecutive
 * tensors whose pointers, sizes, dtypes and chunk prefix sums are packed into
 * one __grid_constant__ struct (read from the constant bank, never copied per
 * thread); block b finds its chunk's tensor by binary search over the
 * prefix sums. Groups are bounded by tensor count only; the chunk loop in the
 * kernel is grid-strided, so any chunk count fits in one launch.
 *
 * Usage (host), for a list of n tensors and a group capacity CAP:
 *   int64_t chunk_base = 0;
 *   for (int64_t first = 0; first < n; first += CAP) {
 *     int count = mixprec__mta_group_count(n, first, CAP);
 *     ... copy pointers/dtypes of tensors[first .. first+count) ...
 *     int64_t n_chunks = mixprec__mta_chunk_prefix(tensors + first, count,
 *                                                  CHUNK, args.chunk_start);
 *     ... launch with args, chunk_base; chunk_base += n_chunks ...
 *   }
 */

/* Kernel parameters may take 32764 bytes (CUDA 12.1+, sm_70+); stay under
 * it with room for the scalar arguments next to the packed struct. */
#define MIXPREC__MTA_PARAM_BUDGET 32000

/* Most blocks a 1-D grid may have. */
#define MIXPREC__MAX_GRID 2147483647LL

MIXPREC__HD int64_t mixprec__mta_chunks(int64_t numel,
                                                 int64_t chunk_elems) {
  return numel / chunk_elems + (numel % chunk_elems != 0);
}

MIXPREC__INLINE int mixprec__mta_group_count(int64_t n_tensors, int64_t first,
                                           int capacity) {
  int64_t left = n_tensors - first;
  return left < capacity ? (int)left : capacity;
}

/* chunk_start[0..count] = prefix sums of the tensors' chunk counts (so
 * chunk_start[count] is the group's chunk count, also returned). */
MIXPREC__INLINE int64_t mixprec__mta_chunk_prefix(const mixprec_tensor *tensors,
                                                int count, int64_t chunk_elems,
                                                int64_t *chunk_start) {
  int64_t total = 0;
  for (int i = 0; i < count; i++) {
    chunk_start[i] = total;
    total += mixprec__mta_chunks(tensors[i].numel, chunk_elems);
  }
  chunk_start[count] = total;
  return total;
}

/* The tensor t of the group holding group-local chunk c, i.e. the last t with
 * chunk_start[t] <= c. Needs 0 <= c < chunk_start[count]; tensors without
 * chunks share their prefix with the next tensor and are never returned. */
MIXPREC__DEVICE int mixprec__mta_find(const int64_t *chunk_start, int count,
                                      int64_t c) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (chunk_start[mid] <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

#endif /* MIXPREC_KERNELS_COMMON_CUH */
