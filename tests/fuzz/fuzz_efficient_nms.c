/* libFuzzer harness: mixprec_efficient_nms() and mixprec_efficient_nms_strided()
 * (efficient_nms.h).
 *
 * One input = one batched post-processing call: 0 to 5 images, 0 to a few
 * hundred boxes, 0 to 12 classes (FP32/FP16/BF16 boxes and scores, each in
 * its own dtype except in a YOLO head, where one buffer holds both), boxes on
 * a coarse grid (exact overlaps, ties) or raw bits, shared or class-specific
 * boxes, and for the strided entry point a layout: contiguous, a YOLO head
 * (B, 4 + C, N) channels first, coordinate-major boxes with class-major
 * padded scores, or random strides (0 included: broadcast), corner or centre
 * coded. Thresholds in and out of range, pre_nms_top_k and max_detections
 * at their limits; with the fault bit NULL pointers, unknown dtypes, sizes
 * past the limits, bad layouts. Checked: the status is one the header
 * documents; on an error no output byte changes; on success the outputs
 * equal a reference written here from the header (flat-index stable sort,
 * top-k, greedy NMS with torchvision's float IoU on the float32-decoded
 * corners, class-aware or not, the padding), the inputs are unchanged, and
 * the results are the same bits on 1 and 2 threads and on every ISA path. */
#include "fuzz_common.h"

typedef struct call {
  int strided, layout_null;
  mixprec_detect_layout l;
  int class_boxes;
  int64_t b, n, c;    /* as passed */
  int64_t hb, hn, hc; /* held */
  int64_t k;          /* output rows per image actually allocated */
  mixprec_dtype bd, sd;
  uint8_t *buf_b, *buf_s; /* allocations (the head: buf_s unused) */
  size_t bytes_b, bytes_s;
  const void *boxes, *scores;
  mixprec_detect_params p;
  int p_null, out_null;
} call;

static int64_t span(const int64_t *dims, const int64_t *strides, int nd) {
  int64_t m = 0;
  for (int d = 0; d < nd; d++)
    if (dims[d] > 0) m += (dims[d] - 1) * strides[d];
  return m + 1;
}

static int64_t box_at(const call *c, int64_t b, int64_t n, int64_t k, int e) {
  return b * c->l.box_strides[0] + n * c->l.box_strides[1] + k * c->l.box_strides[2] +
         e * c->l.box_strides[3];
}

static int64_t score_at(const call *c, int64_t b, int64_t n, int64_t k) {
  return b * c->l.score_strides[0] + n * c->l.score_strides[1] + k * c->l.score_strides[2];
}

static float smax(float a, float b) { return a < b ? b : a; }
static float smin(float a, float b) { return b < a ? b : a; }

static const float *g_s; /* the scores the qsort comparison reads */
static int cmp_order(const void *x, const void *y) {
  const int64_t i = *(const int64_t *)x, j = *(const int64_t *)y;
  if (g_s[i] != g_s[j]) return g_s[i] > g_s[j] ? -1 : 1; /* +0 == -0 */
  return (i > j) - (i < j);
}

