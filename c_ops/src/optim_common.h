/* Shared pieces of the fused optimizer steps (adamw.c, sgd.c): argument
 * checks, the flattened chunk list, and the per-element load/store of the
 * three dtypes. Internal; every name starts with mixprec__. */
#ifndef MIXPREC_OPTIM_COMMON_H
#define MIXPREC_OPTIM_COMMON_H

#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "optim_check.h"
#include "optim_consts.h"
#include "optim_math.h"
#include "stochastic_round.h"

/* Work is cut into chunks of at most this many elements of one tensor. The
 * update is elementwise, so the chunking only balances threads; results do not
 * depend on it. */
#define MIXPREC__OPT_CHUNK ((int64_t)1 << 16)
/* Elements of the FP32 update a vector kernel computes (into the master)
 * before it writes them to the low-precision param (MIXPREC__OPT_BODY_LOOP;
 * the master block is still in L1 for the second loop). */
#define MIXPREC__OPT_BLOCK ((int64_t)512)
/* From this many elements in one step on, the low-precision params are
 * written with non-temporal stores: the step's ~30 B/param are far beyond
 * the caches, and the line the param is written to need not be read first. */
#ifndef MIXPREC__OPT_STREAM_MIN
#define MIXPREC__OPT_STREAM_MIN ((int64_t)1 << 20)
#endif
/* Below this many elements in all, a parallel region costs more than it saves. */
#define MIXPREC__OPT_PARALLEL_MIN ((int64_t)1 << 16)

/* First element of a tensor that torch's scalar tail loop handles. */
MIXPREC__FORCE_INLINE int64_t mixprec__opt_tail_start(int64_t numel) {
  return numel - numel % MIXPREC__OPT_TORCH_VEC;
}

/* Stores a low-precision param element, rounded to nearest even. */
MIXPREC__FORCE_INLINE void mixprec__opt_store_half(void *data, mixprec_dtype dtype, int64_t i,
                                             float v) {
  ((uint16_t *)data)[i] = mixprec__f32_to_half(dtype, v);
}

/* Stores an unscaled grad element (unscale_grads), rounded to nearest even
 * for F16/BF16, exact for F32. The descriptor's grad is const for the
 * read-only default path (mixprec/optim.h): the cast is the one place the
 * scalar path writes through it, and only with unscale_grads. */
MIXPREC__FORCE_INLINE void mixprec__opt_store_grad(const void *grad, mixprec_dtype dtype, int64_t i,
                                             float v) {
  mixprec__store_f32((void *)(uintptr_t)grad, dtype, i, v);
}

/* Stores a master-free BF16 param element, stochastically rounded. */
MIXPREC__FORCE_INLINE void mixprec__opt_store_bf16_sr(void *data, int64_t i, uint32_t key, float v) {
  ((uint16_t *)data)[i] = mixprec__f32_to_bf16_sr(v, mixprec__sr_bits(key, i));
}

/* ---- the lean state element by element (the scalar paths; mixprec/optim.h,
 * mixprec_state_dtype) -------------------------------------------------- */

/* Element i of a moment buffer in FP32 (Q8: at its block's scale). */
MIXPREC__FORCE_INLINE float mixprec__opt_state_get(const void *buf, mixprec_state_dtype d,
                                                  const float *scale, int64_t i, int is_signed) {
  if (d == MIXPREC_STATE_BF16) return mixprec__opt_bf16_f32(((const uint16_t *)buf)[i]);
  if (d == MIXPREC_STATE_Q8)
    return mixprec__q8_load(((const uint8_t *)buf)[i], scale[i / MIXPREC__Q8_BLOCK], is_signed);
  return ((const float *)buf)[i];
}

/* Stores element i of an F32 or BF16 moment buffer (BF16: stochastically,
 * with the buffer's key); a Q8 value goes to the block buffer q instead, at
 * i's place in its block. */
MIXPREC__FORCE_INLINE void mixprec__opt_state_put(void *buf, mixprec_state_dtype d, int64_t i,
                                                 float x, uint32_t key, float *q) {
  if (d == MIXPREC_STATE_BF16)
    ((uint16_t *)buf)[i] = mixprec__f32_to_bf16_sr(x, mixprec__sr_bits(key, i));
  else if (d == MIXPREC_STATE_Q8)
    q[i % MIXPREC__Q8_BLOCK] = x;
  else
    ((float *)buf)[i] = x;
}

/* After the elements [b0, b1) of one block (b0 a multiple of the block):
 * a Q8 buffer's codes and scale from the new values in q. */
MIXPREC__FORCE_INLINE void mixprec__opt_state_flush(void *buf, mixprec_state_dtype d, float *scale,
                                                   int64_t b0, int64_t b1, const float *q,
                                                   int is_signed) {
  if (d == MIXPREC_STATE_Q8)
    mixprec__q8_store_block(q, (int)(b1 - b0), (uint8_t *)buf + b0, &scale[b0 / MIXPREC__Q8_BLOCK],
                            is_signed);
}

/* The FP32 value of a lean tensor's param element (remainder: the master it
 * holds; master-free BF16; else the master or the F32 param P). */
MIXPREC__FORCE_INLINE float mixprec__opt_lean_param_get(const mixprec_opt_tensor *t, const float *P,
                                                       int64_t i, int sr) {
  if (t->remainder) return mixprec__rem_join(((const uint16_t *)t->param)[i], t->remainder[i]);
  if (sr) return mixprec__opt_bf16_f32(((const uint16_t *)t->param)[i]);
  return P[i];
}

MIXPREC__FORCE_INLINE void mixprec__opt_lean_param_put(const mixprec_opt_tensor *t, float *P, int64_t i,
                                                      int sr, uint32_t sr_key, float p) {
  if (t->remainder) {
    mixprec__rem_split(p, (uint16_t *)t->param + i, t->remainder + i);
  } else if (sr) {
    mixprec__opt_store_bf16_sr(t->param, i, sr_key, p);
  } else {
    P[i] = p;
    if (t->param_dtype != MIXPREC_F32) mixprec__opt_store_half(t->param, t->param_dtype, i, p);
  }
}

/* The flattened chunk list: first[t] is tensor t's first chunk, first[n] the
 * chunk count. Returns NULL when out of memory. */
MIXPREC__FORCE_INLINE int64_t *mixprec__opt_chunks(const mixprec_opt_tensor *list, int64_t n,
                                             int64_t *n_chunks, int64_t *total) {
  int64_t *first = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n + 1));
  if (!first) return NULL;
  int64_t c = 0, sum = 0;
  for (int64_t t = 0; t < n; t++) {
    first[t] = c;
    c += (list[t].numel + MIXPREC__OPT_CHUNK - 1) / MIXPREC__OPT_CHUNK;
    sum += list[t].numel;
  }
  first[n] = c;
  *n_chunks = c;
  *total = sum;
  return first;
}

/* Chunk c of the flattened list (see mixprec__opt_chunks): returns its
 * tensor and sets [*begin, *end), the chunk's elements of that tensor. */
MIXPREC__FORCE_INLINE int64_t mixprec__opt_chunk_range(const mixprec_opt_tensor *list,
                                                 const int64_t *first, int64_t n, int64_t c,
                                                 int64_t *begin, int64_t *end) {
  const int64_t t = mixprec__chunk_owner(first, n, c);
  *begin = (c - first[t]) * MIXPREC__OPT_CHUNK;
  *end = list[t].numel - *begin < MIXPREC__OPT_CHUNK ? list[t].numel : *begin + MIXPREC__OPT_CHUNK;
  return t;
}

/* Nonzero when the step must be skipped: *found_inf is nonzero or NaN. */
MIXPREC__FORCE_INLINE int mixprec__opt_skip(const float *found_inf) {
  return found_inf && !(*found_inf == 0.0f);
}

