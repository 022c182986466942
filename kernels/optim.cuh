/* Shared pieces of the fused optimizer steps on CUDA (adamw.cu, sgd.cu): the
 * host-side argument checks, the bias correction 1 - beta^t computed as the
 * CPU computes it, the multi-tensor packing of optimizer descriptors, the
 * per-chunk element loop (vectorised when aligned), and the step-count
 * advance. Included only by the .cu files of kernels/; every name starts with
 * mixprec__.
 *
 * Step counts. Tensors may share one step pointer and every count must be
 * read before any is written, across all launches of one call. So the update
 * kernels only READ the counts (each block reads its tensor's), and after the
 * last update launch, on the same stream, one small kernel per group of
 * DISTINCT step pointers adds 1 to each (the host sorts a copy of the
 * pointers to drop duplicates: the only host allocation, hence
 * MIXPREC_ERR_OUT_OF_MEMORY). Stream order makes every read happen before
 * every write, with no workspace and no host synchronisation; that kernel
 * reads *found_inf like the others, so a skipped step advances nothing. */
#ifndef MIXPREC_KERNELS_OPTIM_CUH
#define MIXPREC_KERNELS_OPTIM_CUH

#include <math.h>
#include <stdlib.h>

#include <type_traits>

#include "common.cuh"
#include "optim_check.h"
#include "optim_consts.h"
#include "optim_math.h"
#include "stochastic_round.h"

/* ---- argument checks -----------------------------------------------------
 * The CPU's own checks (c_ops/src/optim_check.h), so both backends return
 * the same status for the same arguments; the device adds an alignment check
 * below. */

/* The element size of a state format. */
MIXPREC__INLINE uintptr_t mixprec__opt_state_align(mixprec_state_dtype d) {
  return d == MIXPREC_STATE_F32 ? 4u : d == MIXPREC_STATE_BF16 ? 2u : 1u;
}

/* The device-only check, after the CPU's: a device load not aligned to its
 * element size faults and ruins the CUDA context (as in mixprec_cuda_unscale,
 * such a pointer is refused with BAD_ARGUMENT). `use_*` say which state
 * buffers the step will touch. */
MIXPREC__INLINE mixprec_status mixprec__opt_check_alignment(const mixprec_opt_tensor *list,
                                                          int64_t n, int use_m, int use_v,
                                                          int use_vmax,
                                                          const mixprec_ema_params *ema) {
  for (int64_t i = 0; i < n; i++) {
    const mixprec_opt_tensor *t = &list[i];
    if (t->step && (uintptr_t)t->step % 4 != 0) return MIXPREC_ERR_BAD_ARGUMENT;
    if (t->numel == 0) continue;
    const float *e = mixprec__ema_buf(ema, i);
    if (e && (uintptr_t)e % 4 != 0) return MIXPREC_ERR_BAD_ARGUMENT;
    const uintptr_t pa = (uintptr_t)mixprec_dtype_size(t->param_dtype);
    const uintptr_t ga = (uintptr_t)mixprec_dtype_size(t->grad_dtype);
    if ((uintptr_t)t->param % pa != 0 || (uintptr_t)t->grad % ga != 0 ||
        (t->master && (uintptr_t)t->master % 4 != 0) ||
        (use_m && (uintptr_t)t->exp_avg_data % mixprec__opt_state_align(t->exp_avg_dtype) != 0) ||
        (use_v &&
         (uintptr_t)t->exp_avg_sq_data % mixprec__opt_state_align(t->exp_avg_sq_dtype) != 0) ||
        ((uintptr_t)t->remainder % 2 != 0) || ((uintptr_t)t->exp_avg_scale % 4 != 0) ||
        ((uintptr_t)t->exp_avg_sq_scale % 4 != 0) ||
        (use_vmax && (uintptr_t)t->max_exp_avg_sq % 4 != 0))
      return MIXPREC_ERR_BAD_ARGUMENT;
  }
  return MIXPREC_OK;
}

/* ---- 1 - beta^t, as the CPU computes it ----------------------------------
 * The CPU rounds glibc's pow(beta, t) to double and subtracts it from 1.
 * CUDA's double pow is documented with up to 2 ulp of error, so it would
 * differ from glibc's in the last bit now and then, and 1 - x amplifies that
 * (1 - 0.999^1 loses ten bits), which can flip the float rounding of
 * step_size or bc2_sqrt. Instead, for the case that matters (t a
 * non-negative integer up to 2^32, beta in [0, 1)), beta^t is computed in
 * double-double by binary powering: each product has a relative error below
 * ~2^-104 and squaring doubles the error carried so far, so the result is
 * within ~t * 2^-103 relative of the exact power and rounds to the correctly
 * rounded double except when the exact value lies within ~2^-18 ulp of a
 * rounding midpoint. glibc's pow (since 2.28) is within 0.52 ulp, not
 * correctly rounded: measured on glibc 2.36 against this function, t = 0 ..
 * 2e6, no difference for beta 0.9, 0.99, 0.999, 0.95, 0.98, 0.995; a few per
 * million for 0.9995, 0.9999, (double)0.999f; ~5e-4 of steps for 0.999999;
 * in every case examined glibc was the one misrounded. A 1-ulp difference in
 * the double then changes the float scalars only with probability ~2^-19 or
 * less. Any other t (fractional, negative, huge, NaN) uses the device pow.
 * The same function compiles for the host, so the two agree by construction
 * if the CPU ever adopts it.
 *
 * Every operation is an explicit round-to-nearest intrinsic on the device
 * (MIXPREC__DMUL / MIXPREC__DADD of optim_consts.h) so that nvcc cannot
 * contract a product and a sum into an FMA. */
