/* Compressed activations on the CPU: the entry points of mixprec/act_pack.h,
 * the scalar instantiation of act_pack_internal.h's bodies, and the split
 * of the blocks over the library's threads. */
#include "act_pack_internal.h"

MIXPREC__FORCE_INLINE void widen16_portable(const uint16_t *h, float *v, int64_t len) {
  for (int64_t i = 0; i < len; i++) v[i] = mixprec__f16_to_f32(h[i]);
}
MIXPREC__FORCE_INLINE void narrow16_portable(const float *v, uint16_t *h, int64_t len) {
  for (int64_t i = 0; i < len; i++) h[i] = mixprec__f32_to_f16(v[i]);
}

MIXPREC__ACT_DEFINE(scalar, widen16_portable, narrow16_portable)
MIXPREC__ACT_DEFINE_EXTRA(scalar)

/* Blocks per task: about 64K elements, so a thread's share is far above the
 * cost of handing it out, and tiny tensors stay on the calling thread. */
#define TASK_ELEMS ((int64_t)1 << 16)
#define PARALLEL_MIN ((int64_t)1 << 17)

/* Runs fn(ctx, e0, e1) over elements [0, n) in tasks of TASK_ELEMS on the
 * library's threads (on the calling thread below PARALLEL_MIN) and returns
 * the sum of what the calls return: the split of the element-wise entry
 * points (recompute, pool codes). */
typedef int64_t (*elem_range_fn)(const void *ctx, int64_t e0, int64_t e1);

static int64_t for_elem_ranges(int64_t n, elem_range_fn fn, const void *ctx) {
  if (n < PARALLEL_MIN) return fn(ctx, 0, n);
  const int64_t n_tasks = (n + TASK_ELEMS - 1) / TASK_ELEMS;
  const int n_threads = mixprec__num_threads();
  (void)n_threads;
  int64_t sum = 0;
#pragma omp parallel for schedule(static) num_threads(n_threads) reduction(+ : sum)
  for (int64_t t = 0; t < n_tasks; t++)
    sum += fn(ctx, t * TASK_ELEMS, (t + 1) * TASK_ELEMS < n ? (t + 1) * TASK_ELEMS : n);
  return sum;
}

static mixprec__act_pack_fn pack_kernel(void) {
#if defined(MIXPREC_X86)
  switch (mixprec__active_isa()) {
    case MIXPREC_ISA_AVX512: return mixprec__act_pack_avx512;
    case MIXPREC_ISA_AVX2: return mixprec__act_pack_avx2;
    default: break;
  }
#endif
  return mixprec__act_pack_scalar;
}

static mixprec__act_unpack_fn unpack_kernel(void) {
#if defined(MIXPREC_X86)
  switch (mixprec__active_isa()) {
    case MIXPREC_ISA_AVX512: return mixprec__act_unpack_avx512;
    case MIXPREC_ISA_AVX2: return mixprec__act_unpack_avx2;
    default: break;
  }
#endif
  return mixprec__act_unpack_scalar;
}

static mixprec__act_mask_fn mask_kernel(void) {
#if defined(MIXPREC_X86)
  switch (mixprec__active_isa()) {
    case MIXPREC_ISA_AVX512: return mixprec__act_mask_avx512;
    case MIXPREC_ISA_AVX2: return mixprec__act_mask_avx2;
    default: break;
  }
#endif
  return mixprec__act_mask_scalar;
}

static mixprec__act_norm_relu_fn norm_relu_kernel(void) {
#if defined(MIXPREC_X86)
  switch (mixprec__active_isa()) {
    case MIXPREC_ISA_AVX512: return mixprec__act_norm_relu_avx512;
    case MIXPREC_ISA_AVX2: return mixprec__act_norm_relu_avx2;
    default: break;
  }
#endif
  return mixprec__act_norm_relu_scalar;
}

