// What the AdamW and SGD C tests (test_adamw.cc, test_sgd.cc) share: the
// params and reference copies every Param starts from (ParamBase), the list
// of tensors they step (sizes straddling torch's body/tail split, every dtype
// pair, an empty tensor), the multi-step driver and the final comparison with
// the references, the check of the grads a step leaves, the fills, the
// snapshots of skipped and invalid calls and the invalid tensor lists. Each
// test's Param holds its own optimizer's state; the templates here need its
// `grad`, `numel()`, `desc(bool)` and `state()` (the float buffers a step
// may write).
#pragma once

#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace optim_test {

// The fields the lean tests (test_optim_lean.cc, test_optim_lean_cuda.cc) set
// on either optimizer's params h: lr 1e-2, the grad scale, the skip flag,
// unscale_grads and the rounding seed; with emas (NULL: none) an EMA of
// decay 0.9 over them.
template <class P>
void set_lean_step(P &h, const float *scale, const float *found_inf, bool unscale, uint64_t seed,
                   float *const *emas) {
  h.lr = 1e-2;
  h.grad_scale = scale;
  h.found_inf = found_inf;
  h.unscale_grads = unscale;
  h.sr_seed = seed;
  if (emas) {
    h.ema.bufs = emas;
    h.ema.decay = 0.9;
  }
}

using mpt::Buf;

// Vectorized<float>::size() of torch's AVX2 build: each tensor's last
// numel % kTorchVec elements go through torch's scalar tail loop.
constexpr int64_t kTorchVec = 8;

// A buffer's data, NULL when it is empty.
inline float *or_null(std::vector<float> &v) { return v.empty() ? nullptr : v.data(); }

// A float buffer of the library (lib) and the float reference's copy (ref),
// compared bit for bit at the end of a run.
struct Compared {
  const char *name;
  const std::vector<float> *lib, *ref;
};

// What AdamW's and SGD's Param start from: the library's param (misaligned
// for an odd n) and grad (misaligned for an even n), a master for a
// low-precision param, the step count, and the params of the float (rp) and
// double (dp) references, all from the same normal draws.
struct ParamBase {
  Buf param, grad;
  std::vector<float> master;
  float step = 0.0f;
  std::vector<float> rp;   // float reference (torch's fused formula), bit-exact target
  std::vector<double> dp;  // double reference (textbook formula)

  ParamBase(int64_t n, mixprec_dtype pd, mixprec_dtype gd, std::mt19937 &rng)
      : param(pd, n, /*misalign=*/n % 2 == 1), grad(gd, n, n % 2 == 0) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    rp.resize(size_t(n));
    for (float &x : rp) x = nd(rng);
    for (int64_t i = 0; i < n; i++) param.set_value(i, rp[size_t(i)]);
    if (pd != MIXPREC_F32) master = rp;
    dp.assign(rp.begin(), rp.end());
  }
  int64_t numel() const { return param.numel(); }
  // The library's param element i: the master of a low-precision param.
  float lib_p(int64_t i) const {
    return param.dtype() == MIXPREC_F32 ? param.value(i) : master[size_t(i)];
  }
  // The descriptor's param, grad, master, step, numel and dtypes (the
  // optimizer's state unset).
  mixprec_opt_tensor base_desc(float *step_ptr) {
    mixprec_opt_tensor t{};
    t.param = param.data();
    t.grad = grad.data();
    t.master = or_null(master);
    t.step = step_ptr;
    t.numel = numel();
    t.param_dtype = param.dtype();
    t.grad_dtype = grad.dtype();
    return t;
  }
};

// The first element of torch's scalar tail loop in a tensor of n elements.
inline int64_t torch_tail_start(int64_t n) { return n - n % kTorchVec; }

// Grad element i as the references read it: divided by *scale (when scale is
// not NULL) and negated with maximize, in float as torch's fused kernels do
// (ref_grad) or in double (ref_grad_double).
inline float ref_grad(const ParamBase &q, int64_t i, const float *scale, bool maximize) {
  float g = q.grad.value(i);
  if (scale) g = g / *scale;
  if (maximize) g = g * -1.0f;
  return g;
}
inline double ref_grad_double(const ParamBase &q, int64_t i, const float *scale, bool maximize) {
  double g = q.grad.value(i);
  if (scale) g /= *scale;
  if (maximize) g = -g;
  return g;
}