struct mixprec__dd {
  double hi, lo;
};

/* x * y in double-double; the exact product of the high parts by FMA. */
MIXPREC__HD mixprec__dd mixprec__dd_mul(mixprec__dd x, mixprec__dd y) {
  const double p = MIXPREC__DMUL(x.hi, y.hi);
  double e = fma(x.hi, y.hi, -p);
  e = MIXPREC__DADD(e, MIXPREC__DADD(MIXPREC__DMUL(x.hi, y.lo), MIXPREC__DMUL(x.lo, y.hi)));
  mixprec__dd r;
  r.hi = MIXPREC__DADD(p, e);
  r.lo = MIXPREC__DADD(e, -MIXPREC__DADD(r.hi, -p));
  return r;
}

/* 1.0 - pow(beta, t) in double, as `1.0 - pow(beta, step)` on the CPU. */
MIXPREC__HD double mixprec__one_minus_pow(double beta, double t) {
  if (t >= 0.0 && t <= 4294967296.0 && t == floor(t) && beta >= 0.0 && beta < 1.0) {
    const uint64_t n = (uint64_t)t;
    mixprec__dd acc = {1.0, 0.0};
    const mixprec__dd b = {beta, 0.0};
    int top = 63;
    while (top >= 0 && !((n >> top) & 1u)) top--;
    for (int i = top; i >= 0; i--) {
      acc = mixprec__dd_mul(acc, acc);
      if ((n >> i) & 1u) acc = mixprec__dd_mul(acc, b);
      /* acc only shrinks from here, and 1 - x is exactly 1.0 for any
       * x <= 2^-54: stop before the low part underflows. */
      if (acc.hi < 0x1p-100) return 1.0;
    }
    return MIXPREC__DADD(1.0, -acc.hi);
  }
  return MIXPREC__DADD(1.0, -pow(beta, t));
}

/* ---- multi-tensor packing --------------------------------------------- */

/* Elements per chunk (one block's share at a time) and threads per block. */
#define MIXPREC__OPT_CU_CHUNK 16384
#define MIXPREC__OPT_CU_THREADS 256
/* Elements per thread per iteration on the aligned path: 16-byte loads of
 * the FP32 buffers, 8-byte loads of the 16-bit ones. */
#define MIXPREC__OPT_CU_VEC 4

/* The last numel % MIXPREC__OPT_TORCH_VEC (optim_consts.h) elements of each
 * tensor are torch's scalar tail, which fuses different products than its
 * vectorised body; the CPU reproduces that split and so does the GPU (the op
 * gets a `tail` flag). */

/* Group capacities: small lists take a ~5 KB argument struct; the large one
 * stays under the 32 KB kernel-parameter budget. */
#define MIXPREC__OPT_CAP_SMALL 64
#define MIXPREC__OPT_CAP_LARGE 288
#define MIXPREC__OPT_STEP_CAP 2048

/* kind byte: param dtype (bits 0-1), grad dtype (bits 2-3), aligned (bit 4),
 * master-free BF16 with stochastic rounding (bit 5), lean state (bit 6:
 * remainders or moments that are not FP32, mixprec_state_dtype). */
#define MIXPREC__OPT_ALIGNED 16
#define MIXPREC__OPT_SR 32
#define MIXPREC__OPT_LEAN 64

/* One group of tensors. p32 is where the FP32 value lives (master, or the
 * F32 param; NULL for a master-free BF16 param, which is read from and
 * written to half), half the F16/BF16 param to receive it rounded (NULL for
 * F32). first_index: the list index of the group's first tensor (the
 * stochastic rounding hashes a tensor's index in the whole list).
 * s0..s2 are the state buffers the optimizer uses (NULL when unused: the
 * kernel then neither reads nor writes them). */
template <int CAP>
struct mixprec__opt_args {
  float *p32[CAP];
  void *half[CAP];
  const void *grad[CAP];
  float *s0[CAP];
  float *s1[CAP];
  float *s2[CAP];
  const float *step[CAP];
  float *ema[CAP]; /* the EMA buffer, NULL: none */
  /* Lean tensors only: s0 / s1 in their formats (fmt: s0's in bits 0-1,
   * s1's in bits 2-3), their Q8 scales, the param remainders. */
  int16_t *rem[CAP];
  float *sc0[CAP];
  float *sc1[CAP];
  uint8_t fmt[CAP];
  int64_t numel[CAP];
  int64_t chunk_start[CAP + 1];
  int64_t first_index;
  int32_t count;
  uint8_t kind[CAP];
};

static_assert(MIXPREC__OPT_CU_CHUNK % MIXPREC__OPT_TORCH_VEC == 0 &&
                  MIXPREC__OPT_TORCH_VEC % MIXPREC__OPT_CU_VEC == 0,
              "a vector of elements must never straddle torch's body/tail split");
static_assert(sizeof(mixprec__opt_args<MIXPREC__OPT_CAP_LARGE>) + 256 <= MIXPREC__MTA_PARAM_BUDGET,
              "optimizer kernel arguments exceed the parameter budget");

