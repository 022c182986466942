/* The forward-overflow check on CUDA: the GPU twin of c_ops/src/overflow.c.
 *
 * One launch per group of up to MIXPREC__OVERFLOW_CAP tensors (outputs first,
 * then inputs), one block per chunk of one tensor (multi-tensor apply, see
 * common.cuh). Each block folds its chunk's largest finite magnitude into the
 * slot with an integer atomicMax (the same max in any order: see [note:
 * overflow bits]) and its non-finite flag into the slot's scratch fields; the
 * last block of the call's last launch (ticket counter in the slot's scratch)
 * turns the two flags into the CPU's fields and clears the scratch. */
#include "common.cuh"
#include "overflow_internal.h"

#define MIXPREC__OVERFLOW_CHUNK 16384
#define MIXPREC__OVERFLOW_THREADS 256
#define MIXPREC__OVERFLOW_CAP 256
/* A grid this large already fills any GPU; more chunks are grid-strided. */
#define MIXPREC__OVERFLOW_MAX_GRID 65535

/* Scratch fields of a slot (see MIXPREC_OVERFLOW_SLOT in overflow.h). */
#define MIXPREC__OVERFLOW_OUT_BAD 4
#define MIXPREC__OVERFLOW_IN_BAD 5
#define MIXPREC__OVERFLOW_TICKET 6

struct mixprec__overflow_args {
  const void *data[MIXPREC__OVERFLOW_CAP];
  int64_t numel[MIXPREC__OVERFLOW_CAP];
  int64_t chunk_start[MIXPREC__OVERFLOW_CAP + 1];
  int32_t count;
  int32_t n_outputs; /* tensors [0, n_outputs) of the group are outputs */
  int32_t final;     /* the call's last launch: its last block combines */
  uint8_t dtype[MIXPREC__OVERFLOW_CAP];
};

static_assert(sizeof(mixprec__overflow_args) + 2 * sizeof(void *) <= MIXPREC__MTA_PARAM_BUDGET,
              "overflow kernel arguments exceed the parameter budget");

/* One thread's share of a chunk of dtype D: the CPU's two maxima
 * (overflow.c scan_body). */
template <int D>
static __device__ __forceinline__ void mixprec__overflow_span(const void *data, int n,
                                                             uint32_t *m, int *bad) {
  const uint32_t mask = mixprec__overflow_abs_mask((mixprec_dtype)D);
  const uint32_t inf = mixprec__overflow_inf_bits((mixprec_dtype)D);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint32_t v = (D == MIXPREC_F32 ? ((const uint32_t *)data)[i]
                                         : (uint32_t)((const uint16_t *)data)[i]) & mask;
    if (v >= inf) *bad = 1; else if (v > *m) *m = v;
  }
}

/* The chunk scan: mixprec__overflow_span per thread, then a block max and
 * or. */
