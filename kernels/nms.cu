/* Greedy NMS and class-aware NMS on CUDA: the GPU twin of c_ops/src/nms.c.
 *
 * 1. keys: each score becomes a 32-bit key (larger = earlier; NaN highest,
 *    -0 == +0, as on the CPU); boxes failing the score threshold get key 0,
 *    below every real key, and are counted out (valid count m, on device).
 * 2. CUB's radix sort (stable) orders (key, index) descending: equal scores
 *    keep their input order, exactly like the CPU's stable sort.
 * 3. The boxes are gathered in that order as float4 + area (float32 from any
 *    storage dtype), with their class ids.
 * 4. Bitmask tiles: block (row, col) of 64 threads sets, for row box i and
 *    the 64 boxes j of the column block (j > i, same class), bit j when
 *    IoU(i, j) > threshold, with the CPU's operations (correctly rounded,
 *    never contracted), so decisions are bit-identical to the CPU's.
 * 5. One block walks the mask on the device: per 64-box block, warp 0
 *    resolves the block's own boxes serially from the diagonal tile (in
 *    registers, via shuffles), then every thread ORs the rows of the boxes
 *    just kept into the `removed` words of later blocks, in parallel. Kept
 *    indices go straight to `keep` (padded with -1), the count to n_keep,
 *    and the walk stops at max_output. No device-to-host copy of anything.
 */
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "nms_check.h"

#define MIXPREC__NMS_TILE 64
#define MIXPREC__NMS_REDUCE_THREADS 1024
/* `removed` lives in shared memory when it fits the default 48 KiB (with
 * room for the kernel's static shared variables). */
#define MIXPREC__NMS_SHARED_WORDS 6000
#define MIXPREC__NMS_ALIGN 256

namespace {

struct nms_layout {
  size_t keys_in, keys_out, vals_in, vals_out, temp, boxes, area, cls, counter, removed, mask;
  size_t temp_bytes;
  size_t total;
};

size_t align_up(size_t x) { return (x + MIXPREC__NMS_ALIGN - 1) / MIXPREC__NMS_ALIGN * MIXPREC__NMS_ALIGN; }

int64_t col_blocks_of(int64_t n) { return (n + MIXPREC__NMS_TILE - 1) / MIXPREC__NMS_TILE; }

/* Offsets of every workspace region; false if the sort could not be sized. */
bool nms_plan(int64_t n, nms_layout *L) {
  size_t temp_bytes = 0;
  if (n > 0) {
    cudaError_t err = cub::DeviceRadixSort::SortPairsDescending(
        nullptr, temp_bytes, (const uint32_t *)nullptr, (uint32_t *)nullptr,
        (const int32_t *)nullptr, (int32_t *)nullptr, (int)n, 0, 32, (cudaStream_t)0);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
  }
  const size_t un = (size_t)n, cb = (size_t)col_blocks_of(n);
  size_t at = 0;
  L->keys_in = at, at += align_up(un * 4);
  L->keys_out = at, at += align_up(un * 4);
  L->vals_in = at, at += align_up(un * 4);
  L->vals_out = at, at += align_up(un * 4);
  L->temp = at, at += align_up(temp_bytes);
  L->boxes = at, at += align_up(un * 16);
  L->area = at, at += align_up(un * 4);
  L->cls = at, at += align_up(un * 8);
  L->counter = at, at += align_up(8);
  L->removed = at, at += align_up(cb * 8);
  L->mask = at, at += align_up(un * cb * 8);
  L->temp_bytes = temp_bytes;
  L->total = at;
  return true;
}

template <int D>
__device__ __forceinline__ float load_value(const void *data, int64_t i) {
  if constexpr (D == MIXPREC_F32)
    return ((const float *)data)[i];
  else if constexpr (D == MIXPREC_F16)
    return mixprec__f16_to_f32(((const uint16_t *)data)[i]);
  else
    return mixprec__bf16_to_f32(((const uint16_t *)data)[i]);
}

__device__ __forceinline__ float load_any(const void *data, mixprec_dtype dt, int64_t i) {
  switch (dt) {
    case MIXPREC_F16: return load_value<MIXPREC_F16>(data, i);
    case MIXPREC_BF16: return load_value<MIXPREC_BF16>(data, i);
    default: return load_value<MIXPREC_F32>(data, i);
  }
}

__device__ __forceinline__ uint32_t score_key(float s) {
  uint32_t u = __float_as_uint(s);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  if ((u & 0x7fffffffu) == 0) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void nms_keys(const void *scores, mixprec_dtype dt, int n, int use_thr, float thr,
                         uint32_t *keys, int32_t *vals, int *valid) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = load_any(scores, dt, i);
  const bool ok = !use_thr || s > thr;
  keys[i] = ok ? score_key(s) : 0u; /* every real key is >= 0x007fffff */
  vals[i] = i;
  if (ok) atomicAdd(valid, 1);
}

__global__ void nms_gather(const void *boxes, mixprec_dtype dt, const void *classes,
                           int classes_i32, const int32_t *order, int n, float4 *sboxes,
                           float *sarea, int64_t *scls) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= n) return;
  const int64_t i = order[p];
  float4 b;
  b.x = load_any(boxes, dt, 4 * i + 0);
  b.y = load_any(boxes, dt, 4 * i + 1);
  b.z = load_any(boxes, dt, 4 * i + 2);
  b.w = load_any(boxes, dt, 4 * i + 3);
  sboxes[p] = b;
  sarea[p] = __fmul_rn(__fsub_rn(b.z, b.x), __fsub_rn(b.w, b.y));
  if (classes)
    scls[p] = classes_i32 ? (int64_t)((const int32_t *)classes)[i] : ((const int64_t *)classes)[i];
}

