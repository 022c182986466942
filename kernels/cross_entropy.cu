/* Cross-entropy (class-index and class-probability targets) on CUDA: the
 * GPU twin of c_ops/src/cross_entropy.c, the same per-position rules
 * (cross_entropy_rules.h). Contracts: mixprec/cross_entropy.h. Geometry:
 * [note: slice launch] (softmax.cuh); reductions: [note: fixed-order loss
 * reduce]. Not yet run on a GPU.
 *
 * [note: fixed-order loss reduce] Each row / block of columns leaves its
 * (loss sum, weight sum or position count) in the workspace as doubles, and
 * one single-block kernel (ce_reduce) adds them in index order: the SUM/MEAN
 * loss is the same on every run, no atomics.
 * [note: bad target on the GPU] An out-of-range class index cannot be
 * reported without a host sync: its position gets a NaN loss (so a reduced
 * loss is NaN too), NaN stats and a NaN gradient slice. */
#include "cross_entropy_check.h"
#include "cross_entropy_rules.h"
#include "softmax.cuh"


namespace {

struct CeArgs {
  const int64_t *target;
  const float *weight; /* may be NULL */
  float *loss;         /* per position (NONE) or NULL */
  float *stats;        /* 2 * positions */
  double *part;        /* 2 per work unit (loss sum, weight sum) */
  int64_t outer, classes, inner, positions, ignore_index;
  float eps;
};

/* Sum of the class weights (C without weight), by the calling threads
 * together (tid of nt); every thread gets it. */
template <bool WARP>
__device__ float class_weight_sum(const float *w, int64_t C, int tid, int nt, float *scratch) {
  if (!w) return (float)C;
  float s = 0.0f;
  for (int64_t c = tid; c < C; c += nt) s += w[c];
  return WARP ? warp_sum(s) : block_sum(s, scratch);
}

/* Loss of one position from its stats: [note: cross-entropy position loss]. */
__device__ __forceinline__ double position_loss(float xt, float m, float lg, float wt, float wx, float W,
                                                int64_t C, float eps) {
  return mixprec__ce_position_loss(mixprec__ce_nll(xt, m, lg), wt, (double)eps, (double)W, lg, wx, C);
}

/* A column block's partial sums (loss, weight sum or count) in a fixed order
 * (mixprec__block_sum_f64), stored as its unit of `part` in slice o. */
__device__ __forceinline__ void block_partials(double l, double w, double *part, int64_t o,
                                               double *scratch) {
  const double sl = mixprec__block_sum_f64(l, scratch);
  const double sw = mixprec__block_sum_f64(w, scratch);
  if (threadIdx.x == 0) {
    const int64_t unit = o * gridDim.x + blockIdx.x;
    part[2 * unit] = sl;
    part[2 * unit + 1] = sw;
  }
}

/* A row kernel's row and the calling thread's place on it (tid of nt): a
 * warp per row (WARP) or a block per row ([note: slice launch]). */
struct RowAt {
  int64_t row;
  int tid, nt;
};
template <bool WARP>
__device__ __forceinline__ RowAt row_at() {
  RowAt r;
  r.row = WARP ? (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
  r.tid = WARP ? threadIdx.x % 32 : threadIdx.x;
  r.nt = WARP ? 32 : blockDim.x;
  return r;
}

/* A column kernel's sizes and the calling thread's column col of slice o
 * (o0 + blockIdx.y): its position pos and the offset base of its class 0
 * (meaningful for col < inner). */
struct ColAt {
  int64_t C, inner, col, o, pos, base;
};
template <class A>
__device__ __forceinline__ ColAt col_at(const A &a, int64_t o0) {
  ColAt q;
  q.C = a.classes;
  q.inner = a.inner;
  q.col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  q.o = o0 + blockIdx.y;
  q.pos = q.o * q.inner + q.col;
  q.base = q.o * q.C * q.inner + q.col;
  return q;
}

/* A position's loss (reduction NONE: a.loss, else NULL) and its stats (max,
 * log-sum-exp), as both forwards store them. */
template <class A>
__device__ __forceinline__ void put_position(const A &a, int64_t pos, double l, float m, float lg) {
  if (a.loss) a.loss[pos] = (float)l;
  a.stats[pos] = m;
  a.stats[a.positions + pos] = lg;
}

template <int D, bool WARP>
__global__ void ce_rows(const void *logits, CeArgs a) {
  __shared__ float scratch[64];
  const auto [row, tid, nt] = row_at<WARP>();
  if (WARP && row >= a.outer) return;
  const int64_t C = a.classes;
  const int64_t t = a.target[row];
  const bool ignored = t == a.ignore_index;
  const bool bad = !ignored && (t < 0 || t >= C);
  const char *xr = static_cast<const char *>(logits) + row * C * (D == MIXPREC_F32 ? 4 : 2);
  double l = 0.0, wt = 0.0;
  float m = 0.0f, lg = 0.0f;
  if (!ignored && !bad) {
    const MaxSum acc = row_max_sum<D, WARP>(xr, C, tid, nt, scratch);
    m = acc.m;
    lg = logf(acc.s);
    float wx = 0.0f, W = 0.0f;
    if (a.eps > 0.0f) {
      for (int64_t i = tid; i < C; i += nt) wx += (a.weight ? a.weight[i] : 1.0f) * (ld<D>(xr, i) - m);
      wx = WARP ? warp_sum(wx) : block_sum(wx, scratch);
      W = class_weight_sum<WARP>(a.weight, C, tid, nt, scratch);
    }
    const float w_t = a.weight ? a.weight[t] : 1.0f;
    l = position_loss(ld<D>(xr, t), m, lg, w_t, wx, W, C, a.eps);
    wt = w_t;
  } else if (bad) {
    l = NAN;
    m = lg = NAN;
  }
  if (tid == 0) {
    put_position(a, row, l, m, lg);
    a.part[2 * row] = l;
    a.part[2 * row + 1] = wt;
  }
}

template <int D>
__global__ void ce_cols(const void *logits, CeArgs a, int64_t o0) {
  __shared__ double scratch[2 * 32];
  const auto [C, inner, col, o, pos, base] = col_at(a, o0);
  double l = 0.0, wt = 0.0;
  if (col < inner) {
    const int64_t t = a.target[pos];
    const bool ignored = t == a.ignore_index;
    const bool bad = !ignored && (t < 0 || t >= C);
    float m = 0.0f, lg = 0.0f;
    if (!ignored && !bad) {
      const MaxSum acc = col_max_sum<D>(logits, base, C, inner);
      m = acc.m;
      lg = logf(acc.s);
      float wx = 0.0f, W = 0.0f;
      if (a.eps > 0.0f) {
        for (int64_t c = 0; c < C; c++) {
          const float wc = a.weight ? a.weight[c] : 1.0f;
          wx += wc * (ld<D>(logits, base + c * inner) - m);
          W += wc;
        }
      }
      const float w_t = a.weight ? a.weight[t] : 1.0f;
      l = position_loss(ld<D>(logits, base + t * inner), m, lg, w_t, wx, W, C, a.eps);
      wt = w_t;
    } else if (bad) {
      l = NAN;
      m = lg = NAN;
    }
    put_position(a, pos, l, m, lg);
  }
  block_partials(l, wt, a.part, o, scratch);
}

/* One block: adds the units' partial sums in a fixed order and writes the
 * reduced loss and the weight sum. */
__global__ void ce_reduce(const double *part, int64_t units, int reduction, float *loss, float *weight_sum) {
  __shared__ double scratch[2 * 32];
  double l = 0.0, w = 0.0;
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
    l += part[2 * u];
    w += part[2 * u + 1];
  }
  l = mixprec__block_sum_f64(l, scratch);
  w = mixprec__block_sum_f64(w, scratch);
  if (threadIdx.x == 0) {
    if (reduction == MIXPREC_REDUCTION_SUM) loss[0] = (float)l;
    if (reduction == MIXPREC_REDUCTION_MEAN) loss[0] = (float)(l / w);
    if (weight_sum) weight_sum[0] = (float)w;
  }
}

/* ---- backward ----------------------------------------------------------------- */

struct CeBwdArgs {
  const int64_t *target;
  const float *weight;
  const float *stats;
  const float *grad_loss;
  const float *weight_sum;
  int64_t outer, classes, inner, positions, ignore_index;
  float eps;
  int reduction;
};

__device__ __forceinline__ float grad_of(const CeBwdArgs &a, int64_t pos) {
  if (a.reduction == MIXPREC_REDUCTION_NONE) return a.grad_loss[pos];
  if (a.reduction == MIXPREC_REDUCTION_SUM) return a.grad_loss[0];
  return a.grad_loss[0] / a.weight_sum[0];
}

template <int D, bool WARP>
__global__ void ce_rows_bwd(const void *logits, void *dx, CeBwdArgs a) {
  __shared__ float scratch[64];
  const auto [row, tid, nt] = row_at<WARP>();
  if (WARP && row >= a.outer) return;
  const int64_t C = a.classes, off = row * C;
  const int64_t t = a.target[row];
  const float W = a.eps > 0.0f ? class_weight_sum<WARP>(a.weight, C, tid, nt, scratch) : 0.0f;
  if (t == a.ignore_index) {
    for (int64_t i = tid; i < C; i += nt) st<D>(dx, off + i, 0.0f);
    return;
  }
  if (t < 0 || t >= C) {
    for (int64_t i = tid; i < C; i += nt) st<D>(dx, off + i, NAN);
    return;
  }
  const float g = grad_of(a, row);
  const float wt = a.weight ? a.weight[t] : 1.0f;
  const float m = a.stats[row], lg = a.stats[a.positions + row];
  const mixprec__ce_coefs k = mixprec__ce_grad_coefs(g, (double)wt, (double)a.eps, (double)W, C);
  for (int64_t i = tid; i < C; i += nt) {
    const float p = mixprec__ce_prob(ld<D>(logits, off + i), m, lg);
    st<D>(dx, off + i, mixprec__ce_grad_elem(k.a, k.b, k.t, p, a.weight ? a.weight[i] : 1.0f, i == t));
  }
}

template <int D>
__global__ void ce_cols_bwd(const void *logits, void *dx, CeBwdArgs a, int64_t o0) {
  const auto [C, inner, col, o, pos, base] = col_at(a, o0);
  if (col >= inner) return;
  const int64_t t = a.target[pos];
  if (t == a.ignore_index || t < 0 || t >= C) {
    const float v = t == a.ignore_index ? 0.0f : NAN;
    for (int64_t c = 0; c < C; c++) st<D>(dx, base + c * inner, v);
    return;
  }
  float W = 0.0f;
  if (a.eps > 0.0f)
    for (int64_t c = 0; c < C; c++) W += a.weight ? a.weight[c] : 1.0f;
  const float g = grad_of(a, pos);
  const float wt = a.weight ? a.weight[t] : 1.0f;
  const float m = a.stats[pos], lg = a.stats[a.positions + pos];
  const mixprec__ce_coefs k = mixprec__ce_grad_coefs(g, (double)wt, (double)a.eps, (double)W, C);
  for (int64_t c = 0; c < C; c++) {
    const int64_t i = base + c * inner;
    const float p = mixprec__ce_prob(ld<D>(logits, i), m, lg);
    const float v = mixprec__ce_grad_elem(k.a, k.b, k.t, p, a.weight ? a.weight[c] : 1.0f, c == t);
    st<D>(dx, i, v);
  }
}

/* ---- class-probability (soft) targets ---------------------------------------- */

/* The soft-target twin of CeArgs: the target has the logits' layout. part
 * holds per work unit (loss sum, position count), so ce_reduce's MEAN
 * divides by the number of positions, as torch's. */
struct SoftArgs {
  const void *target;
  const float *weight; /* may be NULL */
  float *loss;         /* per position (NONE) or NULL */
  float *stats;        /* 3 * positions */
  double *part;        /* 2 per work unit */
  int64_t outer, classes, inner, positions;
  float keep, add; /* t' = t * keep + add */
};

/* w_c t'_c of [note: soft cross-entropy]. */
template <int TD, class A>
__device__ __forceinline__ float soft_t(const A &a, int64_t i, int64_t c) {
  return mixprec__ce_soft_weight(a.weight ? a.weight[c] : 1.0f, ld<TD>(a.target, i), a.keep, a.add);
}

template <int D, int TD, bool WARP>
__global__ void ces_rows(const void *logits, SoftArgs a) {
  __shared__ float scratch[64];
  const auto [row, tid, nt] = row_at<WARP>();
  if (WARP && row >= a.outer) return;
  const int64_t C = a.classes, off = row * C;
  const char *xr = static_cast<const char *>(logits) + off * (D == MIXPREC_F32 ? 4 : 2);
  const MaxSum acc = row_max_sum<D, WARP>(xr, C, tid, nt, scratch);
  const float m = acc.m, lg = logf(acc.s);
  /* Second pass (from L2): sum_c w t' and sum_c w t' (x_c - max). */
  float tw = 0.0f, twx = 0.0f;
  for (int64_t i = tid; i < C; i += nt) {
    const float p = soft_t<TD>(a, off + i, i);
    tw += p;
    twx += p * (ld<D>(xr, i) - m);
  }
  tw = WARP ? warp_sum(tw) : block_sum(tw, scratch);
  twx = WARP ? warp_sum(twx) : block_sum(twx, scratch);
  if (tid == 0) {
    const double l = mixprec__ce_soft_loss(tw, lg, twx);
    put_position(a, row, l, m, lg);
    a.stats[2 * a.positions + row] = tw;
    a.part[2 * row] = l;
    a.part[2 * row + 1] = 1.0;
  }
}

template <int D, int TD>
__global__ void ces_cols(const void *logits, SoftArgs a, int64_t o0) {
  __shared__ double scratch[2 * 32];
  const auto [C, inner, col, o, pos, base] = col_at(a, o0);
  double l = 0.0, cnt = 0.0;
  if (col < inner) {
    const MaxSum acc = col_max_sum<D>(logits, base, C, inner);
    const float m = acc.m, lg = logf(acc.s);
    float tw = 0.0f, twx = 0.0f;
    for (int64_t c = 0; c < C; c++) {
      const float p = soft_t<TD>(a, base + c * inner, c);
      tw += p;
      twx += p * (ld<D>(logits, base + c * inner) - m);
    }
    l = mixprec__ce_soft_loss(tw, lg, twx);
    cnt = 1.0;
    put_position(a, pos, l, m, lg);
    a.stats[2 * a.positions + pos] = tw;
  }
  block_partials(l, cnt, a.part, o, scratch);
}

struct SoftBwdArgs {
  const void *target;
  const float *weight;
  const float *stats;
  const float *grad_loss;
  int64_t outer, classes, inner, positions;
  float keep, add;
  double keep_d;
  int reduction;
};

__device__ __forceinline__ float soft_grad_of(const SoftBwdArgs &a, int64_t pos) {
  if (a.reduction == MIXPREC_REDUCTION_NONE) return a.grad_loss[pos];
  if (a.reduction == MIXPREC_REDUCTION_SUM) return a.grad_loss[0];
  return mixprec__ce_soft_mean_grad(a.grad_loss[0], a.positions);
}

/* One element c of a position: dx_c and dt_c of [note: soft cross-entropy]. */
template <int D, int TD>
__device__ __forceinline__ void soft_grad_at(const void *logits, void *dx, void *dt, const SoftBwdArgs &a,
                                             int64_t i, int64_t c, float m, float lg,
                                             const mixprec__ce_soft_coefs &k, float g) {
  const float w = a.weight ? a.weight[c] : 1.0f;
  const float lp = mixprec__ce_log_prob(ld<D>(logits, i), m, lg);
  if (dx) st<D>(dx, i, mixprec__ce_soft_grad_elem(k.a, lp, g, soft_t<TD>(a, i, c)));
  if (dt) st<TD>(dt, i, mixprec__ce_soft_target_grad(k.dt, w, lp));
}

template <int D, int TD, bool WARP>
__global__ void ces_rows_bwd(const void *logits, void *dx, void *dt, SoftBwdArgs a) {
  const auto [row, tid, nt] = row_at<WARP>();
  if (row >= a.outer) return;
  const int64_t C = a.classes, off = row * C;
  const float g = soft_grad_of(a, row);
  const float m = a.stats[row], lg = a.stats[a.positions + row];
  const mixprec__ce_soft_coefs k = mixprec__ce_soft_grad_coefs(g, a.stats[2 * a.positions + row], a.keep_d);
  for (int64_t i = tid; i < C; i += nt) soft_grad_at<D, TD>(logits, dx, dt, a, off + i, i, m, lg, k, g);
}

template <int D, int TD>
__global__ void ces_cols_bwd(const void *logits, void *dx, void *dt, SoftBwdArgs a, int64_t o0) {
  const auto [C, inner, col, o, pos, base] = col_at(a, o0);
  if (col >= inner) return;
  const float g = soft_grad_of(a, pos);
  const float m = a.stats[pos], lg = a.stats[a.positions + pos];
  const mixprec__ce_soft_coefs k = mixprec__ce_soft_grad_coefs(g, a.stats[2 * a.positions + pos], a.keep_d);
  for (int64_t c = 0; c < C; c++) soft_grad_at<D, TD>(logits, dx, dt, a, base + c * inner, c, m, lg, k, g);
}

/* ---- host side ---------------------------------------------------------------- */

/* Host checks: the CPU's (cross_entropy_check.h), then alignment instead of the target
 * range (which needs the device data). */
mixprec_status check(const void *logits, mixprec_dtype dtype, const int64_t *target,
                     const mixprec_cross_entropy_params *p, int64_t *positions) {
  const mixprec_status st = mixprec__ce_check(logits, dtype, target, p, positions);
  if (st != MIXPREC_OK || *positions == 0) return st;
  if ((uintptr_t)logits % (uintptr_t)mixprec_dtype_size(dtype) || (uintptr_t)target % 8 ||
      (p->weight && (uintptr_t)p->weight % 4))
    return MIXPREC_ERR_BAD_ARGUMENT;
  return MIXPREC_OK;
}

/* Work units (rows, or blocks of columns) of the forward launch. */
int64_t units_of(const mixprec_cross_entropy_params *p) {
  if (p->inner == 1) return p->outer;
  return p->outer * ((p->inner + MIXPREC__SM_THREADS - 1) / MIXPREC__SM_THREADS);
}

template <int D>
mixprec_status launch_fwd(const void *logits, const CeArgs &a, cudaStream_t s) {
  return launch_slices(
      a.outer, a.classes, a.inner,
      [&](unsigned blocks, int threads) { ce_rows<D, true><<<blocks, threads, 0, s>>>(logits, a); },
      [&](unsigned blocks, int threads) { ce_rows<D, false><<<blocks, threads, 0, s>>>(logits, a); },
      [&](dim3 grid, int64_t o0, int64_t) { ce_cols<D><<<grid, MIXPREC__SM_THREADS, 0, s>>>(logits, a, o0); });
}

template <int D>
mixprec_status launch_bwd(const void *logits, void *dx, const CeBwdArgs &a, cudaStream_t s) {
  return launch_slices(
      a.outer, a.classes, a.inner,
      [&](unsigned blocks, int threads) { ce_rows_bwd<D, true><<<blocks, threads, 0, s>>>(logits, dx, a); },
      [&](unsigned blocks, int threads) { ce_rows_bwd<D, false><<<blocks, threads, 0, s>>>(logits, dx, a); },
      [&](dim3 grid, int64_t o0, int64_t) {
        ce_cols_bwd<D><<<grid, MIXPREC__SM_THREADS, 0, s>>>(logits, dx, a, o0);
      });
}

}  // namespace