mixprec_status mixprec_act_packed_size(int64_t n, int64_t bits, int64_t block, int64_t *code_bytes,
                                       int64_t *n_scales) {
  if (code_bytes == NULL || n_scales == NULL) return MIXPREC_ERR_NULL_POINTER;
  if (n < 0) return MIXPREC_ERR_BAD_SIZE;
  if (!mixprec__act_format_ok(bits, block)) return MIXPREC_ERR_BAD_ARGUMENT;
  *code_bytes = mixprec__act_code_bytes(n, bits);
  *n_scales = mixprec__act_n_scales(n, block);
  return MIXPREC_OK;
}

mixprec_status mixprec_act_pack(const void *x, mixprec_dtype dtype, int64_t n, int64_t bits,
                                int64_t block, uint64_t seed, uint8_t *codes, float *scales) {
  const mixprec_status st = mixprec__act_check(x, dtype, n, bits, block, codes, scales);
  if (st != MIXPREC_OK) return st;
  const int64_t n_blocks = mixprec__act_n_scales(n, block);
  const uint32_t key = mixprec__act_key(seed);
  const mixprec__act_pack_fn pack = pack_kernel();
  const int64_t per_task = TASK_ELEMS / block;
  const int64_t n_tasks = (n_blocks + per_task - 1) / per_task;
  if (n < PARALLEL_MIN) {
    pack(x, dtype, n, bits, block, key, 0, n_blocks, codes, scales);
    return MIXPREC_OK;
  }
  const int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(static) num_threads(n_threads)
  for (int64_t t = 0; t < n_tasks; t++) {
    const int64_t b1 = (t + 1) * per_task < n_blocks ? (t + 1) * per_task : n_blocks;
    pack(x, dtype, n, bits, block, key, t * per_task, b1, codes, scales);
  }
  return MIXPREC_OK;
}

mixprec_status mixprec_act_unpack(const uint8_t *codes, const float *scales, int64_t n,
                                  int64_t bits, int64_t block, void *out, mixprec_dtype dtype) {
  const mixprec_status st = mixprec__act_check(out, dtype, n, bits, block, codes, scales);
  if (st != MIXPREC_OK) return st;
  const int64_t n_blocks = mixprec__act_n_scales(n, block);
  const mixprec__act_unpack_fn unpack = unpack_kernel();
  const int64_t per_task = TASK_ELEMS / block;
  const int64_t n_tasks = (n_blocks + per_task - 1) / per_task;
  if (n < PARALLEL_MIN) {
    unpack(codes, scales, n, bits, block, 0, n_blocks, out, dtype);
    return MIXPREC_OK;
  }
  const int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(static) num_threads(n_threads)
  for (int64_t t = 0; t < n_tasks; t++) {
    const int64_t b1 = (t + 1) * per_task < n_blocks ? (t + 1) * per_task : n_blocks;
    unpack(codes, scales, n, bits, block, t * per_task, b1, out, dtype);
  }
  return MIXPREC_OK;
}

mixprec_status mixprec_act_mask(const void *x, mixprec_dtype dtype, int64_t n, uint8_t *mask) {
  const mixprec_status st = mixprec__act_mask_check(x, dtype, n, mask);
  if (st != MIXPREC_OK) return st;
  const int64_t n_bytes = (n + 7) / 8;
  const mixprec__act_mask_fn fn = mask_kernel();
  if (n < PARALLEL_MIN) {
    fn(x, dtype, n, 0, n_bytes, mask);
    return MIXPREC_OK;
  }
  const int64_t per_task = TASK_ELEMS / 8;
  const int64_t n_tasks = (n_bytes + per_task - 1) / per_task;
  const int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(static) num_threads(n_threads)
  for (int64_t t = 0; t < n_tasks; t++) {
    const int64_t k1 = (t + 1) * per_task < n_bytes ? (t + 1) * per_task : n_bytes;
    fn(x, dtype, n, t * per_task, k1, mask);
  }
  return MIXPREC_OK;
}

/* Elements per piece of mixprec_act_unpack_norm_relu: a multiple of every
 * block (blocks are powers of two <= MIXPREC_ACT_BLOCK_MAX) and of 8 (a mask
 * byte), decoded into a buffer on the stack, then made the ReLU's output. */
