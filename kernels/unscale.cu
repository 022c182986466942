/* Fused multi-tensor unscale + non-finite check (+ optional L2 norms)
 * on CUDA: the GPU twin of c_ops/src/unscale.c.
 *
 * One launch covers a group of up to 256 or 1024 tensors (see common.cuh,
 * multi-tensor apply); each block takes one chunk of
 * MIXPREC__UNSCALE_CHUNK elements of one tensor, with the tensor's dtype
 * chosen per chunk on the device, so a mixed-dtype list needs no more
 * launches than a uniform one. With norms, each block stores its chunk's sum
 * of squares in the workspace; a second kernel per group adds each tensor's
 * chunk sums in index order and a last one adds the tensors' sums in order,
 * so the norms are the same on every run (no atomics). */
#include "common.cuh"
#include "unscale_check.h"
#include "unscale_rules.h"

/* Elements per chunk (one block's share). Small enough that a list of
 * ResNet/ViT-sized gradients gives several blocks per SM, large enough that
 * the per-chunk search and reduction are noise. */
#define MIXPREC__UNSCALE_CHUNK 16384
#define MIXPREC__UNSCALE_THREADS 256
/* Independent 16-byte loads in flight per thread before the first use. */
#define MIXPREC__UNSCALE_ILP 4

/* Group capacities: a list that fits takes the small argument struct
 * (~6 KB) and avoids copying ~25 KB of kernel parameters per launch. */
#define MIXPREC__UNSCALE_CAP_SMALL 256
#define MIXPREC__UNSCALE_CAP_LARGE 1024

template <int CAP>
struct mixprec__unscale_args {
  void *data[CAP];
  int64_t numel[CAP];
  int64_t chunk_start[CAP + 1]; /* group-local chunk prefix sums */
  int64_t chunk_base;           /* global index of the group's chunk 0 */
  int64_t first;                /* list index of the group's tensor 0 */
  int32_t count;
  uint8_t dtype[CAP];
};

/* The struct plus the largest set of scalar arguments passed next to it. */
static_assert(sizeof(mixprec__unscale_args<MIXPREC__UNSCALE_CAP_LARGE>) +
                      4 * sizeof(void *) <=
                  MIXPREC__MTA_PARAM_BUDGET,
              "unscale kernel arguments exceed the parameter budget");

/* One element, given its storage bits: returns the bits to store. The
 * product is [note: unscale element], rounded once more to the storage type; the norm
 * takes the value as stored. A float squared is exact in double, so the
 * accumulation below is the same whether or not it is fused. */
template <int D, bool NORM>
static __device__ __forceinline__ uint32_t mixprec__unscale_bits(
    uint32_t in, float inv_scale, int *nonfinite, double *sq) {
  const float o =
      mixprec__unscale_elem(mixprec__value_of_bits((mixprec_dtype)D, in), inv_scale, nonfinite);
  const uint32_t out = mixprec__bits_of_value((mixprec_dtype)D, o);
  if constexpr (NORM) {
    const float stored = mixprec__value_of_bits((mixprec_dtype)D, out);
    *sq += (double)stored * (double)stored;
  }
  return out;
}

/* 16 bytes: four floats or eight 16-bit values, in memory order (the lower
 * half of each 32-bit word is the earlier element). */