static __global__ void __launch_bounds__(MIXPREC__OVERFLOW_THREADS)
    mixprec__overflow_kernel(const __grid_constant__ mixprec__overflow_args a, float *slot) {
  __shared__ uint32_t warp_max[MIXPREC__OVERFLOW_THREADS / MIXPREC__WARP];
  const int64_t n_chunks = a.chunk_start[a.count];
  for (int64_t c = blockIdx.x; c < n_chunks; c += gridDim.x) {
    const int t = mixprec__mta_find(a.chunk_start, a.count, c);
    const mixprec_dtype dt = (mixprec_dtype)a.dtype[t];
    const int64_t begin = (c - a.chunk_start[t]) * MIXPREC__OVERFLOW_CHUNK;
    const int64_t left = a.numel[t] - begin;
    const int n = left < MIXPREC__OVERFLOW_CHUNK ? (int)left : MIXPREC__OVERFLOW_CHUNK;
    uint32_t m = 0;
    int bad = 0;
    MIXPREC__DISPATCH(dt, D, mixprec__overflow_span<D>(
        (const char *)a.data[t] + begin * (D == MIXPREC_F32 ? 4 : 2), n, &m, &bad));
    for (int off = MIXPREC__WARP / 2; off > 0; off /= 2) {
      const uint32_t o = __shfl_down_sync(0xffffffffu, m, off);
      m = o > m ? o : m;
    }
    if (threadIdx.x % MIXPREC__WARP == 0) warp_max[threadIdx.x / MIXPREC__WARP] = m;
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
      for (int w = 1; w < MIXPREC__OVERFLOW_THREADS / MIXPREC__WARP; w++)
        m = warp_max[w] > m ? warp_max[w] : m;
      if (t < a.n_outputs) {
        float v = 0.0f;
        MIXPREC__DISPATCH(dt, D, v = mixprec__value_of_bits(D, m));
        /* Non-negative floats order as their bits. */
        if (v > 0.0f) atomicMax((unsigned int *)&slot[MIXPREC_OVERFLOW_AMAX], __float_as_uint(v));
        if (bad) slot[MIXPREC__OVERFLOW_OUT_BAD] = 1.0f; /* racy; same value */
      } else if (bad) {
        slot[MIXPREC__OVERFLOW_IN_BAD] = 1.0f;
      }
    }
    __syncthreads(); /* warp_max is reused by the next chunk */
  }
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned int *ticket = (unsigned int *)&slot[MIXPREC__OVERFLOW_TICKET];
    if (atomicAdd(ticket, 1u) == gridDim.x - 1) {
      /* Every other block's stores are visible after their fences. */
      *ticket = 0u;
      if (a.final) {
        volatile float *s = slot;
        if (s[MIXPREC__OVERFLOW_OUT_BAD] != 0.0f) {
          s[MIXPREC_OVERFLOW_NONFINITE] = 1.0f;
          s[s[MIXPREC__OVERFLOW_IN_BAD] != 0.0f ? MIXPREC_OVERFLOW_INPUT_NONFINITE
                                                : MIXPREC_OVERFLOW_FROM_FINITE] = 1.0f;
        }
        s[MIXPREC__OVERFLOW_OUT_BAD] = 0.0f;
        s[MIXPREC__OVERFLOW_IN_BAD] = 0.0f;
      }
    }
  }
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_overflow_check(
    const mixprec_tensor *outputs, int64_t n_outputs, const mixprec_tensor *inputs,
    int64_t n_inputs, float *record, int64_t n_slots, int64_t slot, void *stream) {
  mixprec_status st =
      mixprec__overflow_check_args(outputs, n_outputs, inputs, n_inputs, record, n_slots, slot);
  if (st != MIXPREC_OK) return st;
  if ((st = mixprec__check_tensor_alignment(outputs, n_outputs)) != MIXPREC_OK) return st;
  if ((st = mixprec__check_tensor_alignment(inputs, n_inputs)) != MIXPREC_OK) return st;
  if ((uintptr_t)record % sizeof(float) != 0) return MIXPREC_ERR_BAD_ARGUMENT;
  float *s = record + slot * MIXPREC_OVERFLOW_SLOT;
  const int64_t n = n_outputs + n_inputs;
  /* Always at least one launch: its last block is the one that combines. */
  for (int64_t first = 0; first == 0 || first < n; first += MIXPREC__OVERFLOW_CAP) {
    mixprec__overflow_args a;
    memset(&a, 0, sizeof a);
    const int count = mixprec__mta_group_count(n, first, MIXPREC__OVERFLOW_CAP);
    mixprec_tensor group[MIXPREC__OVERFLOW_CAP];
    for (int i = 0; i < count; i++) {
      const int64_t k = first + i;
      group[i] = k < n_outputs ? outputs[k] : inputs[k - n_outputs];
      a.data[i] = group[i].data;
      a.numel[i] = group[i].numel;
      a.dtype[i] = (uint8_t)group[i].dtype;
    }
    const int64_t outs_left = n_outputs - first;
    a.n_outputs = outs_left <= 0 ? 0 : outs_left >= count ? count : (int32_t)outs_left;
    a.count = count;
    a.final = first + MIXPREC__OVERFLOW_CAP >= n;
    const int64_t n_chunks =
        mixprec__mta_chunk_prefix(group, count, MIXPREC__OVERFLOW_CHUNK, a.chunk_start);
    const unsigned grid = (unsigned)(n_chunks < 1 ? 1
                                     : n_chunks < MIXPREC__OVERFLOW_MAX_GRID
                                         ? n_chunks
                                         : MIXPREC__OVERFLOW_MAX_GRID);
    mixprec__overflow_kernel<<<grid, MIXPREC__OVERFLOW_THREADS, 0, (cudaStream_t)stream>>>(a, s);
    if ((st = mixprec__cuda_launch_status()) != MIXPREC_OK) return st;
  }
  return MIXPREC_OK;
}