// The descriptors of a list, each q.desc(arg).
template <class P>
std::vector<mixprec_opt_tensor> descs(std::vector<P> &ps, bool arg) {
  std::vector<mixprec_opt_tensor> list;
  for (P &q : ps) list.push_back(q.desc(arg));
  return list;
}

// All bits of every buffer a step may write: params, grads, the float
// buffers of q.state() and the step.
template <class P>
std::vector<uint32_t> snapshot(const std::vector<P> &ps) {
  std::vector<uint32_t> s;
  for (const P &q : ps) {
    for (int64_t i = 0; i < q.numel(); i++) s.push_back(q.param.raw(i));
    for (int64_t i = 0; i < q.grad.numel(); i++) s.push_back(q.grad.raw(i));
    for (const std::vector<float> *vec : q.state())
      for (float x : *vec) s.push_back(mpt::f32_bits(x));
    s.push_back(mpt::f32_bits(q.step));
  }
  return s;
}

struct Spec {
  int64_t n;
  mixprec_dtype pd, gd;
};
inline const std::vector<Spec> &specs() {
  static const std::vector<Spec> s = {
      {1, MIXPREC_F32, MIXPREC_F32},    {7, MIXPREC_BF16, MIXPREC_F16},
      {4097, MIXPREC_F16, MIXPREC_BF16}, {100003, MIXPREC_BF16, MIXPREC_BF16},
      {33, MIXPREC_F32, MIXPREC_BF16},  {0, MIXPREC_F16, MIXPREC_F16},
      {515, MIXPREC_F32, MIXPREC_F16},  {64, MIXPREC_F16, MIXPREC_F32},
  };
  return s;
}

// What a step leaves in a grad that held `given`: g / *scale rounded to the
// grad's dtype when unscale_grads had a grad_scale (scale != NULL), else the
// grad untouched. A NaN must stay a NaN (its bits are compared across ISAs in
// test_optim_isa.cc). Returns the mismatches (reported, at most 3).
inline int64_t expect_grads(const Buf &got, const Buf &given, const float *scale) {
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); i++) {
    const uint32_t want = scale ? Buf::narrow(given.dtype(), given.value(i) / *scale) : given.raw(i);
    const bool ok = scale && Buf::is_nan_bits(given.dtype(), want) ? got.is_nan(i)
                                                                    : got.raw(i) == want;
    if (!ok && bad++ < 3)
      ADD_FAILURE() << "grad element " << i << std::hex << ": 0x" << got.raw(i) << " want 0x"
                    << want << " (given 0x" << given.raw(i) << ")";
  }
  return bad;
}

// The grads of a list before a step.
template <class P>
std::vector<Buf> grads_of(const std::vector<P> &ps) {
  std::vector<Buf> g;
  for (const P &q : ps) g.push_back(q.grad);
  return g;
}

// After a step: checks each grad (expect_grads), then puts the given grads
// back, which the references read.
template <class P>
void check_and_restore_grads(std::vector<P> &ps, const std::vector<Buf> &given,
                             const float *written_scale) {
  for (size_t t = 0; t < ps.size(); t++) {
    SCOPED_TRACE("grads of tensor " + std::to_string(t));
    EXPECT_EQ(expect_grads(ps[t].grad, given[t], written_scale), 0);
    ps[t].grad = given[t];
  }
}

template <class P>
std::vector<P> make_params(std::mt19937 &rng) {
  std::vector<P> ps;
  for (const Spec &s : specs()) ps.emplace_back(s.n, s.pd, s.gd, rng);
  return ps;
}

// Fresh random grads (magnitudes 2^-10 .. 2), times mult (a loss scale).
template <class P>
void fill_grads(std::vector<P> &ps, std::mt19937 &rng, float mult) {
  for (P &q : ps) {
    mpt::fill_random(q.grad, rng, -10, 1, /*random_bits=*/false);
    if (mult != 1.0f)
      for (int64_t i = 0; i < q.numel(); i++) q.grad.set_value(i, q.grad.value(i) * mult);
  }
}

