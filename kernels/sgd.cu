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

/* Per-call constants: the shared ones (mixprec__opt_kc), h as sgd.c has it
 * (optim_consts.h; h.lr is used when lr_tensor is NULL). */
struct mixprec__sgd_k : mixprec__opt_kc {
  mixprec__sgd_hyper h;
  int first_step;
};

/* The per-call constants of a checked call. */
static mixprec__sgd_k mixprec__sgd_k_of(const mixprec_sgd_params *p) {
  mixprec__sgd_k k;
  k.set_common(p);
  k.h = mixprec__sgd_hyper_of(p, p->lr);
  k.first_step = p->first_step != 0;
  return k;
}

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

extern "C" MIXPREC_API mixprec_status mixprec_cuda_sgd_step(const mixprec_opt_tensor *list,
                                                            int64_t n,
                                                            const mixprec_sgd_params *p,
                                                            void *stream) {
  if (const mixprec_status st = mixprec__sgd_check(list, n, p); st != MIXPREC_OK) return st;
  /* State slot: the momentum buffer, when momentum is on. */
  return mixprec__opt_cuda_step(list, n, mixprec__sgd_k_of(p), p->momentum != 0.0, 0, 0, &p->ema,
                                p->found_inf, stream,
                                [](auto cap) { return &mixprec__sgd_kernel<decltype(cap)::value>; });
}