/* The EMA fields of mixprec_adamw_params_default / mixprec_sgd_params_default:
 * off, with timm ModelEmaV3's defaults. */
MIXPREC__FORCE_INLINE mixprec_ema_params mixprec__ema_params_default(void) {
  mixprec_ema_params e;
  e.bufs = NULL;
  e.decay = 0.9999;
  e.min_decay = 0.0;
  e.use_warmup = 0;
  e.warmup_gamma = 1.0;
  e.warmup_power = 2.0 / 3.0;
  e.update_after_step = 0;
  e.update_every = 1;
  return e;
}

/* ---- Per-step constants and the ISA-specific body kernels ------------- */

/* AdamW, per tensor: computed once per step from that tensor's count. */
typedef struct mixprec__adamw_scalars {
  float new_step; /* *step + 1, written back at the end */
  float decay;    /* 1 - lr * weight_decay */
  float step_size;
  float bc2_sqrt;
  uint32_t sr_key; /* stochastic rounding (master-free BF16 only) */
  float *ema;      /* the EMA buffer when it is updated at this step, else NULL */
  mixprec__ema_w ema_w;
} mixprec__adamw_scalars;

/* A tensor's EMA at this step (NULL buf: none, or not an update step). */
typedef struct mixprec__ema_scalars {
  float *buf;
  mixprec__ema_w w;
} mixprec__ema_scalars;

/* Tensor i's EMA at this step, whose count after it is t. */
MIXPREC__FORCE_INLINE mixprec__ema_scalars mixprec__ema_scalars_of(const mixprec_ema_params *e,
                                                                 const mixprec__ema_hyper *h,
                                                                 int64_t i, float t) {
  mixprec__ema_scalars r;
  r.buf = mixprec__ema_buf(e, i);
  r.w.w = r.w.w_m1 = 0.0f;
  r.w.small = 1;
  if (r.buf && !mixprec__ema_weight_at(h, t, &r.w)) r.buf = NULL;
  return r;
}

/* AdamW, per step: shared by every tensor. h as the GPU has it
 * (optim_consts.h); the grad scale read on the host. */
typedef struct mixprec__adamw_consts {
  mixprec__adamw_hyper h;
  int has_scale;
  float scale;
  int unscale;   /* unscale_grads with a grad_scale: g / scale goes back to the grad */
  int stream;    /* non-temporal stores for low-precision params (large steps) */
} mixprec__adamw_consts;

/* SGD, per step. */
typedef struct mixprec__sgd_consts {
  mixprec__sgd_hyper h;
  int has_scale;
  float scale;
  int unscale;   /* as in mixprec__adamw_consts */
  int stream;    /* as in mixprec__adamw_consts */
} mixprec__sgd_consts;

/* A body kernel updates elements [begin, end) of one tensor, all of them in
 * torch's vectorised body (end <= mixprec__opt_tail_start(numel)), with the
 * body's formulas, and returns the index it stopped at: a vector kernel
 * covers whole vectors from begin (begin is a multiple of 8, and so is end in
 * practice) and the caller finishes [returned, end) with the scalar body.
 * Every kernel's results are bit-identical to the scalar body's. */
typedef int64_t (*mixprec__adamw_body_fn)(const mixprec_opt_tensor *t, int64_t begin,
                                          int64_t end, const mixprec__adamw_scalars *s,
                                          const mixprec__adamw_consts *k);
typedef int64_t (*mixprec__sgd_body_fn)(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                        int first, uint32_t sr_key,
                                        const mixprec__ema_scalars *ema,
                                        const mixprec__sgd_consts *k);
/* The Q8 map's constants as the vector code indexes them, taken from
 * optim_math.h's scalar functions so both round identically: by top bit L
 * (decoding) and by decade d (encoding), and the AVX-512 encode's
 * thresholds. [note: q8 thresholds] The scalar code of y >= 0 is a
 * non-decreasing function of y (tests/c/optim/test_optim_lean.cc checks it
 * over every float of [0, 2] on the CI's fuzz budget, and once over all
 * floats), so it is the count of thresholds thr[r] <= y, thr[r] being the
 * least float whose code ranks r or more (rank: the codes in the order of
 * their values); thr is found from the scalar encode itself
 * (q8_tabs_init in optim_q8.c), so the vector search gives its codes bit for
 * bit. The AVX-512 encode searches thr in NB = 7 (signed: ranks 0..127, and
 * one more compare for +1.0) or 8 (unsigned) halving steps: thr_top, then
 * three tables indexed by R = r >> (NB - 4), then tables of 16, 32, 64 and
 * (unsigned) 128 entries indexed by the rank's leading bits. */
typedef struct mixprec__q8_tabs {
  float dec_step[8], dec_first[8];                /* by L */
  float lower[8], inv_step[8], step[8], first[8]; /* by d */
  float below[8];                                 /* by d >= 1: decade d - 1's last value */
  float jmax[8];                                  /* by d: 2^L - 1 */
  int32_t base[8];                                /* by d: 2^L */
  float search[8]; /* by k: 10^(k-7) for k = 1..6 (the decade search), [7] NaN (never reached) */
  /* The AVX-512 decode, by the exponent field of (float)magnitude, mod 16
   * (L = 0 at 15, L >= 1 at L - 1; unsigned L = 0 is code 1: step 0, first 1). */
  float dz_step[16], dz_first[16];
  float thr[256];  /* by rank r >= 1 (signed: 1..128, unsigned: 1..255); [0] 0 */
  float bs_r[3][16], bs16[16], bs32[32], bs64[64], bs128[128]; /* the search's tables */
} mixprec__q8_tabs;

/* The tables of the signed (exp_avg, momentum) or unsigned (exp_avg_sq) map:
 * computed on the first call (from optim_math.h's scalar functions), then
 * the same shared copy; never NULL. Thread-safe. */
const mixprec__q8_tabs *mixprec__q8_tabs_get(int is_signed);

/* What a lean vector body needs besides the tensor: the Q8 block buffers of
 * the new moments (index i - b0, b0 the block's first element), the BF16
 * moments' rounding keys, the block's Q8 scales (for decoding) and the map
 * tables. */
typedef struct mixprec__lean_ctx {
  float *q0, *q1;
  int64_t b0;
  uint32_t k0, k1;
  float sc0, sc1;
  const mixprec__q8_tabs *tab_s, *tab_u;
} mixprec__lean_ctx;

/* A lean body kernel updates the whole vectors of [begin, end) (begin a
 * multiple of 8, all in torch's vectorised body and in one Q8 block) and
 * returns where it stopped; the store kernel encodes one block. */
typedef int64_t (*mixprec__adamw_lean_fn)(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                          const mixprec__adamw_scalars *s,
                                          const mixprec__adamw_consts *k, const mixprec__lean_ctx *c);
typedef int64_t (*mixprec__sgd_lean_fn)(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                        int first, uint32_t sr_key, const mixprec__ema_scalars *ema,
                                        const mixprec__sgd_consts *k, const mixprec__lean_ctx *c);
typedef void (*mixprec__q8_store_fn)(const float *x, int n, uint8_t *codes, float *scale,
                                     const mixprec__q8_tabs *tb, int is_signed);

/* The scalar store kernel (the reference). */
MIXPREC__INLINE void mixprec__q8_store_block_scalar(const float *x, int n, uint8_t *codes, float *scale,
                                                    const mixprec__q8_tabs *tb, int is_signed) {
  (void)tb;
  mixprec__q8_store_block(x, n, codes, scale, is_signed);
}

#if defined(MIXPREC_X86)
int64_t mixprec__adamw_lean_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                 const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                 const mixprec__lean_ctx *c);
int64_t mixprec__sgd_lean_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                               uint32_t sr_key, const mixprec__ema_scalars *ema,
                               const mixprec__sgd_consts *k, const mixprec__lean_ctx *c);
