/* Batched detection post-processing on CUDA: the GPU twin of
 * c_ops/src/efficient_nms.c, the whole batch in one fixed set of launches,
 * written to make the CPU's decisions; not yet run on a GPU. Contracts:
 * mixprec/efficient_nms.h. Steps: [note: cuda efficient_nms steps]. */
#include <cub/device/device_radix_sort.cuh>

#include "efficient_nms_check.h"
#include "nms.cuh"

#define MIXPREC__EFFICIENT_NMS_ALIGN 256
#define MIXPREC__EFFICIENT_NMS_REDUCE_THREADS 1024

namespace {

struct efficient_nms_layout {
  size_t keys_in, keys_out, vals_in, vals_out, temp, valid, boxes, area, cls, src, mask;
  size_t temp_bytes;
  size_t total;
};

size_t align_up(size_t x) {
  return (x + MIXPREC__EFFICIENT_NMS_ALIGN - 1) / MIXPREC__EFFICIENT_NMS_ALIGN * MIXPREC__EFFICIENT_NMS_ALIGN;
}

int id_bits(int64_t batch) {
  int bits = 1;
  while (bits < 31 && ((int64_t)1 << bits) < batch) bits++;
  return bits;
}

bool efficient_nms_plan(int64_t batch, int64_t nc, int64_t cap, efficient_nms_layout *L) {
  const size_t total = (size_t)(batch * nc);
  size_t t1 = 0, t2 = 0;
  if (total > 0) {
    if (cub::DeviceRadixSort::SortPairsDescending(
            nullptr, t1, (const uint32_t *)nullptr, (uint32_t *)nullptr, (const int32_t *)nullptr,
            (int32_t *)nullptr, (int)total, 0, 32, (cudaStream_t)0) != cudaSuccess ||
        cub::DeviceRadixSort::SortPairs(nullptr, t2, (const uint32_t *)nullptr,
                                        (uint32_t *)nullptr, (const int32_t *)nullptr,
                                        (int32_t *)nullptr, (int)total, 0, id_bits(batch),
                                        (cudaStream_t)0) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
  }
  const size_t temp_bytes = t1 > t2 ? t1 : t2;
  const size_t bt = (size_t)(batch * cap), cb = (size_t)((cap + MIXPREC__NMS_TILE - 1) / MIXPREC__NMS_TILE);
  size_t at = 0;
  L->keys_in = at, at += align_up(total * 4);
  L->keys_out = at, at += align_up(total * 4);
  L->vals_in = at, at += align_up(total * 4);
  L->vals_out = at, at += align_up(total * 4);
  L->temp = at, at += align_up(temp_bytes);
  L->valid = at, at += align_up((size_t)batch * 4);
  L->boxes = at, at += align_up(bt * 16);
  L->area = at, at += align_up(bt * 4);
  L->cls = at, at += align_up(bt * 8);
  L->src = at, at += align_up(bt * 4);
  L->mask = at, at += align_up(bt * cb * 8);
  L->temp_bytes = temp_bytes;
  L->total = at;
  return true;
}

/* Thread t covers score (b, q, c) of flat index i = b * nc + q * classes + c;
 * with class rows (score stride 1 along n, a channels-first head) q runs
 * fastest over the threads, so a warp's reads are contiguous. */
__global__ void efficient_nms_keys(const void *scores, mixprec_dtype dt, mixprec_detect_layout L,
                                   int total, int n, int classes, int cfirst, int use_thr,
                                   float thr, uint32_t *keys, int32_t *vals, int *valid) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int nc = n * classes, b = t / nc, r = t % nc;
  const int q = cfirst ? r % n : r / classes, c = cfirst ? r / n : r % classes;
  const int i = b * nc + q * classes + c;
  const float s = mixprec__load_f32(scores, dt, mixprec__efficient_nms_score_at(&L, b, q, c));
  const bool ok = s == s && (!use_thr || s > thr);
  keys[i] = ok ? mixprec__nms_score_key(s) : 0u;
  vals[i] = i;
  /* One atomic per (warp, image): lanes grouped by their image. */
  const unsigned active = __activemask();
  const unsigned group = __match_any_sync(active, b);
  const unsigned hits = __ballot_sync(active, ok) & group;
  if ((int)(threadIdx.x & 31) == __ffs(group) - 1 && hits) atomicAdd(&valid[b], __popc(hits));
}

__global__ void efficient_nms_image_ids(const int32_t *vals, int total, int nc, uint32_t *ids) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < total) ids[i] = (uint32_t)(vals[i] / nc);
}

__device__ __forceinline__ int candidates(const int *valid, int64_t b, int64_t cap) {
  return (int)min((int64_t)valid[b], cap);
}

/* Each candidate's box read in place and decoded in float32, as the CPU
 * does (nms_rules.h's mixprec__box_corners). */