/* Fills a group's struct from list[first .. first + count); which state
 * buffers are used is the caller's choice (use_*). Returns the chunk count. */
template <int CAP>
static int64_t mixprec__opt_pack(const mixprec_opt_tensor *list, int64_t first, int count,
                                 int use_s0, int use_s1, int use_s2,
                                 const mixprec_ema_params *ema, mixprec__opt_args<CAP> *a) {
  memset(a, 0, sizeof *a);
  int64_t chunks = 0;
  for (int i = 0; i < count; i++) {
    const mixprec_opt_tensor *t = &list[first + i];
    const int half = t->param_dtype != MIXPREC_F32;
    const int sr = mixprec__opt_is_sr(t);
    a->p32[i] = half ? t->master : (float *)t->param; /* NULL when sr */
    a->half[i] = half ? t->param : NULL;
    a->grad[i] = t->grad;
    a->s0[i] = use_s0 ? t->exp_avg : NULL; /* SGD: momentum_buffer, the same slot */
    a->s1[i] = use_s1 ? t->exp_avg_sq : NULL;
    a->s2[i] = use_s2 ? t->max_exp_avg_sq : NULL;
    a->step[i] = t->step;
    a->ema[i] = mixprec__ema_buf(ema, first + i);
    a->numel[i] = t->numel;
    a->chunk_start[i] = chunks;
    chunks += mixprec__mta_chunks(t->numel, MIXPREC__OPT_CU_CHUNK);
    /* Vector loads need every buffer aligned to 4 of its elements; chunk
     * starts are multiples of the chunk size, so that holds in every chunk. */
    const uintptr_t f4 = 16, h4 = 8;
    const uintptr_t ga = t->grad_dtype == MIXPREC_F32 ? f4 : h4;
    int aligned = (uintptr_t)a->p32[i] % f4 == 0 && (uintptr_t)t->grad % ga == 0 &&
                  (!half || (uintptr_t)t->param % h4 == 0) &&
                  (uintptr_t)a->s0[i] % f4 == 0 && (uintptr_t)a->s1[i] % f4 == 0 &&
                  (uintptr_t)a->s2[i] % f4 == 0 && (uintptr_t)a->ema[i] % f4 == 0;
    const int lean = mixprec__opt_is_lean(t, use_s1);
    if (lean) {
      /* s0 / s1 hold the raw buffers (any format); the lean path never
       * takes the vector loads. */
      a->rem[i] = t->remainder;
      a->sc0[i] = use_s0 ? t->exp_avg_scale : NULL;
      a->sc1[i] = use_s1 ? t->exp_avg_sq_scale : NULL;
      a->fmt[i] = (uint8_t)((unsigned)t->exp_avg_dtype | ((unsigned)(use_s1 ? t->exp_avg_sq_dtype : 0) << 2));
      aligned = 0;
    }
    a->kind[i] = (uint8_t)((unsigned)t->param_dtype | ((unsigned)t->grad_dtype << 2) |
                           (aligned ? MIXPREC__OPT_ALIGNED : 0) | (sr ? MIXPREC__OPT_SR : 0) |
                           (lean ? MIXPREC__OPT_LEAN : 0));
  }
  a->chunk_start[count] = chunks;
  a->first_index = first;
  a->count = count;
  return chunks;
}

/* Enqueues launch(cap, first, count) for consecutive groups covering the
 * list's n tensors: a list of at most MIXPREC__OPT_CAP_SMALL tensors is one
 * group with the small argument struct (cap is an integral_constant of the
 * capacity), a longer one groups of up to MIXPREC__OPT_CAP_LARGE. Stops at
 * the first status that is not OK and returns it. */
template <typename Launch>
static mixprec_status mixprec__opt_for_groups(int64_t n, const Launch &launch) {
  mixprec_status st = MIXPREC_OK;
  for (int64_t first = 0; first < n && st == MIXPREC_OK;) {
    const int64_t left = n - first;
    int count;
    if (left <= MIXPREC__OPT_CAP_SMALL) {
      count = (int)left;
      st = launch(std::integral_constant<int, MIXPREC__OPT_CAP_SMALL>(), first, count);
    } else {
      count = mixprec__mta_group_count(n, first, MIXPREC__OPT_CAP_LARGE);
      st = launch(std::integral_constant<int, MIXPREC__OPT_CAP_LARGE>(), first, count);
    }
    first += count;
  }
  return st;
}

/* ---- device element access ---------------------------------------------- */

template <int D>
MIXPREC__DEVICE float mixprec__opt_ld1(const void *base, int64_t i) {
  if constexpr (D == MIXPREC_F32)
    return ((const float *)base)[i];
  else if constexpr (D == MIXPREC_F16)
    return mixprec__f16_to_f32(((const uint16_t *)base)[i]);
  else
    return mixprec__bf16_to_f32(((const uint16_t *)base)[i]);
}

/* Four elements from an address aligned to four of them. */
template <int D>
MIXPREC__DEVICE void mixprec__opt_ld4(const void *base, int64_t i, float *out) {
  if constexpr (D == MIXPREC_F32) {
    const float4 r = *(const float4 *)((const float *)base + i);
    out[0] = r.x;
    out[1] = r.y;
    out[2] = r.z;
    out[3] = r.w;
  } else {
    const uint2 r = *(const uint2 *)((const uint16_t *)base + i);
    const uint32_t w[2] = {r.x, r.y};
#pragma unroll
    for (int k = 0; k < 2; k++) {
      out[2 * k] = mixprec__half_to_f32((mixprec_dtype)D, (uint16_t)(w[k] & 0xffffu));
      out[2 * k + 1] = mixprec__half_to_f32((mixprec_dtype)D, (uint16_t)(w[k] >> 16));
    }
  }
}

