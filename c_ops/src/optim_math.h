/* The per-element math of the fused optimizer steps, written once for every
 * path (as PyTorch's adam_math in fused_adam_utils.cuh): the scalar C loops
 * of adamw.c / sgd.c (which also finish every range the AVX2 bodies leave)
 * and the CUDA kernels of kernels/adamw.cu / sgd.cu call these functions.
 * The SIMD bodies (adamw_avx2.c, sgd_avx2.c) keep their own vector code and
 * are tested bit for bit against them (tests/c/optim/test_optim_isa.cc).
 * Also here: the lean state formats (mixprec/optim.h: param remainders,
 * BF16 and 8-bit moments), element by element.
 *
 * [note: one rounding per operation] Each float operation below is one
 * MIXPREC__F* macro: the plain operator on the host, where the build's
 * -ffp-contract=off keeps every product and sum rounded on its own, and a
 * round-to-nearest intrinsic on the device, where nvcc would contract a
 * product and a sum into an FMA. fmaf appears exactly where torch's AVX2
 * build fuses (see adamw.c, sgd.c), so both sides round the same way.
 * Depends only on the public header and the shared C/CUDA headers. */
#ifndef MIXPREC_OPTIM_MATH_H
#define MIXPREC_OPTIM_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "compiler.h"
#include "optim_consts.h"
#include "stochastic_round.h"

#ifdef __CUDA_ARCH__
#define MIXPREC__FMUL(a, b) __fmul_rn((a), (b))
#define MIXPREC__FADD(a, b) __fadd_rn((a), (b))
#define MIXPREC__FSUB(a, b) __fsub_rn((a), (b))
#define MIXPREC__FDIV(a, b) __fdiv_rn((a), (b))
#define MIXPREC__FSQRT(a) __fsqrt_rn(a)
#else
#define MIXPREC__FMUL(a, b) ((a) * (b))
#define MIXPREC__FADD(a, b) ((a) + (b))
#define MIXPREC__FSUB(a, b) ((a) - (b))
#define MIXPREC__FDIV(a, b) ((a) / (b))
#define MIXPREC__FSQRT(a) sqrtf(a)
#endif

MIXPREC__HD float mixprec__opt_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---- the gradient as the update sees it ---------------------------------- */

/* g divided by the grad scale in FP32 (the value unscale_grads writes back). */
MIXPREC__HD float mixprec__opt_unscale(float g, int has_scale, float scale) {
  return has_scale ? MIXPREC__FDIV(g, scale) : g;
}

/* ---- AdamW ----------------------------------------------------------------- */

/* One tensor's constants at this step (mixprec__adamw_tensor_consts). */
typedef struct mixprec__adamw_tc {
  float decay, step_size, bc2_sqrt;
} mixprec__adamw_tc;

/* One element of the AdamW step (the formulas of mixprec/optim.h and
 * adamw.c): g is the unscaled gradient after the maximize negation, p the
 * FP32 param (master); *m, *v and (amsgrad) *vmax are updated in place and
 * the new p is returned. tail: the element is in torch's scalar tail. */
MIXPREC__HD float mixprec__adamw_math(float g, float p, float *m, float *v, float *vmax,
                                      const mixprec__adamw_hyper *h, const mixprec__adamw_tc *c,
                                      int tail) {
  if (h->decay_on) p = MIXPREC__FMUL(p, c->decay);
  const float diff = MIXPREC__FSUB(g, *m);
  *m = h->w_small ? fmaf(h->w, diff, *m) : fmaf(h->w_m1, diff, g);
  const float cg = MIXPREC__FMUL(h->c2, g);
  *v = tail ? fmaf(*v, h->beta2, MIXPREC__FMUL(cg, g)) : fmaf(cg, g, MIXPREC__FMUL(*v, h->beta2));
  float vd = *v;
  if (h->amsgrad) {
    const float old = *vmax;
    if (tail) /* std::max(old, v) */
      vd = old < vd ? vd : old;
    else /* torch's Vectorized<float> maximum (AVX2): _mm256_max_ps(old, v)
          * or'ed with an unordered compare: a NaN operand gives all ones */
      vd = (old != old || vd != vd) ? mixprec__opt_from_bits(0xffffffffu) : (old > vd ? old : vd);
    *vmax = vd;
  }
  const float denom = MIXPREC__FADD(MIXPREC__FDIV(MIXPREC__FSQRT(vd), c->bc2_sqrt), h->eps);
  return MIXPREC__FSUB(p, MIXPREC__FDIV(MIXPREC__FMUL(c->step_size, *m), denom));
}

/* ---- SGD ------------------------------------------------------------------- */

/* One element of the SGD step (mixprec/optim.h, sgd.c): g as for AdamW, p
 * the FP32 param; *buf (momentum != 0) updated in place, not read on the
 * tensor's first step; returns the new p. h->lr is the step's lr. */