__global__ void efficient_nms_gather(const void *boxes, mixprec_dtype dt, mixprec_detect_layout L,
                                     const int32_t *order, const int *valid, int64_t n,
                                     int64_t classes, int64_t cap, int agnostic, float4 *sboxes,
                                     float *sarea, int64_t *scls, int32_t *src) {
  const int64_t b = blockIdx.y, p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  const int64_t nc = n * classes;
  if (p >= candidates(valid, b, cap)) return;
  const int64_t i = order[b * nc + p]; /* global flat index of (b, n, c) */
  const int64_t j = i - b * nc;
  const int64_t first = mixprec__efficient_nms_box_at(&L, b, j / classes, j % classes);
  float v[4], corner[4];
  for (int e = 0; e < 4; e++)
    v[e] = mixprec__load_f32(boxes, dt, first + e * L.box_strides[3]);
  mixprec__box_corners(L.box_coding == MIXPREC_BOX_CENTER, v, corner);
  const float4 q = make_float4(corner[0], corner[1], corner[2], corner[3]);
  const int64_t at = b * cap + p;
  sboxes[at] = q;
  sarea[at] = mixprec__nms_area(q.x, q.y, q.z, q.w);
  scls[at] = agnostic ? 0 : j % classes;
  src[at] = (int32_t)j;
}

__global__ void __launch_bounds__(MIXPREC__NMS_TILE)
    efficient_nms_mask(const float4 *sboxes, const float *sarea, const int64_t *scls, const int *valid,
                int64_t cap, int64_t col_blocks, float thr, unsigned long long *mask) {
  const int64_t b = blockIdx.z;
  mixprec__nms_mask_tile(sboxes + b * cap, sarea + b * cap, scls + b * cap, 1,
                         candidates(valid, b, cap), col_blocks, thr, blockIdx.y, blockIdx.x,
                         mask + b * cap * col_blocks);
}

__device__ __forceinline__ void copy_value(const void *from, int64_t fi, void *to, int64_t ti,
                                           int es) {
  if (es == 4)
    ((uint32_t *)to)[ti] = ((const uint32_t *)from)[fi];
  else
    ((uint16_t *)to)[ti] = ((const uint16_t *)from)[fi];
}

/* All-zero bits: +0 in float32, float16 and bfloat16. */
__device__ __forceinline__ void zero_value(void *to, int64_t ti, int es) {
  if (es == 4)
    ((uint32_t *)to)[ti] = 0u;
  else
    ((uint16_t *)to)[ti] = 0u;
}

__global__ void __launch_bounds__(MIXPREC__EFFICIENT_NMS_REDUCE_THREADS)
    efficient_nms_reduce(const unsigned long long *mask, const int32_t *src, const int *valid,
                         int64_t cap, int64_t col_blocks, const void *boxes,
                         mixprec_dtype boxes_dtype, int box_es, mixprec_detect_layout L,
                         const float4 *sboxes, const void *scores, int score_es, int64_t classes,
                         int64_t k, void *out_boxes, void *out_scores, int64_t *out_classes,
                         int64_t *out_indices, int64_t *counts) {
  extern __shared__ unsigned long long removed[];
  const int64_t b = blockIdx.x;
  const int m = candidates(valid, b, cap);
  const int32_t *src_b = src + b * cap;
  const long long count = mixprec__nms_walk(
      mask + b * cap * col_blocks, m, col_blocks, removed, k, [&](long long pos, int64_t p) {
        const int64_t j = src_b[p], nn = j / classes, c = j % classes;
        const int64_t o = b * k + pos;
        if (L.box_coding == MIXPREC_BOX_CENTER) {
          /* The decoded corners the NMS used, rounded to the boxes' dtype. */
          const float4 q = sboxes[b * cap + p];
          mixprec__store_f32(out_boxes, boxes_dtype, 4 * o + 0, q.x);
          mixprec__store_f32(out_boxes, boxes_dtype, 4 * o + 1, q.y);
          mixprec__store_f32(out_boxes, boxes_dtype, 4 * o + 2, q.z);
          mixprec__store_f32(out_boxes, boxes_dtype, 4 * o + 3, q.w);
        } else {
          const int64_t first = mixprec__efficient_nms_box_at(&L, b, nn, c);
          for (int e = 0; e < 4; e++)
            copy_value(boxes, first + e * L.box_strides[3], out_boxes, 4 * o + e, box_es);
        }
        copy_value(scores, mixprec__efficient_nms_score_at(&L, b, nn, c), out_scores, o,
                   score_es);
        out_classes[o] = c;
        out_indices[o] = nn;
      });
  for (int64_t q = count + threadIdx.x; q < k; q += blockDim.x) {
    const int64_t o = b * k + q;
    for (int e = 0; e < 4; e++) zero_value(out_boxes, 4 * o + e, box_es);
    zero_value(out_scores, o, score_es);
    out_classes[o] = -1;
    out_indices[o] = -1;
  }
  if (threadIdx.x == 0) counts[b] = count;
}

}  // namespace

