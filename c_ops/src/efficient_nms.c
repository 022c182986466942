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

#if defined(MIXPREC_X86)
int64_t mixprec__efficient_nms_score_avx2(const void *scores, mixprec_dtype dt, int64_t nc, int use_thr,
                                   float thr, uint32_t *keys, int32_t *idx);
#endif

/* The scalar loop of score_run for scores of dtype D (a constant once
 * dispatched, so each dtype gets its own copy of the loop). */
MIXPREC__FORCE_INLINE int64_t score_body(const void *scores, const mixprec_dtype D, int64_t nc, int use_thr,
                                         float thr, uint32_t *keys, int32_t *idx) {
  uint32_t lk[EFFICIENT_NMS_BLOCK];
  int32_t li[EFFICIENT_NMS_BLOCK];
  int64_t m = 0;
  for (int64_t j0 = 0; j0 < nc; j0 += EFFICIENT_NMS_BLOCK) {
    const int64_t j1 = j0 + EFFICIENT_NMS_BLOCK < nc ? j0 + EFFICIENT_NMS_BLOCK : nc;
    int64_t q = 0;
    for (int64_t j = j0; j < j1; j++) {
      const float s = mixprec__load_f32(scores, D, j);
      const int ok = (s == s) & (!use_thr | (s > thr));
      lk[q] = ~mixprec__nms_score_key(s);
      li[q] = (int32_t)j;
      q += ok;
    }
    memcpy(keys + m, lk, sizeof *lk * (size_t)q);
    memcpy(idx + m, li, sizeof *li * (size_t)q);
    m += q;
  }
  return m;
}
#undef EFFICIENT_NMS_BLOCK

/* The candidates of nc contiguous scores, (~key, position) in position
 * order; returns their count. */
static int64_t score_run(const void *scores, mixprec_dtype dt, int64_t nc, int use_thr,
                         float thr, uint32_t *keys, int32_t *idx) {
#if defined(MIXPREC_X86)
  const mixprec_cpu_isa isa = mixprec__active_isa();
  if (isa == MIXPREC_ISA_AVX2 || isa == MIXPREC_ISA_AVX512)
    return mixprec__efficient_nms_score_avx2(scores, dt, nc, use_thr, thr, keys, idx);
#endif
  MIXPREC__DISPATCH(dt, D, return score_body(scores, D, nc, use_thr, thr, keys, idx));
  return 0;
}

/* The candidates of one image's n x classes scores (score (q, c) at element
 * q * sn + c * sc of `scores`): (~key, flat index q * classes + c) in flat
 * index order, and the histogram of the keys' top bytes. Row-major scores
 * are one contiguous run; class rows (sn == 1, a channels-first head) run
 * class by class, contiguous, and are put back in flat order by a radix sort
 * of the indices; any other layout is read element by element. Returns the
 * count, or -1 when out of memory. */
static int64_t score_candidates(const uint8_t *scores, mixprec_dtype dt, size_t es, int64_t n,
                                int64_t classes, int64_t sn, int64_t sc, int use_thr, float thr,
                                uint32_t *keys, int32_t *idx, int64_t hist[256]) {
  int64_t m = 0;
  if ((sc == 1 || classes == 1) && (sn == classes || n == 1)) {
    m = score_run(scores, dt, n * classes, use_thr, thr, keys, idx);
  } else if (sn == 1 && classes > 1) {
    for (int64_t c = 0; c < classes; c++) {
      const int64_t mc = score_run(scores + (size_t)(c * sc) * es, dt, n, use_thr, thr, keys + m,
                                   idx + m);
      for (int64_t i = m; i < m + mc; i++) idx[i] = (int32_t)((int64_t)idx[i] * classes + c);
      m += mc;
    }
    uint8_t *tmp = (uint8_t *)malloc(((size_t)m + 1) * 8);
    if (!tmp) return -1;
    /* Sort by index: the index is the key, the score key rides along. */
    mixprec__nms_radix_sort((uint32_t *)idx, (int32_t *)keys, (uint32_t *)tmp,
                            (int32_t *)(tmp + ((size_t)m + 1) * 4), m);
    free(tmp);
  } else {
    for (int64_t q = 0; q < n; q++)
      for (int64_t c = 0; c < classes; c++) {
        const float s = mixprec__load_f32(scores, dt, q * sn + c * sc);
        if (s != s || (use_thr && !(s > thr))) continue;
        keys[m] = ~mixprec__nms_score_key(s);
        idx[m] = (int32_t)(q * classes + c);
        m++;
      }
  }
  for (int64_t i = 0; i < m; i++) hist[keys[i] >> 24]++;
  return m;
}

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
  const mixprec_detect_layout *layout;
  const uint8_t *scores;
  size_t score_es;
  mixprec_dtype scores_dtype;
  int64_t n, classes, k;
  const mixprec_detect_params *p;
  float iou_thr, score_thr;
  uint8_t *out_boxes, *out_scores;
  int64_t *out_classes, *out_indices, *counts;
} efficient_nms_args;

