/* Greedy NMS and class-aware (batched) NMS on the CPU. Contracts:
 * mixprec/nms.h. The plan: [note: cpu nms plan] (at run()); bit-exactness
 * with torchvision: [note: torchvision's IoU] (nms_rules.h). */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "nms_check.h"
#include "nms_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Fewest pair tests (sum over classes of size^2 / 2, an upper bound of the
 * work) for which batched NMS runs its classes on several threads. */
#define PARALLEL_MIN_PAIRS 4e6

/* [note: nms scratch] A function's scratch is one malloc `mem` carved into
 * arrays of nn = count + 8 elements, in the order of its X-macro list
 * X(type, name); the list gives both the size and the carving. The slack (8
 * elements each, 64 bytes in all) is kept from the hand-carved lists. */
#define NMS__BUF_SIZE(type, name) +sizeof(type)
#define NMS__BUF_TAKE(type, name) \
  type *name = (type *)at;        \
  at += sizeof(type) * nn;
#define NMS_SCRATCH_OR_RETURN(LIST, count)                              \
  const size_t nn = (size_t)(count) + 8;                                \
  uint8_t *mem = (uint8_t *)malloc(nn * (0 LIST(NMS__BUF_SIZE)) + 64); \
  if (!mem) return MIXPREC_ERR_OUT_OF_MEMORY;                           \
  uint8_t *at = mem;                                                    \
  LIST(NMS__BUF_TAKE)                                                   \
  (void)at

/* A sweep (mixprec__nms_sweep_scalar's contract, nms_internal.h). */
typedef int64_t (*sweep_fn)(const float *x1, const float *y1, const float *x2,
                            const float *y2, const float *area, int32_t *dead,
                            int64_t begin, int64_t end, const float b[5], float thr);

static int64_t sweep_scalar(const float *x1, const float *y1, const float *x2,
                            const float *y2, const float *area, int32_t *dead,
                            int64_t begin, int64_t end, const float b[5], float thr) {
  return mixprec__nms_sweep_scalar(x1, y1, x2, y2, area, dead, begin, end, b, thr);
}

static sweep_fn choose_sweep(void) {
  switch (mixprec__active_isa()) {
#if defined(MIXPREC_X86)
    case MIXPREC_ISA_AVX512: /* no AVX-512 sweep: AVX2 is a subset */
    case MIXPREC_ISA_AVX2:
      return mixprec__nms_sweep_avx2;
#endif
    default:
      return sweep_scalar;
  }
}

float mixprec__nms_float_floor(double t) {
  float f = (float)t;
  if ((double)f > t) f = nextafterf(f, -INFINITY);
  return f;
}

/* 8 bits per pass; passes whose digit is the same for every key are
 * skipped. */
void mixprec__nms_radix_sort(uint32_t *keys, int32_t *vals, uint32_t *tk, int32_t *tv,
                             int64_t m) {
  for (int shift = 0; shift < 32; shift += 8) {
    int64_t count[257] = {0};
    for (int64_t i = 0; i < m; i++) count[((keys[i] >> shift) & 0xffu) + 1]++;
    int trivial = 0;
    for (int d = 1; d <= 256; d++)
      if (count[d] == m) trivial = 1;
    if (trivial) continue;
    for (int d = 1; d <= 256; d++) count[d] += count[d - 1];
    for (int64_t i = 0; i < m; i++) {
      int64_t at = count[(keys[i] >> shift) & 0xffu]++;
      tk[at] = keys[i];
      tv[at] = vals[i];
    }
    memcpy(keys, tk, sizeof *keys * (size_t)m);
    memcpy(vals, tv, sizeof *vals * (size_t)m);
  }
}

/* Candidates of one class, positions [begin, end) of the SoA arrays, in
 * decreasing score order. */
typedef struct nms_soa {
  float *x1, *y1, *x2, *y2, *area;
  int32_t *rank; /* position in the global score order */
  int32_t *dead; /* 0 live, -1 suppressed */
  /* The same candidates sorted by x1 (positions [begin, end) of a class
   * again), for the spatially pruned greedy loop, and scratch for it. */
  float *sx1, *sy1, *sx2, *sy2, *sarea;
  int32_t *sdead;
  int32_t *xpos;          /* score position -> x-sorted position */
  uint32_t *key, *tkey;   /* radix-sort keys */
  int32_t *val, *tval;    /* radix-sort values */
} nms_soa;