/* std::max / std::min of torchvision's CPU kernel (and of nms.c). */
__device__ __forceinline__ float tv_max(float a, float b) { return a < b ? b : a; }
__device__ __forceinline__ float tv_min(float a, float b) { return b < a ? b : a; }

__device__ __forceinline__ bool suppresses(float4 a, float area_a, float4 b, float area_b,
                                           float thr) {
  const float xx1 = tv_max(a.x, b.x), yy1 = tv_max(a.y, b.y);
  const float xx2 = tv_min(a.z, b.z), yy2 = tv_min(a.w, b.w);
  const float w = tv_max(0.0f, __fsub_rn(xx2, xx1));
  const float h = tv_max(0.0f, __fsub_rn(yy2, yy1));
  const float inter = __fmul_rn(w, h);
  /* inter == 0 (or NaN) gives IoU +-0 or NaN, never > thr >= 0: skip the
   * division, the costly part, for the many pairs that do not intersect. */
  if (!(inter > 0.0f)) return false;
  const float ovr = __fdiv_rn(inter, __fsub_rn(__fadd_rn(area_a, area_b), inter));
  return ovr > thr;
}

__global__ void __launch_bounds__(MIXPREC__NMS_TILE)
    nms_mask(const float4 *sboxes, const float *sarea, const int64_t *scls, int use_cls,
             const int *valid, int64_t col_blocks, float thr, unsigned long long *mask) {
  const int64_t row = blockIdx.y, col = blockIdx.x;
  if (col < row) return;
  const int m = *valid;
  if (row * MIXPREC__NMS_TILE >= m) return;
  __shared__ float4 cb[MIXPREC__NMS_TILE];
  __shared__ float ca[MIXPREC__NMS_TILE];
  __shared__ int64_t cc[MIXPREC__NMS_TILE];
  const int t = threadIdx.x;
  const int64_t j0 = col * MIXPREC__NMS_TILE;
  const int ncol = (int)min((int64_t)MIXPREC__NMS_TILE, (int64_t)m - j0);
  if (t < ncol) {
    cb[t] = sboxes[j0 + t];
    ca[t] = sarea[j0 + t];
    cc[t] = use_cls ? scls[j0 + t] : 0;
  }
  __syncthreads();
  const int64_t i = row * MIXPREC__NMS_TILE + t;
  if (i >= m) return;
  const float4 bi = sboxes[i];
  const float ai = sarea[i];
  const int64_t ci = use_cls ? scls[i] : 0;
  unsigned long long bits = 0;
  for (int k = (row == col ? t + 1 : 0); k < ncol; k++) {
    if (cc[k] == ci && suppresses(bi, ai, cb[k], ca[k], thr)) bits |= 1ull << k;
  }
  mask[i * col_blocks + col] = bits;
}