/* Each candidate's box, read in place and decoded in float32 (fb: 4
 * corners per candidate, in sorted order), with its row and class. One copy
 * of the loop per box dtype and coding (the dtype and `center` fold away), and
 * the flat score index split by 32-bit division: idx holds int32 values, so
 * j / classes and j % classes are the same as in 64 bits. */
MIXPREC__FORCE_INLINE void gather_boxes(const uint8_t *boxes, const mixprec_dtype D,
                                        const int center, const int64_t classes,
                                        const int64_t *bs, const int32_t *idx, const int64_t m,
                                        float *fb, int32_t *rows, int64_t *cls) {
  const uint32_t nclass = (uint32_t)classes;
  const int64_t s1 = bs[1], s2 = bs[2], s3 = bs[3];
  for (int64_t r = 0; r < m; r++) {
    const uint32_t j = (uint32_t)idx[r], q = j / nclass, c = j - q * nclass;
    const int64_t at = (int64_t)q * s1 + (int64_t)c * s2;
    float v[4];
    for (int e = 0; e < 4; e++) v[e] = mixprec__load_f32(boxes, D, at + e * s3);
    mixprec__box_corners(center, v, fb + 4 * r);
    rows[r] = (int32_t)r;
    cls[r] = c;
  }
}

/* Whether the layout holds each corner box as a row of 4 coordinates
 * ([note: boxes in place]): element strides (s1, s2, 1) with s1 and s2
 * multiples of 4 put box (q, c) at row q * r1 + c * r2, r1 = s1 / 4 and
 * r2 = s2 / 4 (the contiguous layouts: one box per anchor, s2 = 0, or per
 * anchor and class). 0 for centre coding, other strides, or a row past
 * int32. */
static int box_rows_of(const mixprec_detect_layout *L, int64_t n, int64_t classes, int64_t *r1,
                       int64_t *r2) {
  const int64_t *bs = L->box_strides;
  if (L->box_coding != MIXPREC_BOX_CORNER || bs[3] != 1 || bs[1] % 4 != 0 || bs[2] % 4 != 0)
    return 0;
  *r1 = bs[1] / 4, *r2 = bs[2] / 4;
  if (*r1 < 0 || *r2 < 0 || n < 1 || classes < 1) return 0;
  if (*r2 > 0 && classes - 1 > INT32_MAX / *r2) return 0;
  if (*r1 > 0 && n - 1 > (INT32_MAX - (classes - 1) * *r2) / *r1) return 0;
  return 1;
}

/* Each candidate's box row and class (box_rows_of's r1, r2), as
 * gather_boxes gives them. */
static void box_rows(int64_t classes, int64_t r1, int64_t r2, const int32_t *idx, int64_t m,
                     int32_t *rows, int64_t *cls) {
  const uint32_t nclass = (uint32_t)classes;
  for (int64_t r = 0; r < m; r++) {
    const uint32_t j = (uint32_t)idx[r], q = j / nclass, c = j - q * nclass;
    rows[r] = (int32_t)((int64_t)q * r1 + (int64_t)c * r2);
    cls[r] = c;
  }
}