template <int D, bool NORM>
static __device__ __forceinline__ uint4 mixprec__unscale_vec(
    uint4 r, float inv_scale, int *nonfinite, double *sq) {
  uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    if constexpr (D == MIXPREC_F32) {
      w[k] = mixprec__unscale_bits<D, NORM>(w[k], inv_scale, nonfinite, sq);
    } else {
      uint32_t lo = mixprec__unscale_bits<D, NORM>(w[k] & 0xffffu, inv_scale,
                                                   nonfinite, sq);
      uint32_t hi = mixprec__unscale_bits<D, NORM>(w[k] >> 16, inv_scale,
                                                   nonfinite, sq);
      w[k] = lo | (hi << 16);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/* WRITE = false (mixprec_cuda_grad_norm): the same check and norm, no store. */
template <int D, bool NORM, bool WRITE>
static __device__ __forceinline__ void mixprec__unscale_scalar(
    char *base, int i, float inv_scale, int *nonfinite, double *sq) {
  if constexpr (D == MIXPREC_F32) {
    uint32_t *p = (uint32_t *)base + i;
    const uint32_t o = mixprec__unscale_bits<D, NORM>(*p, inv_scale, nonfinite, sq);
    if constexpr (WRITE) *p = o;
  } else {
    uint16_t *p = (uint16_t *)base + i;
    const uint16_t o = (uint16_t)mixprec__unscale_bits<D, NORM>(*p, inv_scale, nonfinite,
                                                                sq);
    if constexpr (WRITE) *p = o;
  }
}

/* The n elements (n <= chunk size) at base, by the whole block: scalar
 * elements up to the first 16-byte boundary, 16-byte vectors, scalar tail.
 * Chunks start at multiples of the chunk size (a multiple of 16 bytes) from
 * the tensor's start, so every chunk of a tensor has the same head length and
 * a misaligned tensor still gets vector loads. */
template <int D, bool NORM, bool WRITE>
static __device__ void mixprec__unscale_span(char *base, int n,
                                             float inv_scale, int *nonfinite,
                                             double *sq) {
  constexpr int ES = D == MIXPREC_F32 ? 4 : 2;
  constexpr int VEC = 16 / ES;
  constexpr int T = MIXPREC__UNSCALE_THREADS;
  const int tid = threadIdx.x;
  const int misalign = (int)((uintptr_t)base % 16);
  int head = misalign ? (16 - misalign) / ES : 0;
  if (head > n) head = n;
  const int nvec = (n - head) / VEC;
  const int tail = head + nvec * VEC;

  if (tid < head)
    mixprec__unscale_scalar<D, NORM, WRITE>(base, tid, inv_scale, nonfinite, sq);
  if (tid < n - tail)
    mixprec__unscale_scalar<D, NORM, WRITE>(base, tail + tid, inv_scale, nonfinite,
                                            sq);

  uint4 *vp = (uint4 *)(base + (size_t)head * ES);
  for (int i = tid; i < nvec; i += MIXPREC__UNSCALE_ILP * T) {
    uint4 r[MIXPREC__UNSCALE_ILP];
#pragma unroll
    for (int k = 0; k < MIXPREC__UNSCALE_ILP; k++) {
      const int j = i + k * T;
      r[k] = j < nvec ? vp[j] : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int k = 0; k < MIXPREC__UNSCALE_ILP; k++) {
      const int j = i + k * T;
      if (j < nvec) {
        const uint4 o = mixprec__unscale_vec<D, NORM>(r[k], inv_scale, nonfinite, sq);
        if constexpr (WRITE) vp[j] = o;
      }
    }
  }
}

/* partials (with NORM): one double per chunk of the whole list, indexed by
 * global chunk number. */
template <int CAP, bool NORM, bool WRITE>
__global__ void __launch_bounds__(MIXPREC__UNSCALE_THREADS)
    mixprec__unscale_kernel(const __grid_constant__ mixprec__unscale_args<CAP> a,
                            const float *inv_scale, float *found_inf,
                            double *partials) {
  __shared__ double scratch[MIXPREC__UNSCALE_THREADS / MIXPREC__WARP];
  const float inv = *inv_scale;
  const int64_t n_chunks = a.chunk_start[a.count];
  int nonfinite = 0;
  for (int64_t c = blockIdx.x; c < n_chunks; c += gridDim.x) {
    const int t = mixprec__mta_find(a.chunk_start, a.count, c);
    const int64_t begin = (c - a.chunk_start[t]) * MIXPREC__UNSCALE_CHUNK;
    const int64_t left = a.numel[t] - begin;
    const int n = left < MIXPREC__UNSCALE_CHUNK ? (int)left
                                                : MIXPREC__UNSCALE_CHUNK;
    double sq = 0.0;
    MIXPREC__DISPATCH(a.dtype[t], D,
                      mixprec__unscale_span<D, NORM, WRITE>(
                          (char *)a.data[t] + begin * (D == MIXPREC_F32 ? 4 : 2), n, inv,
                          &nonfinite, &sq));
    if constexpr (NORM) {
      const double s = mixprec__block_sum_f64(sq, scratch);
      if (threadIdx.x == 0) partials[a.chunk_base + c] = s;
    }
  }
  /* Racy, but every writer stores the same value. */
  if (nonfinite) *found_inf = 1.0f;
}

/* One block per tensor of the group: adds the tensor's chunk sums. */
template <int CAP>
__global__ void __launch_bounds__(MIXPREC__UNSCALE_THREADS)
    mixprec__unscale_norm_kernel(
        const __grid_constant__ mixprec__unscale_args<CAP> a,
        const double *partials, double *tensor_sums, float *norms) {
  __shared__ double scratch[MIXPREC__UNSCALE_THREADS / MIXPREC__WARP];
  const int t = blockIdx.x;
  const int64_t begin = a.chunk_base + a.chunk_start[t];
  const int64_t end = a.chunk_base + a.chunk_start[t + 1];
  double s = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    s += partials[i];
  s = mixprec__block_sum_f64(s, scratch);
  if (threadIdx.x == 0) {
    tensor_sums[a.first + t] = s;
    if (norms != NULL) norms[a.first + t] = (float)sqrt(s);
  }
}

static __global__ void __launch_bounds__(MIXPREC__UNSCALE_THREADS)
    mixprec__unscale_total_kernel(const double *tensor_sums,
                                  int64_t n_tensors, float *total_norm) {
  __shared__ double scratch[MIXPREC__UNSCALE_THREADS / MIXPREC__WARP];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n_tensors; i += blockDim.x)
    s += tensor_sums[i];
  s = mixprec__block_sum_f64(s, scratch);
  if (threadIdx.x == 0) *total_norm = (float)sqrt(s);
}

/* Workspace layout: chunk sums (one double per chunk of the list), then
 * tensor sums (one double per tensor). -1 if that count overflows. */
static int64_t mixprec__unscale_workspace_doubles(
    const mixprec_tensor *tensors, int64_t n_tensors, int64_t *n_chunks) {
  const int64_t limit = INT64_MAX / (int64_t)sizeof(double);
  if (n_tensors > limit) return -1;
  int64_t total = n_tensors, chunks = 0;
  for (int64_t i = 0; i < n_tensors; i++) {
    const int64_t c =
        mixprec__mta_chunks(tensors[i].numel, MIXPREC__UNSCALE_CHUNK);
    if (c > limit - total) return -1;
    total += c;
    chunks += c;
  }
  *n_chunks = chunks;
  return total;
}

/* Unscale launch (and, with norms, the per-tensor sums) for tensors
 * [first, first + count) of the list. */
template <int CAP>
static mixprec_status mixprec__unscale_group(
    const mixprec_tensor *tensors, int64_t first, int count,
    int64_t *chunk_base, const float *inv_scale, float *found_inf,
    float *norms, double *partials, double *tensor_sums, bool write,
    cudaStream_t stream) {
  mixprec__unscale_args<CAP> a;
  memset(&a, 0, sizeof a);
  for (int i = 0; i < count; i++) {
    a.data[i] = tensors[first + i].data;
    a.numel[i] = tensors[first + i].numel;
    a.dtype[i] = (uint8_t)tensors[first + i].dtype;
  }
  const int64_t n_chunks = mixprec__mta_chunk_prefix(
      tensors + first, count, MIXPREC__UNSCALE_CHUNK, a.chunk_start);
  a.chunk_base = *chunk_base;
  a.first = first;
  a.count = count;

  if (n_chunks > 0) {
    const unsigned grid = (unsigned)(n_chunks < MIXPREC__MAX_GRID
                                         ? n_chunks
                                         : MIXPREC__MAX_GRID);
    if (partials != NULL && write)
      mixprec__unscale_kernel<CAP, true, true>
          <<<grid, MIXPREC__UNSCALE_THREADS, 0, stream>>>(a, inv_scale,
                                                          found_inf, partials);
    else if (write)
      mixprec__unscale_kernel<CAP, false, true>
          <<<grid, MIXPREC__UNSCALE_THREADS, 0, stream>>>(a, inv_scale,
                                                          found_inf, NULL);
    else if (partials != NULL)
      mixprec__unscale_kernel<CAP, true, false>
          <<<grid, MIXPREC__UNSCALE_THREADS, 0, stream>>>(a, inv_scale,
                                                          found_inf, partials);
    else
      mixprec__unscale_kernel<CAP, false, false>
          <<<grid, MIXPREC__UNSCALE_THREADS, 0, stream>>>(a, inv_scale,
                                                          found_inf, NULL);
    mixprec_status st = mixprec__cuda_launch_status();
    if (st != MIXPREC_OK) return st;
  }
  if (partials != NULL) {
    mixprec__unscale_norm_kernel<CAP>
        <<<(unsigned)count, MIXPREC__UNSCALE_THREADS, 0, stream>>>(
            a, partials, tensor_sums, norms);
    mixprec_status st = mixprec__cuda_launch_status();
    if (st != MIXPREC_OK) return st;
  }
  *chunk_base += n_chunks;
  return MIXPREC_OK;
}

extern "C" MIXPREC_API int64_t mixprec_cuda_unscale_workspace_size(
    const mixprec_tensor *tensors, int64_t n_tensors, int want_norm) {
  if (mixprec__check_tensor_list(tensors, n_tensors) != MIXPREC_OK) return -1;
  int64_t n_chunks;
  const int64_t doubles =
      mixprec__unscale_workspace_doubles(tensors, n_tensors, &n_chunks);
  if (doubles < 0) return -1;
  return want_norm ? doubles * (int64_t)sizeof(double) : 0;
}

/* mixprec_cuda_unscale (write) and mixprec_cuda_grad_norm (read only). */
static mixprec_status mixprec__unscale_run(
    const mixprec_tensor *tensors, int64_t n_tensors, const float *inv_scale,
    float *found_inf, float *norms, float *total_norm, void *workspace,
    int64_t workspace_bytes, bool write, void *stream) {
  mixprec_status st = mixprec__unscale_check(tensors, n_tensors, inv_scale, found_inf);
  if (st != MIXPREC_OK) return st;
  int64_t n_chunks;
  const int64_t doubles =
      mixprec__unscale_workspace_doubles(tensors, n_tensors, &n_chunks);
  if (doubles < 0) return MIXPREC_ERR_BAD_SIZE;
  st = mixprec__check_tensor_alignment(tensors, n_tensors);
  if (st != MIXPREC_OK) return st;

  const int want_norm = norms != NULL || total_norm != NULL;
  double *partials = NULL, *tensor_sums = NULL;
  if (want_norm && doubles > 0) {
    if (workspace == NULL) return MIXPREC_ERR_NULL_POINTER;
    if (workspace_bytes < doubles * (int64_t)sizeof(double) ||
        (uintptr_t)workspace % sizeof(double) != 0)
      return MIXPREC_ERR_BAD_ARGUMENT;
    partials = (double *)workspace;
    tensor_sums = partials + n_chunks;
  }

  cudaStream_t s = (cudaStream_t)stream;
  if (n_tensors == 0) {
    /* The sum over no tensors; a memset node is as capturable as a kernel. */
    if (total_norm != NULL)
      return mixprec__cuda_status(
          cudaMemsetAsync(total_norm, 0, sizeof(float), s));
    return MIXPREC_OK;
  }

  int64_t chunk_base = 0;
  for (int64_t first = 0; first < n_tensors;) {
    const int64_t left = n_tensors - first;
    int count;
    if (left <= MIXPREC__UNSCALE_CAP_SMALL) {
      count = (int)left;
      st = mixprec__unscale_group<MIXPREC__UNSCALE_CAP_SMALL>(
          tensors, first, count, &chunk_base, inv_scale, found_inf, norms,
          partials, tensor_sums, write, s);
    } else {
      count = mixprec__mta_group_count(n_tensors, first,
                                       MIXPREC__UNSCALE_CAP_LARGE);
      st = mixprec__unscale_group<MIXPREC__UNSCALE_CAP_LARGE>(
          tensors, first, count, &chunk_base, inv_scale, found_inf, norms,
          partials, tensor_sums, write, s);
    }
    if (st != MIXPREC_OK) return st;
    first += count;
  }

  if (total_norm != NULL) {
    mixprec__unscale_total_kernel<<<1, MIXPREC__UNSCALE_THREADS, 0, s>>>(
        tensor_sums, n_tensors, total_norm);
    return mixprec__cuda_launch_status();
  }
  return MIXPREC_OK;
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_unscale(
    const mixprec_tensor *tensors, int64_t n_tensors, const float *inv_scale,
    float *found_inf, float *norms, float *total_norm, void *workspace,
    int64_t workspace_bytes, void *stream) {
  return mixprec__unscale_run(tensors, n_tensors, inv_scale, found_inf, norms,
                              total_norm, workspace, workspace_bytes, true,
                              stream);
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_grad_norm(
    const mixprec_tensor *tensors, int64_t n_tensors, const float *inv_scale,
    float *found_inf, float *norms, float *total_norm, void *workspace,
    int64_t workspace_bytes, void *stream) {
  return mixprec__unscale_run(tensors, n_tensors, inv_scale, found_inf, norms,
                              total_norm, workspace, workspace_bytes, false,
                              stream);
}
