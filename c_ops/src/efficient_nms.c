/* Batched detection post-processing on the CPU (mixprec_efficient_nms).
 *
 * Per image: one pass over the (N, C) scores turns every candidate (score >
 * threshold, not NaN) into a 32-bit key of mixprec_nms's score order, in
 * flat-index order, and counts the keys' top bytes; the pre-NMS top-k takes
 * every candidate below the boundary byte and radix-selects (8 bits per
 * pass) only within the boundary byte, keeping equal keys in index order, so
 * the stable radix sort of the survivors gives decreasing score, ties by
 * index. The NMS
 * itself is mixprec_nms's core (mixprec__nms_sorted: the same gather, SIMD
 * sweep, x-sorted pruning and per-class split), so the IoU decisions are
 * those of mixprec_nms / torchvision bit for bit. Images run on parallel
 * threads when the batch has several (one image per thread, its classes
 * serial); a single image spreads its classes over the threads instead.
 * Each image writes only its own rows of the outputs: no merge, and nothing
 * depends on the thread count. */
#include <stdlib.h>
#include <string.h>

#include "efficient_nms_check.h"
#include "nms_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

mixprec_detect_params mixprec_detect_params_default(void) {
  mixprec_detect_params p;
  p.iou_threshold = 0.5;
  p.use_score_threshold = 0;
  p.score_threshold = 0.0;
  p.pre_nms_top_k = -1;
  p.max_detections = 100;
  p.class_agnostic = 0;
  return p;
}

/* Of the m (key, idx) pairs (in idx order), keeps in place the k with the
 * smallest keys, equal keys by position; keeps their order. Returns k. */
static int64_t select_smallest(uint32_t *keys, int32_t *idx, int64_t m, int64_t k) {
  uint32_t prefix = 0, mask = 0;
  int64_t need = k; /* rank of the boundary key among those matching prefix */
  for (int shift = 24; shift >= 0; shift -= 8) {
    int64_t count[256] = {0};
    for (int64_t i = 0; i < m; i++)
      if ((keys[i] & mask) == prefix) count[(keys[i] >> shift) & 0xffu]++;
    int d = 0;
    for (; d < 255; d++) {
      if (need <= count[d]) break;
      need -= count[d];
    }
    prefix |= (uint32_t)d << shift;
    mask |= 0xffu << shift;
  }
  /* All keys below the boundary, then the first `need` equal to it. */
  int64_t w = 0, equal = 0;
  for (int64_t i = 0; i < m; i++) {
    if (keys[i] < prefix || (keys[i] == prefix && equal++ < need)) {
      keys[w] = keys[i];
      idx[w] = idx[i];
      w++;
    }
  }
  return w;
}

/* The candidates of one image's nc scores: (~key, flat index) in index
 * order, and the histogram of the keys' top bytes. One loop per dtype,
 * branch-free (the threshold test is unpredictable): each block of scores is
 * compacted into a small local buffer, storing every score and advancing
 * only for a candidate, then appended, so only the candidates' entries of
 * keys/idx are ever touched (they are fresh pages of a large allocation).
 * The histogram is a pass over the candidates only. */
#define EFFICIENT_NMS_BLOCK 1024
#define EFFICIENT_NMS_SCORE_LOOP(LOAD)                                              \
  for (int64_t j0 = 0; j0 < nc; j0 += EFFICIENT_NMS_BLOCK) {                        \
    const int64_t j1 = j0 + EFFICIENT_NMS_BLOCK < nc ? j0 + EFFICIENT_NMS_BLOCK : nc;      \
    int64_t q = 0;                                                           \
    for (int64_t j = j0; j < j1; j++) {                                      \
      const float s = LOAD;                                                  \
      const int ok = (s == s) & (!use_thr | (s > thr));                      \
      lk[q] = ~mixprec__nms_score_key(s);                                    \
      li[q] = (int32_t)j;                                                    \
      q += ok;                                                               \
    }                                                                        \
    memcpy(keys + m, lk, sizeof *lk * (size_t)q);                            \
    memcpy(idx + m, li, sizeof *li * (size_t)q);                             \
    m += q;                                                                  \
  }

#if defined(MIXPREC_X86)
int64_t mixprec__efficient_nms_score_avx2(const void *scores, mixprec_dtype dt, int64_t nc, int use_thr,
                                   float thr, uint32_t *keys, int32_t *idx);
#endif