void mixprec__q8_store_block_avx2(const float *x, int n, uint8_t *codes, float *scale,
                                  const mixprec__q8_tabs *tb, int is_signed);
int64_t mixprec__adamw_body_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                 const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k);
int64_t mixprec__sgd_body_avx2(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                               uint32_t sr_key, const mixprec__ema_scalars *ema,
                               const mixprec__sgd_consts *k);
/* The AVX-512 kernels (adamw_avx512.c, sgd_avx512.c): 16 lanes, the same
 * bits; a range's last whole 8 go to the AVX2 kernels. */
int64_t mixprec__adamw_lean_avx512(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                   const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k,
                                   const mixprec__lean_ctx *c);
int64_t mixprec__sgd_lean_avx512(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                                 uint32_t sr_key, const mixprec__ema_scalars *ema,
                                 const mixprec__sgd_consts *k, const mixprec__lean_ctx *c);
void mixprec__q8_store_block_avx512(const float *x, int n, uint8_t *codes, float *scale,
                                    const mixprec__q8_tabs *tb, int is_signed);
int64_t mixprec__adamw_body_avx512(const mixprec_opt_tensor *t, int64_t begin, int64_t end,
                                   const mixprec__adamw_scalars *s, const mixprec__adamw_consts *k);
int64_t mixprec__sgd_body_avx512(const mixprec_opt_tensor *t, int64_t begin, int64_t end, int first,
                                 uint32_t sr_key, const mixprec__ema_scalars *ema,
                                 const mixprec__sgd_consts *k);
#endif

/* How a lean tensor holds its FP32 param: P (its master, or the F32 param
 * itself), master-free BF16 (stochastic rounding) or BF16 + remainder. */
enum { MIXPREC__PM_P = 0, MIXPREC__PM_SR = 1, MIXPREC__PM_REM = 2 };

MIXPREC__FORCE_INLINE int mixprec__opt_param_mode(const mixprec_opt_tensor *t) {
  return t->remainder ? MIXPREC__PM_REM : mixprec__opt_is_sr(t) ? MIXPREC__PM_SR : MIXPREC__PM_P;
}

/* Runs body once with PM declared as the constant param mode of t (as
 * MIXPREC__DISPATCH does for a dtype): each lean body is stamped per mode. */
#define MIXPREC__PM_DISPATCH(t, PM, ...)                                      \
  do {                                                                        \
    switch (mixprec__opt_param_mode(t)) {                                     \
      case MIXPREC__PM_REM: { const int PM = MIXPREC__PM_REM; __VA_ARGS__; } break; \
      case MIXPREC__PM_SR: { const int PM = MIXPREC__PM_SR; __VA_ARGS__; } break;   \
      default: { const int PM = MIXPREC__PM_P; __VA_ARGS__; } break;                \
    }                                                                         \
  } while (0)

/* The same for a moment's mixprec_state_dtype d, as the constant D. */
#define MIXPREC__STATE_DISPATCH(d, D, ...)                                                        \
  do {                                                                                            \
    switch (d) {                                                                                  \
      case MIXPREC_STATE_BF16: { const mixprec_state_dtype D = MIXPREC_STATE_BF16; __VA_ARGS__; } break; \
      case MIXPREC_STATE_Q8: { const mixprec_state_dtype D = MIXPREC_STATE_Q8; __VA_ARGS__; } break;     \
      default: { const mixprec_state_dtype D = MIXPREC_STATE_F32; __VA_ARGS__; } break;                  \
    }                                                                                             \
  } while (0)

/* The lean kernels of the active ISA (NULL body: scalar only), chosen once
 * per step, and the map tables (mixprec__q8_tabs_get: computed once per
 * process, shared). */
typedef struct mixprec__lean_kernels {
  mixprec__adamw_lean_fn adamw;
  mixprec__sgd_lean_fn sgd;
  mixprec__q8_store_fn store;
  const mixprec__q8_tabs *tab_s, *tab_u;
} mixprec__lean_kernels;

MIXPREC__INLINE void mixprec__lean_kernels_init(mixprec__lean_kernels *lk, const mixprec_opt_tensor *list,
                                                int64_t n, int use_v) {
  lk->adamw = NULL;
  lk->sgd = NULL;
  lk->store = mixprec__q8_store_block_scalar;
  lk->tab_s = lk->tab_u = NULL;
  int q8 = 0;
  for (int64_t i = 0; i < n; i++)
    q8 |= list[i].exp_avg_dtype == MIXPREC_STATE_Q8 || (use_v && list[i].exp_avg_sq_dtype == MIXPREC_STATE_Q8);
  if (q8) {
    lk->tab_s = mixprec__q8_tabs_get(1);
    lk->tab_u = mixprec__q8_tabs_get(0);
  }
#if defined(MIXPREC_X86)
  const mixprec_cpu_isa isa = mixprec__active_isa();
  if (isa == MIXPREC_ISA_AVX512) {
    lk->adamw = mixprec__adamw_lean_avx512;
    lk->sgd = mixprec__sgd_lean_avx512;
    lk->store = mixprec__q8_store_block_avx512;
  } else if (isa == MIXPREC_ISA_AVX2) {
    lk->adamw = mixprec__adamw_lean_avx2;
    lk->sgd = mixprec__sgd_lean_avx2;
    lk->store = mixprec__q8_store_block_avx2;
  }
#endif
}

/* ---- AVX2 + FMA + F16C loads and stores (only in files built with them) */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

/* Elements [i, i + 8) widened to float; bit-identical to
 * mixprec__load_f32 (F16C quiets a NaN and keeps its payload, as
 * mixprec__f16_to_f32 does). */
MIXPREC__FORCE_INLINE __m256 mixprec__opt_load8(const void *data, mixprec_dtype dtype, int64_t i) {
  switch (dtype) {
    case MIXPREC_F16:
      return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)data + i)));
    case MIXPREC_BF16:
      return _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)data + i))),
          16));
    default:
      return _mm256_loadu_ps((const float *)data + i);
  }
}

/* The BF16 round-to-nearest-even of 8 floats, each in the top 16 bits of its
 * 32-bit lane (the low 16 bits are garbage): bit-identical to
 * mixprec__f32_to_bf16 once shifted down. Written with as few shift and
 * shuffle instructions as possible (Zen 3 runs those on two of its four
 * vector pipes): the rounding bit is tested with a compare, not a shift. */
MIXPREC__FORCE_INLINE __m256i mixprec__opt_bf16_rne_hi8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i bit16 = _mm256_set1_epi32(0x10000);
  const __m256i odd = _mm256_cmpeq_epi32(_mm256_and_si256(u, bit16), bit16); /* -1 or 0 */
  const __m256i rne = _mm256_sub_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd);
  const __m256i nan = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rne, nan, is_nan);
}

/* Stores elements [i, i + 8) of a low-precision param, bit-identical to
 * mixprec__opt_store_half: F16 by F16C round-to-nearest-even (a NaN keeps its
 * sign and top payload bits and is quieted, as mixprec__f32_to_f16 does),
 * BF16 by the integer round-to-nearest-even, with a NaN (whose rounding
 * could carry into the exponent) replaced by its quieted top half. */