/* Greedy NMS of one class: flags[rank] = 1 for each kept box; stops after
 * max_keep (< 0: no limit). Reorders (compacts) the segment in place. */
static void greedy(const nms_soa *s, int64_t begin, int64_t end, float thr, int64_t max_keep,
                   sweep_fn sweep, uint8_t *flags) {
  int64_t kept = 0, dead_since = 0;
  for (int64_t i = begin; i < end; i++) {
    if (s->dead[i]) continue;
    flags[s->rank[i]] = 1;
    if (++kept == max_keep) return;
    const float b[5] = {s->x1[i], s->y1[i], s->x2[i], s->y2[i], s->area[i]};
    dead_since += sweep(s->x1, s->y1, s->x2, s->y2, s->area, s->dead, i + 1, end, b, thr);
    if (dead_since >= 64 && 4 * dead_since >= end - i) {
      /* Drop the dead, keeping the survivors' order. */
      int64_t w = i + 1;
      for (int64_t j = i + 1; j < end; j++) {
        if (s->dead[j]) continue;
        s->x1[w] = s->x1[j];
        s->y1[w] = s->y1[j];
        s->x2[w] = s->x2[j];
        s->y2[w] = s->y2[j];
        s->area[w] = s->area[j];
        s->rank[w] = s->rank[j];
        s->dead[w] = 0;
        w++;
      }
      end = w;
      dead_since = 0;
    }
  }
}

/* Below this many candidates a class uses the compacting loop above. */
#define XSORT_MIN 1024