static int64_t score_candidates(const void *scores, mixprec_dtype dt, int64_t nc, int use_thr,
                                float thr, uint32_t *keys, int32_t *idx, int64_t hist[256]) {
  uint32_t lk[EFFICIENT_NMS_BLOCK];
  int32_t li[EFFICIENT_NMS_BLOCK];
  int64_t m = 0;
#if defined(MIXPREC_X86)
  const mixprec_cpu_isa isa = mixprec__active_isa();
  if (isa == MIXPREC_ISA_AVX2 || isa == MIXPREC_ISA_AVX512) {
    m = mixprec__efficient_nms_score_avx2(scores, dt, nc, use_thr, thr, keys, idx);
    for (int64_t i = 0; i < m; i++) hist[keys[i] >> 24]++;
    return m;
  }
#endif
  switch (dt) {
    case MIXPREC_F16: {
      const uint16_t *v = (const uint16_t *)scores;
      EFFICIENT_NMS_SCORE_LOOP(mixprec__f16_to_f32(v[j]))
      break;
    }
    case MIXPREC_BF16: {
      const uint16_t *v = (const uint16_t *)scores;
      EFFICIENT_NMS_SCORE_LOOP(mixprec__bf16_to_f32(v[j]))
      break;
    }
    default: {
      const float *v = (const float *)scores;
      EFFICIENT_NMS_SCORE_LOOP(v[j])
      break;
    }
  }
  for (int64_t i = 0; i < m; i++) hist[keys[i] >> 24]++;
  return m;
}
#undef EFFICIENT_NMS_SCORE_LOOP
#undef EFFICIENT_NMS_BLOCK

/* Keeps in place, in index order, the k (< m) candidates with the smallest
 * keys (equal keys by position), given the histogram of their top bytes:
 * those whose top byte is below the boundary byte are all in; only the
 * boundary byte's candidates (moved to tk/tv) go through the full select. */
static int64_t select_top(uint32_t *keys, int32_t *idx, int64_t m, int64_t k,
                          const int64_t hist[256], uint32_t *tk, int32_t *tv) {
  int64_t need = k;
  uint32_t d = 0;
  for (; d < 255; d++) {
    if (need <= hist[d]) break;
    need -= hist[d];
  }
  int64_t w = 0, side = 0;
  for (int64_t i = 0; i < m; i++) {
    const uint32_t top = keys[i] >> 24;
    if (top < d) {
      keys[w] = keys[i];
      idx[w] = idx[i];
      w++;
    } else if (top == d) {
      tk[side] = keys[i];
      tv[side] = idx[i];
      side++;
    }
  }
  side = select_smallest(tk, tv, side, need);
  /* The boundary byte's keys differ from all the others: appending them
   * after the rest keeps every run of equal keys in index order. */
  memcpy(keys + w, tk, sizeof *keys * (size_t)side);
  memcpy(idx + w, tv, sizeof *idx * (size_t)side);
  return w + side;
}

typedef struct efficient_nms_args {
  const uint8_t *boxes;
  size_t box_es; /* bytes of one box coordinate */
  mixprec_dtype boxes_dtype;
  int class_boxes;
  const uint8_t *scores;
  size_t score_es;
  mixprec_dtype scores_dtype;
  int64_t n, classes, k;
  const mixprec_detect_params *p;
  float iou_thr, score_thr;
  uint8_t *out_boxes, *out_scores;
  int64_t *out_classes, *out_indices, *counts;
} efficient_nms_args;