#define NR_PIECE MIXPREC_ACT_BLOCK_MAX

/* mixprec_act_unpack_norm_relu's arguments and kernels. */
typedef struct {
  const uint8_t *codes;
  const float *scales, *a, *b;
  int64_t bits, block, channels, inner;
  const uint8_t *mask;
  void *out;
  mixprec_dtype dtype;
  mixprec__act_unpack_fn unpack;
  mixprec__act_norm_relu_fn nr;
} norm_relu_args;

/* Elements [e0, e1) (e0 a multiple of NR_PIECE) of the recomputed output. */
static int64_t norm_relu_range(const void *ctx, int64_t e0, int64_t e1) {
  const norm_relu_args *g = (const norm_relu_args *)ctx;
  float v[NR_PIECE];
  uint8_t keep[NR_PIECE];
  for (int64_t first = e0; first < e1; first += NR_PIECE) {
    const int64_t len = e1 - first < NR_PIECE ? e1 - first : NR_PIECE;
    /* the piece's blocks, as a tensor of len elements of its own */
    g->unpack(g->codes + (g->bits == 8 ? first : first / 2), g->scales + first / g->block, len,
              g->bits, g->block, 0, (len + g->block - 1) / g->block, v, MIXPREC_F32);
    for (int64_t k = 0; k < (len + 7) / 8; k++) {
      const uint64_t t = ((uint64_t)g->mask[first / 8 + k] * 0x0101010101010101ull) &
                         0x8040201008040201ull;
      const uint64_t e = ((t + 0x7f7f7f7f7f7f7f7full) >> 7) & 0x0101010101010101ull;
      memcpy(keep + 8 * k, &e, 8);
    }
    g->nr(v, keep, g->a, g->b, g->channels, g->inner, first, len, g->out, g->dtype);
  }
  return 0;
}

mixprec_status mixprec_act_unpack_norm_relu(const uint8_t *codes, const float *scales, int64_t n,
                                            int64_t bits, int64_t block, const float *a,
                                            const float *b, int64_t channels, int64_t inner,
                                            const uint8_t *mask, void *out, mixprec_dtype dtype) {
  const mixprec_status st = mixprec__act_norm_relu_check(codes, scales, n, bits, block, a, b,
                                                         channels, inner, mask, out, dtype);
  if (st != MIXPREC_OK) return st;
  const norm_relu_args args = {codes, scales, a, b, bits, block, channels, inner,
                               mask, out, dtype, unpack_kernel(), norm_relu_kernel()};
  for_elem_ranges(n, norm_relu_range, &args);
  return MIXPREC_OK;
}

/* [note: pool codes] The position (ho, wo) of element i in memory order,
 * stepped as i does: no division per element. */
typedef struct {
  int64_t ho, r_ho, wo, r_wo; /* ho = (i / s_ho) % HO, r_ho = i % s_ho; the same for wo */
} pool_pos;

MIXPREC__FORCE_INLINE pool_pos pool_pos_at(int64_t i, int64_t HO, int64_t WO, int64_t s_ho,
                                           int64_t s_wo) {
  pool_pos p = {(i / s_ho) % HO, i % s_ho, (i / s_wo) % WO, i % s_wo};
  return p;
}

MIXPREC__FORCE_INLINE void pool_pos_next(pool_pos *p, int64_t HO, int64_t WO, int64_t s_ho,
                                         int64_t s_wo) {
  if (++p->r_wo == s_wo) {
    p->r_wo = 0;
    if (++p->wo == WO) p->wo = 0;
  }
  if (++p->r_ho == s_ho) {
    p->r_ho = 0;
    if (++p->ho == HO) p->ho = 0;
  }
}

/* mixprec__act_pool_code by search over the window's rows (kH of them,
 * no division by W): the row h whose columns [h * W, h * W + W) hold v,
 * then its column's offset from the window's. The same code as the rule
 * (the row is unique; the tests compare both with an independent search). */