__global__ void __launch_bounds__(MIXPREC__NMS_REDUCE_THREADS)
    nms_reduce(const unsigned long long *mask, const int32_t *order, const int *valid,
               int64_t col_blocks, unsigned long long *removed_global, int use_shared,
               int64_t max_keep, int64_t cap, int64_t *keep, int64_t *n_keep) {
  extern __shared__ unsigned long long removed_shared[];
  __shared__ unsigned long long s_bits;
  __shared__ long long s_count;
  __shared__ int s_stop;
  unsigned long long *removed = use_shared ? removed_shared : removed_global;
  const int m = *valid;
  const int64_t nb_count = (m + MIXPREC__NMS_TILE - 1) / MIXPREC__NMS_TILE;
  for (int64_t j = threadIdx.x; j < nb_count; j += blockDim.x) removed[j] = 0;
  if (threadIdx.x == 0) {
    s_count = 0;
    s_stop = 0;
  }
  for (int64_t nb = 0; nb < nb_count; nb++) {
    __syncthreads();
    const int64_t base = nb * MIXPREC__NMS_TILE;
    if (threadIdx.x < MIXPREC__WARP) {
      const int lane = threadIdx.x;
      unsigned long long rv = removed[nb], kb = 0;
      const long long before = s_count;
      long long cnt = before;
      const int lim = (int)min((int64_t)MIXPREC__NMS_TILE, (int64_t)m - base);
      const unsigned long long all = lim == 64 ? ~0ull : (1ull << lim) - 1ull;
      /* A block whose boxes are all suppressed already (common in dense
       * scenes) needs no mask load at all. */
      const bool live = (rv & all) != all;
      const unsigned long long d0 =
          live && base + lane < m ? mask[(base + lane) * col_blocks + nb] : 0ull;
      const unsigned long long d1 =
          live && base + 32 + lane < m ? mask[(base + 32 + lane) * col_blocks + nb] : 0ull;
      for (int b = 0; live && b < lim; b++) {
        /* Uniform across the warp: every lane holds the same rv and cnt. */
        const unsigned long long db = __shfl_sync(0xffffffffu, b < 32 ? d0 : d1, b & 31);
        if (!((rv >> b) & 1ull)) {
          kb |= 1ull << b;
          rv |= db;
          if (++cnt == max_keep) break;
        }
      }
      for (int b = lane; b < MIXPREC__NMS_TILE; b += MIXPREC__WARP) {
        if ((kb >> b) & 1ull) {
          const long long pos = before + __popcll(kb & ((1ull << b) - 1ull));
          keep[pos] = order[base + b];
        }
      }
      __syncwarp();
      if (lane == 0) {
        s_bits = kb;
        s_count = cnt;
        s_stop = cnt == max_keep;
      }
    }
    __syncthreads();
    const unsigned long long kb = s_bits;
    if (s_stop) break;
    if (kb) {
      for (int64_t j = nb + 1 + threadIdx.x; j < nb_count; j += blockDim.x) {
        unsigned long long acc = 0, bits = kb;
        while (bits) {
          const int b = __ffsll((long long)bits) - 1;
          bits &= bits - 1;
          acc |= mask[(base + b) * col_blocks + j];
        }
        removed[j] |= acc;
      }
    }
  }
  __syncthreads();
  const long long count = s_count;
  if (threadIdx.x == 0) *n_keep = count;
  for (int64_t k = count + threadIdx.x; k < cap; k += blockDim.x) keep[k] = -1;
}

__global__ void nms_fill(int64_t *keep, int64_t cap, int64_t *n_keep) {
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < cap;
       k += (int64_t)gridDim.x * blockDim.x)
    keep[k] = -1;
  if (blockIdx.x == 0 && threadIdx.x == 0) *n_keep = 0;
}

/* The largest float f with f <= t: `float > t` <=> `float > f` (as nms.c). */
float float_floor(double t) {
  float f = (float)t;
  if ((double)f > t) f = nextafterf(f, -INFINITY);
  return f;
}

bool misaligned(const void *p, size_t a) { return p && (uintptr_t)p % a != 0; }

}  // namespace