// The lists of the UnscaleGradsNonFiniteAndExtremes tests: every dtype pair
// at sizes 10 and 43, with grads that hold infs, NaNs (quiet, signalling,
// with payloads), signed zeros, subnormals and the extremes of their dtype
// among random values.
template <class P>
std::vector<P> extreme_grad_params(std::mt19937 &rng) {
  static const uint32_t f32s[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc12345u, 0x7f800001u,
                                  0x00000000u, 0x80000000u, 0x00000001u, 0x7f7fffffu, 0x33800000u};
  static const uint32_t f16s[] = {0x7c00u, 0xfc00u, 0x7e00u, 0xfe01u, 0x7c01u,
                                  0x0000u, 0x8000u, 0x0001u, 0x7bffu, 0x3c00u};
  static const uint32_t bf16s[] = {0x7f80u, 0xff80u, 0x7fc0u, 0xffc1u, 0x7f81u,
                                   0x0000u, 0x8000u, 0x0001u, 0x7f7fu, 0x3f80u};
  std::vector<P> a;
  for (mixprec_dtype pd : {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16})
    for (mixprec_dtype gd : {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16})
      for (int64_t n : {int64_t(10), int64_t(43)}) a.emplace_back(n, pd, gd, rng);
  for (P &q : a) {
    mpt::fill_random(q.grad, rng, -20, 10);
    const uint32_t *sp = q.grad.dtype() == MIXPREC_F32 ? f32s : q.grad.dtype() == MIXPREC_F16 ? f16s : bf16s;
    for (int64_t i = 0; i < q.numel(); i++)
      if (i < 10 || rng() % 5 == 0) q.grad.set_raw(i, sp[(size_t(i) + rng() % 3) % 10]);
  }
  return a;
}

// After one step of a with unscale_grads 1 and of b with 0 (both from the
// grads `given`, at *scale): a's grads are given / scale rounded, b's
// untouched; then b takes a's grads, so the two lists can be compared bit
// for bit.
template <class P>
void check_unscale_pair(std::vector<P> &a, std::vector<P> &b, const std::vector<Buf> &given,
                        const float *scale, const std::string &what) {
  for (size_t t = 0; t < a.size(); t++) {
    SCOPED_TRACE(what + "tensor " + std::to_string(t));
    EXPECT_EQ(expect_grads(a[t].grad, given[t], scale), 0);
    EXPECT_EQ(expect_grads(b[t].grad, given[t], nullptr), 0);
    b[t].grad = a[t].grad;
  }
}

// The steps of a run_config: step s (1 .. steps) draws fresh grads (times
// *scale when scale is not NULL), sets h.grad_scale = scale, calls
// set_up(s) (which sets the step's other hyper-parameters and returns the lr
// the references use), steps the list (descs(ps, desc_arg)), checks the
// grads it leaves and puts them back (check_and_restore_grads), then calls
// refs(lr, s), which advances the references. A failed step is fatal.
template <class P, class H, class Step, class SetUp, class Refs>
void run_steps(std::vector<P> &ps, std::mt19937 &rng, H &h, float *scale, int steps, bool desc_arg,
               Step step, SetUp set_up, Refs refs) {
  for (int s = 1; s <= steps; s++) {
    fill_grads(ps, rng, scale ? *scale : 1.0f);
    const double lr = set_up(s);
    h.grad_scale = scale;
    std::vector<mixprec_opt_tensor> list = descs(ps, desc_arg);
    const std::vector<Buf> given = grads_of(ps);
    ASSERT_EQ(step(list.data(), int64_t(list.size()), &h), MIXPREC_OK);
    check_and_restore_grads(ps, given, h.unscale_grads ? h.grad_scale : nullptr);
    refs(lr, s);
  }
}