MIXPREC__FORCE_INLINE void mixprec__opt_store8_half(void *data, mixprec_dtype dtype, int64_t i,
                                              __m256 v) {
  __m128i h;
  if (dtype == MIXPREC_F16) {
    h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    const __m256i r = _mm256_srli_epi32(mixprec__opt_bf16_rne_hi8(v), 16);
    /* Every lane is < 2^16: the signed-to-unsigned saturation never bites. */
    h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  _mm_storeu_si128((__m128i *)((uint16_t *)data + i), h);
}

/* Stores elements [i, i + 8) of an unscaled grad (unscale_grads),
 * bit-identical to mixprec__opt_store_grad: F32 as is, F16/BF16 as
 * mixprec__opt_store8_half rounds a param. Plain stores: the grad's lines
 * were just read, so a non-temporal store would save no read. (The const
 * cast as in mixprec__opt_store_grad.) */
MIXPREC__FORCE_INLINE void mixprec__opt_store8_grad(const void *grad, mixprec_dtype dtype, int64_t i,
                                              __m256 v) {
  void *data = (void *)(uintptr_t)grad;
  if (dtype == MIXPREC_F32)
    _mm256_storeu_ps((float *)data + i, v);
  else
    mixprec__opt_store8_half(data, dtype, i, v);
}

/* Writes elements [begin, end) of a low-precision param from the FP32 values
 * src[begin, end) (its master, just updated), bit-identical to
 * mixprec__opt_store_half per element; end - begin is a multiple of 8.
 * stream: 32-byte aligned runs go out with non-temporal stores, which skip
 * the read-for-ownership of a line the step only writes (2 of the 30 bytes
 * per param it would otherwise move); the caller ends with _mm_sfence().
 * (out + begin is always 2-byte aligned; a param that is not 16-byte aligned
 * at begin never reaches 32 and takes plain stores.) */
MIXPREC__FORCE_INLINE void mixprec__opt_store_half_range(void *data, mixprec_dtype dtype, const float *src,
                                                   int64_t begin, int64_t end, int stream) {
  uint16_t *out = (uint16_t *)data;
  int64_t i = begin;
  /* Streaming needs 32-byte alignment, reachable by one 8-element (16-byte)
   * head store when out + i is 16-byte aligned; otherwise plain stores. */
  if (stream && ((uintptr_t)(out + i) & 15u) == 0) {
    if (((uintptr_t)(out + i) & 31u) != 0 && i + 8 <= end) {
      mixprec__opt_store8_half(data, dtype, i, _mm256_loadu_ps(src + i));
      i += 8;
    }
  } else {
    stream = 0;
  }
  for (; i + 16 <= end; i += 16) {
    __m256i h;
    if (dtype == MIXPREC_F16) {
      h = _mm256_setr_m128i(
          _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
          _mm256_cvtps_ph(_mm256_loadu_ps(src + i + 8), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      /* packus works within 128-bit lanes: [a0-3 b0-3 | a4-7 b4-7], then
       * the 64-bit quarters are put back in order. */
      h = _mm256_packus_epi32(_mm256_srli_epi32(mixprec__opt_bf16_rne_hi8(_mm256_loadu_ps(src + i)), 16),
                              _mm256_srli_epi32(mixprec__opt_bf16_rne_hi8(_mm256_loadu_ps(src + i + 8)), 16));
      h = _mm256_permute4x64_epi64(h, 0xD8);
    }
    if (stream)
      _mm256_stream_si256((__m256i *)(out + i), h);
    else
      _mm256_storeu_si256((__m256i *)(out + i), h);
  }
  for (; i < end; i += 8) mixprec__opt_store8_half(data, dtype, i, _mm256_loadu_ps(src + i));
}

/* The words elements [i, i + 8) hash for their random bits
 * (mixprec__sr_bits: key + lo32(i + lane) * 0x9e3779b1 + hi32(i) * 0x85ebca77).
 * Lane j's word is the lane 0 word + j * 0x9e3779b1 because lo32(i) + j does
 * not wrap: body kernels start at chunk starts (multiples of 2^16) and step
 * by 8, so i is a multiple of 8; for the same reason the words of i + 8 are
 * these plus MIXPREC__SR_STEP8 (a loop may advance them so). */
#define MIXPREC__SR_STEP8 ((int)(8u * 0x9e3779b1u))
MIXPREC__FORCE_INLINE __m256i mixprec__opt_sr_words8(uint32_t key, int64_t i) {
  const uint64_t u = (uint64_t)i;
  const uint32_t base = key + (uint32_t)u * 0x9e3779b1u + (uint32_t)(u >> 32) * 0x85ebca77u;
  return _mm256_add_epi32(_mm256_set1_epi32((int)base),
                          _mm256_setr_epi32(0, (int)0x9e3779b1u, (int)(2u * 0x9e3779b1u),
                                            (int)(3u * 0x9e3779b1u), (int)(4u * 0x9e3779b1u),
                                            (int)(5u * 0x9e3779b1u), (int)(6u * 0x9e3779b1u),
                                            (int)(7u * 0x9e3779b1u)));
}

/* Stores elements [i, i + 8) of a master-free BF16 param, stochastically
 * rounded with the bits of the words x (mixprec__opt_sr_words8(key, i)):
 * bit-identical to mixprec__f32_to_bf16_sr(v, mixprec__sr_bits(key, i + lane)). */
MIXPREC__FORCE_INLINE void mixprec__opt_store8_bf16_srw(void *data, int64_t i, __m256i x, __m256 v) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x7feb352du));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bu));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  const __m256i bits = _mm256_castps_si256(v);
  /* A NaN's quieted top half is (bits | 0x400000) >> 16: blended before the
   * one shift. */
  const __m256i sum = _mm256_add_epi32(bits, _mm256_srli_epi32(x, 16));
  const __m256i nan = _mm256_or_si256(bits, _mm256_set1_epi32(0x400000));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(sum, nan, is_nan), 16);
  const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128((__m128i *)((uint16_t *)data + i), h);
}

/* The same with the words of (key, i). */
MIXPREC__FORCE_INLINE void mixprec__opt_store8_bf16_sr(void *data, int64_t i, uint32_t key, __m256 v) {
  mixprec__opt_store8_bf16_srw(data, i, mixprec__opt_sr_words8(key, i), v);
}

/* Declares `const T *name` pointing at a local copy of *src: the compiler
 * may then keep every field in a register (vector stores may alias
 * anything, the caller's structs included). */
#define MIXPREC__OPT_LOCAL(T, name, src) \
  const T name##_copy_ = *(src);         \
  const T *name = &name##_copy_

/* The loop of the AVX2 body kernels (adamw_avx2.c, sgd_avx2.c) over the
 * elements [i, end) of tensor t whose FP32 values are P (its master, or the
 * FP32 param; the param for master-free BF16). UPDATE8(i, sr) is the kernel's
 * expression for the new FP32 param of elements [i, i + 8) (it stores the
 * optimizer state). A param with a master is updated MIXPREC__OPT_BLOCK
 * elements at a time: the FP32 update into the master, then the block rounded
 * to the param (two short loops instead of one long dependency chain per
 * vector, which the out-of-order core could not overlap as well); a
 * master-free BF16 param is rounded stochastically with sr_key. Leaves i at
 * the first element not done (whole vectors only). */