extern "C" {

int64_t mixprec_cuda_nms_workspace_size(int64_t n) {
  if (n < 0 || n > INT32_MAX) return -1;
  nms_layout L;
  if (!nms_plan(n, &L)) return -1;
  return (int64_t)L.total;
}

mixprec_status mixprec_cuda_nms(const void *boxes, mixprec_dtype boxes_dtype, const void *scores,
                                mixprec_dtype scores_dtype, const void *classes,
                                mixprec_index_dtype classes_dtype, int64_t n,
                                const mixprec_nms_params *p, int64_t *keep, int64_t *n_keep,
                                void *workspace, int64_t workspace_bytes, void *stream) {
  mixprec_status st = mixprec__nms_check_sizes(boxes_dtype, scores_dtype, n, p, n_keep);
  if (st != MIXPREC_OK) return st;
  if (!mixprec__nms_classes_dtype_ok(classes_dtype)) return MIXPREC_ERR_BAD_DTYPE;
  st = mixprec__nms_check_data(boxes, scores, n, p, keep);
  if (st != MIXPREC_OK) return st;
  const int64_t cap = mixprec_nms_capacity(n, p);
  if (misaligned(boxes, (size_t)mixprec_dtype_size(boxes_dtype)) ||
      misaligned(scores, (size_t)mixprec_dtype_size(scores_dtype)) ||
      misaligned(classes, classes_dtype == MIXPREC_I32 ? 4 : 8) || misaligned(keep, 8) ||
      misaligned(n_keep, 8))
    return MIXPREC_ERR_BAD_ARGUMENT;
  cudaStream_t s = (cudaStream_t)stream;

  if (n == 0 || cap == 0) {
    const int64_t blocks = (cap + 255) / 256;
    nms_fill<<<blocks < 1 ? 1u : blocks > 1024 ? 1024u : (unsigned)blocks, 256, 0, s>>>(
        keep, cap, n_keep);
    return mixprec__cuda_launch_status();
  }

  nms_layout L;
  if (!nms_plan(n, &L)) return MIXPREC_ERR_CUDA;
  if (!workspace || workspace_bytes < (int64_t)L.total || misaligned(workspace, MIXPREC__NMS_ALIGN))
    return MIXPREC_ERR_BAD_ARGUMENT;
  uint8_t *ws = (uint8_t *)workspace;
  uint32_t *keys_in = (uint32_t *)(ws + L.keys_in), *keys_out = (uint32_t *)(ws + L.keys_out);
  int32_t *vals_in = (int32_t *)(ws + L.vals_in), *vals_out = (int32_t *)(ws + L.vals_out);
  float4 *sboxes = (float4 *)(ws + L.boxes);
  float *sarea = (float *)(ws + L.area);
  int64_t *scls = (int64_t *)(ws + L.cls);
  int *valid = (int *)(ws + L.counter);
  unsigned long long *removed = (unsigned long long *)(ws + L.removed);
  unsigned long long *mask = (unsigned long long *)(ws + L.mask);
  const int ni = (int)n;
  const int64_t cb = col_blocks_of(n);
  const unsigned grid = (unsigned)((n + 255) / 256);
  if (cb > 65535) return MIXPREC_ERR_BAD_SIZE; /* grid.y limit: n > 4,194,240 */

  cudaError_t err = cudaMemsetAsync(valid, 0, sizeof(int), s);
  if (err != cudaSuccess) return MIXPREC_ERR_CUDA;
  nms_keys<<<grid, 256, 0, s>>>(scores, scores_dtype, ni, p->use_score_threshold,
                                p->use_score_threshold ? float_floor(p->score_threshold) : 0.0f,
                                keys_in, vals_in, valid);
  if (mixprec__cuda_launch_status() != MIXPREC_OK) return MIXPREC_ERR_CUDA;
  size_t temp_bytes = L.temp_bytes;
  err = cub::DeviceRadixSort::SortPairsDescending(ws + L.temp, temp_bytes, keys_in, keys_out,
                                                  vals_in, vals_out, ni, 0, 32, s);
  if (err != cudaSuccess) return MIXPREC_ERR_CUDA;
  nms_gather<<<grid, 256, 0, s>>>(boxes, boxes_dtype, classes, classes_dtype == MIXPREC_I32,
                                  vals_out, ni, sboxes, sarea, scls);
  if (mixprec__cuda_launch_status() != MIXPREC_OK) return MIXPREC_ERR_CUDA;
  nms_mask<<<dim3((unsigned)cb, (unsigned)cb), MIXPREC__NMS_TILE, 0, s>>>(
      sboxes, sarea, scls, classes != NULL, valid, cb, float_floor(p->iou_threshold), mask);
  if (mixprec__cuda_launch_status() != MIXPREC_OK) return MIXPREC_ERR_CUDA;
  const int use_shared = cb <= MIXPREC__NMS_SHARED_WORDS;
  nms_reduce<<<1, MIXPREC__NMS_REDUCE_THREADS, use_shared ? (size_t)cb * 8 : 0, s>>>(
      mask, vals_out, valid, cb, removed, use_shared, p->max_output >= 0 ? p->max_output : -1,
      cap, keep, n_keep);
  return mixprec__cuda_launch_status();
}

mixprec_status mixprec_cuda_nms_read_count(const int64_t *d_count, int64_t *h_count,
                                           void *stream) {
  if (!d_count || !h_count) return MIXPREC_ERR_NULL_POINTER;
  cudaStream_t s = (cudaStream_t)stream;
  if (cudaMemcpyAsync(h_count, d_count, sizeof *h_count, cudaMemcpyDeviceToHost, s) != cudaSuccess)
    return MIXPREC_ERR_CUDA;
  return mixprec__cuda_status(cudaStreamSynchronize(s));
}

}  /* extern "C" */
