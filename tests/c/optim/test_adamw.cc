// mixprec_adamw_step(): multi-step runs over lists of odd-sized tensors of
// mixed dtypes against two references written here: one that repeats torch's
// fused CPU AdamW (FusedAdamKernel.cpp, adam_math for float, ADAMW mode)
// operation for operation in float, compared bit for bit, and one in double
// that follows the textbook formula, compared within a tolerance. Also skipped
// steps, and every invalid argument.
#include <cfloat>
#include <functional>
#include <limits>

#include "optim_test_util.h"

namespace {

using mpt::Buf;
using mpt::f32_bits;
using optim_test::check_and_restore_grads;
using optim_test::check_unscale_pair;
using optim_test::extreme_grad_params;
using optim_test::expect_grads;
using optim_test::grads_of;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// One parameter: the library's buffers and the references' copies.
struct Param {
  Buf param, grad;
  std::vector<float> master, m, v, vmax;
  float step = 0.0f;
  // Float reference (torch's fused formula), bit-exact target.
  std::vector<float> rp, rm, rv, rvmax;
  float rstep = 0.0f;
  // Double reference (textbook formula).
  std::vector<double> dp, dm, dv, dvmax;

  Param(int64_t n, mixprec_dtype pd, mixprec_dtype gd, std::mt19937 &rng)
      : param(pd, n, /*misalign=*/n % 2 == 1), grad(gd, n, n % 2 == 0) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    rp.resize(size_t(n));
    for (float &x : rp) x = nd(rng);
    for (int64_t i = 0; i < n; i++) param.set_value(i, rp[size_t(i)]);
    if (pd != MIXPREC_F32) master = rp;
    m.assign(size_t(n), 0.0f);
    v = vmax = rm = rv = rvmax = m;
    dp.assign(rp.begin(), rp.end());
    dm.assign(size_t(n), 0.0);
    dv = dvmax = dm;
  }
  int64_t numel() const { return param.numel(); }
  float lib_p(int64_t i) const {
    return param.dtype() == MIXPREC_F32 ? param.value(i) : master[size_t(i)];
  }
  mixprec_opt_tensor desc(bool amsgrad) {
    mixprec_opt_tensor t{};
    t.param = param.data();
    t.grad = grad.data();
    t.master = master.empty() ? nullptr : master.data();
    t.exp_avg = m.empty() ? nullptr : m.data();
    t.exp_avg_sq = v.empty() ? nullptr : v.data();
    t.max_exp_avg_sq = amsgrad && !vmax.empty() ? vmax.data() : nullptr;
    t.step = &step;
    t.numel = numel();
    t.param_dtype = param.dtype();
    t.grad_dtype = grad.dtype();
    return t;
  }
};

// Vectorized<float>::size() of torch's AVX2 build: each tensor's last
// numel % kTorchVec elements go through torch's scalar tail loop.
constexpr int64_t kTorchVec = 8;

// torch's fused CPU AdamW, float path (FusedAdamKernel.cpp, adam_math<float,
// float, ADAMW>), one tensor, as torch's AVX2 build computes it: GCC compiles
// ATen with -mfma and -ffp-contract=fast, so `a*b + c` becomes one fused
// multiply-add wherever it contracts (found against torch 2.14.1, see
// tests/python/test_optim_capi.py). lr is the double torch passes (lr, or
// lr_tensor.item<double>()).
void ref_float_step(Param &q, double lr, const mixprec_adamw_params &h, const float *scale) {
  const float t = q.rstep + 1.0f;
  const double step = t;
  const double bc1 = 1 - std::pow(h.beta1, step);
  const double bc2 = 1 - std::pow(h.beta2, step);
  const double step_size = lr / bc1;
  const double c1 = 1 - h.beta1, c2 = 1 - h.beta2;
  const double bc2_sqrt = std::sqrt(bc2);
  const float w = float(c1);
  const int64_t tail_start = q.numel() - q.numel() % kTorchVec;
  for (int64_t i = 0; i < q.numel(); i++) {
    const size_t k = size_t(i);
    const bool tail = i >= tail_start;
    float g = q.grad.value(i);
    if (scale) g = g / *scale;
    if (h.maximize) g = g * -1.0f;
    float p = q.rp[k];
    if (h.weight_decay != 0.0) p = p * float(1 - lr * h.weight_decay);
    // exp_avg.lerp_(grad, w): body blendv + vec::fmadd; the tail's
    // m + w*(g - m) or g - (g - m)*(1 - w) contracted: the same roundings.
    float m = q.rm[k];
    if (std::fabs(w) < 0.5f)
      m = std::fma(w, g - m, m);
    else
      m = tail ? std::fma(-(g - m), 1.0f - w, g) : std::fma(w - 1.0f, g - m, g);
    // v*beta2 + c2*g*g: the body fuses the second product, the tail the first.
    float v = q.rv[k];
    if (tail)
      v = std::fma(v, float(h.beta2), float(c2) * g * g);
    else
      v = std::fma(float(c2) * g, g, v * float(h.beta2));
    float den;
    if (h.amsgrad) {
      float &vm = q.rvmax[k];
      if (tail)
        vm = std::max(vm, v);
      else  // _mm256_max_ps(vm, v) | unordered(vm, v)
        vm = (std::isnan(vm) || std::isnan(v)) ? mpt::f32_from_bits(0xffffffffu)
                                               : (vm > v ? vm : v);
      den = std::sqrt(vm) / float(bc2_sqrt) + float(h.eps);
    } else {
      den = std::sqrt(v) / float(bc2_sqrt) + float(h.eps);
    }
    p = p - float(step_size) * m / den;
    q.rm[k] = m;
    q.rv[k] = v;
    q.rp[k] = p;
  }
  q.rstep = t;
}