MIXPREC__HD float mixprec__sgd_math(float g, float p, float *buf, const mixprec__sgd_hyper *h,
                                    int first, int tail) {
  if (h->wd_on) g = fmaf(p, h->wd, g);
  if (h->momentum_on) {
    float b;
    if (first)
      b = g;
    else if (tail)
      b = fmaf(*buf, h->momentum, MIXPREC__FMUL(g, h->damp1));
    else
      b = fmaf(h->damp1, g, MIXPREC__FMUL(*buf, h->momentum));
    *buf = b;
    g = h->nesterov ? fmaf(b, h->momentum, g) : b;
  }
  return fmaf(-g, h->lr, p);
}

/* ---- param remainders (mixprec/optim.h, [note: remainders]) --------------
 * The FP32 master M of a BF16 param is held as the param P (16 bits) and a
 * remainder R (int16): hi = M >> 16, lo = M & 0xffff, R = lo. P is hi rounded
 * up in magnitude (hi + 1) when lo >= 0x8000, so that P is the master rounded
 * to nearest (ties away from zero), hi otherwise. hi + 1 is replaced where it
 * would leave the finite range of bit patterns: for hi whose exponent bits
 * are all ones (M is a NaN, since lo != 0) P = hi, except hi = +-inf's pattern
 * (a signalling NaN whose payload is in its low 16 bits) whose P is +-0.
 * For each R this is a bijection of the 16-bit words, so (P, R) gives M back
 * exactly. */
MIXPREC__HD uint16_t mixprec__rem_param(uint32_t hi, uint32_t lo) {
  if (lo < 0x8000u) return (uint16_t)hi;
  const uint32_t mag = hi & 0x7fffu;
  if (mag < 0x7f80u) return (uint16_t)(hi + 1u);
  if (mag == 0x7f80u) return (uint16_t)(hi & 0x8000u);
  return (uint16_t)hi;
}

/* The master held by (param bits P, remainder R). */
MIXPREC__HD float mixprec__rem_join(uint16_t P, int16_t R) {
  const uint32_t lo = (uint32_t)(uint16_t)R;
  uint32_t hi = P;
  if (lo >= 0x8000u) {
    const uint32_t mag = hi & 0x7fffu;
    if (mag == 0u)
      hi |= 0x7f80u;
    else if (mag <= 0x7f80u)
      hi -= 1u;
  }
  return mixprec__opt_from_bits((hi << 16) | lo);
}

/* Splits the master M into (*P, *R). */
MIXPREC__HD void mixprec__rem_split(float M, uint16_t *P, int16_t *R) {
  const uint32_t u = mixprec__sr_float_bits(M);
  *P = mixprec__rem_param(u >> 16, u & 0xffffu);
  *R = (int16_t)(uint16_t)(u & 0xffffu);
}

/* ---- BF16 moments: stochastic rounding streams --------------------------- */

/* The rounding key of a tensor's BF16 state buffer (stream 1: exp_avg or the
 * momentum buffer, 2: exp_avg_sq) from the tensor's key (mixprec__sr_key), so
 * each buffer draws bits independent of the param's and of each other's. */
MIXPREC__HD uint32_t mixprec__sr_stream_key(uint32_t key, uint32_t stream) {
  return mixprec__mix32(key ^ (stream * 0x632be5abu));
}

MIXPREC__HD float mixprec__opt_bf16_f32(uint16_t h) {
  return mixprec__opt_from_bits((uint32_t)h << 16);
}

/* ---- 8-bit blockwise moments (mixprec/optim.h, [note: q8 map]) -----------
 * Codes index the dynamic tree map of bitsandbytes / torchao (its values, in
 * our own code order): per decade d = 0..6 (covering [10^(d-7), 10^(d-6)))
 * 2^L equal intervals, the value of each its midpoint; L = d for the signed
 * map (1 sign bit + 127 magnitudes, code 0 zero, code 0x80 +1.0), L = d + 1
 * for the unsigned map (code 0 zero, 1 one). In a decade, code q = 2^L + j
 * (j = 0 .. 2^L - 1): L is q's top bit, so decoding needs no table search. */
#define MIXPREC__Q8_BLOCK 256

/* 10^(d-7), d = 0..7, as double literals. */
MIXPREC__HD double mixprec__q8_lower(int d) {
  switch (d) {
    case 0: return 1e-7;
    case 1: return 1e-6;
    case 2: return 1e-5;
    case 3: return 1e-4;
    case 4: return 1e-3;
    case 5: return 1e-2;
    case 6: return 1e-1;
    default: return 1.0;
  }
}

/* The constants of decade d with 2^L intervals, each computed in double and
 * rounded to float once: the value of j = 0 (lower + step / 2), the step,
 * the decade's lower end and 1 / step (the AVX2 body keeps them in tables). */
typedef struct mixprec__q8_decade {
  float first, step, lower, inv_step;
} mixprec__q8_decade;