#define MIXPREC__OPT_BODY_LOOP(t, P, pd, sr, sr_key, stream, i, end, UPDATE8)                  \
  do {                                                                                        \
    if ((pd) != MIXPREC_F32 && !(sr)) {                                                       \
      const int64_t stop_ = (i) + ((end) - (i)) / 8 * 8;                                      \
      while ((i) < stop_) {                                                                   \
        const int64_t b_ = (i);                                                               \
        const int64_t e_ = stop_ - b_ > MIXPREC__OPT_BLOCK ? b_ + MIXPREC__OPT_BLOCK : stop_; \
        for (; (i) < e_; (i) += 8) _mm256_storeu_ps((P) + (i), UPDATE8((i), 0));              \
        mixprec__opt_store_half_range((t)->param, (pd), (P), b_, e_, (stream));               \
      }                                                                                       \
      if (stream) _mm_sfence();                                                               \
    } else {                                                                                  \
      __m256i w_ = (sr) ? mixprec__opt_sr_words8((sr_key), (i)) : _mm256_setzero_si256();    \
      for (; (i) + 8 <= (end); (i) += 8) {                                                    \
        const __m256 p_ = UPDATE8((i), (sr));                                                 \
        if (sr) {                                                                             \
          mixprec__opt_store8_bf16_srw((t)->param, (i), w_, p_);                              \
          w_ = _mm256_add_epi32(w_, _mm256_set1_epi32(MIXPREC__SR_STEP8));                    \
        } else {                                                                              \
          _mm256_storeu_ps((P) + (i), p_);                                                    \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
  } while (0)

/* Elements [i, i + 8) of an EMA buffer moved toward the new FP32 values p:
 * bit-identical to mixprec__ema_lerp per lane (torch's lerp_vec). */
MIXPREC__FORCE_INLINE void mixprec__opt_ema8(float *E, int64_t i, __m256 p, mixprec__ema_w w) {
  const __m256 e = _mm256_loadu_ps(E + i);
  const __m256 d = _mm256_sub_ps(p, e);
  _mm256_storeu_ps(E + i, w.small ? _mm256_fmadd_ps(_mm256_set1_ps(w.w), d, e)
                                  : _mm256_fmadd_ps(_mm256_set1_ps(w.w_m1), d, p));
}

/* ---- the lean state, 8 elements at a time (bit-identical to the scalar
 * helpers above and optim_math.h) ------------------------------------- */

/* The masters held by params [i, i + 8) and their remainders
 * (mixprec__rem_join). */
MIXPREC__FORCE_INLINE __m256 mixprec__opt_rem_join8(const void *param, const int16_t *rem, int64_t i) {
  const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)param + i)));
  const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(rem + i)));
  const __m256i neg = _mm256_cmpgt_epi32(lo, _mm256_set1_epi32(0x7fff));
  const __m256i mag = _mm256_and_si256(hi, _mm256_set1_epi32(0x7fff));
  const __m256i zero = _mm256_cmpeq_epi32(mag, _mm256_setzero_si256());
  /* 1 <= mag <= 0x7f80: hi - 1; mag == 0: hi | 0x7f80 */
  const __m256i dec = _mm256_andnot_si256(zero, _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f81), mag));
  __m256i h = _mm256_add_epi32(hi, _mm256_and_si256(neg, dec));
  h = _mm256_or_si256(h, _mm256_and_si256(_mm256_and_si256(neg, zero), _mm256_set1_epi32(0x7f80)));
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(h, 16), lo));
}

/* 8 packed 16-bit values from 8 lanes below 2^16. */
MIXPREC__FORCE_INLINE __m128i mixprec__opt_pack16(__m256i x) {
  return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

/* Splits masters into params [i, i + 8) and their remainders
 * (mixprec__rem_split). */
MIXPREC__FORCE_INLINE void mixprec__opt_rem_split8(void *param, int16_t *rem, int64_t i, __m256 M) {
  const __m256i u = _mm256_castps_si256(M);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lo = _mm256_and_si256(u, _mm256_set1_epi32(0xffff));
  const __m256i neg = _mm256_cmpgt_epi32(lo, _mm256_set1_epi32(0x7fff));
  const __m256i mag = _mm256_and_si256(hi, _mm256_set1_epi32(0x7fff));
  const __m256i fin = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f80), mag);
  const __m256i infp = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f80));
  __m256i P = _mm256_sub_epi32(hi, _mm256_and_si256(neg, fin));
  P = _mm256_blendv_epi8(P, _mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), _mm256_and_si256(neg, infp));
  _mm_storeu_si128((__m128i *)((uint16_t *)param + i), mixprec__opt_pack16(P));
  _mm_storeu_si128((__m128i *)(rem + i), mixprec__opt_pack16(lo));
}

/* Codes [i, i + 8) decoded at scale (mixprec__q8_load). */
MIXPREC__FORCE_INLINE __m256 mixprec__q8_load8(const uint8_t *codes, int64_t i, float scale,
                                               const mixprec__q8_tabs *tb, const int is_signed) {
  const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + i)));
  const __m256i q = is_signed ? _mm256_and_si256(c, _mm256_set1_epi32(0x7f)) : c;
  /* q's top bit L from its float exponent (q = 0: masked below). */
  const __m256i L = _mm256_sub_epi32(
      _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(q)), 23), _mm256_set1_epi32(127));
  const __m256i j = _mm256_sub_epi32(q, _mm256_sllv_epi32(_mm256_set1_epi32(1), L));
  __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(j),
                             _mm256_permutevar8x32_ps(_mm256_loadu_ps(tb->dec_step), L),
                             _mm256_permutevar8x32_ps(_mm256_loadu_ps(tb->dec_first), L));
  const __m256i one_code = _mm256_set1_epi32(is_signed ? 0x80 : 1);
  const __m256 is_zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(q, _mm256_setzero_si256()));
  const __m256 is_one = _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, one_code));
  if (is_signed)
    v = _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24)));
  v = _mm256_andnot_ps(is_zero, v);
  v = _mm256_blendv_ps(v, _mm256_set1_ps(1.0f), is_one);
  return _mm256_mul_ps(v, _mm256_set1_ps(scale));
}

/* The codes of 8 values at inv (mixprec__q8_encode), in the low 8 bytes. */
MIXPREC__FORCE_INLINE __m128i mixprec__q8_encode8(__m256 x, __m256 inv, const mixprec__q8_tabs *tb,
                                                  const int is_signed) {
  const __m256i xb = _mm256_castps_si256(x);
  const __m256i sign = is_signed ? _mm256_srli_epi32(_mm256_and_si256(xb, _mm256_set1_epi32((int)0x80000000u)), 24)
                                 : _mm256_setzero_si256();
  const __m256 y = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), inv);
  const __m256 nan = _mm256_cmp_ps(y, y, _CMP_UNORD_Q);
  /* The decade d = how many of 10^-6 .. 10^-1 y reaches (as the scalar
   * loop counts; the ends are increasing, so a binary search over them):
   * 4 or 0, then + 2, then + 1 (search[7], NaN, is never reached; a NaN y
   * reaches none). */
  const __m256 srch = _mm256_loadu_ps(tb->search);
  __m256i d = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(y, _mm256_set1_ps(tb->search[4]), _CMP_GE_OQ)),
                               _mm256_set1_epi32(4));
  d = _mm256_add_epi32(d, _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(
                              y, _mm256_permutevar8x32_ps(srch, _mm256_add_epi32(d, _mm256_set1_epi32(2))), _CMP_GE_OQ)),
                          _mm256_set1_epi32(2)));
  d = _mm256_add_epi32(d, _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(
                              y, _mm256_permutevar8x32_ps(srch, _mm256_add_epi32(d, _mm256_set1_epi32(1))), _CMP_GE_OQ)),
                          _mm256_set1_epi32(1)));
  const __m256 lower = _mm256_permutevar8x32_ps(_mm256_loadu_ps(tb->lower), d);
  const __m256 jmax = _mm256_permutevar8x32_ps(_mm256_loadu_ps(tb->jmax), d);
  __m256 jf = _mm256_floor_ps(
      _mm256_mul_ps(_mm256_sub_ps(y, lower), _mm256_permutevar8x32_ps(_mm256_loadu_ps(tb->inv_step), d)));
  jf = _mm256_max_ps(jf, _mm256_setzero_ps()); /* a NaN (second operand wins) or negative: 0 */
  jf = _mm256_min_ps(jf, jmax);
  const __m256i q = _mm256_add_epi32(_mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)tb->base), d),
                                     _mm256_cvttps_epi32(jf));
  const __m256 vq = _mm256_fmadd_ps(jf, _mm256_permutevar8x32_ps(_mm256_loadu_ps(tb->step), d),
                                    _mm256_permutevar8x32_ps(_mm256_loadu_ps(tb->first), d));
  const __m256 first = _mm256_cmp_ps(jf, _mm256_setzero_ps(), _CMP_EQ_OQ);
  const __m256 d0 = _mm256_castsi256_ps(_mm256_cmpeq_epi32(d, _mm256_setzero_si256()));
  const __m256 below = _mm256_permutevar8x32_ps(_mm256_loadu_ps(tb->below), d);
  const __m256 c_below = _mm256_and_ps(_mm256_andnot_ps(d0, first),
                                       _mm256_cmp_ps(_mm256_sub_ps(y, below), _mm256_sub_ps(vq, y), _CMP_LT_OQ));
  const __m256 c_zero = _mm256_and_ps(_mm256_and_ps(d0, first),
                                      _mm256_cmp_ps(y, _mm256_mul_ps(vq, _mm256_set1_ps(0.5f)), _CMP_LT_OQ));
  __m256 c_one = _mm256_and_ps(
      _mm256_castsi256_ps(_mm256_cmpeq_epi32(d, _mm256_set1_epi32(6))),
      _mm256_and_ps(_mm256_cmp_ps(jf, jmax, _CMP_EQ_OQ),
                    _mm256_cmp_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), y), _mm256_sub_ps(y, vq), _CMP_LT_OQ)));
  if (is_signed) c_one = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(sign, _mm256_set1_epi32(0x80))), c_one);
  __m256i code = _mm256_or_si256(sign, q);
  code = _mm256_blendv_epi8(code, _mm256_or_si256(sign, _mm256_sub_epi32(q, _mm256_set1_epi32(1))),
                            _mm256_castps_si256(c_below));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(is_signed ? 0x80 : 1), _mm256_castps_si256(c_one));
  code = _mm256_andnot_si256(_mm256_castps_si256(_mm256_or_ps(c_zero, nan)), code);
  const __m128i h = mixprec__opt_pack16(code);
  return _mm_packus_epi16(h, h);
}

