// mixprec_sgd_step(): multi-step runs over lists of odd-sized tensors of mixed
// dtypes against a reference written here that repeats torch's fused CPU SGD
// (FusedSGDKernel.cpp, sgd_math for float) operation for operation in float,
// compared bit for bit, and a double reference compared within a tolerance.
// Also the first-step rule, skipped steps, and every invalid argument.
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

struct Param {
  Buf param, grad;
  std::vector<float> master, buf;
  float step = 0.0f;
  std::vector<float> rp, rbuf;  // float reference (torch's fused formula)
  bool rfirst = true;
  std::vector<double> dp, dbuf;  // double reference

  Param(int64_t n, mixprec_dtype pd, mixprec_dtype gd, std::mt19937 &rng)
      : param(pd, n, n % 2 == 1), grad(gd, n, n % 2 == 0) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    rp.resize(size_t(n));
    for (float &x : rp) x = nd(rng);
    for (int64_t i = 0; i < n; i++) param.set_value(i, rp[size_t(i)]);
    if (pd != MIXPREC_F32) master = rp;
    // Garbage in the momentum buffer: the first step must overwrite it.
    buf.assign(size_t(n), 123.0f);
    rbuf = buf;
    dp.assign(rp.begin(), rp.end());
    dbuf.assign(size_t(n), 0.0);
  }
  int64_t numel() const { return param.numel(); }
  float lib_p(int64_t i) const {
    return param.dtype() == MIXPREC_F32 ? param.value(i) : master[size_t(i)];
  }
  mixprec_opt_tensor desc(bool with_step) {
    mixprec_opt_tensor t{};
    t.param = param.data();
    t.grad = grad.data();
    t.master = master.empty() ? nullptr : master.data();
    t.momentum_buffer = buf.empty() ? nullptr : buf.data();
    t.step = with_step ? &step : nullptr;
    t.numel = numel();
    t.param_dtype = param.dtype();
    t.grad_dtype = grad.dtype();
    return t;
  }
};

// Vectorized<float>::size() of torch's AVX2 build: each tensor's last
// numel % kTorchVec elements go through torch's scalar tail loop.
constexpr int64_t kTorchVec = 8;