// Textbook AdamW in double (torch/optim/adamw.py _single_tensor_adam).
void ref_double_step(Param &q, double lr, const mixprec_adamw_params &h, const float *scale,
                     int step) {
  const double bc1 = 1 - std::pow(h.beta1, step), bc2 = 1 - std::pow(h.beta2, step);
  for (int64_t i = 0; i < q.numel(); i++) {
    const size_t k = size_t(i);
    double g = q.grad.value(i);
    if (scale) g /= *scale;
    if (h.maximize) g = -g;
    q.dp[k] *= 1 - lr * h.weight_decay;
    q.dm[k] = h.beta1 * q.dm[k] + (1 - h.beta1) * g;
    q.dv[k] = h.beta2 * q.dv[k] + (1 - h.beta2) * g * g;
    q.dvmax[k] = std::max(q.dvmax[k], q.dv[k]);
    const double vv = h.amsgrad ? q.dvmax[k] : q.dv[k];
    q.dp[k] -= lr / bc1 * q.dm[k] / (std::sqrt(vv) / std::sqrt(bc2) + h.eps);
  }
}


struct Config {
  std::string name;
  std::function<void(mixprec_adamw_params &)> tweak;
  bool use_scale = false;
  bool use_lr_tensor = false;  // a scheduler changes lr each step
  int threads = 0;
};


