/* Fused multi-tensor SGD step on CUDA: the GPU twin of c_ops/src/sgd.c,
 * equal to it bit for bit.
 *
 * Same structure as adamw.cu (optim.cuh): one launch per group of tensors,
 * dtypes per chunk on the device, every thread returns at once when
 * *found_inf says skip, step counts only read by the update (a tensor's
 * "first step" is *step == 0, read by each thread) and advanced by a separate
 * kernel after the last group. Elementwise math: the CPU's own function,
 * mixprec__sgd_math in c_ops/src/optim_math.h. */
#include "optim.cuh"

/* Per-call constants: h as sgd.c has it (optim_consts.h; h.lr is used when
 * lr_tensor is NULL). */
struct mixprec__sgd_k {
  const float *lr_tensor, *grad_scale, *found_inf;
  mixprec__sgd_hyper h;
  int first_step;
  uint64_t sr_seed;
  bool unscale; /* unscale_grads with a grad_scale */
  mixprec__ema_hyper eh; /* the EMA's decay formula (the buffers are packed per group) */
};

/* One element: mixprec__sgd_math (optim_math.h), as sgd_range in
 * c_ops/src/sgd.c calls it. s0 is the momentum buffer; s1 and s2 are unused
 * (NULL, never touched). */
struct mixprec__sgd_op {
  mixprec__sgd_hyper h; /* h.lr: the step's lr */
  float scale;
  bool has_scale, first;

  /* gs: the grad in, the unscaled grad out (before maximize). */
  __device__ __forceinline__ void operator()(float &gs, float &p, float &buf, float &, float &,
                                             bool tail) const {
    gs = mixprec__opt_unscale(gs, has_scale, scale);
    p = mixprec__sgd_math(h.maximize ? -gs : gs, p, &buf, &h, first, tail);
  }
};

template <int CAP>
__global__ void __launch_bounds__(MIXPREC__OPT_CU_THREADS)
    mixprec__sgd_kernel(const __grid_constant__ mixprec__opt_args<CAP> a,
                        const mixprec__sgd_k k) {
  if (mixprec__opt_skip_dev(k.found_inf)) return;
  mixprec__sgd_op op;
  /* (float)(double)x == x: the CPU's lr.item<double>() rounded back. */
  op.h = k.h;
  op.h.lr = k.lr_tensor ? *k.lr_tensor : k.h.lr;
  op.has_scale = k.grad_scale != NULL;
  op.scale = k.grad_scale ? *k.grad_scale : 1.0f;

  const int64_t n_chunks = a.chunk_start[a.count];
  for (int64_t c = blockIdx.x; c < n_chunks; c += gridDim.x) {
    const int t = mixprec__mta_find(a.chunk_start, a.count, c);
    op.first = a.step[t] ? *a.step[t] == 0.0f : k.first_step != 0;
    const int64_t begin = (c - a.chunk_start[t]) * MIXPREC__OPT_CU_CHUNK;
    const int64_t left = a.numel[t] - begin;
    const int n = left < MIXPREC__OPT_CU_CHUNK ? (int)left : MIXPREC__OPT_CU_CHUNK;
    mixprec__opt_span_dispatch(a, t, begin, n, !op.first, k.unscale, k.sr_seed, k.eh, op);
  }
}

template <int CAP>
static mixprec_status mixprec__sgd_group(const mixprec_opt_tensor *list, int64_t first,
                                         int count, const mixprec__sgd_k &k,
                                         const mixprec_ema_params *ema, cudaStream_t stream) {
  mixprec__opt_args<CAP> a;
  const int64_t n_chunks = mixprec__opt_pack<CAP>(list, first, count, k.h.momentum_on, 0, 0, ema, &a);
  if (n_chunks == 0) return MIXPREC_OK;
  const unsigned grid =
      (unsigned)(n_chunks < MIXPREC__MAX_GRID ? n_chunks : MIXPREC__MAX_GRID);
  mixprec__sgd_kernel<CAP><<<grid, MIXPREC__OPT_CU_THREADS, 0, stream>>>(a, k);
  return mixprec__cuda_launch_status();
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_sgd_step(const mixprec_opt_tensor *list,
                                                            int64_t n,
                                                            const mixprec_sgd_params *p,
                                                            void *stream) {
  mixprec_status st = mixprec__sgd_check(list, n, p);
  if (st != MIXPREC_OK) return st;
  st = mixprec__opt_check_alignment(list, n, p->momentum != 0.0, 0, 0, &p->ema);
  if (st != MIXPREC_OK) return st;
  if (n == 0) return MIXPREC_OK;

  float **steps;
  int64_t n_steps;
  st = mixprec__opt_distinct_steps(list, n, &steps, &n_steps);
  if (st != MIXPREC_OK) return st;

  mixprec__sgd_k k;
  k.lr_tensor = p->lr_tensor;
  k.grad_scale = p->grad_scale;
  k.found_inf = p->found_inf;
  k.h = mixprec__sgd_hyper_of(p, p->lr);
  k.sr_seed = p->sr_seed;
  k.first_step = p->first_step != 0;
  k.unscale = p->grad_scale != NULL && p->unscale_grads != 0;
  k.eh = mixprec__ema_hyper_of(&p->ema);

  cudaStream_t s = (cudaStream_t)stream;
  st = mixprec__opt_for_groups(n, [&](auto cap, int64_t first, int count) {
    return mixprec__sgd_group<decltype(cap)::value>(list, first, count, k, &p->ema, s);
  });
  if (st == MIXPREC_OK) st = mixprec__opt_advance(steps, n_steps, p->found_inf, s);
  free(steps);
  return st;
}