extern "C" {

/* [note: cuda efficient_nms steps]
 * 1. keys: every (b, n, c) score becomes mixprec_nms's 32-bit key (0 for a
 *    non-candidate: NaN or not above the threshold); warps count each
 *    image's candidates (one atomic per image and warp).
 * 2. A stable CUB radix sort of all B * N * C keys, descending, the flat
 *    index as value; then a second stable sort by image id (only its bits)
 *    regroups the batch per image with that order intact. (A segmented sort
 *    would give one block per image: one SM for B = 1.)
 * 3. gather: the first T = min(candidates, top-k) of each image as float4 +
 *    area in float32, class id (0 when class-agnostic) and flat index.
 * 4. One bitmask grid over all images (64x64 tiles, blockIdx.z = image),
 *    then one reduction block per image: the tile and the walk of nms.cuh,
 *    shared with mixprec_cuda_nms ([note: cuda nms steps]). The walk writes
 *    each kept candidate's box and score (input bits), class and index to
 *    the outputs, pads to K and writes the count. Scratch comes from the
 *    caller; nothing is copied to the host. */
int64_t mixprec_cuda_efficient_nms_workspace_size(int64_t batch, int64_t n, int64_t classes,
                                                  const mixprec_detect_params *p) {
  if (!p || batch < 0 || n < 0 || classes < 0) return -1;
  if (classes > 0 && n > INT32_MAX / classes) return -1;
  const int64_t nc = n * classes;
  if (nc > 0 && batch > INT32_MAX / nc) return -1;
  const int64_t cap = mixprec__efficient_nms_cap(n, classes, p);
  if (cap > MIXPREC_CUDA_DETECT_MAX_CANDIDATES) return -1;
  efficient_nms_layout L;
  if (!efficient_nms_plan(batch, nc, cap, &L)) return -1;
  return (int64_t)L.total;
}

mixprec_status mixprec_cuda_efficient_nms_strided(
    const void *boxes, mixprec_dtype boxes_dtype, const void *scores, mixprec_dtype scores_dtype,
    const mixprec_detect_layout *layout, int64_t batch, int64_t n, int64_t classes,
    const mixprec_detect_params *p, void *out_boxes, void *out_scores, int64_t *out_classes,
    int64_t *out_indices, int64_t *counts, void *workspace, int64_t workspace_bytes,
    void *stream) {
  mixprec_status st =
      mixprec__efficient_nms_check(boxes, boxes_dtype, scores, scores_dtype, batch, n, classes, p,
                                   out_boxes, out_scores, out_classes, out_indices, counts);
  if (st == MIXPREC_OK) st = mixprec__efficient_nms_check_layout(layout, batch, n, classes);
  if (st != MIXPREC_OK) return st;
  const mixprec_detect_layout lay = *layout;
  if (batch == 0) return MIXPREC_OK;
  const int64_t nc = n * classes, cap = mixprec__efficient_nms_cap(n, classes, p);
  if (nc > 0 && batch > INT32_MAX / nc) return MIXPREC_ERR_BAD_SIZE;
  if (cap > MIXPREC_CUDA_DETECT_MAX_CANDIDATES || batch > 65535) return MIXPREC_ERR_BAD_SIZE;
  const int box_es = mixprec_dtype_size(boxes_dtype), score_es = mixprec_dtype_size(scores_dtype);
  if ((boxes && (uintptr_t)boxes % box_es) || (scores && (uintptr_t)scores % score_es) ||
      (uintptr_t)out_boxes % box_es || (uintptr_t)out_scores % score_es ||
      (uintptr_t)out_classes % 8 || (uintptr_t)out_indices % 8 || (uintptr_t)counts % 8)
    return MIXPREC_ERR_BAD_ARGUMENT;
  efficient_nms_layout L;
  if (!efficient_nms_plan(batch, nc, cap, &L)) return MIXPREC_ERR_CUDA;
  if (!workspace || workspace_bytes < (int64_t)L.total ||
      (uintptr_t)workspace % MIXPREC__EFFICIENT_NMS_ALIGN != 0)
    return MIXPREC_ERR_BAD_ARGUMENT;
  cudaStream_t s = (cudaStream_t)stream;
  uint8_t *ws = (uint8_t *)workspace;
  uint32_t *keys_in = (uint32_t *)(ws + L.keys_in), *keys_out = (uint32_t *)(ws + L.keys_out);
  int32_t *vals_in = (int32_t *)(ws + L.vals_in), *vals_out = (int32_t *)(ws + L.vals_out);
  int *valid = (int *)(ws + L.valid);
  float4 *sboxes = (float4 *)(ws + L.boxes);
  float *sarea = (float *)(ws + L.area);
  int64_t *scls = (int64_t *)(ws + L.cls);
  int32_t *src = (int32_t *)(ws + L.src);
  unsigned long long *mask = (unsigned long long *)(ws + L.mask);
  const int64_t k = p->max_detections;
  const int64_t cb = (cap + MIXPREC__NMS_TILE - 1) / MIXPREC__NMS_TILE;
  const int total = (int)(batch * nc);

  if (cudaMemsetAsync(valid, 0, sizeof(int) * (size_t)batch, s) != cudaSuccess)
    return MIXPREC_ERR_CUDA;
  if (total > 0) {
    const unsigned grid = (unsigned)((total + 255) / 256);
    efficient_nms_keys<<<grid, 256, 0, s>>>(
        scores, scores_dtype, lay, total, (int)n, (int)classes,
        lay.score_strides[1] == 1 && classes > 1, p->use_score_threshold,
        p->use_score_threshold ? mixprec__cuda_nms_float_floor(p->score_threshold) : 0.0f,
        keys_in, vals_in, valid);
    if (mixprec__cuda_launch_status() != MIXPREC_OK) return MIXPREC_ERR_CUDA;
    size_t temp_bytes = L.temp_bytes;
    if (cub::DeviceRadixSort::SortPairsDescending(ws + L.temp, temp_bytes, keys_in, keys_out,
                                                  vals_in, vals_out, total, 0, 32,
                                                  s) != cudaSuccess)
      return MIXPREC_ERR_CUDA;
    efficient_nms_image_ids<<<grid, 256, 0, s>>>(vals_out, total, (int)nc, keys_in);
    if (mixprec__cuda_launch_status() != MIXPREC_OK) return MIXPREC_ERR_CUDA;
    temp_bytes = L.temp_bytes;
    /* Stable: each image keeps the score order of the first sort. */
    if (cub::DeviceRadixSort::SortPairs(ws + L.temp, temp_bytes, keys_in, keys_out, vals_out,
                                        vals_in, total, 0, id_bits(batch), s) != cudaSuccess)
      return MIXPREC_ERR_CUDA;
    efficient_nms_gather<<<dim3((unsigned)((cap + 255) / 256), (unsigned)batch), 256, 0, s>>>(
        boxes, boxes_dtype, lay, vals_in, valid, n, classes, cap,
        p->class_agnostic != 0, sboxes, sarea, scls, src);
    if (mixprec__cuda_launch_status() != MIXPREC_OK) return MIXPREC_ERR_CUDA;
    efficient_nms_mask<<<dim3((unsigned)cb, (unsigned)cb, (unsigned)batch), MIXPREC__NMS_TILE, 0, s>>>(
        sboxes, sarea, scls, valid, cap, cb, mixprec__cuda_nms_float_floor(p->iou_threshold),
        mask);
    if (mixprec__cuda_launch_status() != MIXPREC_OK) return MIXPREC_ERR_CUDA;
  }
  efficient_nms_reduce<<<(unsigned)batch, MIXPREC__EFFICIENT_NMS_REDUCE_THREADS, (size_t)(cb > 0 ? cb : 1) * 8,
                  s>>>(mask, src, valid, cap, cb, boxes, boxes_dtype, box_es, lay, sboxes, scores,
                       score_es, classes, k, out_boxes, out_scores, out_classes, out_indices,
                       counts);
  return mixprec__cuda_launch_status();
}

mixprec_status mixprec_cuda_efficient_nms(
    const void *boxes, mixprec_dtype boxes_dtype, int class_boxes, const void *scores,
    mixprec_dtype scores_dtype, int64_t batch, int64_t n, int64_t classes,
    const mixprec_detect_params *p, void *out_boxes, void *out_scores, int64_t *out_classes,
    int64_t *out_indices, int64_t *counts, void *workspace, int64_t workspace_bytes,
    void *stream) {
  const mixprec_status st =
      mixprec__efficient_nms_check(boxes, boxes_dtype, scores, scores_dtype, batch, n, classes, p,
                                   out_boxes, out_scores, out_classes, out_indices, counts);
  if (st != MIXPREC_OK) return st;
  const mixprec_detect_layout l = mixprec__efficient_nms_contiguous(n, classes, class_boxes);
  return mixprec_cuda_efficient_nms_strided(boxes, boxes_dtype, scores, scores_dtype, &l, batch,
                                            n, classes, p, out_boxes, out_scores, out_classes,
                                            out_indices, counts, workspace, workspace_bytes,
                                            stream);
}

}  /* extern "C" */