/* Orderable bits of a finite float (ascending). */
MIXPREC__FORCE_INLINE uint32_t x_key(float f) {
  uint32_t u = mixprec__f32_bits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* First q in [lo, hi) with !(below(a[q])), for a predicate that holds on a
 * prefix of the ascending array a. */
#define LOWER_BOUND(a, lo, hi, below) \
  do {                                 \
    while (lo < hi) {                  \
      int64_t mid_ = lo + (hi - lo) / 2; \
      if (below(a[mid_])) lo = mid_ + 1; else hi = mid_; \
    }                                  \
  } while (0)

/* Greedy NMS of one class with spatial pruning: the candidates are also kept
 * sorted by x1, and a kept box i only sweeps those with
 *   x1i - wmax < x1j < x2i
 * (wmax: the widest candidate), since any other j has an intersection width
 * min(x2i, x2j) - max(x1i, x1j) <= 0, hence inter = 0 and IoU +-0 or NaN,
 * never > thr. Sweeping a candidate of higher score (kept or dead already)
 * changes nothing: only boxes of lower score are ever looked up. The
 * decisions are those of greedy(), bit for bit. Needs finite x1/x2 for all
 * candidates (checked by the caller); returns 0 if it was not applicable. */
static int greedy_x(const nms_soa *s, int64_t begin, int64_t end, float thr, int64_t max_keep,
                    sweep_fn sweep, uint8_t *flags) {
  const int64_t len = end - begin;
  double wmax = 0.0;
  for (int64_t k = begin; k < end; k++) {
    const float a = s->x1[k], b = s->x2[k];
    if (mixprec__f32_bits_nonfinite(mixprec__f32_bits(a)) ||
        mixprec__f32_bits_nonfinite(mixprec__f32_bits(b)))
      return 0;
    const double w = (double)b - (double)a;
    if (w > wmax) wmax = w;
    s->key[k] = x_key(a);
    s->val[k] = (int32_t)k;
  }
  mixprec__nms_radix_sort(s->key + begin, s->val + begin, s->tkey + begin, s->tval + begin, len);
  for (int64_t q = begin; q < end; q++) {
    const int32_t p = s->val[q];
    s->sx1[q] = s->x1[p];
    s->sy1[q] = s->y1[p];
    s->sx2[q] = s->x2[p];
    s->sy2[q] = s->y2[p];
    s->sarea[q] = s->area[p];
    s->sdead[q] = 0;
    s->xpos[p] = (int32_t)q;
  }
  /* Rounding slack: x1i - wmax is computed in double from floats. */
  const double slack = wmax * 1e-9 + 1e-300;
  int64_t kept = 0;
  for (int64_t i = begin; i < end; i++) {
    if (s->sdead[s->xpos[i]]) continue;
    flags[s->rank[i]] = 1;
    if (++kept == max_keep) return 1;
    const float b[5] = {s->x1[i], s->y1[i], s->x2[i], s->y2[i], s->area[i]};
    const double lo_x = (double)b[0] - wmax - slack - fabs((double)b[0]) * 1e-9;
    const float hi_x = b[2];
    int64_t lo = begin, hi = end;
#define BELOW_LO(v) ((double)(v) <= lo_x)
#define BELOW_HI(v) ((v) < hi_x)
    LOWER_BOUND(s->sx1, lo, hi, BELOW_LO);
    int64_t first = lo;
    hi = end;
    LOWER_BOUND(s->sx1, lo, hi, BELOW_HI);
#undef BELOW_LO
#undef BELOW_HI
    sweep(s->sx1, s->sy1, s->sx2, s->sy2, s->sarea, s->sdead, first, lo, b, thr);
  }
  return 1;
}

static void class_nms(const nms_soa *s, int64_t begin, int64_t end, float thr, int64_t max_keep,
                      sweep_fn sweep, uint8_t *flags) {
  if (end - begin >= XSORT_MIN && greedy_x(s, begin, end, thr, max_keep, sweep, flags)) return;
  greedy(s, begin, end, thr, max_keep, sweep, flags);
}

MIXPREC__FORCE_INLINE int64_t load_class(const void *classes, mixprec_index_dtype dt, int64_t i) {
  return dt == MIXPREC_I32 ? (int64_t)((const int32_t *)classes)[i]
                           : ((const int64_t *)classes)[i];
}

typedef struct class_rank {
  int64_t cls;
  int32_t rank;
} class_rank;

static int cmp_class_rank(const void *pa, const void *pb) {
  const class_rank *a = (const class_rank *)pa, *b = (const class_rank *)pb;
  if (a->cls != b->cls) return a->cls < b->cls ? -1 : 1;
  return (a->rank > b->rank) - (a->rank < b->rank);
}

/* Fills perm[0..m) with the ranks 0..m-1 grouped by class cls[rank] (each
 * class in rank order) and seg[0..n_seg] with the class boundaries. seg has
 * room for m + 1 entries. Returns the segment count, or -1 if out of
 * memory. */
static int64_t group_by_class(const int64_t *cls, int64_t m, int32_t *perm, int64_t *seg) {
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int64_t r = 0; r < m; r++) {
    int64_t c = cls[r];
    if (c < lo) lo = c;
    if (c > hi) hi = c;
  }
  const uint64_t range = (uint64_t)hi - (uint64_t)lo + 1u; /* >= 1, may wrap to 0 */
  int64_t n_seg = 0;
  if (range != 0 && range <= (uint64_t)(2 * m + 4096)) {
    /* Counting sort by class: stable, so each class keeps rank order. */
    int64_t *count = (int64_t *)calloc((size_t)range + 1, sizeof *count);
    if (!count) return -1;
    for (int64_t r = 0; r < m; r++)
      count[(uint64_t)cls[r] - (uint64_t)lo + 1u]++;
    for (uint64_t k = 1; k <= range; k++) {
      if (count[k]) seg[n_seg++] = count[k - 1];
      count[k] += count[k - 1];
    }
    for (int64_t r = 0; r < m; r++)
      perm[count[(uint64_t)cls[r] - (uint64_t)lo]++] = (int32_t)r;
    free(count);
  } else {
    class_rank *cr = (class_rank *)malloc(sizeof *cr * (size_t)m);
    if (!cr) return -1;
    for (int64_t r = 0; r < m; r++) {
      cr[r].cls = cls[r];
      cr[r].rank = (int32_t)r;
    }
    qsort(cr, (size_t)m, sizeof *cr, cmp_class_rank);
    for (int64_t r = 0; r < m; r++) {
      perm[r] = cr[r].rank;
      if (r == 0 || cr[r].cls != cr[r - 1].cls) seg[n_seg++] = r;
    }
    free(cr);
  }
  seg[n_seg] = m;
  return n_seg;
}

mixprec_nms_params mixprec_nms_params_default(void) {
  mixprec_nms_params p;
  p.iou_threshold = 0.5;
  p.use_score_threshold = 0;
  p.score_threshold = 0.0;
  p.max_output = -1;
  return p;
}

int64_t mixprec_nms_capacity(int64_t n, const mixprec_nms_params *p) {
  if (n < 0 || !p) return -1;
  return p->max_output >= 0 && p->max_output < n ? p->max_output : n;
}