/* Moment elements [i, i + 8) in FP32 (mixprec__opt_state_get). */
MIXPREC__FORCE_INLINE __m256 mixprec__opt_state_load8(const void *buf, mixprec_state_dtype d, int64_t i,
                                                      float scale, const mixprec__q8_tabs *tb,
                                                      const int is_signed) {
  if (d == MIXPREC_STATE_BF16) return mixprec__opt_load8(buf, MIXPREC_BF16, i);
  if (d == MIXPREC_STATE_Q8) return mixprec__q8_load8((const uint8_t *)buf, i, scale, tb, is_signed);
  return _mm256_loadu_ps((const float *)buf + i);
}

/* Stores moment elements [i, i + 8) (mixprec__opt_state_put: Q8 values to
 * the block buffer q at i - b0). */
MIXPREC__FORCE_INLINE void mixprec__opt_state_store8(void *buf, mixprec_state_dtype d, int64_t i, __m256 x,
                                                     uint32_t key, float *q, int64_t b0) {
  if (d == MIXPREC_STATE_BF16)
    mixprec__opt_store8_bf16_sr(buf, i, key, x);
  else if (d == MIXPREC_STATE_Q8)
    _mm256_storeu_ps(q + (i - b0), x);
  else
    _mm256_storeu_ps((float *)buf + i, x);
}

/* The FP32 values of a lean tensor's params [i, i + 8)
 * (mixprec__opt_lean_param_get); pm (mixprec__opt_param_mode) is a
 * constant of each lean body. */
MIXPREC__FORCE_INLINE __m256 mixprec__opt_lean_param_load8(const mixprec_opt_tensor *t, const float *P,
                                                           int64_t i, const int pm) {
  if (pm == MIXPREC__PM_REM) return mixprec__opt_rem_join8(t->param, t->remainder, i);
  if (pm == MIXPREC__PM_SR) return mixprec__opt_load8(t->param, MIXPREC_BF16, i);
  return _mm256_loadu_ps(P + i);
}

MIXPREC__FORCE_INLINE void mixprec__opt_lean_param_store8(const mixprec_opt_tensor *t, float *P, int64_t i,
                                                          const int pm, uint32_t sr_key, __m256 p) {
  if (pm == MIXPREC__PM_REM) {
    mixprec__opt_rem_split8(t->param, t->remainder, i, p);
  } else if (pm == MIXPREC__PM_SR) {
    mixprec__opt_store8_bf16_sr(t->param, i, sr_key, p);
  } else {
    _mm256_storeu_ps(P + i, p);
    if (t->param_dtype != MIXPREC_F32) mixprec__opt_store8_half(t->param, t->param_dtype, i, p);
  }
}

/* -x for every lane: flips the sign bit, NaNs included, like C's unary -. */
MIXPREC__FORCE_INLINE __m256 mixprec__opt_neg8(__m256 x) {
  return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
}

/* ---- AVX-512 (F, BW, VL, DQ) loads and stores, 16 lanes (only in files
 * built with them: adamw_avx512.c, sgd_avx512.c). Each is the 8-lane helper
 * above at twice the width, its blends done with mask registers: the same
 * operations per lane, so the same bits. (vcvtneps2bf16 is not used: it
 * flushes denormals, and our BF16 roundings are our own.) */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)

/* Elements [i, i + 16) widened to float (mixprec__opt_load8). */
MIXPREC__FORCE_INLINE __m512 mixprec__opt_load16(const void *data, mixprec_dtype dtype, int64_t i) {
  switch (dtype) {
    case MIXPREC_F16:
      return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)data + i)));
    case MIXPREC_BF16:
      return _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)data + i))), 16));
    default:
      return _mm512_loadu_ps((const float *)data + i);
  }
}

/* mixprec__opt_bf16_rne_hi8 for 16 lanes. */
MIXPREC__FORCE_INLINE __m512i mixprec__opt_bf16_rne_hi16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 odd = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000));
  const __m512i t = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
  const __m512i rne = _mm512_mask_add_epi32(t, odd, t, _mm512_set1_epi32(1));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rne, is_nan, u, _mm512_set1_epi32(0x400000));
}

/* mixprec__opt_store8_half for 16 lanes. */
MIXPREC__FORCE_INLINE void mixprec__opt_store16_half(void *data, mixprec_dtype dtype, int64_t i, __m512 v) {
  __m256i h;
  if (dtype == MIXPREC_F16)
    h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  else /* every lane < 2^16 after the shift: the truncating pack is exact */
    h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(mixprec__opt_bf16_rne_hi16(v), 16));
  _mm256_storeu_si256((__m256i *)((uint16_t *)data + i), h);
}

/* mixprec__opt_store8_grad for 16 lanes. */
MIXPREC__FORCE_INLINE void mixprec__opt_store16_grad(const void *grad, mixprec_dtype dtype, int64_t i,
                                                     __m512 v) {
  void *data = (void *)(uintptr_t)grad;
  if (dtype == MIXPREC_F32)
    _mm512_storeu_ps((float *)data + i, v);
  else
    mixprec__opt_store16_half(data, dtype, i, v);
}

/* mixprec__opt_sr_words8 for 16 lanes (i a multiple of 8 in a chunk: lo32(i)
 * + 15 does not wrap either, a chunk's whole vectors ending at its end). */