void run_config(const Config &cfg, uint32_t salt) {
  SCOPED_TRACE(cfg.name);
  mpt::GlobalStateGuard guard;
  if (cfg.threads) mixprec_set_num_threads(cfg.threads);
  std::mt19937 rng(mpt::kSeed + salt);
  std::vector<Param> ps = optim_test::make_params<Param>(rng);
  mixprec_adamw_params h = mixprec_adamw_params_default();
  if (cfg.tweak) cfg.tweak(h);
  float scale = 1024.0f, lr_t = 0.0f;
  const int kSteps = 50;
  for (int s = 1; s <= kSteps; s++) {
    optim_test::fill_grads(ps, rng, cfg.use_scale ? scale : 1.0f);
    double lr = h.lr;
    if (cfg.use_lr_tensor) {
      lr_t = float(h.lr * (1.0 + 0.5 * std::cos(s * 0.3)));  // a schedule
      lr = lr_t;
      h.lr = -1.0;  // ignored, not checked, when lr_tensor is given
      h.lr_tensor = &lr_t;
    }
    h.grad_scale = cfg.use_scale ? &scale : nullptr;
    std::vector<mixprec_opt_tensor> list;
    for (Param &q : ps) list.push_back(q.desc(h.amsgrad));
    const std::vector<Buf> given = grads_of(ps);
    ASSERT_EQ(mixprec_adamw_step(list.data(), int64_t(list.size()), &h), MIXPREC_OK);
    check_and_restore_grads(ps, given, h.unscale_grads ? h.grad_scale : nullptr);
    for (Param &q : ps) {
      ref_float_step(q, lr, h, h.grad_scale);
      ref_double_step(q, lr, h, h.grad_scale, s);
    }
    if (cfg.use_lr_tensor) h.lr = lr;
  }
  for (size_t t = 0; t < ps.size(); t++) {
    Param &q = ps[t];
    SCOPED_TRACE("tensor " + std::to_string(t) + " n=" + std::to_string(q.numel()) + " " +
                 mpt::dtype_name(q.param.dtype()) + "/" + mpt::dtype_name(q.grad.dtype()));
    EXPECT_EQ(f32_bits(q.step), f32_bits(float(kSteps)));
    int64_t bad = 0, bad_round = 0, bad_close = 0;
    for (int64_t i = 0; i < q.numel(); i++) {
      const size_t k = size_t(i);
      const float p = q.lib_p(i);
      bool ok = f32_bits(p) == f32_bits(q.rp[k]) && f32_bits(q.m[k]) == f32_bits(q.rm[k]) &&
                f32_bits(q.v[k]) == f32_bits(q.rv[k]) &&
                (!h.amsgrad || f32_bits(q.vmax[k]) == f32_bits(q.rvmax[k]));
      if (!ok && bad++ < 3)
        ADD_FAILURE() << "element " << i << ": p " << p << " want " << q.rp[k] << ", m " << q.m[k]
                      << " want " << q.rm[k] << ", v " << q.v[k] << " want " << q.rv[k];
      // The low-precision param is the master rounded to nearest even.
      if (q.param.dtype() != MIXPREC_F32 &&
          q.param.raw(i) != Buf::narrow(q.param.dtype(), q.master[k]) && bad_round++ < 3)
        ADD_FAILURE() << "element " << i << ": param bits 0x" << std::hex << q.param.raw(i)
                      << " is not the master " << q.master[k] << " rounded";
      const double tol = 1e-5 * (std::fabs(q.dp[k]) + h.lr * kSteps);
      if (!(std::fabs(double(p) - q.dp[k]) <= tol) && bad_close++ < 3)
        ADD_FAILURE() << "element " << i << ": p " << p << " double reference " << q.dp[k];
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(bad_round, 0);
    EXPECT_EQ(bad_close, 0);
  }
}

TEST(AdamW, DefaultsMatchReferences) { run_config({"defaults", nullptr}, 1); }
TEST(AdamW, Amsgrad) {
  run_config({"amsgrad", [](mixprec_adamw_params &h) { h.amsgrad = 1; }}, 2);
}
TEST(AdamW, Maximize) {
  run_config({"maximize", [](mixprec_adamw_params &h) { h.maximize = 1; }}, 3);
}
TEST(AdamW, NoWeightDecay) {
  run_config({"wd0", [](mixprec_adamw_params &h) { h.weight_decay = 0.0; }}, 4);
}
TEST(AdamW, LargeWeightDecayAndLr) {
  run_config({"wd", [](mixprec_adamw_params &h) {
                h.weight_decay = 0.3;
                h.lr = 0.05;
              }},
             5);
}
// beta1 <= 0.5 takes the other branch of torch's lerp.
TEST(AdamW, SmallBeta1OtherLerpBranch) {
  run_config({"beta1=0.3", [](mixprec_adamw_params &h) {
                h.beta1 = 0.3;
                h.beta2 = 0.9;
                h.eps = 1e-6;
              }},
             6);
}
TEST(AdamW, GradScaleDivides) { run_config({"scale", nullptr, /*use_scale=*/true}, 7); }
TEST(AdamW, LrTensorOverridesLr) {
  run_config({"lr_tensor", [](mixprec_adamw_params &h) { h.amsgrad = 1; }, false, true}, 8);
}
TEST(AdamW, OneThreadSameResults) {
  run_config({"1 thread", nullptr, true, false, /*threads=*/1}, 9);
}
std::vector<uint32_t> snapshot(const std::vector<Param> &ps);

// unscale_grads: each grad ends as g / scale in its dtype (before the
// maximize negation); params, masters and state exactly as without it.
TEST(AdamW, UnscaleGradsWritesUnscaledGrads) {
  run_config({"unscale_grads", [](mixprec_adamw_params &h) { h.unscale_grads = 1; }, true}, 10);
}
TEST(AdamW, UnscaleGradsMaximizeAmsgradOneThread) {
  run_config({"unscale_grads maximize amsgrad",
              [](mixprec_adamw_params &h) {
                h.unscale_grads = 1;
                h.maximize = 1;
                h.amsgrad = 1;
              },
              true, true, /*threads=*/1},
             11);
}
// Without a grad_scale there is nothing to unscale: grads are not written.
TEST(AdamW, UnscaleGradsWithoutScaleWritesNoGrad) {
  run_config({"unscale_grads, no scale", [](mixprec_adamw_params &h) { h.unscale_grads = 1; }}, 12);
}

// Non-finite, signed-zero, subnormal and extreme grads of every dtype
// (F32, F16 and BF16 params): the written grads are g / scale rounded (a
// quotient that underflows the grad's dtype included), and every other
// buffer is bit for bit the same call's with unscale_grads 0.
TEST(AdamW, UnscaleGradsNonFiniteAndExtremes) {
  for (float scale : {65536.0f, 3000.0f, 0.125f}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    std::mt19937 rng(mpt::kSeed + 30);
    std::vector<Param> a = extreme_grad_params<Param>(rng);
    std::vector<Param> b = a;
    mixprec_adamw_params h = mixprec_adamw_params_default();
    h.amsgrad = 1;
    h.maximize = 1;
    h.grad_scale = &scale;
    const std::vector<Buf> given = grads_of(a);
    std::vector<mixprec_opt_tensor> la, lb;
    for (Param &q : a) la.push_back(q.desc(true));
    for (Param &q : b) lb.push_back(q.desc(true));
    h.unscale_grads = 1;
    ASSERT_EQ(mixprec_adamw_step(la.data(), int64_t(la.size()), &h), MIXPREC_OK);
    h.unscale_grads = 0;
    ASSERT_EQ(mixprec_adamw_step(lb.data(), int64_t(lb.size()), &h), MIXPREC_OK);
    check_unscale_pair(a, b, given, &scale, "");
    EXPECT_TRUE(snapshot(a) == snapshot(b)) << "unscale_grads changed the update";
  }
}

// ---- Skipped steps ---------------------------------------------------------

// All bits of every buffer a step may write.
std::vector<uint32_t> snapshot(const std::vector<Param> &ps) {
  std::vector<uint32_t> s;
  for (const Param &q : ps) {
    for (int64_t i = 0; i < q.numel(); i++) s.push_back(q.param.raw(i));
    for (int64_t i = 0; i < q.grad.numel(); i++) s.push_back(q.grad.raw(i));
    for (const auto *vec : {&q.master, &q.m, &q.v, &q.vmax})
      for (float x : *vec) s.push_back(f32_bits(x));
    s.push_back(f32_bits(q.step));
  }
  return s;
}

TEST(AdamW, FoundInfSkipsWholeStep) {
  std::mt19937 rng(mpt::kSeed + 20);
  std::vector<Param> ps = optim_test::make_params<Param>(rng);
  mixprec_adamw_params h = mixprec_adamw_params_default();
  h.amsgrad = 1;
  float scale = 8.0f;
  h.grad_scale = &scale;
  h.unscale_grads = 1;  // a skipped step writes no grad either
  // A few real steps first, so the state is not all zeros.
  for (int s = 0; s < 3; s++) {
    optim_test::fill_grads(ps, rng, 1.0f);
    std::vector<mixprec_opt_tensor> list;
    for (Param &q : ps) list.push_back(q.desc(true));
    ASSERT_EQ(mixprec_adamw_step(list.data(), int64_t(list.size()), &h), MIXPREC_OK);
  }
  optim_test::fill_grads(ps, rng, 1.0f);
  for (float fi : {1.0f, 2.0f, kNaN, -1.0f, std::numeric_limits<float>::infinity()}) {
    const std::vector<uint32_t> before = snapshot(ps);
    h.found_inf = &fi;
    std::vector<mixprec_opt_tensor> list;
    for (Param &q : ps) list.push_back(q.desc(true));
    EXPECT_EQ(mixprec_adamw_step(list.data(), int64_t(list.size()), &h), MIXPREC_OK);
    EXPECT_TRUE(snapshot(ps) == before) << "found_inf " << fi << " wrote something";
  }
  // Zero (either sign) does not skip.
  for (float fi : {0.0f, -0.0f}) {
    const float step0 = ps[0].step;
    h.found_inf = &fi;
    std::vector<mixprec_opt_tensor> list;
    for (Param &q : ps) list.push_back(q.desc(true));
    EXPECT_EQ(mixprec_adamw_step(list.data(), int64_t(list.size()), &h), MIXPREC_OK);
    EXPECT_EQ(ps[0].step, step0 + 1.0f);
  }
}

// Tensors sharing one step pointer use the same count, advanced once.
TEST(AdamW, SharedStepAdvancesOnce) {
  std::mt19937 rng(mpt::kSeed + 21);
  Param a(5, MIXPREC_F32, MIXPREC_F32, rng), b(9, MIXPREC_BF16, MIXPREC_F32, rng);
  mpt::fill_random(a.grad, rng, -4, 0, false);
  mpt::fill_random(b.grad, rng, -4, 0, false);
  float shared = 4.0f;
  mixprec_opt_tensor list[2] = {a.desc(false), b.desc(false)};
  list[0].step = list[1].step = &shared;
  mixprec_adamw_params h = mixprec_adamw_params_default();
  ASSERT_EQ(mixprec_adamw_step(list, 2, &h), MIXPREC_OK);
  EXPECT_EQ(shared, 5.0f);
  a.rstep = b.rstep = 4.0f;
  ref_float_step(a, h.lr, h, nullptr);
  ref_float_step(b, h.lr, h, nullptr);
  for (int64_t i = 0; i < 5; i++) EXPECT_EQ(f32_bits(a.lib_p(i)), f32_bits(a.rp[size_t(i)]));
  for (int64_t i = 0; i < 9; i++) EXPECT_EQ(f32_bits(b.lib_p(i)), f32_bits(b.rp[size_t(i)]));
}

// ---- Invalid arguments -----------------------------------------------------

struct Bad {
  std::string name;
  mixprec_status want;
  std::function<void(std::vector<mixprec_opt_tensor> &, mixprec_adamw_params &, int64_t &)> make;
};

TEST(AdamW, InvalidArgumentsWriteNothing) {
  const double kNaNd = std::numeric_limits<double>::quiet_NaN();
  const double kInfd = std::numeric_limits<double>::infinity();
  const std::vector<Bad> cases = {
      {"n < 0", MIXPREC_ERR_BAD_SIZE, [](auto &, auto &, int64_t &n) { n = -1; }},
      {"numel < 0", MIXPREC_ERR_BAD_SIZE, [](auto &l, auto &, int64_t &) { l[1].numel = -3; }},
      {"param dtype", MIXPREC_ERR_BAD_DTYPE,
       [](auto &l, auto &, int64_t &) { mpt::poke_enum(&l[1].param_dtype, 7); }},
      {"grad dtype", MIXPREC_ERR_BAD_DTYPE,
       [](auto &l, auto &, int64_t &) { mpt::poke_enum(&l[1].grad_dtype, -1); }},
      {"param NULL", MIXPREC_ERR_NULL_POINTER, [](auto &l, auto &, int64_t &) { l[1].param = nullptr; }},
      {"grad NULL", MIXPREC_ERR_NULL_POINTER, [](auto &l, auto &, int64_t &) { l[1].grad = nullptr; }},
      {"master NULL for F16", MIXPREC_ERR_NULL_POINTER,
       [](auto &l, auto &, int64_t &) { l[1].master = nullptr; }},
      {"master for F32", MIXPREC_ERR_BAD_ARGUMENT,
       [](auto &l, auto &, int64_t &) { l[2].master = l[1].master; }},
      {"exp_avg NULL", MIXPREC_ERR_NULL_POINTER, [](auto &l, auto &, int64_t &) { l[1].exp_avg = nullptr; }},
      {"exp_avg_sq NULL", MIXPREC_ERR_NULL_POINTER,
       [](auto &l, auto &, int64_t &) { l[1].exp_avg_sq = nullptr; }},
      {"max_exp_avg_sq NULL", MIXPREC_ERR_NULL_POINTER,
       [](auto &l, auto &, int64_t &) { l[1].max_exp_avg_sq = nullptr; }},
      {"step NULL", MIXPREC_ERR_NULL_POINTER, [](auto &l, auto &, int64_t &) { l[1].step = nullptr; }},
      {"step NULL, numel 0", MIXPREC_ERR_NULL_POINTER,
       [](auto &l, auto &, int64_t &) { l[3].step = nullptr; }},
      {"lr < 0", MIXPREC_ERR_BAD_ARGUMENT, [](auto &, auto &h, int64_t &) { h.lr = -1e-3; }},
      {"lr NaN", MIXPREC_ERR_BAD_ARGUMENT, [=](auto &, auto &h, int64_t &) { h.lr = kNaNd; }},
      {"lr inf", MIXPREC_ERR_BAD_ARGUMENT, [=](auto &, auto &h, int64_t &) { h.lr = kInfd; }},
      {"eps < 0", MIXPREC_ERR_BAD_ARGUMENT, [](auto &, auto &h, int64_t &) { h.eps = -1e-8; }},
      {"eps NaN", MIXPREC_ERR_BAD_ARGUMENT, [=](auto &, auto &h, int64_t &) { h.eps = kNaNd; }},
      {"beta1 = 1", MIXPREC_ERR_BAD_ARGUMENT, [](auto &, auto &h, int64_t &) { h.beta1 = 1.0; }},
      {"beta1 < 0", MIXPREC_ERR_BAD_ARGUMENT, [](auto &, auto &h, int64_t &) { h.beta1 = -0.1; }},
      {"beta2 = 1", MIXPREC_ERR_BAD_ARGUMENT, [](auto &, auto &h, int64_t &) { h.beta2 = 1.0; }},
      {"beta2 NaN", MIXPREC_ERR_BAD_ARGUMENT, [=](auto &, auto &h, int64_t &) { h.beta2 = kNaNd; }},
      {"weight_decay < 0", MIXPREC_ERR_BAD_ARGUMENT,
       [](auto &, auto &h, int64_t &) { h.weight_decay = -0.01; }},
      {"weight_decay inf", MIXPREC_ERR_BAD_ARGUMENT,
       [=](auto &, auto &h, int64_t &) { h.weight_decay = kInfd; }},
      {"bad arg with found_inf set", MIXPREC_ERR_BAD_ARGUMENT,
       [](auto &, auto &h, int64_t &) {
         static const float one = 1.0f;
         h.found_inf = &one;
         h.beta1 = 2.0;
       }},
  };
  std::mt19937 rng(mpt::kSeed + 30);
  for (const Bad &c : cases) {
    SCOPED_TRACE(c.name);
    // Tensor 0 is valid and comes first: it must not be updated either.
    std::vector<Param> ps;
    ps.emplace_back(40, MIXPREC_BF16, MIXPREC_F16, rng);
    ps.emplace_back(17, MIXPREC_F16, MIXPREC_BF16, rng);
    ps.emplace_back(9, MIXPREC_F32, MIXPREC_F32, rng);
    ps.emplace_back(0, MIXPREC_F32, MIXPREC_F32, rng);
    optim_test::fill_grads(ps, rng, 1.0f);
    for (Param &q : ps) {
      // Poison the state with recognisable non-zero values.
      for (auto *vec : {&q.m, &q.v, &q.vmax})
        for (float &x : *vec) x = 0.25f;
      q.step = 3.0f;
    }
    std::vector<mixprec_opt_tensor> list;
    for (Param &q : ps) list.push_back(q.desc(true));
    mixprec_adamw_params h = mixprec_adamw_params_default();
    h.amsgrad = 1;
    int64_t n = int64_t(list.size());
    c.make(list, h, n);
    const std::vector<uint32_t> before = snapshot(ps);
    EXPECT_EQ(mixprec_adamw_step(list.data(), n, &h), c.want);
    EXPECT_TRUE(snapshot(ps) == before) << "an invalid call wrote something";
  }
  mixprec_adamw_params h = mixprec_adamw_params_default();
  EXPECT_EQ(mixprec_adamw_step(nullptr, 1, &h), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_adamw_step(nullptr, 0, nullptr), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_adamw_step(nullptr, 0, &h), MIXPREC_OK);
  // lr is neither used nor checked when lr_tensor is given.
  float lr = 1e-3f;
  h.lr = -5.0;
  h.lr_tensor = &lr;
  EXPECT_EQ(mixprec_adamw_step(nullptr, 0, &h), MIXPREC_OK);
}

TEST(AdamW, DefaultsAreTorchs) {
  const mixprec_adamw_params h = mixprec_adamw_params_default();
  EXPECT_EQ(h.lr, 1e-3);
  EXPECT_EQ(h.beta1, 0.9);
  EXPECT_EQ(h.beta2, 0.999);
  EXPECT_EQ(h.eps, 1e-8);
  EXPECT_EQ(h.weight_decay, 1e-2);
  EXPECT_EQ(h.amsgrad, 0);
  EXPECT_EQ(h.maximize, 0);
  EXPECT_EQ(h.lr_tensor, nullptr);
  EXPECT_EQ(h.grad_scale, nullptr);
  EXPECT_EQ(h.found_inf, nullptr);
  EXPECT_EQ(h.sr_seed, 0u);
  EXPECT_EQ(h.unscale_grads, 0);
}

}  // namespace