// The end of a run_config: each tensor's step is want_step, and each element
// of the library's param and state (q.compared()) is bit for bit the float
// reference's, a low-precision param is its master rounded to nearest even,
// and the param is within 1e-5 * (|double reference| + slack) of the double
// reference.
template <class P>
void check_against_references(const std::vector<P> &ps, float want_step, double slack) {
  for (size_t t = 0; t < ps.size(); t++) {
    const P &q = ps[t];
    SCOPED_TRACE("tensor " + std::to_string(t) + " n=" + std::to_string(q.numel()) + " " +
                 mpt::dtype_name(q.param.dtype()) + "/" + mpt::dtype_name(q.grad.dtype()));
    EXPECT_EQ(mpt::f32_bits(q.step), mpt::f32_bits(want_step));
    const std::vector<Compared> state = q.compared();
    int64_t bad = 0, bad_round = 0, bad_close = 0;
    for (int64_t i = 0; i < q.numel(); i++) {
      const size_t k = size_t(i);
      const float p = q.lib_p(i);
      bool ok = mpt::f32_bits(p) == mpt::f32_bits(q.rp[k]);
      std::ostringstream msg;
      for (const Compared &c : state) {
        ok = ok && mpt::f32_bits((*c.lib)[k]) == mpt::f32_bits((*c.ref)[k]);
        msg << ", " << c.name << " " << (*c.lib)[k] << " want " << (*c.ref)[k];
      }
      if (!ok && bad++ < 3)
        ADD_FAILURE() << "element " << i << ": p " << p << " want " << q.rp[k] << msg.str();
      if (q.param.dtype() != MIXPREC_F32 &&
          q.param.raw(i) != Buf::narrow(q.param.dtype(), q.master[k]) && bad_round++ < 3)
        ADD_FAILURE() << "element " << i << ": param bits 0x" << std::hex << q.param.raw(i)
                      << " is not the master " << q.master[k] << " rounded";
      const double tol = 1e-5 * (std::fabs(q.dp[k]) + slack);
      if (!(std::fabs(double(p) - q.dp[k]) <= tol) && bad_close++ < 3)
        ADD_FAILURE() << "element " << i << ": p " << p << " double reference " << q.dp[k];
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(bad_round, 0);
    EXPECT_EQ(bad_close, 0);
  }
}

// The UnscaleGradsNonFiniteAndExtremes tests: for each scale, two copies of
// extreme_grad_params (from kSeed + salt) take `steps` steps of h0 with that
// grad_scale from the same grads, a with unscale_grads 1 and b with 0: a's
// grads are the grads unscaled, b's untouched, everything else bit for bit
// the same (check_unscale_pair, snapshot). The grads are put back after each
// step.
template <class P, class H, class Step>
void check_unscale_extremes(const H &h0, uint32_t salt, int steps, Step step) {
  for (float scale : {65536.0f, 3000.0f, 0.125f}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    std::mt19937 rng(mpt::kSeed + salt);
    std::vector<P> a = extreme_grad_params<P>(rng);
    std::vector<P> b = a;
    H h = h0;
    h.grad_scale = &scale;
    const std::vector<Buf> given = grads_of(a);
    for (int s = 0; s < steps; s++) {
      std::vector<mixprec_opt_tensor> la = descs(a, true), lb = descs(b, true);
      h.unscale_grads = 1;
      ASSERT_EQ(step(la.data(), int64_t(la.size()), &h), MIXPREC_OK);
      h.unscale_grads = 0;
      ASSERT_EQ(step(lb.data(), int64_t(lb.size()), &h), MIXPREC_OK);
      check_unscale_pair(a, b, given, &scale, steps > 1 ? "step " + std::to_string(s) + " " : "");
      EXPECT_TRUE(snapshot(a) == snapshot(b)) << "unscale_grads changed the update";
      for (size_t t = 0; t < a.size(); t++) a[t].grad = b[t].grad = given[t];
    }
  }
}

// A step with each of found_infs (each must skip it) writes nothing.
template <class P, class H, class Step>
void expect_skipped(std::vector<P> &ps, H &h, std::initializer_list<float> found_infs, Step step) {
  for (float fi : found_infs) {
    const std::vector<uint32_t> before = snapshot(ps);
    h.found_inf = &fi;
    std::vector<mixprec_opt_tensor> list = descs(ps, true);
    EXPECT_EQ(step(list.data(), int64_t(list.size()), &h), MIXPREC_OK);
    EXPECT_TRUE(snapshot(ps) == before) << "found_inf " << fi << " wrote something";
  }
}

// An invalid call: what it edits in a valid list (or in its count n or its
// hyper-parameters), and the status it must return.
template <class H>
struct Bad {
  std::string name;
  mixprec_status want;
  std::function<void(std::vector<mixprec_opt_tensor> &, H &, int64_t &)> make;
};

// The invalid lists both optimizers reject alike, on a list whose tensor 1
// has a low-precision param with a master and tensor 2 an F32 param: a
// count n < 0, a numel < 0, unknown param and grad dtypes (the values given),
// NULL param, grad and master, a master for an F32 param.
template <class H>
std::vector<Bad<H>> bad_lists(int64_t n, int64_t numel, int param_dtype, int grad_dtype) {
  return {
      {"n < 0", MIXPREC_ERR_BAD_SIZE, [=](auto &, auto &, int64_t &c) { c = n; }},
      {"numel < 0", MIXPREC_ERR_BAD_SIZE, [=](auto &l, auto &, int64_t &) { l[1].numel = numel; }},
      {"param dtype", MIXPREC_ERR_BAD_DTYPE,
       [=](auto &l, auto &, int64_t &) { mpt::poke_enum(&l[1].param_dtype, param_dtype); }},
      {"grad dtype", MIXPREC_ERR_BAD_DTYPE,
       [=](auto &l, auto &, int64_t &) { mpt::poke_enum(&l[1].grad_dtype, grad_dtype); }},
      {"param NULL", MIXPREC_ERR_NULL_POINTER, [](auto &l, auto &, int64_t &) { l[1].param = nullptr; }},
      {"grad NULL", MIXPREC_ERR_NULL_POINTER, [](auto &l, auto &, int64_t &) { l[1].grad = nullptr; }},
      {"master NULL for F16", MIXPREC_ERR_NULL_POINTER,
       [](auto &l, auto &, int64_t &) { l[1].master = nullptr; }},
      {"master for F32", MIXPREC_ERR_BAD_ARGUMENT,
       [](auto &l, auto &, int64_t &) { l[2].master = l[1].master; }},
  };
}

// Each case on a fresh list (BF16/F16 n=40, F16/BF16 n=17, F32/F32 n=9 and,
// with_empty, an empty F32/F32; fresh grads; poison(q) then sets each
// tensor's state; tensor 0 is valid and comes first: it must not be updated
// either) with h0: the call returns c.want and writes nothing.
template <class P, class H, class Poison, class Step>
void expect_bad_calls_write_nothing(const std::vector<Bad<H>> &cases, std::mt19937 &rng,
                                    const H &h0, bool with_empty, Poison poison, Step step) {
  for (const Bad<H> &c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<P> ps;
    ps.emplace_back(40, MIXPREC_BF16, MIXPREC_F16, rng);
    ps.emplace_back(17, MIXPREC_F16, MIXPREC_BF16, rng);
    ps.emplace_back(9, MIXPREC_F32, MIXPREC_F32, rng);
    if (with_empty) ps.emplace_back(0, MIXPREC_F32, MIXPREC_F32, rng);
    fill_grads(ps, rng, 1.0f);
    for (P &q : ps) poison(q);
    std::vector<mixprec_opt_tensor> list = descs(ps, true);
    H h = h0;
    int64_t n = int64_t(list.size());
    c.make(list, h, n);
    const std::vector<uint32_t> before = snapshot(ps);
    EXPECT_EQ(step(list.data(), n, &h), c.want);
    EXPECT_TRUE(snapshot(ps) == before) << "an invalid call wrote something";
  }
}

// The NULL list and params checks of a step function: a NULL list of n > 0,
// NULL params, and an empty NULL list (valid).
template <class H, class Step>
void expect_null_checks(const H &h, Step step) {
  EXPECT_EQ(step(nullptr, 1, &h), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(step(nullptr, 0, nullptr), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(step(nullptr, 0, &h), MIXPREC_OK);
}

}  // namespace optim_test