#define MIXPREC__SR_STEP16 ((int)(16u * 0x9e3779b1u))
MIXPREC__FORCE_INLINE __m512i mixprec__opt_sr_words16(uint32_t key, int64_t i) {
  const __m256i lo = mixprec__opt_sr_words8(key, i);
  const __m256i hi = _mm256_add_epi32(lo, _mm256_set1_epi32(MIXPREC__SR_STEP8));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* mixprec__opt_store8_bf16_srw for 16 lanes. */
MIXPREC__FORCE_INLINE void mixprec__opt_store16_bf16_srw(void *data, int64_t i, __m512i x, __m512 v) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0x7feb352du));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0x846ca68bu));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i sum = _mm512_add_epi32(bits, _mm512_srli_epi32(x, 16));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i r = _mm512_srli_epi32(_mm512_mask_or_epi32(sum, is_nan, bits, _mm512_set1_epi32(0x400000)), 16);
  _mm256_storeu_si256((__m256i *)((uint16_t *)data + i), _mm512_cvtepi32_epi16(r));
}

MIXPREC__FORCE_INLINE void mixprec__opt_store16_bf16_sr(void *data, int64_t i, uint32_t key, __m512 v) {
  mixprec__opt_store16_bf16_srw(data, i, mixprec__opt_sr_words16(key, i), v);
}

/* MIXPREC__OPT_BODY_LOOP with UPDATE16 over whole 16-lane vectors (the
 * block's rounding to the param by mixprec__opt_store_half_range); leaves i
 * at the first element not done, end - i < 16 (the caller's AVX2 kernel
 * takes a last 8). */
#define MIXPREC__OPT_BODY_LOOP16(t, P, pd, sr, sr_key, stream, i, end, UPDATE16)              \
  do {                                                                                        \
    const int64_t stop_ = (i) + ((end) - (i)) / 16 * 16;                                      \
    if ((pd) != MIXPREC_F32 && !(sr)) {                                                       \
      while ((i) < stop_) {                                                                   \
        const int64_t b_ = (i);                                                               \
        const int64_t e_ = stop_ - b_ > MIXPREC__OPT_BLOCK ? b_ + MIXPREC__OPT_BLOCK : stop_; \
        for (; (i) < e_; (i) += 16) _mm512_storeu_ps((P) + (i), UPDATE16((i), 0));            \
        mixprec__opt_store_half_range((t)->param, (pd), (P), b_, e_, (stream));               \
      }                                                                                       \
      if (stream) _mm_sfence();                                                               \
    } else {                                                                                  \
      __m512i w_ = (sr) ? mixprec__opt_sr_words16((sr_key), (i)) : _mm512_setzero_si512();   \
      for (; (i) < stop_; (i) += 16) {                                                        \
        const __m512 p_ = UPDATE16((i), (sr));                                                \
        if (sr) {                                                                             \
          mixprec__opt_store16_bf16_srw((t)->param, (i), w_, p_);                             \
          w_ = _mm512_add_epi32(w_, _mm512_set1_epi32(MIXPREC__SR_STEP16));                   \
        } else {                                                                              \
          _mm512_storeu_ps((P) + (i), p_);                                                    \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
  } while (0)

/* mixprec__opt_ema8 for 16 lanes. */
MIXPREC__FORCE_INLINE void mixprec__opt_ema16(float *E, int64_t i, __m512 p, mixprec__ema_w w) {
  const __m512 e = _mm512_loadu_ps(E + i);
  const __m512 d = _mm512_sub_ps(p, e);
  _mm512_storeu_ps(E + i, w.small ? _mm512_fmadd_ps(_mm512_set1_ps(w.w), d, e)
                                  : _mm512_fmadd_ps(_mm512_set1_ps(w.w_m1), d, p));
}

/* mixprec__opt_rem_join8 for 16 lanes. */
MIXPREC__FORCE_INLINE __m512 mixprec__opt_rem_join16(const void *param, const int16_t *rem, int64_t i) {
  const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)param + i)));
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(rem + i)));
  const __mmask16 neg = _mm512_cmpgt_epi32_mask(lo, _mm512_set1_epi32(0x7fff));
  const __m512i mag = _mm512_and_si512(hi, _mm512_set1_epi32(0x7fff));
  const __mmask16 zero = _mm512_mask_cmpeq_epi32_mask(neg, mag, _mm512_setzero_si512());
  /* 1 <= mag <= 0x7f80: hi - 1; mag == 0: hi | 0x7f80 */
  const __mmask16 dec = _mm512_mask_cmpgt_epi32_mask((__mmask16)(neg & ~zero), _mm512_set1_epi32(0x7f81), mag);
  __m512i h = _mm512_mask_sub_epi32(hi, dec, hi, _mm512_set1_epi32(1));
  h = _mm512_mask_or_epi32(h, zero, h, _mm512_set1_epi32(0x7f80));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(h, 16), lo));
}

/* mixprec__opt_rem_split8 for 16 lanes. */
MIXPREC__FORCE_INLINE void mixprec__opt_rem_split16(void *param, int16_t *rem, int64_t i, __m512 M) {
  const __m512i u = _mm512_castps_si512(M);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lo = _mm512_and_si512(u, _mm512_set1_epi32(0xffff));
  const __mmask16 neg = _mm512_cmpgt_epi32_mask(lo, _mm512_set1_epi32(0x7fff));
  const __m512i mag = _mm512_and_si512(hi, _mm512_set1_epi32(0x7fff));
  const __mmask16 fin = _mm512_mask_cmpgt_epi32_mask(neg, _mm512_set1_epi32(0x7f80), mag);
  const __mmask16 infp = _mm512_mask_cmpeq_epi32_mask(neg, mag, _mm512_set1_epi32(0x7f80));
  __m512i P = _mm512_mask_add_epi32(hi, fin, hi, _mm512_set1_epi32(1));
  P = _mm512_mask_and_epi32(P, infp, hi, _mm512_set1_epi32(0x8000));
  _mm256_storeu_si256((__m256i *)((uint16_t *)param + i), _mm512_cvtepi32_epi16(P));
  _mm256_storeu_si256((__m256i *)(rem + i), _mm512_cvtepi32_epi16(lo));
}

/* Codes [i, i + 16) decoded at scale (mixprec__q8_load): the magnitude q's
 * top bit L from the exponent of (float)q, j = q - 2^L exactly in float,
 * fma(j, step[L], first[L]) (mixprec__q8_mag's one rounding; q = 0 masked
 * to 0), the sign, and the signed map's +1.0 at 0x80. */
MIXPREC__FORCE_INLINE __m512 mixprec__q8_load16(const uint8_t *codes, int64_t i, float scale,
                                                const mixprec__q8_tabs *tb, const int is_signed) {
  const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + i)));
  const __m512i q = is_signed ? _mm512_and_si512(c, _mm512_set1_epi32(0x7f)) : c;
  const __m512 qf = _mm512_cvtepi32_ps(q);
  const __m512i e = _mm512_srli_epi32(_mm512_castps_si512(qf), 23);
  const __m512 j = _mm512_sub_ps(qf, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)));
  __m512 v = _mm512_maskz_fmadd_ps(_mm512_test_epi32_mask(q, q), j,
                                   _mm512_permutexvar_ps(e, _mm512_loadu_ps(tb->dz_step)),
                                   _mm512_permutexvar_ps(e, _mm512_loadu_ps(tb->dz_first)));
  if (is_signed) {
    /* v ^ (c << 24 & sign bit): ternary-logic 0x78 is A ^ (B & C) */
    v = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(v), _mm512_slli_epi32(c, 24),
                                                      _mm512_set1_epi32((int)0x80000000u), 0x78));
    v = _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(0x80)), _mm512_set1_ps(1.0f));
  }
  return _mm512_mul_ps(v, _mm512_set1_ps(scale));
}

/* The AVX-512 encode's tables in registers ([note: q8 thresholds]). */
typedef struct mixprec__q8_enc16 {
  __m512 top, one, r0, r1, r2, t16, t32[2], t64[4], t128[8];
} mixprec__q8_enc16;

