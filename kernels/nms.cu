/* Greedy NMS and class-aware NMS on CUDA: the GPU twin of c_ops/src/nms.c,
 * written to make the CPU's decisions (the IoU test of nms_rules.h); not yet
 * run on a GPU. Contracts: mixprec/nms.h. Steps: [note: cuda nms steps]. */
#include <cub/device/device_radix_sort.cuh>

#include "nms.cuh"
#include "nms_check.h"

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

__global__ void nms_keys(const void *scores, mixprec_dtype dt, int n, int use_thr, float thr,
                         uint32_t *keys, int32_t *vals, int *valid) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = mixprec__load_f32(scores, dt, i);
  const bool ok = !use_thr || s > thr;
  keys[i] = ok ? mixprec__nms_score_key(s) : 0u; /* every real key is >= 0x007fffff */
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
  b.x = mixprec__load_f32(boxes, dt, 4 * i + 0);
  b.y = mixprec__load_f32(boxes, dt, 4 * i + 1);
  b.z = mixprec__load_f32(boxes, dt, 4 * i + 2);
  b.w = mixprec__load_f32(boxes, dt, 4 * i + 3);
  sboxes[p] = b;
  sarea[p] = mixprec__nms_area(b.x, b.y, b.z, b.w);
  if (classes)
    scls[p] = classes_i32 ? (int64_t)((const int32_t *)classes)[i] : ((const int64_t *)classes)[i];
}

__global__ void __launch_bounds__(MIXPREC__NMS_TILE)
    nms_mask(const float4 *sboxes, const float *sarea, const int64_t *scls, int use_cls,
             const int *valid, int64_t col_blocks, float thr, unsigned long long *mask) {
  mixprec__nms_mask_tile(sboxes, sarea, scls, use_cls, *valid, col_blocks, thr, blockIdx.y,
                         blockIdx.x, mask);
}

__global__ void __launch_bounds__(MIXPREC__NMS_REDUCE_THREADS)
    nms_reduce(const unsigned long long *mask, const int32_t *order, const int *valid,
               int64_t col_blocks, unsigned long long *removed_global, int use_shared,
               int64_t max_keep, int64_t cap, int64_t *keep, int64_t *n_keep) {
  extern __shared__ unsigned long long removed_shared[];
  unsigned long long *removed = use_shared ? removed_shared : removed_global;
  const long long count =
      mixprec__nms_walk(mask, *valid, col_blocks, removed, max_keep,
                        [&](long long pos, int64_t p) { keep[pos] = order[p]; });
  if (threadIdx.x == 0) *n_keep = count;
  for (int64_t k = count + threadIdx.x; k < cap; k += blockDim.x) keep[k] = -1;
}

__global__ void nms_fill(int64_t *keep, int64_t cap, int64_t *n_keep) {
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < cap;
       k += (int64_t)gridDim.x * blockDim.x)
    keep[k] = -1;
  if (blockIdx.x == 0 && threadIdx.x == 0) *n_keep = 0;
}

}  // namespace

/* The largest float f with f <= t: `float > t` <=> `float > f` (as nms.c);
 * also used by efficient_nms.cu. */
float mixprec__cuda_nms_float_floor(double t) {
  float f = (float)t;
  if ((double)f > t) f = nextafterf(f, -INFINITY);
  return f;
}

namespace {

bool misaligned(const void *p, size_t a) { return p && (uintptr_t)p % a != 0; }

}  // namespace

extern "C" {

/* [note: cuda nms steps]
 * 1. keys: each score becomes a 32-bit key (larger = earlier; NaN highest,
 *    -0 == +0, as on the CPU); boxes failing the score threshold get key 0,
 *    below every real key, and are counted out (valid count m, on device).
 * 2. CUB's stable radix sort orders (key, index) descending: equal scores
 *    keep their input order, as the CPU's stable sort.
 * 3. The boxes are gathered in that order as float4 + area (float32 from any
 *    storage dtype), with their class ids.
 * 4. Bitmask tiles (nms.cuh): block (row, col) of 64 threads sets, for row
 *    box i and the 64 boxes j > i of the column block of its class, bit j
 *    when IoU(i, j) > threshold, by nms_rules.h's test.
 * 5. One block walks the mask (nms.cuh) on the device; kept indices go
 *    straight to `keep` (padded with -1), the count to n_keep, and the walk
 *    stops at max_output. Nothing is copied to the host. */
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
                                p->use_score_threshold ? mixprec__cuda_nms_float_floor(p->score_threshold) : 0.0f,
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
      sboxes, sarea, scls, classes != NULL, valid, cb, mixprec__cuda_nms_float_floor(p->iou_threshold), mask);
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