MIXPREC__DEVICE void mixprec__opt_st4f(float *base, int64_t i, const float *v) {
  *(float4 *)(base + i) = make_float4(v[0], v[1], v[2], v[3]);
}

template <int D>
MIXPREC__DEVICE uint32_t mixprec__opt_narrow(float v) {
  return mixprec__f32_to_half((mixprec_dtype)D, v);
}

/* A master-free BF16 param of four elements, rounded stochastically with the
 * bits of elements e .. e + 3 of its tensor (e: the tensor-relative index of
 * i; a multiple of 4, so lo32(e) + k does not wrap). */
MIXPREC__DEVICE void mixprec__opt_st4sr(void *base, int64_t i, uint32_t key, int64_t e,
                                        const float *v) {
  uint32_t h[4];
#pragma unroll
  for (int k = 0; k < 4; k++) h[k] = mixprec__f32_to_bf16_sr(v[k], mixprec__sr_bits(key, e + k));
  uint2 r;
  r.x = h[0] | (h[1] << 16);
  r.y = h[2] | (h[3] << 16);
  *(uint2 *)((uint16_t *)base + i) = r;
}

/* The model param of four elements, rounded to nearest even. */
template <int D>
MIXPREC__DEVICE void mixprec__opt_st4h(void *base, int64_t i, const float *v) {
  uint2 r;
  r.x = mixprec__opt_narrow<D>(v[0]) | (mixprec__opt_narrow<D>(v[1]) << 16);
  r.y = mixprec__opt_narrow<D>(v[2]) | (mixprec__opt_narrow<D>(v[3]) << 16);
  *(uint2 *)((uint16_t *)base + i) = r;
}

/* Pointers of one chunk, already offset to its first element. */
struct mixprec__opt_span_ptrs {
  float *p32;
  void *half;
  const void *grad;
  float *s0, *s1, *s2;
  float *ema; /* NULL: no EMA update in this chunk */
};

template <int CAP>
MIXPREC__DEVICE mixprec__opt_span_ptrs mixprec__opt_span_at(const mixprec__opt_args<CAP> &a,
                                                            int t, int64_t begin) {
  mixprec__opt_span_ptrs s;
  const int pd = a.kind[t] & 3, gd = (a.kind[t] >> 2) & 3;
  s.p32 = a.p32[t] ? a.p32[t] + begin : NULL;
  s.half = a.half[t] ? (void *)((uint16_t *)a.half[t] + begin) : NULL;
  s.grad = gd == MIXPREC_F32 ? (const void *)((const float *)a.grad[t] + begin)
                             : (const void *)((const uint16_t *)a.grad[t] + begin);
  s.s0 = a.s0[t] ? a.s0[t] + begin : NULL;
  s.s1 = a.s1[t] ? a.s1[t] + begin : NULL;
  s.s2 = a.s2[t] ? a.s2[t] + begin : NULL;
  s.ema = a.ema[t] ? a.ema[t] + begin : NULL;
  (void)pd;
  return s;
}

/* An unscaled grad of four elements (unscale_grads): F32 as is, F16/BF16
 * rounded to nearest even as the param is. The grad pointer is const for the
 * read-only default (mixprec/optim.h); this and mixprec__opt_st1g are the
 * only writes through it. */
template <int D>
MIXPREC__DEVICE void mixprec__opt_st4g(const void *grad, int64_t i, const float *v) {
  void *base = (void *)(uintptr_t)grad;
  if constexpr (D == MIXPREC_F32)
    mixprec__opt_st4f((float *)base, i, v);
  else
    mixprec__opt_st4h<D>(base, i, v);
}

/* One unscaled grad element, stored as mixprec__opt_st4g stores four (the
 * scalar loops of mixprec__opt_span and mixprec__opt_span_lean). */
template <int D>
MIXPREC__DEVICE void mixprec__opt_st1g(const void *grad, int64_t i, float v) {
  void *base = (void *)(uintptr_t)grad;
  if constexpr (D == MIXPREC_F32)
    ((float *)base)[i] = v;
  else
    ((uint16_t *)base)[i] = (uint16_t)mixprec__opt_narrow<D>(v);
}

/* The n elements of one chunk, by the whole block (SR: a master-free BF16
 * param, read from s.half and written back stochastically rounded with
 * `key`; begin is the chunk's first element in its tensor). op(g, p, s0, s1, s2, tail)
 * updates one element in registers and leaves g divided by the grad scale
 * (before any maximize negation); with write_g (unscale_grads and a
 * grad_scale) that g is stored back to the grad in its dtype (tail: the element is in torch's scalar
 * tail, i.e. its chunk-relative index is >= tail_from); a state buffer that
 * is NULL is neither read nor written (its register holds 0), and s0 is not
 * read when read_s0 is false (SGD's first step overwrites the momentum buffer). The
 * element order does not matter: the update is elementwise. */