static mixprec_status check_args(const void *boxes, mixprec_dtype boxes_dtype,
                                 const void *scores, mixprec_dtype scores_dtype, int64_t n,
                                 const mixprec_nms_params *p, const int64_t *keep,
                                 const int64_t *n_keep) {
  const mixprec_status st = mixprec__nms_check_sizes(boxes_dtype, scores_dtype, n, p, n_keep);
  if (st != MIXPREC_OK) return st;
  return mixprec__nms_check_data(boxes, scores, n, p, keep);
}

mixprec_status mixprec__nms_sorted(const void *boxes, mixprec_dtype boxes_dtype,
                                   const int32_t *rows, const int64_t *cls, int64_t m,
                                   float iou_thr, int64_t max_keep, int max_threads,
                                   uint8_t *flags) {
  for (int64_t r = 0; r < m; r++) flags[r] = 0;
  if (m == 0 || max_keep == 0) return MIXPREC_OK;

  /* One allocation ([note: nms scratch]); the x-sorted copies sx1.. sdead
   * mirror x1.. dead. */
#define SORTED_BUFS(X)                                                         \
  X(int64_t, seg) X(int32_t, perm) X(float, x1) X(float, y1) X(float, x2)      \
  X(float, y2) X(float, area) X(int32_t, rank) X(int32_t, dead) X(float, sx1)  \
  X(float, sy1) X(float, sx2) X(float, sy2) X(float, sarea) X(int32_t, sdead) \
  X(int32_t, xpos) X(uint32_t, key) X(uint32_t, tkey) X(int32_t, val)          \
  X(int32_t, tval)
  NMS_SCRATCH_OR_RETURN(SORTED_BUFS, m);
#undef SORTED_BUFS
  nms_soa s;
  s.x1 = x1, s.y1 = y1, s.x2 = x2, s.y2 = y2, s.area = area, s.rank = rank, s.dead = dead;
  s.sx1 = sx1, s.sy1 = sy1, s.sx2 = sx2, s.sy2 = sy2, s.sarea = sarea, s.sdead = sdead;
  s.xpos = xpos, s.key = key, s.tkey = tkey, s.val = val, s.tval = tval;

  int64_t n_seg = 1;
  seg[0] = 0;
  seg[1] = m;
  if (cls) {
    n_seg = group_by_class(cls, m, perm, seg);
    if (n_seg < 0) {
      free(mem);
      return MIXPREC_ERR_OUT_OF_MEMORY;
    }
  } else {
    for (int64_t r = 0; r < m; r++) perm[r] = (int32_t)r;
  }
  for (int64_t k = 0; k < m; k++) {
    const int32_t r = perm[k];
    const int64_t i = rows[r];
    x1[k] = mixprec__load_f32(boxes, boxes_dtype, 4 * i + 0);
    y1[k] = mixprec__load_f32(boxes, boxes_dtype, 4 * i + 1);
    x2[k] = mixprec__load_f32(boxes, boxes_dtype, 4 * i + 2);
    y2[k] = mixprec__load_f32(boxes, boxes_dtype, 4 * i + 3);
    area[k] = mixprec__nms_area(x1[k], y1[k], x2[k], y2[k]);
    rank[k] = r;
    dead[k] = 0;
  }

  const sweep_fn sweep = choose_sweep();
  if (n_seg == 1) {
    class_nms(&s, 0, m, iou_thr, max_keep, sweep, flags);
  } else {
    /* Threads pay only for enough pairs: a parallel region costs tens of
     * microseconds, and far more when the cores are shared (a spinning
     * OpenMP worker then loses whole scheduler ticks). */
    double pairs = 0.0;
    for (int64_t c = 0; c < n_seg; c++) {
      const double len = (double)(seg[c + 1] - seg[c]);
      pairs += 0.5 * len * len;
    }
    int threads = max_threads < 1 ? 1 : max_threads;
    if (threads > n_seg) threads = (int)n_seg;
    if (pairs < PARALLEL_MIN_PAIRS) threads = 1;
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
#endif
    for (int64_t c = 0; c < n_seg; c++)
      class_nms(&s, seg[c], seg[c + 1], iou_thr, max_keep, sweep, flags);
  }
  free(mem);
  return MIXPREC_OK;
}

