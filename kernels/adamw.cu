/* Fused multi-tensor AdamW step on CUDA: the GPU twin of c_ops/src/adamw.c,
 * equal to it bit for bit (see optim.cuh for the one caveat, the bias
 * corrections' pow).
 *
 * One launch per group of up to 64 or 384 tensors (multi-tensor apply, see
 * common.cuh); each block takes chunks of MIXPREC__OPT_CU_CHUNK elements of
 * one tensor, with the param/grad dtypes chosen per chunk on the device. At
 * each chunk, thread 0 reads the tensor's step count and computes the
 * tensor's scalars exactly as the CPU does (double from the float count,
 * rounded to float once); the block shares them through shared memory. The
 * counts are advanced by a separate kernel after the last group (optim.cuh).
 * Every thread reads *found_inf first and returns when the step is skipped,
 * so nothing is written and no host synchronisation is needed.
 *
 * Elementwise math: the CPU's own function, mixprec__adamw_math in
 * c_ops/src/optim_math.h ([note: one rounding per operation] there). */
#include "optim.cuh"

/* Per-call constants: the shared ones (mixprec__opt_kc), h as adamw.c has it
 * (optim_consts.h), the doubles the per-tensor constants are computed from
 * on the device. */
struct mixprec__adamw_k : mixprec__opt_kc {
  double beta1, beta2, weight_decay, lr; /* lr: used when lr_tensor is NULL */
  mixprec__adamw_hyper h;
};

/* The per-call constants of a checked call. */
static mixprec__adamw_k mixprec__adamw_k_of(const mixprec_adamw_params *p) {
  mixprec__adamw_k k;
  k.set_common(p);
  k.beta1 = p->beta1;
  k.beta2 = p->beta2;
  k.weight_decay = p->weight_decay;
  k.lr = p->lr;
  k.h = mixprec__adamw_hyper_of(p);
  return k;
}

/* One element: mixprec__adamw_math (optim_math.h), as adamw_range in
 * c_ops/src/adamw.c calls it. s0 is exp_avg, s1 exp_avg_sq, s2
 * max_exp_avg_sq. */
struct mixprec__adamw_op {
  mixprec__adamw_hyper h;
  mixprec__adamw_tc c;
  float scale;
  bool has_scale;

  /* gs: the grad in, the unscaled grad out (before maximize). */
  __device__ __forceinline__ void operator()(float &gs, float &p, float &m, float &v,
                                             float &vmax, bool tail) const {
    gs = mixprec__opt_unscale(gs, has_scale, scale);
    p = mixprec__adamw_math(h.maximize ? -gs : gs, p, &m, &v, &vmax, &h, &c, tail);
  }
};

template <int CAP>
__global__ void __launch_bounds__(MIXPREC__OPT_CU_THREADS)
    mixprec__adamw_kernel(const __grid_constant__ mixprec__opt_args<CAP> a,
                          const mixprec__adamw_k k) {
  if (mixprec__opt_skip_dev(k.found_inf)) return;
  __shared__ float scalars[3]; /* decay, step_size, bc2_sqrt */

  mixprec__adamw_op op;
  op.h = k.h;
  op.has_scale = k.grad_scale != NULL;
  op.scale = k.grad_scale ? *k.grad_scale : 1.0f;

  const int64_t n_chunks = a.chunk_start[a.count];
  for (int64_t c = blockIdx.x; c < n_chunks; c += gridDim.x) {
    const int t = mixprec__mta_find(a.chunk_start, a.count, c);
    if (threadIdx.x == 0) {
      /* As adamw.c: torch reads the lr tensor as a double; every scalar in
       * double from the float count t = *step + 1, rounded to float once. */
      const double lr = k.lr_tensor ? (double)*k.lr_tensor : k.lr;
      const float tf = __fadd_rn(*a.step[t], 1.0f);
      const double step = (double)tf;
      const double bc1 = mixprec__one_minus_pow(k.beta1, step);
      const double bc2 = mixprec__one_minus_pow(k.beta2, step);
      mixprec__adamw_tensor_consts(lr, k.weight_decay, bc1, bc2, &scalars[0], &scalars[1],
                                   &scalars[2]);
    }
    __syncthreads();
    op.c.decay = scalars[0];
    op.c.step_size = scalars[1];
    op.c.bc2_sqrt = scalars[2];
    const int64_t begin = (c - a.chunk_start[t]) * MIXPREC__OPT_CU_CHUNK;
    const int64_t left = a.numel[t] - begin;
    const int n = left < MIXPREC__OPT_CU_CHUNK ? (int)left : MIXPREC__OPT_CU_CHUNK;
    mixprec__opt_span_dispatch(a, t, begin, n, true, k.unscale, k.sr_seed, k.eh, op);
    __syncthreads(); /* the next chunk's scalars overwrite these */
  }
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_adamw_step(const mixprec_opt_tensor *list,
                                                              int64_t n,
                                                              const mixprec_adamw_params *p,
                                                              void *stream) {
  if (const mixprec_status st = mixprec__adamw_check(list, n, p); st != MIXPREC_OK) return st;
  /* State slots: exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad. */
  return mixprec__opt_cuda_step(list, n, mixprec__adamw_k_of(p), 1, 1, p->amsgrad != 0, &p->ema,
                                p->found_inf, stream,
                                [](auto cap) { return &mixprec__adamw_kernel<decltype(cap)::value>; });
}