template <int PD, int GD, bool ALIGNED, bool SR, typename Op>
MIXPREC__DEVICE void mixprec__opt_span(const mixprec__opt_span_ptrs &s, int n, int tail_from,
                                       bool read_s0, bool write_g, uint32_t key, int64_t begin,
                                       mixprec__ema_w ew, const Op &op) {
  static_assert(!SR || PD == MIXPREC_BF16, "stochastic rounding is for BF16 params only");
  constexpr int T = MIXPREC__OPT_CU_THREADS;
  constexpr int V = MIXPREC__OPT_CU_VEC;
  int done = 0;
  if constexpr (ALIGNED) {
    const int nv = n / V;
    for (int j = threadIdx.x; j < nv; j += T) {
      const int64_t i = (int64_t)j * V;
      float g[V], p[V], a0[V] = {}, a1[V] = {}, a2[V] = {};
      mixprec__opt_ld4<GD>(s.grad, i, g);
      if constexpr (SR)
        mixprec__opt_ld4<MIXPREC_BF16>(s.half, i, p);
      else
        mixprec__opt_ld4<MIXPREC_F32>(s.p32, i, p);
      if (s.s0 && read_s0) mixprec__opt_ld4<MIXPREC_F32>(s.s0, i, a0);
      if (s.s1) mixprec__opt_ld4<MIXPREC_F32>(s.s1, i, a1);
      if (s.s2) mixprec__opt_ld4<MIXPREC_F32>(s.s2, i, a2);
      /* tail_from is a multiple of 8 (or <= 0): a vector is wholly on one side. */
      const bool tail = (int)i >= tail_from;
#pragma unroll
      for (int k = 0; k < V; k++) op(g[k], p[k], a0[k], a1[k], a2[k], tail);
      if (write_g) mixprec__opt_st4g<GD>(s.grad, i, g);
      if (s.s0) mixprec__opt_st4f(s.s0, i, a0);
      if (s.s1) mixprec__opt_st4f(s.s1, i, a1);
      if (s.s2) mixprec__opt_st4f(s.s2, i, a2);
      if (s.ema) {
        float e[V];
        mixprec__opt_ld4<MIXPREC_F32>(s.ema, i, e);
#pragma unroll
        for (int k = 0; k < V; k++) e[k] = mixprec__ema_lerp(e[k], p[k], ew);
        mixprec__opt_st4f(s.ema, i, e);
      }
      if constexpr (SR) {
        mixprec__opt_st4sr(s.half, i, key, begin + i, p);
      } else {
        mixprec__opt_st4f(s.p32, i, p);
        if constexpr (PD != MIXPREC_F32) mixprec__opt_st4h<PD>(s.half, i, p);
      }
    }
    done = nv * V;
  }
  for (int i = done + threadIdx.x; i < n; i += T) {
    float g = mixprec__opt_ld1<GD>(s.grad, i);
    float p = SR ? mixprec__opt_ld1<MIXPREC_BF16>(s.half, i) : s.p32[i];
    float a0 = s.s0 && read_s0 ? s.s0[i] : 0.0f;
    float a1 = s.s1 ? s.s1[i] : 0.0f;
    float a2 = s.s2 ? s.s2[i] : 0.0f;
    op(g, p, a0, a1, a2, i >= tail_from);
    if (write_g) mixprec__opt_st1g<GD>(s.grad, i, g);
    if (s.s0) s.s0[i] = a0;
    if (s.s1) s.s1[i] = a1;
    if (s.s2) s.s2[i] = a2;
    if (s.ema) s.ema[i] = mixprec__ema_lerp(s.ema[i], p, ew);
    if constexpr (SR) {
      ((uint16_t *)s.half)[i] = mixprec__f32_to_bf16_sr(p, mixprec__sr_bits(key, begin + i));
    } else {
      s.p32[i] = p;
      if constexpr (PD != MIXPREC_F32) ((uint16_t *)s.half)[i] = (uint16_t)mixprec__opt_narrow<PD>(p);
    }
  }
}

/* ---- the lean state on the device (mixprec_state_dtype) -------------------
 * One element per thread, the block's 256 threads on 256 consecutive
 * elements: one Q8 block (chunks start at multiples of it), encoded after a
 * block-wide max of the new values. The element math, the formats' loads
 * and stores and the encoding are optim_math.h's, as on the CPU. */
static_assert(MIXPREC__OPT_CU_THREADS == MIXPREC__Q8_BLOCK &&
                  MIXPREC__OPT_CU_CHUNK % MIXPREC__Q8_BLOCK == 0,
              "a thread block covers exactly one Q8 block");

/* One chunk's lean buffers, offset to its first element (scales: to its
 * first block). */
struct mixprec__opt_lean_ptrs {
  void *s0, *s1; /* NULL: unused */
  float *sc0, *sc1;
  int16_t *rem;
  int f0, f1;
};

MIXPREC__DEVICE size_t mixprec__opt_state_size(int f) {
  return f == MIXPREC_STATE_F32 ? 4 : f == MIXPREC_STATE_BF16 ? 2 : 1;
}

MIXPREC__DEVICE float mixprec__opt_dev_state_get(const void *buf, int f, const float *scale, int i,
                                                 int is_signed) {
  if (f == MIXPREC_STATE_BF16) return mixprec__opt_bf16_f32(((const uint16_t *)buf)[i]);
  if (f == MIXPREC_STATE_Q8)
    return mixprec__q8_load(((const uint8_t *)buf)[i], scale[i / MIXPREC__Q8_BLOCK], is_signed);
  return ((const float *)buf)[i];
}