/* [note: cpu nms plan] Widen the scores, drop those at or below the score
 * threshold, sort the rest by decreasing score with a stable LSD radix sort
 * on 32-bit keys; gather the boxes in that order into structure-of-arrays
 * floats (x1, y1, x2, y2, area); for the batched variant regroup them by
 * class (stable, so each class stays in score order). Then, per class, the
 * greedy loop: the first live box is kept and sweeps the later live boxes of
 * its class with an IoU test that is SIMD over 8 candidates (nms_avx2.c). A
 * class of 1024+ candidates with finite x coordinates is also sorted by x1,
 * and a kept box only sweeps the x-range that can intersect it (greedy_x);
 * smaller classes compact their dead candidates away once a quarter of the
 * remaining ones are dead. Classes run in parallel, each marking its kept
 * boxes in a per-rank flag array read out in rank order (= decreasing score,
 * stable) at the end, so the result does not depend on threads. Everything
 * after the score sort is mixprec__nms_sorted, which efficient_nms.c calls
 * as well. */
static mixprec_status run(const void *boxes, mixprec_dtype boxes_dtype, const void *scores,
                          mixprec_dtype scores_dtype, const void *classes,
                          mixprec_index_dtype classes_dtype, int64_t n,
                          const mixprec_nms_params *p, int64_t *keep, int64_t *n_keep) {
  const int64_t cap = mixprec_nms_capacity(n, p);
  const float iou_thr = mixprec__nms_float_floor(p->iou_threshold);
  const float score_thr =
      p->use_score_threshold ? mixprec__nms_float_floor(p->score_threshold) : 0.0f;

  /* One allocation ([note: nms scratch]). */
#define RUN_BUFS(X) \
  X(int64_t, cls) X(uint32_t, keys) X(uint32_t, tk) X(int32_t, orig) X(int32_t, tv) X(uint8_t, flags)
  NMS_SCRATCH_OR_RETURN(RUN_BUFS, n);
#undef RUN_BUFS

  /* Candidates (score > threshold), sorted by decreasing score, stable. */
  int64_t m = 0;
  for (int64_t i = 0; i < n; i++) {
    float sc = mixprec__load_f32(scores, scores_dtype, i);
    if (p->use_score_threshold && !(sc > score_thr)) continue;
    keys[m] = ~mixprec__nms_score_key(sc);
    orig[m] = (int32_t)i;
    m++;
  }
  mixprec__nms_radix_sort(keys, orig, tk, tv, m);
  if (classes)
    for (int64_t r = 0; r < m; r++) cls[r] = load_class(classes, classes_dtype, orig[r]);

  const int64_t max_keep = p->max_output >= 0 ? p->max_output : -1;
  const mixprec_status st =
      mixprec__nms_sorted(boxes, boxes_dtype, orig, classes ? cls : NULL, m, iou_thr, max_keep,
                          mixprec__num_threads(), flags);
  if (st != MIXPREC_OK) {
    free(mem);
    return st;
  }

  int64_t count = 0;
  for (int64_t r = 0; r < m && count < cap; r++)
    if (flags[r]) keep[count++] = orig[r];
  for (int64_t k = count; k < cap; k++) keep[k] = -1;
  *n_keep = count;
  free(mem);
  return MIXPREC_OK;
}

mixprec_status mixprec_nms(const void *boxes, mixprec_dtype boxes_dtype, const void *scores,
                           mixprec_dtype scores_dtype, int64_t n, const mixprec_nms_params *p,
                           int64_t *keep, int64_t *n_keep) {
  mixprec_status st = check_args(boxes, boxes_dtype, scores, scores_dtype, n, p, keep, n_keep);
  if (st != MIXPREC_OK) return st;
  return run(boxes, boxes_dtype, scores, scores_dtype, NULL, MIXPREC_I64, n, p, keep, n_keep);
}

mixprec_status mixprec_batched_nms(const void *boxes, mixprec_dtype boxes_dtype,
                                   const void *scores, mixprec_dtype scores_dtype,
                                   const void *classes, mixprec_index_dtype classes_dtype,
                                   int64_t n, const mixprec_nms_params *p, int64_t *keep,
                                   int64_t *n_keep) {
  mixprec_status st = check_args(boxes, boxes_dtype, scores, scores_dtype, n, p, keep, n_keep);
  if (st != MIXPREC_OK) return st;
  if (n > 0 && !classes) return MIXPREC_ERR_NULL_POINTER;
  if (!mixprec__nms_classes_dtype_ok(classes_dtype)) return MIXPREC_ERR_BAD_DTYPE;
  return run(boxes, boxes_dtype, scores, scores_dtype, classes, classes_dtype, n, p, keep,
             n_keep);
}