/* The header's semantics, directly, into the five output buffers. */
static void reference(const call *c, uint8_t *ob, uint8_t *os, int64_t *oc, int64_t *oi,
                      int64_t *cnt) {
  const int64_t N = c->hn, C = c->hc, K = c->p.max_detections, NC = N * C;
  const size_t bes = fz_dsize(c->bd), ses = fz_dsize(c->sd);
  float *s = (float *)fz_alloc(sizeof(float) * (size_t)NC);
  float *corner = (float *)fz_alloc(sizeof(float) * 4 * (size_t)NC);
  int64_t *ord = (int64_t *)fz_alloc(sizeof(int64_t) * (size_t)NC);
  int64_t *kept = (int64_t *)fz_alloc(sizeof(int64_t) * (size_t)NC);
  for (int64_t b = 0; b < c->hb; b++) {
    int64_t m = 0;
    for (int64_t j = 0; j < NC; j++) {
      const int64_t n = j / C, k = j % C;
      s[j] = fz_load(c->scores, c->sd, score_at(c, b, n, k));
      float v[4];
      for (int e = 0; e < 4; e++) v[e] = fz_load(c->boxes, c->bd, box_at(c, b, n, k, e));
      if (c->l.box_coding == MIXPREC_BOX_CENTER) {
        const float hw = v[2] * 0.5f, hh = v[3] * 0.5f;
        const float d[4] = {v[0] - hw, v[1] - hh, v[0] + hw, v[1] + hh};
        memcpy(&corner[4 * j], d, sizeof d);
      } else {
        memcpy(&corner[4 * j], v, sizeof v);
      }
      if (fz_isnan(s[j])) continue;
      if (c->p.use_score_threshold && !((double)s[j] > c->p.score_threshold)) continue;
      ord[m++] = j;
    }
    g_s = s;
    qsort(ord, (size_t)m, sizeof *ord, cmp_order);
    if (c->p.pre_nms_top_k > 0 && m > c->p.pre_nms_top_k) m = c->p.pre_nms_top_k;
    int64_t n_kept = 0;
    for (int64_t r = 0; r < m && n_kept < K; r++) {
      const int64_t j = ord[r];
      const float *bj = &corner[4 * j];
      const float aj = (bj[2] - bj[0]) * (bj[3] - bj[1]);
      int suppressed = 0;
      for (int64_t q = 0; q < n_kept && !suppressed; q++) {
        const int64_t i = kept[q];
        if (!c->p.class_agnostic && i % C != j % C) continue;
        const float *bi = &corner[4 * i];
        const float ai = (bi[2] - bi[0]) * (bi[3] - bi[1]);
        const float w = smax(0.0f, smin(bi[2], bj[2]) - smax(bi[0], bj[0]));
        const float h = smax(0.0f, smin(bi[3], bj[3]) - smax(bi[1], bj[1]));
        const float inter = w * h;
        if ((double)(inter / (ai + aj - inter)) > c->p.iou_threshold) suppressed = 1;
      }
      if (suppressed) continue;
      const int64_t o = b * K + n_kept, n = j / C, k = j % C;
      kept[n_kept++] = j;
      for (int e = 0; e < 4; e++) {
        if (c->l.box_coding == MIXPREC_BOX_CENTER)
          fz_store(ob, c->bd, 4 * o + e, corner[4 * j + e]);
        else
          memcpy(ob + (size_t)(4 * o + e) * bes,
                 (const uint8_t *)c->boxes + (size_t)box_at(c, b, n, k, e) * bes, bes);
      }
      memcpy(os + (size_t)o * ses, (const uint8_t *)c->scores + (size_t)score_at(c, b, n, k) * ses,
             ses);
      oc[o] = k;
      oi[o] = n;
    }
    for (int64_t q = n_kept; q < K; q++) {
      const int64_t o = b * K + q;
      memset(ob + (size_t)(4 * o) * bes, 0, 4 * bes);
      memset(os + (size_t)o * ses, 0, ses);
      oc[o] = oi[o] = -1;
    }
    cnt[b] = n_kept;
  }
  free(s);
  free(corner);
  free(ord);
  free(kept);
}

static void fill_boxes(fz *f, uint8_t *buf, mixprec_dtype d, const call *c, int center) {
  const uint8_t mode = fz_u8(f) % 4;
  const int g = (int)fz_range(f, 1, 48), sz = (int)fz_range(f, 0, 12);
  const float unit = ldexpf(1.0f, (int)fz_range(f, -6, 10));
  const uint8_t rate = fz_u8(f);
  const int64_t nk = c->l.box_strides[2] ? c->hc : 1;
  for (int64_t b = 0; b < c->hb; b++)
    for (int64_t n = 0; n < c->hn; n++)
      for (int64_t k = 0; k < nk; k++) {
        const uint64_t r = fz_rng(f);
        float v[4];
        if (mode == 0) {
          for (int e = 0; e < 4; e++) v[e] = fz_f32_from_bits((uint32_t)fz_rng(f));
        } else {
          const float x = (float)(r % (uint64_t)g) * unit, y = (float)((r >> 8) % (uint64_t)g) * unit;
          const float w = (float)((r >> 16) % (uint64_t)(sz + 1)) * unit;
          const float h = (float)((r >> 24) % (uint64_t)(sz + 1)) * unit;
          if (center) {
            v[0] = x, v[1] = y, v[2] = w, v[3] = h;
          } else {
            v[0] = x, v[1] = y, v[2] = x + w, v[3] = y + h;
          }
          if (mode == 3 && ((r >> 40) & 255) < rate / 8) v[(r >> 48) & 3] = fz_special(f);
        }
        for (int e = 0; e < 4; e++) fz_store(buf, d, box_at(c, b, n, k, e), v[e]);
      }
}