/* F32 / BF16 state stores (BF16: with the buffer's key at tensor index e). */
MIXPREC__DEVICE void mixprec__opt_dev_state_put(void *buf, int f, int i, float x, uint32_t key,
                                                int64_t e) {
  if (f == MIXPREC_STATE_BF16)
    ((uint16_t *)buf)[i] = mixprec__f32_to_bf16_sr(x, mixprec__sr_bits(key, e));
  else if (f == MIXPREC_STATE_F32)
    ((float *)buf)[i] = x;
}

/* A Q8 block: every thread of the block calls it with its new value x
 * (valid: the thread has an element, at chunk index i). */
MIXPREC__DEVICE void mixprec__opt_q8_block(float x, bool valid, uint8_t *codes, float *scale, int i,
                                           int is_signed, float *red) {
  float mx = valid ? mixprec__q8_absmax_step(0.0f, x) : 0.0f;
  /* Finite, non-negative values: the max is exact in any order. */
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  float m = red[0];
#pragma unroll
  for (int k = 1; k < MIXPREC__OPT_CU_THREADS / 32; k++) m = fmaxf(m, red[k]);
  if (valid) codes[i] = mixprec__q8_encode(x, mixprec__q8_inv(m), is_signed);
  if (threadIdx.x == 0) *scale = m;
  __syncthreads(); /* red is reused by the next block */
}

/* The n elements of one lean chunk (begin: its first element in the
 * tensor); arguments as mixprec__opt_span's. */
template <int PD, int GD, typename Op>
MIXPREC__DEVICE void mixprec__opt_span_lean(const mixprec__opt_span_ptrs &s,
                                            const mixprec__opt_lean_ptrs &l, int n, int tail_from,
                                            bool read_s0, bool write_g, bool sr, uint32_t key,
                                            int64_t begin, mixprec__ema_w ew, const Op &op) {
  __shared__ float red[MIXPREC__OPT_CU_THREADS / 32];
  const uint32_t k0 = mixprec__sr_stream_key(key, 1), k1 = mixprec__sr_stream_key(key, 2);
  for (int base = 0; base < n; base += MIXPREC__OPT_CU_THREADS) {
    const int i = base + (int)threadIdx.x;
    const bool valid = i < n;
    float a0 = 0.0f, a1 = 0.0f;
    if (valid) {
      float g = mixprec__opt_ld1<GD>(s.grad, i);
      float p;
      if (l.rem)
        p = mixprec__rem_join(((const uint16_t *)s.half)[i], l.rem[i]);
      else if (sr)
        p = mixprec__opt_ld1<MIXPREC_BF16>(s.half, i);
      else
        p = s.p32[i];
      if (l.s0 && read_s0) a0 = mixprec__opt_dev_state_get(l.s0, l.f0, l.sc0, i, 1);
      if (l.s1) a1 = mixprec__opt_dev_state_get(l.s1, l.f1, l.sc1, i, 0);
      float a2 = s.s2 ? s.s2[i] : 0.0f;
      op(g, p, a0, a1, a2, i >= tail_from);
      if (write_g) mixprec__opt_st1g<GD>(s.grad, i, g);
      if (l.s0) mixprec__opt_dev_state_put(l.s0, l.f0, i, a0, k0, begin + i);
      if (l.s1) mixprec__opt_dev_state_put(l.s1, l.f1, i, a1, k1, begin + i);
      if (s.s2) s.s2[i] = a2;
      if (s.ema) s.ema[i] = mixprec__ema_lerp(s.ema[i], p, ew);
      if (l.rem) {
        uint16_t hp;
        mixprec__rem_split(p, &hp, l.rem + i);
        ((uint16_t *)s.half)[i] = hp;
      } else if (sr) {
        ((uint16_t *)s.half)[i] = mixprec__f32_to_bf16_sr(p, mixprec__sr_bits(key, begin + i));
      } else {
        s.p32[i] = p;
        if constexpr (PD != MIXPREC_F32)
          ((uint16_t *)s.half)[i] = (uint16_t)mixprec__opt_narrow<PD>(p);
      }
    }
    if (l.s0 && l.f0 == MIXPREC_STATE_Q8)
      mixprec__opt_q8_block(a0, valid, (uint8_t *)l.s0, l.sc0 + base / MIXPREC__Q8_BLOCK, i, 1, red);
    if (l.s1 && l.f1 == MIXPREC_STATE_Q8)
      mixprec__opt_q8_block(a1, valid, (uint8_t *)l.s1, l.sc1 + base / MIXPREC__Q8_BLOCK, i, 0, red);
  }
}

template <typename Op>
MIXPREC__DEVICE void mixprec__opt_span_lean_dispatch(int pd, int gd, const mixprec__opt_span_ptrs &s,
                                                     const mixprec__opt_lean_ptrs &l, int n, int tf,
                                                     bool read_s0, bool write_g, bool sr,
                                                     uint32_t key, int64_t begin,
                                                     mixprec__ema_w ew, const Op &op) {
  MIXPREC__DISPATCH(pd, PD, MIXPREC__DISPATCH(gd, GD,
      mixprec__opt_span_lean<PD, GD>(s, l, n, tf, read_s0, write_g, sr, key, begin, ew, op)));
}

/* The chunk with the dtypes chosen at run time: one switch per chunk, so a
 * mixed-dtype list takes no more launches than a uniform one. */
