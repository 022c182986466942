// mixprec_adamw_step(): multi-step runs over lists of odd-sized tensors of
// mixed dtypes against two references written here: one that repeats torch's
// fused CPU AdamW (FusedAdamKernel.cpp, adam_math for float, ADAMW mode)
// operation for operation in float, compared bit for bit, and one in double
// that follows the textbook formula, compared within a tolerance. Also skipped
// steps, and every invalid argument.
#include <cfloat>
#include <limits>

#include "optim_test_util.h"

namespace {

using mpt::f32_bits;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// One parameter: the library's buffers and the references' copies.
struct Param : optim_test::ParamBase {
  std::vector<float> m, v, vmax;
  // Float reference (torch's fused formula), bit-exact target, besides rp.
  std::vector<float> rm, rv, rvmax;
  float rstep = 0.0f;
  // Double reference (textbook formula), besides dp.
  std::vector<double> dm, dv, dvmax;

  Param(int64_t n, mixprec_dtype pd, mixprec_dtype gd, std::mt19937 &rng)
      : ParamBase(n, pd, gd, rng) {
    m.assign(size_t(n), 0.0f);
    v = vmax = rm = rv = rvmax = m;
    dm.assign(size_t(n), 0.0);
    dv = dvmax = dm;
  }
  std::vector<const std::vector<float> *> state() const { return {&master, &m, &v, &vmax}; }
  // Without amsgrad neither the library nor the reference writes vmax.
  std::vector<optim_test::Compared> compared() const {
    return {{"m", &m, &rm}, {"v", &v, &rv}, {"vmax", &vmax, &rvmax}};
  }
  mixprec_opt_tensor desc(bool amsgrad) {
    mixprec_opt_tensor t = base_desc(&step);
    t.exp_avg = optim_test::or_null(m);
    t.exp_avg_sq = optim_test::or_null(v);
    t.max_exp_avg_sq = amsgrad ? optim_test::or_null(vmax) : nullptr;
    return t;
  }
};

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
  const int64_t tail_start = optim_test::torch_tail_start(q.numel());
  for (int64_t i = 0; i < q.numel(); i++) {
    const size_t k = size_t(i);
    const bool tail = i >= tail_start;
    float g = optim_test::ref_grad(q, i, scale, h.maximize);
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
    double g = optim_test::ref_grad_double(q, i, scale, h.maximize);
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
  ASSERT_NO_FATAL_FAILURE(optim_test::run_steps(
      ps, rng, h, cfg.use_scale ? &scale : nullptr, kSteps, h.amsgrad != 0, mixprec_adamw_step,
      [&](int s) {
        double lr = h.lr;
        if (cfg.use_lr_tensor) {
          lr_t = float(h.lr * (1.0 + 0.5 * std::cos(s * 0.3)));  // a schedule
          lr = lr_t;
          h.lr = -1.0;  // ignored, not checked, when lr_tensor is given
          h.lr_tensor = &lr_t;
        }
        return lr;
      },
      [&](double lr, int s) {
        for (Param &q : ps) {
          ref_float_step(q, lr, h, h.grad_scale);
          ref_double_step(q, lr, h, h.grad_scale, s);
        }
        if (cfg.use_lr_tensor) h.lr = lr;
      }));
  optim_test::check_against_references(ps, float(kSteps), h.lr * kSteps);
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
  mixprec_adamw_params h = mixprec_adamw_params_default();
  h.amsgrad = 1;
  h.maximize = 1;
  optim_test::check_unscale_extremes<Param>(h, 30, 1, mixprec_adamw_step);
}

// ---- Skipped steps ---------------------------------------------------------

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
    std::vector<mixprec_opt_tensor> list = optim_test::descs(ps, true);
    ASSERT_EQ(mixprec_adamw_step(list.data(), int64_t(list.size()), &h), MIXPREC_OK);
  }
  optim_test::fill_grads(ps, rng, 1.0f);
  optim_test::expect_skipped(ps, h, {1.0f, 2.0f, kNaN, -1.0f, std::numeric_limits<float>::infinity()},
                             mixprec_adamw_step);
  // Zero (either sign) does not skip.
  for (float fi : {0.0f, -0.0f}) {
    const float step0 = ps[0].step;
    h.found_inf = &fi;
    std::vector<mixprec_opt_tensor> list = optim_test::descs(ps, true);
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

TEST(AdamW, InvalidArgumentsWriteNothing) {
  const double kNaNd = std::numeric_limits<double>::quiet_NaN();
  const double kInfd = std::numeric_limits<double>::infinity();
  std::vector<optim_test::Bad<mixprec_adamw_params>> cases =
      optim_test::bad_lists<mixprec_adamw_params>(-1, -3, 7, -1);
  cases.insert(cases.end(), {
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
  });
  std::mt19937 rng(mpt::kSeed + 30);
  mixprec_adamw_params h = mixprec_adamw_params_default();
  h.amsgrad = 1;
  optim_test::expect_bad_calls_write_nothing<Param>(
      cases, rng, h, /*with_empty=*/true,
      [](Param &q) {
        // Poison the state with recognisable non-zero values.
        for (auto *vec : {&q.m, &q.v, &q.vmax})
          for (float &x : *vec) x = 0.25f;
        q.step = 3.0f;
      },
      mixprec_adamw_step);
  h = mixprec_adamw_params_default();
  optim_test::expect_null_checks(h, mixprec_adamw_step);
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