static mixprec_status efficient_nms_image(const efficient_nms_args *a, int64_t b, int threads) {
  const int64_t nc = a->n * a->classes, k = a->k;
  uint8_t *ob = a->out_boxes + (size_t)(b * k * 4) * a->box_es;
  uint8_t *os = a->out_scores + (size_t)(b * k) * a->score_es;
  int64_t *ocls = a->out_classes + b * k, *oidx = a->out_indices + b * k;
  int64_t count = 0;
  if (nc > 0) {
    /* Two allocations: keys and idx for every score (under glibc's 32 MiB
     * mmap ceiling up to 4M scores, so repeated calls reuse heap pages
     * instead of faulting fresh ones in), then the rest for the m
     * candidates only: tk (u32); tv, rows (i32); cls (i64); flags (u8). */
    const size_t nn = (size_t)nc + 8;
    uint8_t *mem = (uint8_t *)malloc(nn * (4 + 4) + 64);
    if (!mem) return MIXPREC_ERR_OUT_OF_MEMORY;
    uint32_t *keys = (uint32_t *)mem;
    int32_t *idx = (int32_t *)(keys + nn);

    const void *scores = a->scores + (size_t)(b * nc) * a->score_es;
    int64_t hist[256] = {0};
    int64_t m = score_candidates(scores, a->scores_dtype, nc, a->p->use_score_threshold,
                                 a->score_thr, keys, idx, hist);
    const size_t mm = (size_t)m + 8;
    uint8_t *mem2 = (uint8_t *)malloc(mm * (4 + 4 * 2 + 8 + 1) + 64);
    if (!mem2) {
      free(mem);
      return MIXPREC_ERR_OUT_OF_MEMORY;
    }
    int64_t *cls = (int64_t *)mem2;
    uint32_t *tk = (uint32_t *)(cls + mm);
    int32_t *tv = (int32_t *)(tk + mm), *rows = tv + mm;
    uint8_t *flags = (uint8_t *)(rows + mm);
    if (a->p->pre_nms_top_k > 0 && m > a->p->pre_nms_top_k)
      m = select_top(keys, idx, m, a->p->pre_nms_top_k, hist, tk, tv);
    mixprec__nms_radix_sort(keys, idx, tk, tv, m);
    for (int64_t r = 0; r < m; r++) {
      const int64_t j = idx[r];
      rows[r] = (int32_t)(a->class_boxes ? j : j / a->classes);
      cls[r] = j % a->classes;
    }
    const void *boxes = a->boxes + (size_t)(b * (a->class_boxes ? nc : a->n) * 4) * a->box_es;
    const mixprec_status st =
        mixprec__nms_sorted(boxes, a->boxes_dtype, rows, a->p->class_agnostic ? NULL : cls, m,
                            a->iou_thr, k, threads, flags);
    if (st != MIXPREC_OK) {
      free(mem2);
      free(mem);
      return st;
    }
    for (int64_t r = 0; r < m && count < k; r++) {
      if (!flags[r]) continue;
      const int64_t j = idx[r];
      memcpy(ob + (size_t)(count * 4) * a->box_es,
             (const uint8_t *)boxes + (size_t)(rows[r] * 4) * a->box_es, 4 * a->box_es);
      memcpy(os + (size_t)count * a->score_es, (const uint8_t *)scores + (size_t)j * a->score_es,
             a->score_es);
      ocls[count] = j % a->classes;
      oidx[count] = j / a->classes;
      count++;
    }
    free(mem2);
    free(mem);
  }
  /* All-zero bits are +0 in float32, float16 and bfloat16. */
  memset(ob + (size_t)(count * 4) * a->box_es, 0, (size_t)((k - count) * 4) * a->box_es);
  memset(os + (size_t)count * a->score_es, 0, (size_t)(k - count) * a->score_es);
  for (int64_t q = count; q < k; q++) ocls[q] = oidx[q] = -1;
  a->counts[b] = count;
  return MIXPREC_OK;
}

mixprec_status mixprec_efficient_nms(const void *boxes, mixprec_dtype boxes_dtype,
                                     int class_boxes, const void *scores,
                                     mixprec_dtype scores_dtype, int64_t batch, int64_t n,
                                     int64_t classes, const mixprec_detect_params *p,
                                     void *out_boxes, void *out_scores, int64_t *out_classes,
                                     int64_t *out_indices, int64_t *counts) {
  const mixprec_status st =
      mixprec__efficient_nms_check(boxes, boxes_dtype, scores, scores_dtype, batch, n, classes, p,
                            out_boxes, out_scores, out_classes, out_indices, counts);
  if (st != MIXPREC_OK) return st;
  if (batch == 0) return MIXPREC_OK;
  efficient_nms_args a;
  a.boxes = (const uint8_t *)boxes;
  a.box_es = (size_t)mixprec_dtype_size(boxes_dtype);
  a.boxes_dtype = boxes_dtype;
  a.class_boxes = class_boxes != 0;
  a.scores = (const uint8_t *)scores;
  a.score_es = (size_t)mixprec_dtype_size(scores_dtype);
  a.scores_dtype = scores_dtype;
  a.n = n, a.classes = classes, a.k = p->max_detections, a.p = p;
  a.iou_thr = mixprec__nms_float_floor(p->iou_threshold);
  a.score_thr = p->use_score_threshold ? mixprec__nms_float_floor(p->score_threshold) : 0.0f;
  a.out_boxes = (uint8_t *)out_boxes, a.out_scores = (uint8_t *)out_scores;
  a.out_classes = out_classes, a.out_indices = out_indices, a.counts = counts;

  /* An image's scratch comes from malloc inside its task, so an allocation
   * failure is only known after other images wrote their rows: the outputs
   * are then unspecified (the header says so). */
  const int threads = mixprec__num_threads();
  int failed = 0;
  if (batch == 1 || threads <= 1) {
    for (int64_t b = 0; b < batch; b++)
      if (efficient_nms_image(&a, b, threads) != MIXPREC_OK) failed = 1;
  } else {
    const int t = batch < threads ? (int)batch : threads;
    (void)t;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(t) reduction(| : failed)
#endif
    for (int64_t b = 0; b < batch; b++)
      if (efficient_nms_image(&a, b, 1) != MIXPREC_OK) failed |= 1;
  }
  return failed ? MIXPREC_ERR_OUT_OF_MEMORY : MIXPREC_OK;
}