static void fill_scores(fz *f, uint8_t *buf, mixprec_dtype d, const call *c) {
  const int64_t NC = c->hn * c->hc;
  float *v = (float *)fz_alloc(sizeof(float) * (size_t)(NC > 0 ? NC : 1));
  for (int64_t b = 0; b < c->hb; b++) {
    fz_fill(f, v, MIXPREC_F32, NC);
    for (int64_t j = 0; j < NC; j++) fz_store(buf, d, score_at(c, b, j / c->hc, j % c->hc), v[j]);
  }
  free(v);
}

static mixprec_status run(const call *c, void *ob, void *os, int64_t *oc, int64_t *oi,
                          int64_t *cnt) {
  const mixprec_detect_params p = c->p;
  const mixprec_detect_layout l = c->l;
  const int z = c->out_null;
  void *b = z == 1 ? NULL : ob, *s = z == 2 ? NULL : os;
  int64_t *k = z == 3 ? NULL : oc, *i = z == 4 ? NULL : oi, *n = z == 5 ? NULL : cnt;
  const mixprec_detect_params *pp = c->p_null ? NULL : &p;
  mixprec_status st;
  if (c->strided)
    st = mixprec_efficient_nms_strided(c->boxes, c->bd, c->scores, c->sd,
                                       c->layout_null ? NULL : &l, c->b, c->n, c->c, pp, b, s, k,
                                       i, n);
  else
    st = mixprec_efficient_nms(c->boxes, c->bd, c->class_boxes, c->scores, c->sd, c->b, c->n,
                               c->c, pp, b, s, k, i, n);
  FZ_CHECK(!memcmp(&p, &c->p, sizeof p), "params written");
  FZ_CHECK(!memcmp(&l, &c->l, sizeof l), "layout written");
  return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FZ_OPEN(f, c, op);
  c.strided = op & 1;
  const int faults = fz_faults(op, 0xc0);
  c.hb = fz_range(&f, 0, 5);
  c.hn = fz_u8(&f) < 230 ? fz_range(&f, 0, 40) : fz_range(&f, 41, 400);
  c.hc = fz_range(&f, 0, 12);
  c.b = c.hb, c.n = c.hn, c.c = c.hc;
  c.bd = fz_dtype(&f, faults);
  c.sd = fz_dtype(&f, faults);
  const mixprec_dtype bd = fz_dtype_ok(c.bd) ? c.bd : MIXPREC_F32;
  const mixprec_dtype sd = fz_dtype_ok(c.sd) ? c.sd : MIXPREC_F32;
  const size_t bes = fz_dsize(c.bd), ses = fz_dsize(c.sd);

  /* The layout. */
  const uint8_t lm = c.strided ? fz_u8(&f) % 4 : 0;
  c.class_boxes = lm == 0 && (fz_u8(&f) & 1);
  c.l = mixprec_detect_layout_contiguous(c.hn, c.hc, c.class_boxes);
  const int64_t N = c.hn, C = c.hc;
  if (lm == 1 && bd == sd && bes == ses) { /* a YOLO head, one buffer */
    const int64_t S = (4 + C) * N;
    const mixprec_detect_layout head = {{S, 1, 0, N}, {S, 1, N}, 0};
    c.l = head;
  } else if (lm == 2) { /* coordinate-major boxes, class-major padded scores */
    const int64_t pad = fz_range(&f, 1, 3);
    const mixprec_detect_layout t = {{4 * N, 1, 0, N}, {C * N * pad, pad, N * pad}, 0};
    c.l = t;
  } else if (lm == 3) { /* random strides, broadcast included */
    for (int d = 0; d < 4; d++) c.l.box_strides[d] = fz_range(&f, 0, 2 * C * 4 + 8);
    for (int d = 0; d < 3; d++) c.l.score_strides[d] = fz_range(&f, 0, 2 * C + 4);
  }
  if (c.strided) c.l.box_coding = fz_u8(&f) & 1;
  const int head = lm == 1 && bd == sd && bes == ses;

  c.p = mixprec_detect_params_default();
  {
    const uint8_t m = fz_u8(&f);
    c.p.iou_threshold = m < 64 ? 0.5 : m < 128 ? (double)fz_range(&f, 0, 8) / 8.0 : fz_param(&f, 0.0, 1.0);
    if (!faults && !(c.p.iou_threshold >= 0)) c.p.iou_threshold = 0.3;
    c.p.use_score_threshold = fz_u8(&f) >= 100;
    if (c.p.use_score_threshold) {
      c.p.score_threshold = fz_param(&f, -1.0, 1.0);
      if (!faults && c.p.score_threshold != c.p.score_threshold) c.p.score_threshold = 0.0;
    }
    const uint8_t t = fz_u8(&f);
    c.p.pre_nms_top_k = t < 128 ? -1 : t < 136 ? INT64_MIN : fz_range(&f, 1, 300);
    c.p.max_detections = fz_u8(&f) < 200 ? fz_range(&f, 1, 60) : fz_range(&f, 61, 400);
    c.p.class_agnostic = fz_u8(&f) & 1;
  }
  const uint8_t fm = faults ? fz_u8(&f) : 0;
  if (fm & 1) {
    static const int64_t bad[] = {-1, INT64_MIN, (int64_t)INT32_MAX + 1, INT64_MAX};
    const int64_t v = bad[fz_u8(&f) % 4];
    switch (fz_u8(&f) % 3) {
      case 0: c.b = v; break;
      case 1: c.n = v; break;
      default: c.c = v; break;
    }
  }
  if (fm & 2) {
    static const int64_t bad_k[] = {0, -1, (int64_t)INT32_MAX + 1, INT64_MIN};
    const uint8_t w = fz_u8(&f);
    if (w & 1) c.p.max_detections = bad_k[w % 4];
    else c.p.pre_nms_top_k = 0;
  }
  c.p_null = (fm & 4) != 0;
  c.out_null = (fm & 8) ? (int)fz_range(&f, 1, 5) : 0;
  if ((fm & 16) && c.strided) {
    const uint8_t w = fz_u8(&f);
    if (w % 4 == 0) c.layout_null = 1;
    else if (w % 4 == 1) c.l.box_coding = w % 8 == 1 ? -1 : 2;
    else if (w % 4 == 2) c.l.score_strides[w % 3] = -1 - (int64_t)(w >> 4);
    else c.l.box_strides[w % 4] = INT64_MAX / 2;
  }
  const int boxes_null = (fm & 32) != 0, scores_null = (fm & 64) != 0;

  /* The layout's verdict as the header states it: NULL, an unknown coding
   * or a negative stride is refused; so is a byte offset (4-byte elements)
   * past INT64_MAX when there is anything to index. Buffers are made for the
   * held sizes only when the layout is usable. */
  int neg = 0;
  for (int d = 0; d < 4; d++) neg |= c.l.box_strides[d] < 0;
  for (int d = 0; d < 3; d++) neg |= c.l.score_strides[d] < 0;
  const int coding_bad = c.l.box_coding != 0 && c.l.box_coding != 1;
  int big = 0;
  if (!neg && c.hb > 0 && N > 0 && C > 0) {
    const int64_t bd4[4] = {c.hb - 1, N - 1, C - 1, 3};
    __int128 mb = 0, ms = 0;
    for (int d = 0; d < 4; d++) mb += (__int128)bd4[d] * c.l.box_strides[d];
    for (int d = 0; d < 3; d++) ms += (__int128)bd4[d] * c.l.score_strides[d];
    big = mb * 4 > (__int128)INT64_MAX || ms * 4 > (__int128)INT64_MAX;
  }
  const int layout_ok = !c.layout_null && !neg && !coding_bad && !big;
  const int64_t bdims[4] = {c.hb, N, C, 4}, sdims[3] = {c.hb, N, C};
  const int64_t nb = layout_ok && c.hb * N * C > 0 ? span(bdims, c.l.box_strides, 4) : 1;
  const int64_t ns = layout_ok && c.hb * N * C > 0 ? span(sdims, c.l.score_strides, 3) : 1;
  if (head) {
    c.bytes_b = (size_t)(c.hb * (4 + C) * N + 1) * bes;
    c.buf_b = (uint8_t *)fz_alloc(c.bytes_b);
    fz_fill(&f, c.buf_b, bd, (int64_t)(c.bytes_b / bes));
    c.boxes = c.buf_b;
    c.scores = c.buf_b + (size_t)(4 * N) * bes;
  } else {
    c.bytes_b = (size_t)nb * bes;
    c.bytes_s = (size_t)ns * ses;
    c.buf_b = (uint8_t *)fz_alloc(c.bytes_b);
    c.buf_s = (uint8_t *)fz_alloc(c.bytes_s);
    fz_fill(&f, c.buf_b, bd, nb);
    fz_fill(&f, c.buf_s, sd, ns);
    c.boxes = c.buf_b;
    c.scores = c.buf_s;
  }
  if (layout_ok && c.hb * N * C > 0) {
    fill_boxes(&f, (uint8_t *)c.boxes, bd, &c, c.l.box_coding == MIXPREC_BOX_CENTER);
    fill_scores(&f, (uint8_t *)c.scores, sd, &c);
  }
  if (boxes_null) c.boxes = NULL;
  if (scores_null) c.scores = NULL;

  /* The documented errors. */
  fz_allowed errors = 0;
  if (c.p_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  if (c.b < 0 || c.n < 0 || c.c < 0 || c.b > INT32_MAX || (c.c > 0 && c.n > INT32_MAX / c.c))
    errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  if (!fz_dtype_ok(c.bd) || !fz_dtype_ok(c.sd)) errors |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
  if (c.b > 0 && c.out_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  if (c.b > 0 && c.n > 0 && c.c > 0 && (!c.boxes || !c.scores))
    errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  if (!(c.p.iou_threshold >= 0)) errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (c.p.use_score_threshold && c.p.score_threshold != c.p.score_threshold)
    errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (c.p.pre_nms_top_k == 0 || c.p.max_detections < 1 || c.p.max_detections > INT32_MAX)
    errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (c.strided) {
    if (c.layout_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
    else if (coding_bad || neg) errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
    else if (big) errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  }
  FZ_CHECK(errors || layout_ok, "harness: unusable layout without an error");

  const int64_t K = c.p.max_detections >= 1 && c.p.max_detections <= 400 ? c.p.max_detections : 1;
  c.k = K;
  const int64_t rows = c.hb * K;
  const size_t ob_bytes = (size_t)(4 * rows) * bes, os_bytes = (size_t)rows * ses;
  const size_t oc_bytes = sizeof(int64_t) * (size_t)rows, cnt_bytes = sizeof(int64_t) * (size_t)c.hb;
  uint8_t *ob0 = (uint8_t *)fz_alloc(ob_bytes), *os0 = (uint8_t *)fz_alloc(os_bytes);
  int64_t *oc0 = (int64_t *)fz_alloc(oc_bytes), *oi0 = (int64_t *)fz_alloc(oc_bytes);
  int64_t *cnt0 = (int64_t *)fz_alloc(cnt_bytes);
  memset(ob0, 0x5a, ob_bytes), memset(os0, 0x5a, os_bytes);
  memset(oc0, 0x5a, oc_bytes), memset(oi0, 0x5a, oc_bytes), memset(cnt0, 0x5a, cnt_bytes);
  void *in_b = fz_dup(c.buf_b, c.bytes_b), *in_s = c.buf_s ? fz_dup(c.buf_s, c.bytes_s) : NULL;

  if (getenv("FZ_VERBOSE"))
    fprintf(stderr,
            "strided %d mode %d B %lld N %lld C %lld bd %d sd %d coding %d box_strides %lld %lld "
            "%lld %lld score_strides %lld %lld %lld iou %g thr %d %g top_k %lld K %lld agn %d "
            "faults 0x%x\n",
            c.strided, (int)lm, (long long)c.b, (long long)c.n, (long long)c.c, (int)c.bd,
            (int)c.sd, c.l.box_coding, (long long)c.l.box_strides[0], (long long)c.l.box_strides[1],
            (long long)c.l.box_strides[2], (long long)c.l.box_strides[3],
            (long long)c.l.score_strides[0], (long long)c.l.score_strides[1],
            (long long)c.l.score_strides[2], c.p.iou_threshold, c.p.use_score_threshold,
            c.p.score_threshold, (long long)c.p.pre_nms_top_k, (long long)c.p.max_detections,
            c.p.class_agnostic, (unsigned)fm);
  FZ_CONFIGS(cfg, n_cfg);
  uint8_t *rb = NULL, *rs = NULL;
  int64_t *rc = NULL, *ri = NULL, *rn = NULL;
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, q) {
    uint8_t *ob = (uint8_t *)fz_dup(ob0, ob_bytes), *os = (uint8_t *)fz_dup(os0, os_bytes);
    int64_t *oc = (int64_t *)fz_dup(oc0, oc_bytes), *oi = (int64_t *)fz_dup(oi0, oc_bytes);
    int64_t *cnt = (int64_t *)fz_dup(cnt0, cnt_bytes);
    const mixprec_status st = run(&c, ob, os, oc, oi, cnt);
    fz_check_status(c.strided ? "mixprec_efficient_nms_strided" : "mixprec_efficient_nms", st,
                    errors);
    fz_unchanged("boxes (input)", in_b, c.buf_b, c.bytes_b, st);
    if (in_s) fz_unchanged("scores (input)", in_s, c.buf_s, c.bytes_s, st);
    if (st != MIXPREC_OK) {
      fz_unchanged("out_boxes", ob0, ob, ob_bytes, st);
      fz_unchanged("out_scores", os0, os, os_bytes, st);
      fz_unchanged("out_classes", oc0, oc, oc_bytes, st);
      fz_unchanged("out_indices", oi0, oi, oc_bytes, st);
      fz_unchanged("counts", cnt0, cnt, cnt_bytes, st);
      free(ob), free(os), free(oc), free(oi), free(cnt);
      break;
    }
    if (q == 0) {
      rb = ob, rs = os, rc = oc, ri = oi, rn = cnt;
      continue;
    }
    fz_same("out_boxes", rb, ob, ob_bytes, cfg[0], cfg[q]);
    fz_same("out_scores", rs, os, os_bytes, cfg[0], cfg[q]);
    fz_same("out_classes", rc, oc, oc_bytes, cfg[0], cfg[q]);
    fz_same("out_indices", ri, oi, oc_bytes, cfg[0], cfg[q]);
    fz_same("counts", rn, cnt, cnt_bytes, cfg[0], cfg[q]);
    free(ob), free(os), free(oc), free(oi), free(cnt);
  }
  if (rb) {
    uint8_t *wb = (uint8_t *)fz_dup(ob0, ob_bytes), *ws = (uint8_t *)fz_dup(os0, os_bytes);
    int64_t *wc = (int64_t *)fz_dup(oc0, oc_bytes), *wi = (int64_t *)fz_dup(oi0, oc_bytes);
    int64_t *wn = (int64_t *)fz_dup(cnt0, cnt_bytes);
    if (c.hb > 0) reference(&c, wb, ws, wc, wi, wn);
    const fz_config ref_cfg = {MIXPREC_ISA_AUTO, 0};
    fz_same("counts vs the reference", wn, rn, cnt_bytes, ref_cfg, cfg[0]);
    fz_same("out_indices vs the reference", wi, ri, oc_bytes, ref_cfg, cfg[0]);
    fz_same("out_classes vs the reference", wc, rc, oc_bytes, ref_cfg, cfg[0]);
    if (getenv("FZ_VERBOSE") && memcmp(wb, rb, ob_bytes))
      for (int64_t i = 0; i < 4 * rows; i++) {
        const float x = fz_load(wb, c.bd, i), y = fz_load(rb, c.bd, i);
        if (fz_bits(x) == fz_bits(y)) continue;
        const int64_t o = i / 4, b = o / K, n = ri[o], k = rc[o];
        fprintf(stderr, "box %lld (image %lld, n %lld, class %lld) coord %lld: reference %a, got %a; stored", (long long)o,
                (long long)b, (long long)n, (long long)k, (long long)(i % 4), (double)x, (double)y);
        for (int e = 0; e < 4; e++) fprintf(stderr, " %a", (double)fz_load(c.boxes, c.bd, box_at(&c, b, n, k, e)));
        fprintf(stderr, "\n");
        break;
      }
    /* Decoded corners: a NaN's payload is the compiler's operand order's
     * (the header leaves it open); copied corners are exact. */
    if (c.l.box_coding == MIXPREC_BOX_CENTER)
      fz_same_nan("out_boxes vs the reference", 0, wb, rb, c.bd, 4 * rows, ref_cfg, cfg[0]);
    else
      fz_same("out_boxes vs the reference", wb, rb, ob_bytes, ref_cfg, cfg[0]);
    fz_same("out_scores vs the reference", ws, rs, os_bytes, ref_cfg, cfg[0]);
    free(wb), free(ws), free(wc), free(wi), free(wn);
    free(rb), free(rs), free(rc), free(ri), free(rn);
  }
  mixprec_set_cpu_isa(MIXPREC_ISA_AUTO);
  free(ob0), free(os0), free(oc0), free(oi0), free(cnt0);
  free(in_b), free(in_s);
  free(c.buf_b), free(c.buf_s);
  return 0;
}
