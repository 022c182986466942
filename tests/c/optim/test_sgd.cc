// mixprec_sgd_step(): multi-step runs over lists of odd-sized tensors of mixed
// dtypes against a reference written here that repeats torch's fused CPU SGD
// (FusedSGDKernel.cpp, sgd_math for float) operation for operation in float,
// compared bit for bit, and a double reference compared within a tolerance.
// Also the first-step rule, skipped steps, and every invalid argument.
#include <limits>

#include "optim_test_util.h"

namespace {

using mpt::f32_bits;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Param : optim_test::ParamBase {
  std::vector<float> buf;
  std::vector<float> rbuf;  // float reference (torch's fused formula), besides rp
  bool rfirst = true;
  std::vector<double> dbuf;  // double reference, besides dp

  Param(int64_t n, mixprec_dtype pd, mixprec_dtype gd, std::mt19937 &rng)
      : ParamBase(n, pd, gd, rng) {
    // Garbage in the momentum buffer: the first step must overwrite it.
    buf.assign(size_t(n), 123.0f);
    rbuf = buf;
    dbuf.assign(size_t(n), 0.0);
  }
  std::vector<const std::vector<float> *> state() const { return {&master, &buf}; }
  std::vector<optim_test::Compared> compared() const { return {{"buf", &buf, &rbuf}}; }
  mixprec_opt_tensor desc(bool with_step) {
    mixprec_opt_tensor t = base_desc(with_step ? &step : nullptr);
    t.momentum_buffer = optim_test::or_null(buf);
    return t;
  }
};

// torch's fused CPU SGD, float path (FusedSGDKernel.cpp, sgd_math<float,
// float>), as torch's AVX2 build computes it: the vector body calls
// vec::fmadd for weight decay, momentum and nesterov, and GCC (-mfma,
// -ffp-contract=fast) contracts `param += grad * (-lr)` and the scalar tail's
// `a*b + c` into fused multiply-adds; in the momentum update the tail fuses
// the other product than the body (found against torch 2.14.1, see
// tests/python/test_optim_capi.py).
void ref_float_step(Param &q, double lr, const mixprec_sgd_params &h, const float *scale) {
  const int64_t tail_start = optim_test::torch_tail_start(q.numel());
  const float mom = float(h.momentum), damp1 = float(1 - h.dampening);
  for (int64_t i = 0; i < q.numel(); i++) {
    const size_t k = size_t(i);
    const bool tail = i >= tail_start;
    float g = optim_test::ref_grad(q, i, scale, h.maximize);
    if (h.weight_decay != 0.0) g = std::fma(q.rp[k], float(h.weight_decay), g);
    if (h.momentum != 0.0) {
      if (q.rfirst)
        q.rbuf[k] = g;
      else if (tail)
        q.rbuf[k] = std::fma(q.rbuf[k], mom, g * damp1);
      else
        q.rbuf[k] = std::fma(damp1, g, q.rbuf[k] * mom);
      if (h.nesterov)
        g = std::fma(q.rbuf[k], mom, g);
      else
        g = q.rbuf[k];
    }
    // body: fma(g, -lr, p); tail: p -= g*lr contracted; the same rounding.
    q.rp[k] = tail ? std::fma(-g, float(lr), q.rp[k]) : std::fma(g, -float(lr), q.rp[k]);
  }
  q.rfirst = false;
}

// torch/optim/sgd.py _single_tensor_sgd, in double.
void ref_double_step(Param &q, double lr, const mixprec_sgd_params &h, const float *scale,
                     bool first) {
  for (int64_t i = 0; i < q.numel(); i++) {
    const size_t k = size_t(i);
    double g = optim_test::ref_grad_double(q, i, scale, h.maximize);
    g += h.weight_decay * q.dp[k];
    if (h.momentum != 0.0) {
      q.dbuf[k] = first ? g : h.momentum * q.dbuf[k] + (1 - h.dampening) * g;
      g = h.nesterov ? g + h.momentum * q.dbuf[k] : q.dbuf[k];
    }
    q.dp[k] -= lr * g;
  }
}



struct Config {
  std::string name;
  std::function<void(mixprec_sgd_params &)> tweak;
  bool use_scale = false;
  bool use_lr_tensor = false;
  bool step_ptr = true;  // false: first step from params.first_step
  int threads = 0;
};

void run_config(const Config &cfg, uint32_t salt) {
  SCOPED_TRACE(cfg.name);
  mpt::GlobalStateGuard guard;
  if (cfg.threads) mixprec_set_num_threads(cfg.threads);
  std::mt19937 rng(mpt::kSeed + 100 + salt);
  std::vector<Param> ps = optim_test::make_params<Param>(rng);
  mixprec_sgd_params h = mixprec_sgd_params_default();
  h.lr = 0.01;
  if (cfg.tweak) cfg.tweak(h);
  float scale = 4096.0f, lr_t = 0.0f;
  const double base_lr = h.lr;
  const int kSteps = 50;
  ASSERT_NO_FATAL_FAILURE(optim_test::run_steps(
      ps, rng, h, cfg.use_scale ? &scale : nullptr, kSteps, cfg.step_ptr, mixprec_sgd_step,
      [&](int s) {
        double lr = base_lr;
        if (cfg.use_lr_tensor) {
          lr_t = float(base_lr * (1.0 + 0.5 * std::sin(s * 0.2)));
          lr = lr_t;
          h.lr_tensor = &lr_t;
          h.lr = std::numeric_limits<double>::quiet_NaN();  // ignored
        }
        h.first_step = s == 1;
        return lr;
      },
      [&](double lr, int s) {
        for (Param &q : ps) {
          ref_float_step(q, lr, h, h.grad_scale);
          ref_double_step(q, lr, h, h.grad_scale, s == 1);
        }
      }));
  optim_test::check_against_references(ps, cfg.step_ptr ? float(kSteps) : 0.0f,
                                       base_lr * kSteps * 4.0);
}

TEST(SGD, PlainNoMomentum) { run_config({"plain", nullptr}, 1); }
TEST(SGD, Momentum) {
  run_config({"momentum", [](mixprec_sgd_params &h) { h.momentum = 0.9; }}, 2);
}
TEST(SGD, MomentumDampeningWeightDecay) {
  run_config({"damp+wd", [](mixprec_sgd_params &h) {
                h.momentum = 0.8;
                h.dampening = 0.1;
                h.weight_decay = 1e-2;
              }},
             3);
}
TEST(SGD, NesterovMaximize) {
  run_config({"nesterov+max", [](mixprec_sgd_params &h) {
                h.momentum = 0.9;
                h.nesterov = 1;
                h.maximize = 1;
                h.weight_decay = 5e-4;
              }},
             4);
}
TEST(SGD, WeightDecayNoMomentum) {
  run_config({"wd", [](mixprec_sgd_params &h) { h.weight_decay = 0.1; }}, 5);
}
TEST(SGD, GradScaleDivides) {
  run_config({"scale", [](mixprec_sgd_params &h) { h.momentum = 0.5; }, true}, 6);
}
TEST(SGD, LrTensorOverridesLr) {
  run_config({"lr_tensor", [](mixprec_sgd_params &h) { h.momentum = 0.9; }, false, true}, 7);
}
TEST(SGD, FirstStepFlagWithoutStepPointers) {
  run_config({"flag", [](mixprec_sgd_params &h) { h.momentum = 0.9; }, false, false, false}, 8);
}
TEST(SGD, OneThreadSameResults) {
  run_config({"1 thread", [](mixprec_sgd_params &h) { h.momentum = 0.9; }, true, false, true, 1},
             9);
}

// unscale_grads: each grad ends as g / scale in its dtype (before the
// maximize negation); params, masters and buffers exactly as without it.
TEST(SGD, UnscaleGradsWritesUnscaledGrads) {
  run_config({"unscale_grads",
              [](mixprec_sgd_params &h) {
                h.momentum = 0.9;
                h.weight_decay = 1e-3;
                h.unscale_grads = 1;
              },
              true},
             10);
}
TEST(SGD, UnscaleGradsNesterovMaximizeOneThread) {
  run_config({"unscale_grads nesterov maximize",
              [](mixprec_sgd_params &h) {
                h.momentum = 0.9;
                h.nesterov = 1;
                h.maximize = 1;
                h.unscale_grads = 1;
              },
              true, true, true, /*threads=*/1},
             11);
}
TEST(SGD, UnscaleGradsWithoutScaleWritesNoGrad) {
  run_config({"unscale_grads, no scale", [](mixprec_sgd_params &h) { h.unscale_grads = 1; }}, 12);
}

// As AdamW.UnscaleGradsNonFiniteAndExtremes (test_adamw.cc), over the first
// step (buf = g) and a later one.
TEST(SGD, UnscaleGradsNonFiniteAndExtremes) {
  mixprec_sgd_params h = mixprec_sgd_params_default();
  h.momentum = 0.9;
  h.weight_decay = 1e-2;
  h.maximize = 1;
  optim_test::check_unscale_extremes<Param>(h, 130, 2, mixprec_sgd_step);
}

// A skipped first step leaves step at 0, so the next step still initialises
// the momentum buffers (buf = g), whatever they hold.
TEST(SGD, FoundInfSkipsWholeStepAndKeepsFirstStep) {
  std::mt19937 rng(mpt::kSeed + 120);
  std::vector<Param> ps = optim_test::make_params<Param>(rng);
  mixprec_sgd_params h = mixprec_sgd_params_default();
  h.momentum = 0.9;
  h.weight_decay = 1e-3;
  float scale = 2.0f;
  h.grad_scale = &scale;
  for (int round = 0; round < 2; round++) {
    optim_test::fill_grads(ps, rng, 1.0f);
    h.unscale_grads = 1;  // a skipped step writes no grad either
    optim_test::expect_skipped(ps, h, {1.0f, 2.0f, kNaN, -3.0f}, mixprec_sgd_step);
    float zero = 0.0f;
    h.found_inf = &zero;
    h.unscale_grads = 0;  // the reference below reads the grads
    std::vector<mixprec_opt_tensor> list = optim_test::descs(ps, true);
    ASSERT_EQ(mixprec_sgd_step(list.data(), int64_t(list.size()), &h), MIXPREC_OK);
    for (Param &q : ps) ref_float_step(q, h.lr, h, &scale);
  }
  for (Param &q : ps) {
    EXPECT_EQ(q.step, 2.0f);
    for (int64_t i = 0; i < q.numel(); i++) {
      ASSERT_EQ(f32_bits(q.lib_p(i)), f32_bits(q.rp[size_t(i)])) << i;
      ASSERT_EQ(f32_bits(q.buf[size_t(i)]), f32_bits(q.rbuf[size_t(i)])) << i;
    }
  }
}

TEST(SGD, InvalidArgumentsWriteNothing) {
  const double kNaNd = std::numeric_limits<double>::quiet_NaN();
  const double kInfd = std::numeric_limits<double>::infinity();
  std::vector<optim_test::Bad<mixprec_sgd_params>> cases =
      optim_test::bad_lists<mixprec_sgd_params>(-2, -1, 3, 99);
  cases.insert(cases.end(), {
      {"master-free BF16 without a step", MIXPREC_ERR_NULL_POINTER,
       [](auto &l, auto &, int64_t &) {
         l[0].master = nullptr;
         l[0].step = nullptr;
       }},
      {"momentum buffer NULL", MIXPREC_ERR_NULL_POINTER,
       [](auto &l, auto &, int64_t &) { l[1].momentum_buffer = nullptr; }},
      {"lr < 0", MIXPREC_ERR_BAD_ARGUMENT, [](auto &, auto &h, int64_t &) { h.lr = -0.1; }},
      {"lr NaN", MIXPREC_ERR_BAD_ARGUMENT, [=](auto &, auto &h, int64_t &) { h.lr = kNaNd; }},
      {"momentum < 0", MIXPREC_ERR_BAD_ARGUMENT, [](auto &, auto &h, int64_t &) { h.momentum = -0.9; }},
      {"momentum inf", MIXPREC_ERR_BAD_ARGUMENT, [=](auto &, auto &h, int64_t &) { h.momentum = kInfd; }},
      {"weight_decay < 0", MIXPREC_ERR_BAD_ARGUMENT,
       [](auto &, auto &h, int64_t &) { h.weight_decay = -1e-4; }},
      {"dampening NaN", MIXPREC_ERR_BAD_ARGUMENT,
       [=](auto &, auto &h, int64_t &) { h.dampening = kNaNd; }},
      {"nesterov with dampening", MIXPREC_ERR_BAD_ARGUMENT,
       [](auto &, auto &h, int64_t &) {
         h.nesterov = 1;
         h.dampening = 0.1;
       }},
      {"nesterov without momentum", MIXPREC_ERR_BAD_ARGUMENT,
       [](auto &, auto &h, int64_t &) {
         h.nesterov = 1;
         h.momentum = 0.0;
       }},
      {"bad arg with found_inf set", MIXPREC_ERR_BAD_ARGUMENT,
       [](auto &, auto &h, int64_t &) {
         static const float one = 1.0f;
         h.found_inf = &one;
         h.lr = -1.0;
       }},
  });
  std::mt19937 rng(mpt::kSeed + 130);
  mixprec_sgd_params h = mixprec_sgd_params_default();
  h.momentum = 0.9;
  optim_test::expect_bad_calls_write_nothing<Param>(
      cases, rng, h, /*with_empty=*/false, [](Param &q) { q.step = 2.0f; }, mixprec_sgd_step);
  h = mixprec_sgd_params_default();
  optim_test::expect_null_checks(h, mixprec_sgd_step);
  // Without momentum the buffer is not needed, and step is optional.
  std::mt19937 rng2(mpt::kSeed + 131);
  Param q(5, MIXPREC_BF16, MIXPREC_BF16, rng2);
  mixprec_opt_tensor t = q.desc(false);
  t.momentum_buffer = nullptr;
  EXPECT_EQ(mixprec_sgd_step(&t, 1, &h), MIXPREC_OK);
}

TEST(SGD, DefaultsAreTorchs) {
  const mixprec_sgd_params h = mixprec_sgd_params_default();
  EXPECT_EQ(h.lr, 1e-3);
  EXPECT_EQ(h.momentum, 0.0);
  EXPECT_EQ(h.dampening, 0.0);
  EXPECT_EQ(h.weight_decay, 0.0);
  EXPECT_EQ(h.nesterov, 0);
  EXPECT_EQ(h.maximize, 0);
  EXPECT_EQ(h.first_step, 0);
  EXPECT_EQ(h.lr_tensor, nullptr);
  EXPECT_EQ(h.sr_seed, 0u);
  EXPECT_EQ(h.unscale_grads, 0);
}

}  // namespace