// torch's fused CPU SGD, float path (FusedSGDKernel.cpp, sgd_math<float,
// float>), as torch's AVX2 build computes it: the vector body calls
// vec::fmadd for weight decay, momentum and nesterov, and GCC (-mfma,
// -ffp-contract=fast) contracts `param += grad * (-lr)` and the scalar tail's
// `a*b + c` into fused multiply-adds; in the momentum update the tail fuses
// the other product than the body (found against torch 2.14.1, see
// tests/python/test_optim_capi.py).
void ref_float_step(Param &q, double lr, const mixprec_sgd_params &h, const float *scale) {
  const int64_t tail_start = q.numel() - q.numel() % kTorchVec;
  const float mom = float(h.momentum), damp1 = float(1 - h.dampening);
  for (int64_t i = 0; i < q.numel(); i++) {
    const size_t k = size_t(i);
    const bool tail = i >= tail_start;
    float g = q.grad.value(i);
    if (scale) g = g / *scale;
    if (h.maximize) g = g * -1.0f;
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
    double g = q.grad.value(i);
    if (scale) g /= *scale;
    if (h.maximize) g = -g;
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
  for (int s = 1; s <= kSteps; s++) {
    optim_test::fill_grads(ps, rng, cfg.use_scale ? scale : 1.0f);
    double lr = base_lr;
    if (cfg.use_lr_tensor) {
      lr_t = float(base_lr * (1.0 + 0.5 * std::sin(s * 0.2)));
      lr = lr_t;
      h.lr_tensor = &lr_t;
      h.lr = std::numeric_limits<double>::quiet_NaN();  // ignored
    }
    h.grad_scale = cfg.use_scale ? &scale : nullptr;
    h.first_step = s == 1;
    std::vector<mixprec_opt_tensor> list;
    for (Param &q : ps) list.push_back(q.desc(cfg.step_ptr));
    const std::vector<Buf> given = grads_of(ps);
    ASSERT_EQ(mixprec_sgd_step(list.data(), int64_t(list.size()), &h), MIXPREC_OK);
    check_and_restore_grads(ps, given, h.unscale_grads ? h.grad_scale : nullptr);
    for (Param &q : ps) {
      ref_float_step(q, lr, h, h.grad_scale);
      ref_double_step(q, lr, h, h.grad_scale, s == 1);
    }
  }
  for (size_t t = 0; t < ps.size(); t++) {
    Param &q = ps[t];
    SCOPED_TRACE("tensor " + std::to_string(t) + " n=" + std::to_string(q.numel()) + " " +
                 mpt::dtype_name(q.param.dtype()) + "/" + mpt::dtype_name(q.grad.dtype()));
    EXPECT_EQ(q.step, cfg.step_ptr ? float(kSteps) : 0.0f);
    int64_t bad = 0, bad_round = 0, bad_close = 0;
    for (int64_t i = 0; i < q.numel(); i++) {
      const size_t k = size_t(i);
      const float p = q.lib_p(i);
      const bool ok = f32_bits(p) == f32_bits(q.rp[k]) && f32_bits(q.buf[k]) == f32_bits(q.rbuf[k]);
      if (!ok && bad++ < 3)
        ADD_FAILURE() << "element " << i << ": p " << p << " want " << q.rp[k] << ", buf "
                      << q.buf[k] << " want " << q.rbuf[k];
      if (q.param.dtype() != MIXPREC_F32 &&
          q.param.raw(i) != Buf::narrow(q.param.dtype(), q.master[k]) && bad_round++ < 3)
        ADD_FAILURE() << "element " << i << ": param is not the master rounded";
      const double tol = 1e-5 * (std::fabs(q.dp[k]) + base_lr * kSteps * 4.0);
      if (!(std::fabs(double(p) - q.dp[k]) <= tol) && bad_close++ < 3)
        ADD_FAILURE() << "element " << i << ": p " << p << " double reference " << q.dp[k];
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(bad_round, 0);
    EXPECT_EQ(bad_close, 0);
  }
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

std::vector<uint32_t> snapshot(const std::vector<Param> &ps);

// As AdamW.UnscaleGradsNonFiniteAndExtremes (test_adamw.cc).
TEST(SGD, UnscaleGradsNonFiniteAndExtremes) {
  for (float scale : {65536.0f, 3000.0f, 0.125f}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    std::mt19937 rng(mpt::kSeed + 130);
    std::vector<Param> a = extreme_grad_params<Param>(rng);
    std::vector<Param> b = a;
    mixprec_sgd_params h = mixprec_sgd_params_default();
    h.momentum = 0.9;
    h.weight_decay = 1e-2;
    h.maximize = 1;
    h.grad_scale = &scale;
    const std::vector<Buf> given = grads_of(a);
    for (int s = 0; s < 2; s++) {  // the first step (buf = g), then a later one
      std::vector<mixprec_opt_tensor> la, lb;
      for (Param &q : a) la.push_back(q.desc(true));
      for (Param &q : b) lb.push_back(q.desc(true));
      h.unscale_grads = 1;
      ASSERT_EQ(mixprec_sgd_step(la.data(), int64_t(la.size()), &h), MIXPREC_OK);
      h.unscale_grads = 0;
      ASSERT_EQ(mixprec_sgd_step(lb.data(), int64_t(lb.size()), &h), MIXPREC_OK);
      check_unscale_pair(a, b, given, &scale, "step " + std::to_string(s) + " ");
      EXPECT_TRUE(snapshot(a) == snapshot(b)) << "unscale_grads changed the update";
      for (size_t t = 0; t < a.size(); t++) a[t].grad = b[t].grad = given[t];
    }
  }
}

std::vector<uint32_t> snapshot(const std::vector<Param> &ps) {
  std::vector<uint32_t> s;
  for (const Param &q : ps) {
    for (int64_t i = 0; i < q.numel(); i++) s.push_back(q.param.raw(i));
    for (int64_t i = 0; i < q.grad.numel(); i++) s.push_back(q.grad.raw(i));
    for (const auto *vec : {&q.master, &q.buf})
      for (float x : *vec) s.push_back(f32_bits(x));
    s.push_back(f32_bits(q.step));
  }
  return s;
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
    for (float fi : {1.0f, 2.0f, kNaN, -3.0f}) {
      const std::vector<uint32_t> before = snapshot(ps);
      h.found_inf = &fi;
      h.unscale_grads = 1;  // a skipped step writes no grad either
      std::vector<mixprec_opt_tensor> list;
      for (Param &q : ps) list.push_back(q.desc(true));
      EXPECT_EQ(mixprec_sgd_step(list.data(), int64_t(list.size()), &h), MIXPREC_OK);
      EXPECT_TRUE(snapshot(ps) == before) << "found_inf " << fi << " wrote something";
    }
    float zero = 0.0f;
    h.found_inf = &zero;
    h.unscale_grads = 0;  // the reference below reads the grads
    std::vector<mixprec_opt_tensor> list;
    for (Param &q : ps) list.push_back(q.desc(true));
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

struct Bad {
  std::string name;
  mixprec_status want;
  std::function<void(std::vector<mixprec_opt_tensor> &, mixprec_sgd_params &, int64_t &)> make;
};

TEST(SGD, InvalidArgumentsWriteNothing) {
  const double kNaNd = std::numeric_limits<double>::quiet_NaN();
  const double kInfd = std::numeric_limits<double>::infinity();
  const std::vector<Bad> cases = {
      {"n < 0", MIXPREC_ERR_BAD_SIZE, [](auto &, auto &, int64_t &n) { n = -2; }},
      {"numel < 0", MIXPREC_ERR_BAD_SIZE, [](auto &l, auto &, int64_t &) { l[1].numel = -1; }},
      {"param dtype", MIXPREC_ERR_BAD_DTYPE,
       [](auto &l, auto &, int64_t &) { mpt::poke_enum(&l[1].param_dtype, 3); }},
      {"grad dtype", MIXPREC_ERR_BAD_DTYPE,
       [](auto &l, auto &, int64_t &) { mpt::poke_enum(&l[1].grad_dtype, 99); }},
      {"param NULL", MIXPREC_ERR_NULL_POINTER, [](auto &l, auto &, int64_t &) { l[1].param = nullptr; }},
      {"grad NULL", MIXPREC_ERR_NULL_POINTER, [](auto &l, auto &, int64_t &) { l[1].grad = nullptr; }},
      {"master NULL for F16", MIXPREC_ERR_NULL_POINTER,
       [](auto &l, auto &, int64_t &) { l[1].master = nullptr; }},
      {"master for F32", MIXPREC_ERR_BAD_ARGUMENT,
       [](auto &l, auto &, int64_t &) { l[2].master = l[1].master; }},
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
  };
  std::mt19937 rng(mpt::kSeed + 130);
  for (const Bad &c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<Param> ps;
    ps.emplace_back(40, MIXPREC_BF16, MIXPREC_F16, rng);
    ps.emplace_back(17, MIXPREC_F16, MIXPREC_BF16, rng);
    ps.emplace_back(9, MIXPREC_F32, MIXPREC_F32, rng);
    optim_test::fill_grads(ps, rng, 1.0f);
    for (Param &q : ps) q.step = 2.0f;
    std::vector<mixprec_opt_tensor> list;
    for (Param &q : ps) list.push_back(q.desc(true));
    mixprec_sgd_params h = mixprec_sgd_params_default();
    h.momentum = 0.9;
    int64_t n = int64_t(list.size());
    c.make(list, h, n);
    const std::vector<uint32_t> before = snapshot(ps);
    EXPECT_EQ(mixprec_sgd_step(list.data(), n, &h), c.want);
    EXPECT_TRUE(snapshot(ps) == before) << "an invalid call wrote something";
  }
  mixprec_sgd_params h = mixprec_sgd_params_default();
  EXPECT_EQ(mixprec_sgd_step(nullptr, 1, &h), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_sgd_step(nullptr, 0, nullptr), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_sgd_step(nullptr, 0, &h), MIXPREC_OK);
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