static mixprec_status efficient_nms_image(const efficient_nms_args *a, int64_t b, int threads) {
  const mixprec_detect_layout *L = a->layout;
  const int64_t nc = a->n * a->classes, k = a->k;
  const int center = L->box_coding == MIXPREC_BOX_CENTER;
  uint8_t *ob = a->out_boxes + (size_t)(b * k * 4) * a->box_es;
  uint8_t *os = a->out_scores + (size_t)(b * k) * a->score_es;
  int64_t *ocls = a->out_classes + b * k, *oidx = a->out_indices + b * k;
  int64_t count = 0;
  if (nc > 0) {
    /* Two allocations: keys and idx for every score (under glibc's 32 MiB
     * mmap ceiling up to 4M scores, so repeated calls reuse heap pages
     * instead of faulting fresh ones in), then the rest for the m
     * candidates only: cls (i64); tk (u32); tv, rows (i32); fb (4 f32, only
     * when the boxes are gathered: [note: boxes in place]); flags (u8). */
    const size_t nn = (size_t)nc + 8;
    uint8_t *mem = (uint8_t *)malloc(nn * (4 + 4) + 64);
    if (!mem) return MIXPREC_ERR_OUT_OF_MEMORY;
    uint32_t *keys = (uint32_t *)mem;
    int32_t *idx = (int32_t *)(keys + nn);

    const uint8_t *scores = a->scores + (size_t)(b * L->score_strides[0]) * a->score_es;
    int64_t hist[256] = {0};
    int64_t m = score_candidates(scores, a->scores_dtype, a->score_es, a->n, a->classes,
                                 L->score_strides[1], L->score_strides[2],
                                 a->p->use_score_threshold, a->score_thr, keys, idx, hist);
    if (m < 0) {
      free(mem);
      return MIXPREC_ERR_OUT_OF_MEMORY;
    }
    int64_t r1 = 0, r2 = 0;
    const int in_rows = box_rows_of(L, a->n, a->classes, &r1, &r2);
    const size_t mm = (size_t)m + 8;
    uint8_t *mem2 = (uint8_t *)malloc(mm * ((in_rows ? 0 : 16) + 8 + 4 + 4 * 2 + 1) + 64);
    if (!mem2) {
      free(mem);
      return MIXPREC_ERR_OUT_OF_MEMORY;
    }
    int64_t *cls = (int64_t *)mem2;
    uint32_t *tk = (uint32_t *)(cls + mm);
    int32_t *tv = (int32_t *)(tk + mm), *rows = tv + mm;
    float *fb = (float *)(rows + mm);
    uint8_t *flags = (uint8_t *)(fb + (in_rows ? 0 : 4 * mm));
    if (a->p->pre_nms_top_k > 0 && m > a->p->pre_nms_top_k)
      m = select_top(keys, idx, m, a->p->pre_nms_top_k, hist, tk, tv);
    mixprec__nms_radix_sort(keys, idx, tk, tv, m);
    /* [note: boxes in place] Boxes stored as rows of 4 corners go to the NMS
     * in place, by row: it reads them once, widened to float32 exactly. Any
     * other layout (and centre coding) is read here, decoded in float32,
     * into contiguous corners fb: one more pass over the candidates and 16
     * more bytes each, which the contiguous case (the common one) does not
     * pay. Same float32 corners either way, so the same results. */
    const uint8_t *boxes = a->boxes + (size_t)(b * L->box_strides[0]) * a->box_es;
    const void *nms_boxes = boxes;
    mixprec_dtype nms_dtype = a->boxes_dtype;
    if (in_rows) {
      box_rows(a->classes, r1, r2, idx, m, rows, cls);
    } else {
      if (center)
        MIXPREC__DISPATCH(a->boxes_dtype, D,
                          gather_boxes(boxes, D, 1, a->classes, L->box_strides, idx, m, fb, rows, cls));
      else
        MIXPREC__DISPATCH(a->boxes_dtype, D,
                          gather_boxes(boxes, D, 0, a->classes, L->box_strides, idx, m, fb, rows, cls));
      nms_boxes = fb;
      nms_dtype = MIXPREC_F32;
    }
    const mixprec_status st =
        mixprec__nms_sorted(nms_boxes, nms_dtype, rows, a->p->class_agnostic ? NULL : cls, m,
                            a->iou_thr, k, threads, flags);
    if (st != MIXPREC_OK) {
      free(mem2);
      free(mem);
      return st;
    }
    for (int64_t r = 0; r < m && count < k; r++) {
      if (!flags[r]) continue;
      const int64_t j = idx[r], q = j / a->classes, c = j % a->classes;
      const int64_t at = q * L->box_strides[1] + c * L->box_strides[2];
      for (int e = 0; e < 4; e++) {
        if (center)
          mixprec__store_f32(ob, a->boxes_dtype, count * 4 + e, fb[4 * r + e]);
        else
          memcpy(ob + (size_t)(count * 4 + e) * a->box_es,
                 boxes + (size_t)(at + e * L->box_strides[3]) * a->box_es, a->box_es);
      }
      memcpy(os + (size_t)count * a->score_es,
             scores + (size_t)(q * L->score_strides[1] + c * L->score_strides[2]) * a->score_es,
             a->score_es);
      ocls[count] = c;
      oidx[count] = q;
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

mixprec_detect_layout mixprec_detect_layout_contiguous(int64_t n, int64_t classes,
                                                       int class_boxes) {
  return mixprec__efficient_nms_contiguous(n, classes, class_boxes);
}

mixprec_status mixprec_efficient_nms_strided(
    const void *boxes, mixprec_dtype boxes_dtype, const void *scores, mixprec_dtype scores_dtype,
    const mixprec_detect_layout *layout, int64_t batch, int64_t n, int64_t classes,
    const mixprec_detect_params *p, void *out_boxes, void *out_scores, int64_t *out_classes,
    int64_t *out_indices, int64_t *counts) {
  mixprec_status st =
      mixprec__efficient_nms_check(boxes, boxes_dtype, scores, scores_dtype, batch, n, classes, p,
                                   out_boxes, out_scores, out_classes, out_indices, counts);
  if (st == MIXPREC_OK) st = mixprec__efficient_nms_check_layout(layout, batch, n, classes);
  if (st != MIXPREC_OK) return st;
  if (batch == 0) return MIXPREC_OK;
  efficient_nms_args a;
  a.boxes = (const uint8_t *)boxes;
  a.box_es = (size_t)mixprec_dtype_size(boxes_dtype);
  a.boxes_dtype = boxes_dtype;
  a.layout = layout;
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

mixprec_status mixprec_efficient_nms(const void *boxes, mixprec_dtype boxes_dtype,
                                     int class_boxes, const void *scores,
                                     mixprec_dtype scores_dtype, int64_t batch, int64_t n,
                                     int64_t classes, const mixprec_detect_params *p,
                                     void *out_boxes, void *out_scores, int64_t *out_classes,
                                     int64_t *out_indices, int64_t *counts) {
  /* The sizes first: the layout's products must not overflow. */
  const mixprec_status st =
      mixprec__efficient_nms_check(boxes, boxes_dtype, scores, scores_dtype, batch, n, classes, p,
                                   out_boxes, out_scores, out_classes, out_indices, counts);
  if (st != MIXPREC_OK) return st;
  const mixprec_detect_layout l = mixprec__efficient_nms_contiguous(n, classes, class_boxes);
  return mixprec_efficient_nms_strided(boxes, boxes_dtype, scores, scores_dtype, &l, batch, n,
                                       classes, p, out_boxes, out_scores, out_classes,
                                       out_indices, counts);
}
