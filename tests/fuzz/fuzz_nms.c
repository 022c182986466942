/* libFuzzer harness: mixprec_nms() and mixprec_batched_nms() (nms.h).
 *
 * One input = one NMS call on 0 to a few thousand boxes (FP32/FP16/BF16
 * boxes and scores, each in its own dtype; int64/int32 class ids), boxes on
 * a coarse grid (many exact overlaps and score ties) or with raw bits (NaN,
 * inf, inverted, zero-area), IoU thresholds in and out of [0, 1] (NaN and
 * negative refused), score thresholds (NaN refused), max_output from
 * INT64_MIN to INT64_MAX; with the fault bit also NULL pointers, unknown
 * dtypes and sizes outside [0, INT32_MAX]. keep[] is exactly
 * mixprec_nms_capacity() entries (ASan sees a write past it). Checked: the
 * status is one the header documents; on an error keep and n_keep are
 * unchanged; on success keep and n_keep equal a greedy O(n * kept)
 * reference written here from the header's semantics (torchvision's float
 * IoU, stable descending sort with NaN first, per-class suppression, -1
 * padding), the inputs are unchanged, and so is the result on 1 and 2
 * threads and on each ISA path. */
#include "fuzz_common.h"

typedef struct call {
  int batched;
  int64_t n;    /* as passed */
  int64_t held; /* boxes actually allocated */
  mixprec_dtype bd, sd;
  mixprec_index_dtype cd;
  void *boxes, *scores, *classes;
  mixprec_nms_params p;
  int p_null, keep_null, nkeep_null;
} call;

static int64_t load_class(const call *c, int64_t i) {
  if (c->cd == MIXPREC_I32) {
    int32_t v;
    memcpy(&v, (const char *)c->classes + 4 * i, 4);
    return v;
  }
  int64_t v;
  memcpy(&v, (const char *)c->classes + 8 * i, 8);
  return v;
}

/* std::max / std::min as torchvision calls them: max(a, b) = a < b ? b : a,
 * min(a, b) = b < a ? b : a. */
static float smax(float a, float b) { return a < b ? b : a; }
static float smin(float a, float b) { return b < a ? b : a; }