extern "C" MIXPREC_API int64_t mixprec_cuda_cross_entropy_workspace_size(
    const mixprec_cross_entropy_params *p) {
  if (!p || p->outer < 0 || p->classes < 0 || p->inner < 0) return -1;
  if (p->outer == 0 || p->inner == 0) return 0;
  if (p->outer > INT64_MAX / p->inner) return -1;
  return units_of(p) * 2 * (int64_t)sizeof(double);
}

namespace {

/* The fields every argument struct of the kernels shares. */
template <class A>
void common_args(A &a, const mixprec_cross_entropy_params *p, int64_t positions) {
  a.weight = p->weight;
  a.outer = p->outer;
  a.classes = p->classes;
  a.inner = p->inner;
  a.positions = positions;
}

/* ... and those of the two forward structs. */
template <class A, class T>
void forward_args(A &a, const mixprec_cross_entropy_params *p, int64_t positions, T target, float *loss,
                  float *stats, double *part) {
  common_args(a, p, positions);
  a.target = target;
  a.loss = p->reduction == MIXPREC_REDUCTION_NONE ? loss : nullptr;
  a.stats = stats;
  a.part = part;
}

/* What both forward entry points do around their kernels: the loss and
 * workspace checks, the empty case (SUM 0, MEAN 0/0 = NaN, weight sum 0,
 * written by the reduce kernel from zero units), then launch(a) with the
 * forward struct a (CeArgs or SoftArgs) holding the shared fields
 * (forward_args; launch sets its own and launches) and the fixed-order
 * reduce of the units' partial sums. weight_sum may be null. */
template <class A, class T, class Launch>
mixprec_status forward_reduced(const mixprec_cross_entropy_params *p, int64_t positions, T target,
                               float *loss, float *stats, float *weight_sum, void *workspace,
                               int64_t workspace_bytes, cudaStream_t s, const Launch &launch) {
  if (!loss && (positions > 0 || p->reduction != MIXPREC_REDUCTION_NONE)) return MIXPREC_ERR_NULL_POINTER;
  const int64_t need = mixprec_cuda_cross_entropy_workspace_size(p);
  if (need < 0) return MIXPREC_ERR_BAD_SIZE;
  if (positions == 0) {
    ce_reduce<<<1, 32, 0, s>>>(nullptr, 0, p->reduction, loss, weight_sum);
    return mixprec__cuda_launch_status();
  }
  if (!stats || !workspace) return MIXPREC_ERR_NULL_POINTER;
  if (workspace_bytes < need) return MIXPREC_ERR_BAD_SIZE;
  double *part = static_cast<double *>(workspace);
  A a;
  forward_args(a, p, positions, target, loss, stats, part);
  const mixprec_status st = launch(a);
  if (st != MIXPREC_OK) return st;
  ce_reduce<<<1, 1024, 0, s>>>(part, units_of(p), p->reduction,
                               p->reduction == MIXPREC_REDUCTION_NONE ? nullptr : loss, weight_sum);
  return mixprec__cuda_launch_status();
}

}  // namespace