MIXPREC__HD mixprec__q8_decade mixprec__q8_decade_of(int d, int L) {
  const double lower = mixprec__q8_lower(d);
  const double step = MIXPREC__DDIV(MIXPREC__DMUL(lower, 9.0), (double)(1 << L));
  mixprec__q8_decade r;
  r.first = (float)MIXPREC__DADD(lower, MIXPREC__DMUL(step, 0.5));
  r.step = (float)step;
  r.lower = (float)lower;
  r.inv_step = (float)MIXPREC__DDIV(1.0, step);
  return r;
}

/* Top bit of q (q >= 1). */
MIXPREC__HD int mixprec__q8_top(uint32_t q) {
  int L = 0;
  while (q >> (L + 1)) L++;
  return L;
}

/* The map's value of a magnitude code q (signed: 0..127; unsigned 0..255)
 * with the special codes handled by the caller. */
MIXPREC__HD float mixprec__q8_mag(uint32_t q, int is_signed) {
  const int L = mixprec__q8_top(q);
  const mixprec__q8_decade c = mixprec__q8_decade_of(is_signed ? L : L - 1, L);
  return fmaf((float)(q - (1u << L)), c.step, c.first);
}

/* The normalised value (in [-1, 1]) of code c. */
MIXPREC__HD float mixprec__q8_decode(uint8_t c, int is_signed) {
  if (is_signed) {
    if (c == 0x80u) return 1.0f;
    const uint32_t q = c & 0x7fu;
    if (q == 0) return 0.0f;
    const float v = mixprec__q8_mag(q, 1);
    return (c & 0x80u) ? -v : v;
  }
  if (c <= 1u) return (float)c;
  return mixprec__q8_mag(c, 0);
}

/* The code of x at block scale inv = 1 / absmax (0 for an all-zero block):
 * the map's value nearest to |x| * inv, with x's sign (signed map). A NaN
 * gives 0, +-inf the largest magnitude of its sign. */
MIXPREC__HD uint8_t mixprec__q8_encode(float x, float inv, int is_signed) {
  const uint32_t sign = is_signed && mixprec__sr_float_bits(x) >> 31 ? 0x80u : 0u;
  const float y = MIXPREC__FMUL(fabsf(x), inv);
  if (!(y == y)) return 0;
  const int top = is_signed ? 6 : 7; /* the largest L */
  /* The decade: how many of the lower ends 10^-6 .. 10^-1 y reaches. */
  int d = 0;
  for (int k = 1; k <= 6; k++) d += y >= (float)mixprec__q8_lower(k);
  const int L = is_signed ? d : d + 1;
  const mixprec__q8_decade c = mixprec__q8_decade_of(d, L);
  float jf = floorf(MIXPREC__FMUL(MIXPREC__FSUB(y, c.lower), c.inv_step));
  const float jmax = (float)((1 << L) - 1);
  if (!(jf >= 0.0f)) jf = 0.0f;
  if (jf > jmax) jf = jmax;
  uint32_t q = (1u << L) + (uint32_t)jf;
  const float vq = fmaf(jf, c.step, c.first);
  if (q == (1u << L)) {
    if (d > 0) {
      /* The lower decade's last value may be nearer. */
      const float below = mixprec__q8_mag(q - 1u, is_signed);
      if (MIXPREC__FSUB(y, below) < MIXPREC__FSUB(vq, y)) return (uint8_t)(sign | (q - 1u));
    } else if (y < MIXPREC__FMUL(vq, 0.5f)) {
      return 0; /* nearer to zero */
    }
  }
  if (L == top && jf == jmax && !sign && MIXPREC__FSUB(1.0f, y) < MIXPREC__FSUB(y, vq))
    return is_signed ? 0x80u : 1u; /* nearer to one */
  return (uint8_t)(sign | q);
}

/* The FP32 value of a code at its block's scale. */
MIXPREC__HD float mixprec__q8_load(uint8_t c, float scale, int is_signed) {
  return MIXPREC__FMUL(mixprec__q8_decode(c, is_signed), scale);
}

/* A block's scale: the largest finite |x| (NaN and +-inf do not count). */
MIXPREC__HD float mixprec__q8_absmax_step(float mx, float x) {
  const float a = fabsf(x);
  return a > mx && a <= 3.40282346638528859812e+38f ? a : mx;
}

/* The factor codes are taken at: 1 / scale, or 0 for an all-zero block. */
MIXPREC__HD float mixprec__q8_inv(float scale) {
  return scale > 0.0f ? MIXPREC__FDIV(1.0f, scale) : 0.0f;
}

/* Encodes the n (<= 256) new values x of one block into codes and *scale. */
MIXPREC__HD void mixprec__q8_store_block(const float *x, int n, uint8_t *codes, float *scale,
                                         int is_signed) {
  float mx = 0.0f;
  for (int j = 0; j < n; j++) mx = mixprec__q8_absmax_step(mx, x[j]);
  const float inv = mixprec__q8_inv(mx);
  for (int j = 0; j < n; j++) codes[j] = mixprec__q8_encode(x[j], inv, is_signed);
  *scale = mx;
}

#endif /* MIXPREC_OPTIM_MATH_H */