MIXPREC__FORCE_INLINE uint8_t pool_code_search(int64_t v, int64_t h0, int64_t w0,
                                               const int64_t *g, int undilated) {
  const int64_t W = g[0], kH = g[1], kW = g[2], dH = g[7], dW = g[8];
  for (int64_t kh = 0; kh < kH; kh++) {
    const int64_t h = h0 + kh * dH;
    if (h < 0 || v >= ((int64_t)1 << 52)) continue;
    const int64_t w = v - h * W;
    if (w < 0 || w >= W) continue;
    const int64_t dw = w - w0;
    if (dw < 0) return 255;
    if (undilated) return dw < kW ? (uint8_t)(kh * kW + dw) : 255;
    const int64_t kw = dw / dW;
    if (kw >= kW || kw * dW != dw) return 255;
    return (uint8_t)(kh * kW + kw);
  }
  return 255;
}

/* The code of max-pool index v in the undilated window at (h0, w0): the
 * row h = v / W by a float estimate corrected by one step each way (exact:
 * |v| < 2^53 here or the element is refused anyway), then two range
 * checks; no branch on the data, so no mispredictions on which window row
 * holds the maximum. (A valid code is < kH * kW <= 255, so 255 is "not in
 * the window" only.) */
MIXPREC__FORCE_INLINE uint8_t pool_code_undilated(int64_t v, int64_t h0, int64_t w0, int64_t W,
                                                  int64_t kH, int64_t kW, double inv_w) {
  int64_t h = (int64_t)((double)v * inv_w);
  h -= h * W > v;
  h += (h + 1) * W <= v;
  const int64_t dh = h - h0, dw = v - h * W - w0;
  const int ok = (v >= 0) & (v < ((int64_t)1 << 52)) & ((uint64_t)dh < (uint64_t)kH) &
                 ((uint64_t)dw < (uint64_t)kW);
  return ok ? (uint8_t)(dh * kW + dw) : 255;
}

/* mixprec_act_pool_encode / _decode's arguments (idx and codes: one read,
 * the other written). */
typedef struct {
  const int64_t *idx_in;
  int64_t *idx_out;
  const uint8_t *codes_in;
  uint8_t *codes_out;
  int64_t HO, WO, s_ho, s_wo;
  const int64_t *geom;
} pool_args;

/* Elements [e0, e1); returns the number of codes 255. */
static int64_t pool_encode_range(const void *ctx, int64_t e0, int64_t e1) {
  const pool_args *g = (const pool_args *)ctx;
  const int64_t *idx = g->idx_in, *geom = g->geom;
  const int64_t HO = g->HO, WO = g->WO, s_ho = g->s_ho, s_wo = g->s_wo;
  uint8_t *codes = g->codes_out;
  const int64_t sH = geom[3], sW = geom[4], pH = geom[5], pW = geom[6];
  pool_pos p = pool_pos_at(e0, HO, WO, s_ho, s_wo);
  int64_t bad = 0;
#define POOL_ENCODE_LOOP(UNDILATED)                                                          \
  for (int64_t i = e0; i < e1; i++) {                                                        \
    const uint8_t c = pool_code_search(idx[i], p.ho * sH - pH, p.wo * sW - pW, geom, UNDILATED); \
    codes[i] = c;                                                                            \
    bad += c == 255;                                                                         \
    pool_pos_next(&p, HO, WO, s_ho, s_wo);                                                   \
  }
  if (geom[7] == 1 && geom[8] == 1) {
    const int64_t W = geom[0], kH = geom[1], kW = geom[2];
    const double inv_w = 1.0 / (double)W;
    if (s_wo == 1 && s_ho == WO) {
      /* Planes in rows of WO outputs (NCHW): the window's row origin is
       * the output row's, its column origin steps by sW; no position
       * stepping per element. The same codes as the loop below. */
      for (int64_t i = e0; i < e1;) {
        const int64_t wo0 = i % WO, h0 = (i / WO) % HO * sH - pH;
        const int64_t len = WO - wo0 < e1 - i ? WO - wo0 : e1 - i;
        for (int64_t k = 0; k < len; k++) {
          const uint8_t c = pool_code_undilated(idx[i + k], h0, (wo0 + k) * sW - pW, W, kH, kW, inv_w);
          codes[i + k] = c;
          bad += c == 255;
        }
        i += len;
      }
      return bad;
    }
    for (int64_t i = e0; i < e1; i++) {
      const uint8_t c = pool_code_undilated(idx[i], p.ho * sH - pH, p.wo * sW - pW, W, kH, kW, inv_w);
      codes[i] = c;
      bad += c == 255;
      pool_pos_next(&p, HO, WO, s_ho, s_wo);
    }
  } else if (geom[8] == 1) { /* the loop without a division by dW */
    POOL_ENCODE_LOOP(1)
  } else {
    POOL_ENCODE_LOOP(0)
  }
#undef POOL_ENCODE_LOOP
  return bad;
}