template <bool ALIGNED, typename Op>
MIXPREC__DEVICE void mixprec__opt_span_dispatch2(int pd, int gd, bool sr,
                                                 const mixprec__opt_span_ptrs &s, int n, int tf,
                                                 bool read_s0, bool write_g, uint32_t key,
                                                 int64_t begin, mixprec__ema_w ew, const Op &op) {
  /* sr only for a BF16 param (the F32 and F16 instantiations take false). */
  MIXPREC__DISPATCH(pd, PD, MIXPREC__DISPATCH(gd, GD, {
    if (sr)
      mixprec__opt_span<PD, GD, ALIGNED, PD == MIXPREC_BF16>(s, n, tf, read_s0, write_g, key, begin, ew, op);
    else
      mixprec__opt_span<PD, GD, ALIGNED, false>(s, n, tf, read_s0, write_g, key, begin, ew, op);
  }));
}

template <int CAP, typename Op>
MIXPREC__DEVICE void mixprec__opt_span_dispatch(const mixprec__opt_args<CAP> &a, int t,
                                                int64_t begin, int n, bool read_s0,
                                                bool write_g, uint64_t sr_seed,
                                                const mixprec__ema_hyper &eh, const Op &op) {
  mixprec__opt_span_ptrs s = mixprec__opt_span_at(a, t, begin);
  /* The EMA's weight at the count after this step (as the CPU: a double
   * formula of the float count); not an update step: the buffer is left
   * alone. Every thread computes it (the same value): no shared memory. */
  mixprec__ema_w ew = {0.0f, 0.0f, 1};
  if (s.ema && !mixprec__ema_weight_at(&eh, __fadd_rn(*a.step[t], 1.0f), &ew)) s.ema = NULL;
  const int pd = a.kind[t] & 3, gd = (a.kind[t] >> 2) & 3;
  /* torch's tail starts at numel - numel % 8, here relative to the chunk and
   * clamped to [0, n] (chunk sizes are multiples of 8). */
  const int64_t numel = a.numel[t];
  int64_t tf64 = numel - numel % MIXPREC__OPT_TORCH_VEC - begin;
  const int tf = tf64 < 0 ? 0 : tf64 > n ? n : (int)tf64;
  const bool sr = (a.kind[t] & MIXPREC__OPT_SR) != 0;
  const bool lean = (a.kind[t] & MIXPREC__OPT_LEAN) != 0;
  /* The key needs the count after this step: *step + 1, as the CPU (which
   * takes 0 for an SGD tensor without a count). */
  const uint32_t key =
      sr || lean ? mixprec__sr_key(sr_seed, (uint64_t)(a.first_index + t),
                                   a.step[t] ? __fadd_rn(*a.step[t], 1.0f) : 0.0f)
                 : 0u;
  if (lean) {
    mixprec__opt_lean_ptrs l;
    l.f0 = a.fmt[t] & 3;
    l.f1 = (a.fmt[t] >> 2) & 3;
    l.s0 = a.s0[t] ? (void *)((char *)a.s0[t] + begin * (int64_t)mixprec__opt_state_size(l.f0)) : NULL;
    l.s1 = a.s1[t] ? (void *)((char *)a.s1[t] + begin * (int64_t)mixprec__opt_state_size(l.f1)) : NULL;
    l.sc0 = a.sc0[t] ? a.sc0[t] + begin / MIXPREC__Q8_BLOCK : NULL;
    l.sc1 = a.sc1[t] ? a.sc1[t] + begin / MIXPREC__Q8_BLOCK : NULL;
    l.rem = a.rem[t] ? a.rem[t] + begin : NULL;
    mixprec__opt_span_lean_dispatch(pd, gd, s, l, n, tf, read_s0, write_g, sr, key, begin, ew, op);
    return;
  }
  if (a.kind[t] & MIXPREC__OPT_ALIGNED)
    mixprec__opt_span_dispatch2<true>(pd, gd, sr, s, n, tf, read_s0, write_g, key, begin, ew, op);
  else
    mixprec__opt_span_dispatch2<false>(pd, gd, sr, s, n, tf, read_s0, write_g, key, begin, ew, op);
}

/* Nonzero when the step must be skipped: *found_inf is nonzero or NaN. */
MIXPREC__DEVICE bool mixprec__opt_skip_dev(const float *found_inf) {
  return found_inf != NULL && !(*found_inf == 0.0f);
}

/* ---- step advance --------------------------------------------------------- */

struct mixprec__step_args {
  float *step[MIXPREC__OPT_STEP_CAP];
  int32_t count;
};

static __global__ void __launch_bounds__(MIXPREC__OPT_CU_THREADS)
    mixprec__opt_advance_kernel(const __grid_constant__ mixprec__step_args a,
                                const float *found_inf) {
  if (mixprec__opt_skip_dev(found_inf)) return;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < a.count) {
    float *s = a.step[i];
    *s = __fadd_rn(*s, 1.0f);
  }
}

static int mixprec__opt_ptr_cmp(const void *x, const void *y) {
  const uintptr_t a = (uintptr_t) * (float *const *)x, b = (uintptr_t) * (float *const *)y;
  return a < b ? -1 : a > b;
}

/* The distinct non-NULL step pointers of the list, sorted, in a malloc'd
 * array (*out; NULL when there are none). Returns OUT_OF_MEMORY on failure. */