extern "C" MIXPREC_API mixprec_status mixprec_cuda_cross_entropy(
    const void *logits, mixprec_dtype dtype, const int64_t *target, const mixprec_cross_entropy_params *p,
    float *loss, float *stats, float *weight_sum, void *workspace, int64_t workspace_bytes, void *stream) {
  int64_t positions;
  const mixprec_status status = check(logits, dtype, target, p, &positions);
  if (status != MIXPREC_OK) return status;
  cudaStream_t s = (cudaStream_t)stream;
  return forward_reduced<CeArgs>(p, positions, target, loss, stats, weight_sum, workspace,
                                 workspace_bytes, s, [&](CeArgs &a) {
                                   a.ignore_index = p->ignore_index;
                                   a.eps = (float)p->label_smoothing;
                                   mixprec_status st;
                                   MIXPREC__DISPATCH(dtype, D, st = launch_fwd<D>(logits, a, s));
                                   return st;
                                 });
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_cross_entropy_backward(
    const float *grad_loss, const void *logits, mixprec_dtype dtype, const int64_t *target,
    const mixprec_cross_entropy_params *p, const float *stats, const float *weight_sum, void *grad_logits,
    void *stream) {
  int64_t positions;
  mixprec_status status = check(logits, dtype, target, p, &positions);
  if (status != MIXPREC_OK || positions == 0) return status;
  if (!grad_loss || !stats || !grad_logits) return MIXPREC_ERR_NULL_POINTER;
  if (p->reduction == MIXPREC_REDUCTION_MEAN && !weight_sum) return MIXPREC_ERR_NULL_POINTER;
  if ((uintptr_t)grad_logits % (uintptr_t)mixprec_dtype_size(dtype)) return MIXPREC_ERR_BAD_ARGUMENT;
  CeBwdArgs a;
  a.target = target;
  common_args(a, p, positions);
  a.stats = stats;
  a.grad_loss = grad_loss;
  a.weight_sum = weight_sum;
  a.ignore_index = p->ignore_index;
  a.eps = (float)p->label_smoothing;
  a.reduction = p->reduction;
  cudaStream_t s = (cudaStream_t)stream;
  MIXPREC__DISPATCH(dtype, D, status = launch_bwd<D>(logits, grad_logits, a, s));
  return status;
}

/* ---- soft targets: host side -------------------------------------------------- */

namespace {

mixprec_status soft_check(const void *logits, mixprec_dtype dtype, const void *target, mixprec_dtype td,
                          const mixprec_cross_entropy_params *p, int64_t *positions) {
  const mixprec_status st = mixprec__ce_soft_check(logits, dtype, target, td, p, positions);
  if (st != MIXPREC_OK || *positions == 0) return st;
  if ((uintptr_t)logits % (uintptr_t)mixprec_dtype_size(dtype) ||
      (uintptr_t)target % (uintptr_t)mixprec_dtype_size(td) || (p->weight && (uintptr_t)p->weight % 4))
    return MIXPREC_ERR_BAD_ARGUMENT;
  return MIXPREC_OK;
}

template <int D, int TD>
mixprec_status launch_soft_fwd(const void *logits, const SoftArgs &a, cudaStream_t s) {
  return launch_slices(
      a.outer, a.classes, a.inner,
      [&](unsigned blocks, int threads) { ces_rows<D, TD, true><<<blocks, threads, 0, s>>>(logits, a); },
      [&](unsigned blocks, int threads) { ces_rows<D, TD, false><<<blocks, threads, 0, s>>>(logits, a); },
      [&](dim3 grid, int64_t o0, int64_t) {
        ces_cols<D, TD><<<grid, MIXPREC__SM_THREADS, 0, s>>>(logits, a, o0);
      });
}

template <int D, int TD>
mixprec_status launch_soft_bwd(const void *logits, void *dx, void *dt, const SoftBwdArgs &a, cudaStream_t s) {
  return launch_slices(
      a.outer, a.classes, a.inner,
      [&](unsigned blocks, int threads) {
        ces_rows_bwd<D, TD, true><<<blocks, threads, 0, s>>>(logits, dx, dt, a);
      },
      [&](unsigned blocks, int threads) {
        ces_rows_bwd<D, TD, false><<<blocks, threads, 0, s>>>(logits, dx, dt, a);
      },
      [&](dim3 grid, int64_t o0, int64_t) {
        ces_cols_bwd<D, TD><<<grid, MIXPREC__SM_THREADS, 0, s>>>(logits, dx, dt, a, o0);
      });
}

}  // namespace

extern "C" MIXPREC_API mixprec_status mixprec_cuda_cross_entropy_soft(
    const void *logits, mixprec_dtype dtype, const void *target, mixprec_dtype target_dtype,
    const mixprec_cross_entropy_params *p, float *loss, float *stats, void *workspace, int64_t workspace_bytes,
    void *stream) {
  int64_t positions;
  const mixprec_status status = soft_check(logits, dtype, target, target_dtype, p, &positions);
  if (status != MIXPREC_OK) return status;
  cudaStream_t s = (cudaStream_t)stream;
  return forward_reduced<SoftArgs>(p, positions, target, loss, stats, nullptr, workspace,
                                   workspace_bytes, s, [&](SoftArgs &a) {
                                     a.keep = (float)(1.0 - p->label_smoothing);
                                     a.add = (float)(p->label_smoothing / (double)p->classes);
                                     mixprec_status st;
                                     MIXPREC__DISPATCH(
                                         dtype, D,
                                         MIXPREC__DISPATCH(target_dtype, TD,
                                                           st = launch_soft_fwd<D, TD>(logits, a, s)));
                                     return st;
                                   });
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_cross_entropy_soft_backward(
    const float *grad_loss, const void *logits, mixprec_dtype dtype, const void *target,
    mixprec_dtype target_dtype, const mixprec_cross_entropy_params *p, const float *stats, void *grad_logits,
    void *grad_target, void *stream) {
  int64_t positions;
  mixprec_status status = soft_check(logits, dtype, target, target_dtype, p, &positions);
  if (status != MIXPREC_OK || positions == 0 || (!grad_logits && !grad_target)) return status;
  if (!grad_loss || !stats) return MIXPREC_ERR_NULL_POINTER;
  if ((uintptr_t)grad_logits % (uintptr_t)mixprec_dtype_size(dtype) ||
      (uintptr_t)grad_target % (uintptr_t)mixprec_dtype_size(target_dtype))
    return MIXPREC_ERR_BAD_ARGUMENT;
  SoftBwdArgs a;
  a.target = target;
  common_args(a, p, positions);
  a.stats = stats;
  a.grad_loss = grad_loss;
  a.keep_d = 1.0 - p->label_smoothing;
  a.keep = (float)a.keep_d;
  a.add = (float)(p->label_smoothing / (double)p->classes);
  a.reduction = p->reduction;
  cudaStream_t s = (cudaStream_t)stream;
  MIXPREC__DISPATCH(dtype, D,
                    MIXPREC__DISPATCH(target_dtype, TD,
                                      status = launch_soft_bwd<D, TD>(logits, grad_logits, grad_target, a, s)));
  return status;
}