mixprec_status mixprec_act_pool_encode(const int64_t *idx, int64_t n, int64_t HO, int64_t WO,
                                       int64_t s_ho, int64_t s_wo, const int64_t *geom,
                                       uint8_t *codes, int64_t *inexact) {
  const mixprec_status st =
      mixprec__act_pool_check(idx, n, HO, WO, s_ho, s_wo, geom, codes, inexact, 1);
  if (st != MIXPREC_OK) return st;
  const pool_args args = {idx, NULL, NULL, codes, HO, WO, s_ho, s_wo, geom};
  *inexact = for_elem_ranges(n, pool_encode_range, &args);
  return MIXPREC_OK;
}

/* Elements [e0, e1): the window origin's index plus the code's offset in
 * it (a table of the 256 offsets, mixprec__act_pool_index's terms). */
static int64_t pool_decode_range(const void *ctx, int64_t e0, int64_t e1) {
  const pool_args *g = (const pool_args *)ctx;
  const int64_t *geom = g->geom;
  const int64_t W = geom[0], kW = geom[2], sH = geom[3], sW = geom[4], pH = geom[5];
  const int64_t pW = geom[6], dH = geom[7], dW = geom[8];
  int64_t off[256];
  for (int c = 0; c < 256; c++) off[c] = (c / kW) * dH * W + (c % kW) * dW;
  if (g->s_wo == 1 && g->s_ho == g->WO) { /* NCHW rows, as in pool_encode_range */
    const int64_t WO = g->WO;
    for (int64_t i = e0; i < e1;) {
      const int64_t wo0 = i % WO, base = ((i / WO) % g->HO * sH - pH) * W - pW;
      const int64_t len = WO - wo0 < e1 - i ? WO - wo0 : e1 - i;
      for (int64_t k = 0; k < len; k++)
        g->idx_out[i + k] = base + (wo0 + k) * sW + off[g->codes_in[i + k]];
      i += len;
    }
    return 0;
  }
  pool_pos p = pool_pos_at(e0, g->HO, g->WO, g->s_ho, g->s_wo);
  for (int64_t i = e0; i < e1; i++) {
    g->idx_out[i] = (p.ho * sH - pH) * W + p.wo * sW - pW + off[g->codes_in[i]];
    pool_pos_next(&p, g->HO, g->WO, g->s_ho, g->s_wo);
  }
  return 0;
}

mixprec_status mixprec_act_pool_decode(const uint8_t *codes, int64_t n, int64_t HO, int64_t WO,
                                       int64_t s_ho, int64_t s_wo, const int64_t *geom,
                                       int64_t *idx) {
  const mixprec_status st =
      mixprec__act_pool_check(codes, n, HO, WO, s_ho, s_wo, geom, idx, NULL, 0);
  if (st != MIXPREC_OK) return st;
  const pool_args args = {NULL, idx, codes, NULL, HO, WO, s_ho, s_wo, geom};
  for_elem_ranges(n, pool_decode_range, &args);
  return MIXPREC_OK;
}