MIXPREC__INLINE mixprec_status mixprec__opt_distinct_steps(const mixprec_opt_tensor *list,
                                                         int64_t n, float ***out,
                                                         int64_t *n_out) {
  *out = NULL;
  *n_out = 0;
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) k += list[i].step != NULL;
  if (k == 0) return MIXPREC_OK;
  if ((uint64_t)k > SIZE_MAX / sizeof(float *)) return MIXPREC_ERR_OUT_OF_MEMORY;
  float **v = (float **)malloc(sizeof(float *) * (size_t)k);
  if (!v) return MIXPREC_ERR_OUT_OF_MEMORY;
  k = 0;
  for (int64_t i = 0; i < n; i++)
    if (list[i].step) v[k++] = list[i].step;
  qsort(v, (size_t)k, sizeof(float *), mixprec__opt_ptr_cmp);
  int64_t u = 0;
  for (int64_t i = 0; i < k; i++)
    if (u == 0 || v[u - 1] != v[i]) v[u++] = v[i];
  *out = v;
  *n_out = u;
  return MIXPREC_OK;
}

/* Enqueues the advance of the distinct counts, after every update launch. */
MIXPREC__INLINE mixprec_status mixprec__opt_advance(float **steps, int64_t n_steps,
                                                  const float *found_inf, cudaStream_t s) {
  for (int64_t first = 0; first < n_steps; first += MIXPREC__OPT_STEP_CAP) {
    mixprec__step_args a;
    memset(&a, 0, sizeof a);
    const int count = mixprec__mta_group_count(n_steps, first, MIXPREC__OPT_STEP_CAP);
    for (int i = 0; i < count; i++) a.step[i] = steps[first + i];
    a.count = count;
    const unsigned grid = (unsigned)((count + MIXPREC__OPT_CU_THREADS - 1) / MIXPREC__OPT_CU_THREADS);
    mixprec__opt_advance_kernel<<<grid, MIXPREC__OPT_CU_THREADS, 0, s>>>(a, found_inf);
    const mixprec_status st = mixprec__cuda_launch_status();
    if (st != MIXPREC_OK) return st;
  }
  return MIXPREC_OK;
}

/* ---- the step driver ------------------------------------------------------ */

/* The per-call constants both optimizers' kernels take from their params
 * (mixprec_adamw_params / mixprec_sgd_params): the optional device scalars,
 * the rounding seed, unscale_grads with a grad_scale, the EMA's decay
 * formula (its buffers are packed per group). */
struct mixprec__opt_kc {
  const float *lr_tensor, *grad_scale, *found_inf;
  uint64_t sr_seed;
  bool unscale;
  mixprec__ema_hyper eh;

  template <class P>
  void set_common(const P *p) {
    lr_tensor = p->lr_tensor;
    grad_scale = p->grad_scale;
    found_inf = p->found_inf;
    sr_seed = p->sr_seed;
    unscale = p->grad_scale != NULL && p->unscale_grads != 0;
    eh = mixprec__ema_hyper_of(&p->ema);
  }
};

/* The one host driver of the CUDA steps (adamw.cu, sgd.cu), called once the
 * step's checks (optim_check.h) passed: first the device's alignment check
 * of the state slots s0, s1, s2 it will use (mixprec__opt_check_alignment);
 * then nothing for n == 0; else, on `stream`, kernel_of(cap)
 * (the optimizer's kernel at that group capacity) over each group of the list
 * packed with the state slots s0, s1, s2 (mixprec__opt_pack), with the
 * per-call constants k, then the advance of the distinct step counts. No host
 * synchronisation: a skip (found_inf) is decided on the device.
 * @return : MIXPREC_OK, BAD_ARGUMENT (alignment), OUT_OF_MEMORY, or the
 *   first launch's error. */
template <class K, class KernelOf>
static mixprec_status mixprec__opt_cuda_step(const mixprec_opt_tensor *list, int64_t n,
                                             const K &k, int s0, int s1, int s2,
                                             const mixprec_ema_params *ema,
                                             const float *found_inf, void *stream,
                                             const KernelOf &kernel_of) {
  mixprec_status st = mixprec__opt_check_alignment(list, n, s0, s1, s2, ema);
  if (st != MIXPREC_OK) return st;
  if (n == 0) return MIXPREC_OK;
  float **steps;
  int64_t n_steps;
  st = mixprec__opt_distinct_steps(list, n, &steps, &n_steps);
  if (st != MIXPREC_OK) return st;
  cudaStream_t s = (cudaStream_t)stream;
  st = mixprec__opt_for_groups(n, [&](auto cap, int64_t first, int count) {
    constexpr int CAP = decltype(cap)::value;
    mixprec__opt_args<CAP> a;
    const int64_t n_chunks = mixprec__opt_pack<CAP>(list, first, count, s0, s1, s2, ema, &a);
    if (n_chunks == 0) return MIXPREC_OK;
    const unsigned grid =
        (unsigned)(n_chunks < MIXPREC__MAX_GRID ? n_chunks : MIXPREC__MAX_GRID);
    kernel_of(cap)<<<grid, MIXPREC__OPT_CU_THREADS, 0, s>>>(a, k);
    return mixprec__cuda_launch_status();
  });
  if (st == MIXPREC_OK) st = mixprec__opt_advance(steps, n_steps, found_inf, s);
  free(steps);
  return st;
}

#endif /* MIXPREC_KERNELS_OPTIM_CUH */
