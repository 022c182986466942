// The optim ops (adamw_step_, sgd_step_), validated once for both devices:
// each op is a template over a backend B (optim.cpp: CPU, optim_cuda.cpp:
// CUDA) that only says how to run the C entry point:
//   B::check_device(op, where)            the tensors are B's
//   B::step(op, args, params)             -> mixprec_status, for
//     params a mixprec_adamw_params or a mixprec_sgd_params
// Every check runs before any kernel, so a failed call leaves all inputs
// untouched.
#pragma once

#include <algorithm>
#include <optional>
#include <vector>

#include "common.h"

namespace mixprec_shim {
namespace optim {

struct OptArgs {
  std::vector<mixprec_opt_tensor> list;
  Where device;
  const float* lr_tensor;   // null when absent
  const float* grad_scale;  // null when absent
  const float* found_inf;   // null when absent
  std::vector<float*> emas; // one per param when the step keeps an EMA, else empty
};

inline bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  auto sa = a.sizes(), sb = b.sizes(), ta = a.strides(), tb = b.strides();
  for (int64_t d = 0; d < a.dim(); d++) {
    if (sa[d] != sb[d]) return false;
    if (sa[d] != 1 && ta[d] != tb[d]) return false;
  }
  return true;
}

inline mixprec_dtype float_dtype(const char* op, const char* list, size_t i,
                                 const Tensor& t) {
  mixprec_dtype d;
  MIXPREC_CHECK(to_mixprec_dtype(t.scalar_type(), &d), "mixprec::", op, ": ", list, "[", i,
                  "] must be float32, float16 or bfloat16, got ", dtype_name(t.scalar_type()));
  return d;
}

// An element-for-element companion of params[i] (grad, master, state).
inline void check_companion(const char* op, const char* list, size_t i, const Tensor& t,
                            const Tensor& param, const Where& dev) {
  MIXPREC_CHECK(t.defined() && t.layout() == Layout::Strided, "mixprec::", op, ": ", list, "[",
                  i, "] must be a defined strided tensor (sparse is not supported)");
  MIXPREC_CHECK(where(t) == dev, "mixprec::", op, ": ", list, "[", i, "] is on ",
                  describe(where(t)), " but params[", i, "] is on ", describe(dev));
  MIXPREC_CHECK(same_layout(t, param), "mixprec::", op, ": ", list, "[", i,
                  "] must have the same shape and strides as params[", i, "]");
}

inline const char* state_dtype_name(ScalarType s) {
  switch (s) {
    case ScalarType::Short: return "int16";
    case ScalarType::Byte: return "uint8";
    default: return dtype_name(s);
  }
}

// The lean state lists (mixprec_state_dtype in mixprec/optim.h), absent
// when empty: remainders (int16 beside a bfloat16 param without a master)
// and, per lean state list, its Q8 scales.
struct LeanLists {
  const std::vector<Tensor>* remainders;
  const std::vector<Tensor>* scales[2];
  const char* scale_names[2];
};

// The tensor lists of mixprec::adamw_step_ / sgd_step_. params:
// float32/float16/bfloat16, dense; grads: same sizes and strides, any of the
// three dtypes; masters: float32 with the param's sizes and strides, or an
// empty tensor for a float32 param (which is its own master); state lists
// (names given by the caller, empty list = absent): float32 with the param's
// sizes and strides; steps: one-element float32 each. Every tensor on the
// params' device.
inline OptArgs opt_args(const char* op, const std::vector<Tensor>& params,
                        const std::vector<Tensor>& grads, const std::vector<Tensor>& masters,
                        const std::vector<Tensor>* states[], const char* const state_names[],
                        int n_states, const std::vector<Tensor>& steps,
                        const std::optional<Tensor>& lr_tensor,
                        const std::optional<Tensor>& grad_scale,
                        const std::optional<Tensor>& found_inf,
                        const std::vector<Tensor>& emas, const LeanLists& lean,
                        int n_lean_states) {
  OptArgs a;
  const size_t n = params.size();
  MIXPREC_CHECK(n > 0, "mixprec::", op, ": params must be a non-empty list of tensors");
  MIXPREC_CHECK(grads.size() == n, "mixprec::", op, ": grads has ", grads.size(),
                  " tensors but params has ", n);
  MIXPREC_CHECK(masters.size() == n, "mixprec::", op, ": masters has ", masters.size(),
                  " tensors but params has ", n);
  MIXPREC_CHECK(steps.size() == n, "mixprec::", op, ": steps has ", steps.size(),
                  " tensors but params has ", n);
  for (int k = 0; k < n_states; k++)
    MIXPREC_CHECK(states[k]->empty() || states[k]->size() == n, "mixprec::", op, ": ",
                    state_names[k], " has ", states[k]->size(), " tensors but params has ", n);
  MIXPREC_CHECK(emas.empty() || emas.size() == n, "mixprec::", op, ": emas has ", emas.size(),
                  " tensors but params has ", n);
  MIXPREC_CHECK(lean.remainders->empty() || lean.remainders->size() == n, "mixprec::", op,
                ": remainders has ", lean.remainders->size(), " tensors but params has ", n);
  for (int k = 0; k < n_lean_states; k++)
    MIXPREC_CHECK(lean.scales[k]->empty() || lean.scales[k]->size() == n, "mixprec::", op, ": ",
                  lean.scale_names[k], " has ", lean.scales[k]->size(), " tensors but params has ",
                  n);
  a.device = where(params[0]);
  a.list.resize(n);
  for (size_t i = 0; i < n; i++) {
    const Tensor& p = params[i];
    MIXPREC_CHECK(p.defined() && p.layout() == Layout::Strided, "mixprec::", op, ": params[", i,
                    "] must be a defined strided tensor");
    MIXPREC_CHECK(where(p) == a.device, "mixprec::", op, ": params[", i, "] is on ",
                    describe(where(p)), " but params[0] is on ", describe(a.device));
    MIXPREC_CHECK(is_dense(p), "mixprec::", op, ": params[", i,
                    "] must be contiguous or dense in some dimension order");
    mixprec_opt_tensor& d = a.list[i];
    d.numel = p.numel();
    d.param_dtype = float_dtype(op, "params", i, p);
    d.param = d.numel ? p.data_ptr() : nullptr;
    check_companion(op, "grads", i, grads[i], p, a.device);
    d.grad_dtype = float_dtype(op, "grads", i, grads[i]);
    d.grad = d.numel ? grads[i].data_ptr() : nullptr;
    if (!lean.remainders->empty()) {
      const Tensor& r = (*lean.remainders)[i];
      if (r.defined() && r.numel() > 0) {
        check_companion(op, "remainders", i, r, p, a.device);
        MIXPREC_CHECK(r.scalar_type() == ScalarType::Short, "mixprec::", op, ": remainders[", i,
                      "] must be int16, got ", state_dtype_name(r.scalar_type()));
        MIXPREC_CHECK(d.param_dtype == MIXPREC_BF16, "mixprec::", op, ": remainders[", i,
                      "] is given but params[", i, "] is ", dtype_name(p.scalar_type()),
                      ": remainders are for bfloat16 params only");
        MIXPREC_CHECK(!masters[i].defined() || masters[i].numel() == 0, "mixprec::", op, ": remainders[", i,
                      "] is given beside masters[", i,
                      "]: a remainder replaces the FP32 master, give one or the other");
        d.remainder = static_cast<int16_t*>(r.data_ptr());
      }
    }
    const Tensor& m = masters[i];
    if (d.param_dtype == MIXPREC_F32 || (m.defined() && m.numel() == 0 && d.numel == 0)) {
      MIXPREC_CHECK(!m.defined() || m.numel() == 0, "mixprec::", op, ": masters[", i,
                      "] must be an empty tensor: params[", i, "] is float32 (its own master)");
      d.master = nullptr;
    } else if (!m.defined() || m.numel() == 0) {
      // No master: the stochastic-rounding mode, for bfloat16 only.
      MIXPREC_CHECK(d.param_dtype == MIXPREC_BF16, "mixprec::", op, ": masters[", i,
                      "] is empty but params[", i,
                      "] is float16: only bfloat16 params can go without an FP32 master"
                      " (stochastic rounding)");
      d.master = nullptr;
    } else {
      check_companion(op, "masters", i, m, p, a.device);
      MIXPREC_CHECK(m.scalar_type() == ScalarType::Float, "mixprec::", op, ": masters[", i,
                      "] must be float32, got ", dtype_name(m.scalar_type()));
      d.master = d.numel ? static_cast<float*>(m.data_ptr()) : nullptr;
    }
    void* state_ptr[3] = {nullptr, nullptr, nullptr};
    mixprec_state_dtype state_dt[2] = {MIXPREC_STATE_F32, MIXPREC_STATE_F32};
    float* scale_ptr[2] = {nullptr, nullptr};
    for (int k = 0; k < n_states; k++) {
      if (states[k]->empty()) continue;
      const Tensor& t = (*states[k])[i];
      check_companion(op, state_names[k], i, t, p, a.device);
      const ScalarType st = t.scalar_type();
      if (k < n_lean_states) {
        MIXPREC_CHECK(st == ScalarType::Float || st == ScalarType::BFloat16 ||
                          st == ScalarType::Byte,
                      "mixprec::", op, ": ", state_names[k], "[", i,
                      "] must be float32, bfloat16 or uint8 (8-bit blockwise), got ",
                      state_dtype_name(st));
        state_dt[k] = st == ScalarType::Float      ? MIXPREC_STATE_F32
                      : st == ScalarType::BFloat16 ? MIXPREC_STATE_BF16
                                                   : MIXPREC_STATE_Q8;
        const bool has_scales = !lean.scales[k]->empty() && (*lean.scales[k])[i].defined() &&
                                (*lean.scales[k])[i].numel() > 0;
        const int64_t blocks = (d.numel + 255) / 256;
        if (state_dt[k] == MIXPREC_STATE_Q8 && d.numel > 0) {
          MIXPREC_CHECK(has_scales, "mixprec::", op, ": ", state_names[k], "[", i,
                        "] is uint8 (8-bit blockwise) but ", lean.scale_names[k], "[", i,
                        "] is missing: it needs ", blocks, " float32 scales");
          const Tensor& sc = (*lean.scales[k])[i];
          MIXPREC_CHECK(where(sc) == a.device, "mixprec::", op, ": ", lean.scale_names[k], "[",
                        i, "] is on ", describe(where(sc)), " but params[", i, "] is on ",
                        describe(a.device));
          MIXPREC_CHECK(sc.layout() == Layout::Strided && sc.scalar_type() == ScalarType::Float &&
                            sc.numel() == blocks && sc.is_contiguous(),
                        "mixprec::", op, ": ", lean.scale_names[k], "[", i,
                        "] must be a contiguous float32 tensor of ceil(numel / 256) = ", blocks,
                        " elements, got ", sc.numel(), " ", state_dtype_name(sc.scalar_type()));
          scale_ptr[k] = static_cast<float*>(sc.data_ptr());
        } else {
          MIXPREC_CHECK(!has_scales, "mixprec::", op, ": ", lean.scale_names[k], "[", i,
                        "] is given but ", state_names[k], "[", i, "] is ",
                        state_dtype_name(st), ", not uint8: scales belong to 8-bit state only");
        }
      } else {
        MIXPREC_CHECK(st == ScalarType::Float, "mixprec::", op, ": ", state_names[k], "[", i,
                      "] must be float32, got ", state_dtype_name(st));
      }
      state_ptr[k] = d.numel ? t.data_ptr() : nullptr;
    }
    d.exp_avg_data = state_ptr[0];
    d.exp_avg_sq_data = state_ptr[1];
    d.max_exp_avg_sq = static_cast<float*>(state_ptr[2]);
    d.exp_avg_dtype = state_dt[0];
    d.exp_avg_sq_dtype = state_dt[1];
    d.exp_avg_scale = scale_ptr[0];
    d.exp_avg_sq_scale = scale_ptr[1];
    const Tensor& st = steps[i];
    MIXPREC_CHECK(st.defined() && st.scalar_type() == ScalarType::Float && st.numel() == 1,
                    "mixprec::", op, ": steps[", i, "] must be a one-element float32 tensor");
    MIXPREC_CHECK(where(st) == a.device, "mixprec::", op, ": steps[", i, "] is on ",
                    describe(where(st)), " but params[", i, "] is on ", describe(a.device));
    d.step = static_cast<float*>(st.data_ptr());
    if (!emas.empty()) {
      const Tensor& e = emas[i];
      // The dispatcher does not look into an optional list: a meta (or any
      // non-CPU, non-CUDA) EMA among CPU tensors reaches this kernel, and
      // where() would not tell it from the CPU.
      MIXPREC_CHECK(!e.defined() || e.is_cpu() || e.is_cuda(), "mixprec::", op, ": emas[", i,
                      "] is on another device (meta?) but params[", i, "] is on ",
                      describe(a.device));
      check_companion(op, "emas", i, e, p, a.device);
      MIXPREC_CHECK(e.scalar_type() == ScalarType::Float, "mixprec::", op, ": emas[", i,
                      "] must be float32, got ", dtype_name(e.scalar_type()));
      a.emas.push_back(d.numel ? static_cast<float*>(e.data_ptr()) : nullptr);
    }
  }
  const std::optional<Tensor>* scalars[3] = {&lr_tensor, &grad_scale, &found_inf};
  const char* scalar_names[3] = {"lr", "grad_scale", "found_inf"};
  const float* scalar_ptr[3] = {nullptr, nullptr, nullptr};
  for (int k = 0; k < 3; k++) {
    if (!scalars[k]->has_value()) continue;
    check_scalar(op, scalar_names[k], **scalars[k], ScalarType::Float, a.device, nullptr);
    scalar_ptr[k] = static_cast<const float*>((*scalars[k])->data_ptr());
  }
  a.lr_tensor = scalar_ptr[0];
  a.grad_scale = scalar_ptr[1];
  a.found_inf = scalar_ptr[2];
  // The C contract: no two tensors of one step overlap (the same tensor
  // twice, a grad that is its own param, exp_avg aliasing exp_avg_sq would
  // each be read and written out of order). The scalars are only read.
  // One step tensor may serve several params (optim.h: every count is read
  // before any is written): it enters the check once.
  std::vector<Span> spans;
  const struct { const std::vector<Tensor>* list; const char* name; } lists[] = {
      {&params, "params"}, {&grads, "grads"}, {&masters, "masters"}};
  for (const auto& l : lists)
    for (size_t i = 0; i < l.list->size(); i++) add_span(spans, (*l.list)[i], l.name, (int64_t)i);
  std::vector<const void*> step_seen;
  for (size_t i = 0; i < steps.size(); i++) {
    const void* ptr = steps[i].data_ptr();
    if (std::find(step_seen.begin(), step_seen.end(), ptr) != step_seen.end()) continue;
    step_seen.push_back(ptr);
    add_span(spans, steps[i], "steps", (int64_t)i);
  }
  for (int k = 0; k < n_states; k++)
    for (size_t i = 0; i < states[k]->size(); i++)
      add_span(spans, (*states[k])[i], state_names[k], (int64_t)i);
  for (size_t i = 0; i < emas.size(); i++) add_span(spans, emas[i], "emas", (int64_t)i);
  for (size_t i = 0; i < lean.remainders->size(); i++)
    add_span(spans, (*lean.remainders)[i], "remainders", (int64_t)i);
  for (int k = 0; k < n_lean_states; k++)
    for (size_t i = 0; i < lean.scales[k]->size(); i++)
      add_span(spans, (*lean.scales[k])[i], lean.scale_names[k], (int64_t)i);
  check_disjoint(op, std::move(spans));
  return a;
}

// The hyper-parameter checks the C API makes (optim_check.h: torch's ranges
// plus finiteness), made here first so the error names the argument and its
// value instead of the C status text.
inline void check_hyper(const char* op, const char* name, double v, bool ok, const char* range) {
  MIXPREC_CHECK(ok, "mixprec::", op, ": ", name, " must be ", range, ", got ", v);
}
inline bool finite_ge0(double v) { return std::isfinite(v) && v >= 0.0; }

// The EMA arguments (mixprec_ema_params), checked with names when an EMA is
// kept; its buffers point into a.emas, which outlives the step.
inline mixprec_ema_params ema_params(const char* op, const OptArgs& a, double decay,
                                     double min_decay, bool use_warmup, double warmup_gamma,
                                     double warmup_power, int64_t update_after_step,
                                     int64_t update_every) {
  mixprec_ema_params e = mixprec_adamw_params_default().ema;
  if (a.emas.empty()) return e;
  check_hyper(op, "ema_decay", decay, decay >= 0.0 && decay <= 1.0, "in [0, 1]");
  check_hyper(op, "ema_min_decay", min_decay, min_decay >= 0.0 && min_decay <= 1.0, "in [0, 1]");
  if (use_warmup) {
    check_hyper(op, "ema_warmup_gamma", warmup_gamma,
                std::isfinite(warmup_gamma) && warmup_gamma > 0.0, "finite and > 0");
    check_hyper(op, "ema_warmup_power", warmup_power,
                std::isfinite(warmup_power) && warmup_power > 0.0, "finite and > 0");
  }
  MIXPREC_CHECK(update_after_step >= 0, "mixprec::", op, ": ema_update_after_step must be >= 0, got ",
                update_after_step);
  MIXPREC_CHECK(update_every >= 1, "mixprec::", op, ": ema_update_every must be >= 1, got ",
                update_every);
  e.bufs = a.emas.data();
  e.decay = decay;
  e.min_decay = min_decay;
  e.use_warmup = use_warmup;
  e.warmup_gamma = warmup_gamma;
  e.warmup_power = warmup_power;
  e.update_after_step = update_after_step;
  e.update_every = update_every;
  return e;
}

// The fields both optimizers' params take from the checked arguments.
template <class P>
void set_shared(P& p, const OptArgs& a, int64_t sr_seed, bool unscale_grads) {
  p.lr_tensor = a.lr_tensor;
  p.grad_scale = a.grad_scale;
  p.found_inf = a.found_inf;
  p.sr_seed = (uint64_t)sr_seed;
  p.unscale_grads = unscale_grads;
}

// The lean lists from an op's optional arguments (absent: an empty list).
inline LeanLists lean_lists(const std::optional<std::vector<Tensor>>& remainders,
                            const std::optional<std::vector<Tensor>>& scales0,
                            const std::optional<std::vector<Tensor>>& scales1,
                            const char* name0, const char* name1) {
  static const std::vector<Tensor> none;
  auto of = [](const std::optional<std::vector<Tensor>>& l) { return l ? &*l : &none; };
  return {of(remainders), {of(scales0), of(scales1)}, {name0, name1}};
}

// The EMA arguments of both schemas, as they come (checked by ema_params).
struct EmaArgs {
  double decay, min_decay;
  bool use_warmup;
  double warmup_gamma, warmup_power;
  int64_t update_after_step, update_every;
};

// The arguments both schemas take beside their own state lists and
// hyper-parameters, as they come (checked by opt_args and ema_params).
struct StepArgs {
  const std::vector<Tensor>& params;
  const std::vector<Tensor>& grads;
  const std::vector<Tensor>& masters;
  const std::vector<Tensor>& steps;
  double lr, weight_decay;
  bool maximize;
  const std::optional<Tensor>& lr_tensor;
  const std::optional<Tensor>& grad_scale;
  const std::optional<Tensor>& found_inf;
  int64_t sr_seed;
  bool unscale_grads;
  const std::optional<std::vector<Tensor>>& emas;
  EmaArgs ema;
};

// Either op once its own checks passed, p holding its own hyper-parameters:
// the descriptors (opt_args over s, the op's state lists and its lean
// lists), the device check, the EMA, the fields both params share, then the
// step on backend B; a bad status raises.
template <class B, class P>
void finish_step(const char* op, const StepArgs& s, const std::vector<Tensor>* states[],
                 const char* const names[], int n_states, const LeanLists& lean,
                 int n_lean_states, P p) {
  OptArgs a = opt_args(op, s.params, s.grads, s.masters, states, names, n_states, s.steps,
                       s.lr_tensor, s.grad_scale, s.found_inf,
                       s.emas ? *s.emas : std::vector<Tensor>{}, lean, n_lean_states);
  B::check_device(op, a.device);
  const EmaArgs& e = s.ema;
  p.ema = ema_params(op, a, e.decay, e.min_decay, e.use_warmup, e.warmup_gamma, e.warmup_power,
                     e.update_after_step, e.update_every);
  p.lr = s.lr;
  p.weight_decay = s.weight_decay;
  p.maximize = s.maximize;
  set_shared(p, a, s.sr_seed, s.unscale_grads);
  check_status(B::step(op, a, p), op);
}

template <class B>
void adamw_step_op(std::vector<Tensor> params, std::vector<Tensor> grads,
                   std::vector<Tensor> masters, std::vector<Tensor> exp_avgs,
                   std::vector<Tensor> exp_avg_sqs, std::vector<Tensor> max_exp_avg_sqs,
                   std::vector<Tensor> steps, double lr, double beta1, double beta2,
                   double weight_decay, double eps, bool amsgrad, bool maximize,
                   std::optional<Tensor> lr_tensor, std::optional<Tensor> grad_scale,
                   std::optional<Tensor> found_inf, int64_t sr_seed, bool unscale_grads,
                   std::optional<std::vector<Tensor>> emas, double ema_decay, double ema_min_decay,
                   bool ema_use_warmup, double ema_warmup_gamma, double ema_warmup_power,
                   int64_t ema_update_after_step, int64_t ema_update_every,
                   std::optional<std::vector<Tensor>> remainders,
                   std::optional<std::vector<Tensor>> exp_avg_scales,
                   std::optional<std::vector<Tensor>> exp_avg_sq_scales) {
  const char* op = "adamw_step_";
  MIXPREC_CHECK(!exp_avgs.empty() && !exp_avg_sqs.empty(), "mixprec::", op,
                  ": exp_avgs and exp_avg_sqs are required");
  MIXPREC_CHECK(amsgrad == !max_exp_avg_sqs.empty(), "mixprec::", op,
                  ": max_exp_avg_sqs must be given exactly when amsgrad is true");
  // AdamW's own hyper-parameters, checked below.
  mixprec_adamw_params p = mixprec_adamw_params_default();
  p.beta1 = beta1;
  p.beta2 = beta2;
  p.eps = eps;
  p.amsgrad = amsgrad;
  if (!lr_tensor.has_value()) check_hyper(op, "lr", lr, finite_ge0(lr), "finite and >= 0");
  check_hyper(op, "beta1", beta1, beta1 >= 0.0 && beta1 < 1.0, "in [0, 1)");
  check_hyper(op, "beta2", beta2, beta2 >= 0.0 && beta2 < 1.0, "in [0, 1)");
  check_hyper(op, "weight_decay", weight_decay, finite_ge0(weight_decay), "finite and >= 0");
  check_hyper(op, "eps", eps, finite_ge0(eps), "finite and >= 0");
  const StepArgs s = {params, grads, masters, steps, lr, weight_decay, maximize, lr_tensor,
                      grad_scale, found_inf, sr_seed, unscale_grads, emas,
                      {ema_decay, ema_min_decay, ema_use_warmup, ema_warmup_gamma,
                       ema_warmup_power, ema_update_after_step, ema_update_every}};
  const std::vector<Tensor>* states[3] = {&exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs};
  const char* const names[3] = {"exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"};
  const LeanLists lean = lean_lists(remainders, exp_avg_scales, exp_avg_sq_scales,
                                    "exp_avg_scales", "exp_avg_sq_scales");
  finish_step<B>(op, s, states, names, 3, lean, 2, p);
}

template <class B>
void sgd_step_op(std::vector<Tensor> params, std::vector<Tensor> grads,
                 std::vector<Tensor> masters, std::vector<Tensor> momentum_buffers,
                 std::vector<Tensor> steps, double lr, double momentum, double dampening,
                 double weight_decay, bool nesterov, bool maximize,
                 std::optional<Tensor> lr_tensor, std::optional<Tensor> grad_scale,
                 std::optional<Tensor> found_inf, int64_t sr_seed, bool unscale_grads,
                 std::optional<std::vector<Tensor>> emas, double ema_decay, double ema_min_decay,
                 bool ema_use_warmup, double ema_warmup_gamma, double ema_warmup_power,
                 int64_t ema_update_after_step, int64_t ema_update_every,
                 std::optional<std::vector<Tensor>> remainders,
                 std::optional<std::vector<Tensor>> buf_scales) {
  const char* op = "sgd_step_";
  MIXPREC_CHECK((momentum != 0) == !momentum_buffers.empty(), "mixprec::", op,
                  ": momentum_buffers must be given exactly when momentum is not 0");
  // SGD's own hyper-parameters, checked below.
  mixprec_sgd_params p = mixprec_sgd_params_default();
  p.momentum = momentum;
  p.dampening = dampening;
  p.nesterov = nesterov;
  if (!lr_tensor.has_value()) check_hyper(op, "lr", lr, finite_ge0(lr), "finite and >= 0");
  check_hyper(op, "momentum", momentum, finite_ge0(momentum), "finite and >= 0");
  check_hyper(op, "weight_decay", weight_decay, finite_ge0(weight_decay), "finite and >= 0");
  check_hyper(op, "dampening", dampening, std::isfinite(dampening), "finite");
  MIXPREC_CHECK(!nesterov || (momentum > 0.0 && dampening == 0.0), "mixprec::", op,
                ": nesterov needs momentum > 0 and dampening == 0, got momentum ", momentum,
                " and dampening ", dampening);
  const StepArgs s = {params, grads, masters, steps, lr, weight_decay, maximize, lr_tensor,
                      grad_scale, found_inf, sr_seed, unscale_grads, emas,
                      {ema_decay, ema_min_decay, ema_use_warmup, ema_warmup_gamma,
                       ema_warmup_power, ema_update_after_step, ema_update_every}};
  const std::vector<Tensor>* states[1] = {&momentum_buffers};
  const char* const names[1] = {"momentum_buffers"};
  const LeanLists lean = lean_lists(remainders, buf_scales, std::nullopt, "buf_scales", "unused");
  finish_step<B>(op, s, states, names, 1, lean, 1, p);
}

}  // namespace optim
}  // namespace mixprec_shim