MIXPREC__FORCE_INLINE mixprec__q8_enc16 mixprec__q8_enc16_load(const mixprec__q8_tabs *tb, const int is_signed) {
  mixprec__q8_enc16 e;
  e.top = _mm512_set1_ps(tb->thr[is_signed ? 64 : 128]);
  e.one = _mm512_set1_ps(tb->thr[128]);
  e.r0 = _mm512_loadu_ps(tb->bs_r[0]);
  e.r1 = _mm512_loadu_ps(tb->bs_r[1]);
  e.r2 = _mm512_loadu_ps(tb->bs_r[2]);
  e.t16 = _mm512_loadu_ps(tb->bs16);
  for (int k = 0; k < 2; k++) e.t32[k] = _mm512_loadu_ps(tb->bs32 + 16 * k);
  for (int k = 0; k < 4; k++) e.t64[k] = _mm512_loadu_ps(tb->bs64 + 16 * k);
  for (int k = 0; k < 8; k++) e.t128[k] = is_signed ? _mm512_setzero_ps() : _mm512_loadu_ps(tb->bs128 + 16 * k);
  return e;
}

/* The codes of 16 values at inv (mixprec__q8_encode), as bytes: the rank r
 * of y = |x| * inv is the count of thresholds <= y, found in NB = 7
 * (signed) or 8 halving steps; R = r >> (NB - 4) indexes the first tables,
 * then I, the rank's leading bits, the wider ones (a NaN y compares false
 * everywhere: rank 0, code 0). */
MIXPREC__FORCE_INLINE __m128i mixprec__q8_encode16(__m512 x, __m512 inv, const mixprec__q8_enc16 *t,
                                                   const int is_signed) {
  const __m512i one_i = _mm512_set1_epi32(1);
  const __m512 y = _mm512_mul_ps(_mm512_abs_ps(x), inv);
#define MIXPREC__GE(thr) _mm512_cmp_ps_mask(y, (thr), _CMP_GE_OQ)
#define MIXPREC__NEXT(I, m) \
  _mm512_mask_add_epi32(_mm512_add_epi32((I), (I)), (m), _mm512_add_epi32((I), (I)), one_i)
  const __mmask16 m_top = MIXPREC__GE(t->top);
  __m512i R = _mm512_maskz_mov_epi32(m_top, _mm512_set1_epi32(8));
  const __mmask16 m_2nd = MIXPREC__GE(_mm512_permutexvar_ps(R, t->r0));
  R = _mm512_mask_add_epi32(R, m_2nd, R, _mm512_set1_epi32(4));
  R = _mm512_mask_add_epi32(R, MIXPREC__GE(_mm512_permutexvar_ps(R, t->r1)), R, _mm512_set1_epi32(2));
  R = _mm512_mask_add_epi32(R, MIXPREC__GE(_mm512_permutexvar_ps(R, t->r2)), R, one_i);
  __m512i I = MIXPREC__NEXT(R, MIXPREC__GE(_mm512_permutexvar_ps(R, t->t16)));
  I = MIXPREC__NEXT(I, MIXPREC__GE(_mm512_permutex2var_ps(t->t32[0], I, t->t32[1])));
  /* I's bit 5 is the rank's top bit (m_top) */
  I = MIXPREC__NEXT(I, MIXPREC__GE(_mm512_mask_blend_ps(m_top, _mm512_permutex2var_ps(t->t64[0], I, t->t64[1]),
                                                        _mm512_permutex2var_ps(t->t64[2], I, t->t64[3]))));
  __m512i code;
  if (is_signed) {
    const __mmask16 neg = _mm512_movepi32_mask(_mm512_castps_si512(x));
    const __mmask16 one = _mm512_mask_cmp_ps_mask((__mmask16)~neg, y, t->one, _CMP_GE_OQ);
    code = _mm512_mask_or_epi32(I, (__mmask16)(neg & _mm512_test_epi32_mask(I, I)), I, _mm512_set1_epi32(0x80));
    code = _mm512_mask_mov_epi32(code, one, _mm512_set1_epi32(0x80));
  } else {
    /* I's bits 5 and 6 are the rank's bits 6 (m_2nd) and 7 (m_top) */
    const __m512 lo = _mm512_mask_blend_ps(m_2nd, _mm512_permutex2var_ps(t->t128[0], I, t->t128[1]),
                                           _mm512_permutex2var_ps(t->t128[2], I, t->t128[3]));
    const __m512 hi = _mm512_mask_blend_ps(m_2nd, _mm512_permutex2var_ps(t->t128[4], I, t->t128[5]),
                                           _mm512_permutex2var_ps(t->t128[6], I, t->t128[7]));
    const __m512i r = MIXPREC__NEXT(I, MIXPREC__GE(_mm512_mask_blend_ps(m_top, lo, hi)));
    /* rank 0: code 0; 255: code 1 (+1.0); else rank + 1 */
    code = _mm512_maskz_add_epi32(_mm512_test_epi32_mask(r, r), r, one_i);
    code = _mm512_mask_mov_epi32(code, _mm512_cmpeq_epi32_mask(r, _mm512_set1_epi32(255)), one_i);
  }
#undef MIXPREC__GE
#undef MIXPREC__NEXT
  return _mm512_cvtepi32_epi8(code);
}

/* mixprec__opt_state_load8 for 16 lanes. */
MIXPREC__FORCE_INLINE __m512 mixprec__opt_state_load16(const void *buf, mixprec_state_dtype d, int64_t i,
                                                       float scale, const mixprec__q8_tabs *tb,
                                                       const int is_signed) {
  if (d == MIXPREC_STATE_BF16) return mixprec__opt_load16(buf, MIXPREC_BF16, i);
  if (d == MIXPREC_STATE_Q8) return mixprec__q8_load16((const uint8_t *)buf, i, scale, tb, is_signed);
  return _mm512_loadu_ps((const float *)buf + i);
}

/* mixprec__opt_state_store8 for 16 lanes. */
MIXPREC__FORCE_INLINE void mixprec__opt_state_store16(void *buf, mixprec_state_dtype d, int64_t i, __m512 x,
                                                      uint32_t key, float *q, int64_t b0) {
  if (d == MIXPREC_STATE_BF16)
    mixprec__opt_store16_bf16_sr(buf, i, key, x);
  else if (d == MIXPREC_STATE_Q8)
    _mm512_storeu_ps(q + (i - b0), x);
  else
    _mm512_storeu_ps((float *)buf + i, x);
}

/* mixprec__opt_lean_param_load8 / store8 for 16 lanes. */
MIXPREC__FORCE_INLINE __m512 mixprec__opt_lean_param_load16(const mixprec_opt_tensor *t, const float *P,
                                                            int64_t i, const int pm) {
  if (pm == MIXPREC__PM_REM) return mixprec__opt_rem_join16(t->param, t->remainder, i);
  if (pm == MIXPREC__PM_SR) return mixprec__opt_load16(t->param, MIXPREC_BF16, i);
  return _mm512_loadu_ps(P + i);
}

MIXPREC__FORCE_INLINE void mixprec__opt_lean_param_store16(const mixprec_opt_tensor *t, float *P, int64_t i,
                                                           const int pm, uint32_t sr_key, __m512 p) {
  if (pm == MIXPREC__PM_REM) {
    mixprec__opt_rem_split16(t->param, t->remainder, i, p);
  } else if (pm == MIXPREC__PM_SR) {
    mixprec__opt_store16_bf16_sr(t->param, i, sr_key, p);
  } else {
    _mm512_storeu_ps(P + i, p);
    if (t->param_dtype != MIXPREC_F32) mixprec__opt_store16_half(t->param, t->param_dtype, i, p);
  }
}

MIXPREC__FORCE_INLINE __m512 mixprec__opt_neg16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
}
#endif /* AVX-512 */

#endif

#endif /* MIXPREC_OPTIM_COMMON_H */