static int order_before(float a, int64_t ia, float b, int64_t ib) {
  /* decreasing score, NaN above every number, stable (ties by index) */
  const int na = fz_isnan(a), nb = fz_isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

static float *g_sc; /* the scores qsort's comparison reads */
static int cmp_order(const void *x, const void *y) {
  const int64_t i = *(const int64_t *)x, j = *(const int64_t *)y;
  if (i == j) return 0;
  return order_before(g_sc[i], i, g_sc[j], j) ? -1 : 1;
}

/* The header's semantics, directly: returns the kept count, fills keep. */
static int64_t reference(const call *c, int64_t *keep, int64_t cap) {
  const int64_t n = c->n;
  float *sc = (float *)fz_alloc(sizeof(float) * (size_t)n);
  float *b = (float *)fz_alloc(sizeof(float) * 4 * (size_t)n);
  float *area = (float *)fz_alloc(sizeof(float) * (size_t)n);
  int64_t *ord = (int64_t *)fz_alloc(sizeof(int64_t) * (size_t)n);
  int64_t *kept = (int64_t *)fz_alloc(sizeof(int64_t) * (size_t)n);
  int64_t m = 0;
  for (int64_t i = 0; i < n; i++) {
    sc[i] = fz_load(c->scores, c->sd, i);
    for (int k = 0; k < 4; k++) b[4 * i + k] = fz_load(c->boxes, c->bd, 4 * i + k);
    area[i] = (b[4 * i + 2] - b[4 * i + 0]) * (b[4 * i + 3] - b[4 * i + 1]);
    if (c->p.use_score_threshold && !((double)sc[i] > c->p.score_threshold)) continue;
    ord[m++] = i;
  }
  g_sc = sc;
  qsort(ord, (size_t)m, sizeof *ord, cmp_order);
  int64_t n_kept = 0;
  for (int64_t r = 0; r < m; r++) {
    const int64_t j = ord[r];
    int suppressed = 0;
    for (int64_t q = 0; q < n_kept && !suppressed; q++) {
      const int64_t i = kept[q];
      if (c->batched && load_class(c, i) != load_class(c, j)) continue;
      const float *bi = &b[4 * i], *bj = &b[4 * j];
      const float xx1 = smax(bi[0], bj[0]), yy1 = smax(bi[1], bj[1]);
      const float xx2 = smin(bi[2], bj[2]), yy2 = smin(bi[3], bj[3]);
      const float w = smax(0.0f, xx2 - xx1), h = smax(0.0f, yy2 - yy1);
      const float inter = w * h;
      const float ovr = inter / (area[i] + area[j] - inter);
      if ((double)ovr > c->p.iou_threshold) suppressed = 1;
    }
    if (!suppressed) kept[n_kept++] = j;
  }
  if (c->p.max_output >= 0 && n_kept > c->p.max_output) n_kept = c->p.max_output;
  for (int64_t k = 0; k < cap; k++) keep[k] = k < n_kept ? kept[k] : -1;
  free(sc);
  free(b);
  free(area);
  free(ord);
  free(kept);
  return n_kept;
}

static mixprec_status run(const call *c, int64_t *keep, int64_t *n_keep) {
  const mixprec_nms_params p = c->p;
  mixprec_status st;
  if (c->batched)
    st = mixprec_batched_nms(c->boxes, c->bd, c->scores, c->sd, c->classes, c->cd, c->n,
                             c->p_null ? NULL : &p, c->keep_null ? NULL : keep,
                             c->nkeep_null ? NULL : n_keep);
  else
    st = mixprec_nms(c->boxes, c->bd, c->scores, c->sd, c->n, c->p_null ? NULL : &p,
                     c->keep_null ? NULL : keep, c->nkeep_null ? NULL : n_keep);
  FZ_CHECK(!memcmp(&p, &c->p, sizeof p), "params written");
  return st;
}

static void fill_boxes(fz *f, void *buf, mixprec_dtype d, int64_t n) {
  const uint8_t mode = fz_u8(f) % 4;
  if (mode == 0) { /* raw bits and specials */
    fz_fill(f, buf, d, 4 * n);
    return;
  }
  /* Boxes on a grid of `g` steps, sizes up to `s` steps: exact overlaps,
   * duplicates, zero-area boxes; mode 3 also inverts some. */
  const int g = (int)fz_range(f, 1, 64), s = (int)fz_range(f, 0, 16);
  const float unit = ldexpf(1.0f, (int)fz_range(f, -8, 12));
  const uint8_t rate = fz_u8(f);
  for (int64_t i = 0; i < n; i++) {
    const uint64_t r = fz_rng(f);
    float x1 = (float)(r % (uint64_t)g) * unit, y1 = (float)((r >> 8) % (uint64_t)g) * unit;
    float w = (float)((r >> 16) % (uint64_t)(s + 1)) * unit;
    float h = (float)((r >> 24) % (uint64_t)(s + 1)) * unit;
    float v[4] = {x1, y1, x1 + w, y1 + h};
    if (mode == 3 && ((r >> 32) & 7) == 0) {
      const float t = v[0];
      v[0] = v[2];
      v[2] = t;
    }
    if (((r >> 40) & 255) < rate / 8) v[(r >> 48) & 3] = fz_special(f);
    for (int k = 0; k < 4; k++) fz_store(buf, d, 4 * i + k, v[k]);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FZ_OPEN(f, c, op);
  c.batched = op & 1;
  const int faults = fz_faults(op, 0xc0);
  const uint8_t sz = fz_u8(&f);
  /* 2900+ boxes of one class (or several of ~2000) pass the 4M-pair limit
   * above which batched NMS runs its classes on several threads. */
  c.held = sz < 8 ? 0 : sz < 210 ? fz_range(&f, 1, 64) : sz < 255 ? fz_range(&f, 65, 400) : 0;
  if (sz == 255) c.held = c.batched && (fz_u8(&f) & 3) == 3 ? fz_range(&f, 2900, 3400) : 401;
  c.n = c.held;
  c.bd = fz_dtype(&f, faults);
  c.sd = fz_dtype(&f, faults);
  c.cd = (mixprec_index_dtype)(fz_u8(&f) & 1);
  c.p = mixprec_nms_params_default();
  {
    const uint8_t m = fz_u8(&f);
    c.p.iou_threshold = m < 64 ? 0.5 : m < 128 ? (double)fz_range(&f, 0, 8) / 8.0
                                                : fz_param(&f, 0.0, 1.0);
    if (!faults && !(c.p.iou_threshold >= 0)) c.p.iou_threshold = 0.3;
    const uint8_t u = fz_u8(&f);
    c.p.use_score_threshold = u >= 160;
    if (c.p.use_score_threshold) {
      c.p.score_threshold = fz_param(&f, -1.0, 1.0);
      if (!faults && c.p.score_threshold != c.p.score_threshold) c.p.score_threshold = 0.0;
    }
    const uint8_t mo = fz_u8(&f);
    static const int64_t extremes[] = {INT64_MIN, -2, 0, INT64_MAX, (int64_t)1 << 40};
    c.p.max_output = mo < 128 ? -1 : mo < 224 ? fz_range(&f, 0, 64) : extremes[mo % 5];
  }
  fz_allowed errors = 0;
  const uint8_t fm = faults ? fz_u8(&f) : 0;
  if (fm & 1) {
    static const int64_t bad_n[] = {-1, INT64_MIN, (int64_t)INT32_MAX + 1, INT64_MAX};
    c.n = bad_n[fz_u8(&f) % 4];
  }
  c.p_null = (fm & 2) != 0;
  c.keep_null = (fm & 4) != 0;
  c.nkeep_null = (fm & 8) != 0;
  if (faults && fz_u8(&f) >= 224) c.cd = (mixprec_index_dtype)(fz_u8(&f) % 2 ? 2 : -1);

  const size_t bsz = fz_dsize(c.bd), ssz = fz_dsize(c.sd);
  const size_t csz = c.cd == MIXPREC_I32 ? 4 : 8;
  if (!(fm & 16)) {
    c.boxes = fz_alloc((size_t)c.held * 4 * bsz);
    fill_boxes(&f, c.boxes, fz_dtype_ok(c.bd) ? c.bd : MIXPREC_F32, c.held);
  }
  if (!(fm & 32)) {
    c.scores = fz_alloc((size_t)c.held * ssz);
    fz_fill(&f, c.scores, fz_dtype_ok(c.sd) ? c.sd : MIXPREC_F32, c.held);
  }
  if (c.batched && !(fm & 64)) {
    c.classes = fz_alloc((size_t)c.held * csz);
    const int64_t nc = fz_range(&f, 1, 8);
    const uint8_t wild = fz_u8(&f);
    for (int64_t i = 0; i < c.held; i++) {
      int64_t v = (int64_t)(fz_rng(&f) % (uint64_t)nc);
      if (wild >= 200) v = v == 0 ? INT64_MIN : v == 1 ? INT64_MAX : v == 2 ? -1 : v;
      if (c.cd == MIXPREC_I32) {
        const int32_t w = (int32_t)v;
        memcpy((char *)c.classes + 4 * i, &w, 4);
      } else {
        memcpy((char *)c.classes + 8 * i, &v, 8);
      }
    }
  }

  /* The documented errors. */
  if (c.p_null || c.nkeep_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  if (c.n < 0 || c.n > INT32_MAX) errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  if (!fz_dtype_ok(c.bd) || !fz_dtype_ok(c.sd)) errors |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
  if (c.n > 0 && (!c.boxes || !c.scores)) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  if (!(c.p.iou_threshold >= 0)) errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (c.p.use_score_threshold && c.p.score_threshold != c.p.score_threshold)
    errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (c.batched) {
    if (c.n > 0 && !c.classes) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
    if (c.cd != MIXPREC_I64 && c.cd != MIXPREC_I32) errors |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
  }
  /* Capacity: n, or max_output if smaller and not negative; -1 for n < 0 or
   * p NULL. keep[] gets what the capacity says for the n passed, but never
   * more than the boxes held (a larger n must be refused first). */
  const int64_t cap = mixprec_nms_capacity(c.n, c.p_null ? NULL : &c.p);
  {
    int64_t want = -1;
    if (!c.p_null && c.n >= 0) want = c.p.max_output >= 0 && c.p.max_output < c.n ? c.p.max_output : c.n;
    FZ_CHECK(cap == want, "mixprec_nms_capacity(%lld, max_output %lld) = %lld, expected %lld",
             (long long)c.n, (long long)c.p.max_output, (long long)cap, (long long)want);
  }
  if (cap > 0 && c.keep_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  int64_t keep_len = cap > 0 ? cap : 0;
  if (keep_len > c.held) keep_len = c.held; /* only with an error expected */
  FZ_CHECK(errors || keep_len == (cap > 0 ? cap : 0), "harness: capacity %lld > held %lld",
           (long long)cap, (long long)c.held);

  void *boxes0 = c.boxes ? fz_dup(c.boxes, (size_t)c.held * 4 * bsz) : NULL;
  void *scores0 = c.scores ? fz_dup(c.scores, (size_t)c.held * ssz) : NULL;
  void *classes0 = c.classes ? fz_dup(c.classes, (size_t)c.held * csz) : NULL;
  int64_t *keep_init = (int64_t *)fz_alloc(sizeof(int64_t) * (size_t)keep_len);
  for (int64_t k = 0; k < keep_len; k++) keep_init[k] = 0x5a5a5a5a5a5a5a5all;
  const int64_t nkeep_init = -12345;

  FZ_CONFIGS(cfg, n_cfg);
  if (c.held > 2000) { /* the threading case: the best path on 1 and 2 threads */
    cfg[0] = cfg[n_cfg - 2];
    cfg[1] = cfg[n_cfg - 1];
    n_cfg = 2;
  }
  int64_t *ref_keep = NULL, ref_n = 0;
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    int64_t *keep = (int64_t *)fz_dup(keep_init, sizeof(int64_t) * (size_t)keep_len);
    int64_t n_keep = nkeep_init;
    const mixprec_status st = run(&c, keep, &n_keep);
    fz_check_status(c.batched ? "mixprec_batched_nms" : "mixprec_nms", st, errors);
    if (c.boxes) fz_unchanged("boxes (input)", boxes0, c.boxes, (size_t)c.held * 4 * bsz, st);
    if (c.scores) fz_unchanged("scores (input)", scores0, c.scores, (size_t)c.held * ssz, st);
    if (c.classes) fz_unchanged("classes (input)", classes0, c.classes, (size_t)c.held * csz, st);
    if (st != MIXPREC_OK) {
      fz_unchanged("keep", keep_init, keep, sizeof(int64_t) * (size_t)keep_len, st);
      fz_unchanged("n_keep", &nkeep_init, &n_keep, sizeof n_keep, st);
      free(keep);
      break;
    }
    if (k == 0) {
      ref_keep = keep;
      ref_n = n_keep;
      continue;
    }
    fz_same("keep", ref_keep, keep, sizeof(int64_t) * (size_t)keep_len, cfg[0], cfg[k]);
    fz_same("n_keep", &ref_n, &n_keep, sizeof n_keep, cfg[0], cfg[k]);
    free(keep);
  }
  if (ref_keep) {
    int64_t *want = (int64_t *)fz_alloc(sizeof(int64_t) * (size_t)keep_len);
    const int64_t want_n = reference(&c, want, keep_len);
    FZ_CHECK(ref_n == want_n, "n_keep %lld, the reference keeps %lld (n %lld, iou %.17g)",
             (long long)ref_n, (long long)want_n, (long long)c.n, c.p.iou_threshold);
    for (int64_t k = 0; k < keep_len; k++)
      FZ_CHECK(ref_keep[k] == want[k], "keep[%lld] = %lld, the reference has %lld (n %lld)",
               (long long)k, (long long)ref_keep[k], (long long)want[k], (long long)c.n);
    /* A batched call with one class is a plain one. */
    if (c.batched && c.held > 0) {
      call one = c;
      one.batched = 0;
      int64_t *keep = (int64_t *)fz_dup(keep_init, sizeof(int64_t) * (size_t)keep_len);
      int64_t n1 = nkeep_init;
      int same_class = 1;
      for (int64_t i = 1; i < c.n && same_class; i++) same_class = load_class(&c, i) == load_class(&c, 0);
      if (same_class) {
        fz_apply(cfg[0]);
        FZ_CHECK(run(&one, keep, &n1) == MIXPREC_OK, "mixprec_nms failed where batched did not");
        fz_same("keep of nms vs batched_nms with one class", ref_keep, keep,
                sizeof(int64_t) * (size_t)keep_len, cfg[0], cfg[0]);
        fz_same("n_keep of nms vs batched_nms with one class", &ref_n, &n1, sizeof n1, cfg[0],
                cfg[0]);
      }
      free(keep);
    }
    free(want);
    free(ref_keep);
  }
  free(keep_init);
  free(boxes0);
  free(scores0);
  free(classes0);
  free(c.boxes);
  free(c.scores);
  free(c.classes);
  return 0;
}
