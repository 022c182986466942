// The master-free mode of the fused optimizers: BF16 params without an FP32
// master, written back with stochastic rounding (c_ops/src/stochastic_round.h).
// Checked: the rounding itself (exact probabilities over every random word),
// that each element lands on one of the two BF16 neighbours of the FP32
// update computed from the widened param, reproducibility (seed, step,
// thread count), that updates far below BF16 resolution are kept on average
// where nearest-even rounding loses them, skipped steps, and that F16 params
// still need a master.
#include <cmath>
#include <map>

#include "stochastic_round.h"
#include "test_util.h"

namespace {

using mpt::Buf;

uint16_t bf16_up(uint16_t h) { return uint16_t(h + 1); }  // next magnitude

TEST(StochasticRound, ExactValuesInfAndNaN) {
  std::mt19937 rng(mpt::kSeed);
  for (int k = 0; k < 2000; k++) {
    const uint16_t h = uint16_t(rng());
    const float x = mpt::ref_bf16_to_f32(h);
    for (uint32_t r : {0u, 0xffffffffu, 0x80000000u, uint32_t(rng())}) {
      const uint16_t got = mixprec__f32_to_bf16_sr(x, r);
      if (mpt::bf16_bits_is_nan(h)) {
        EXPECT_TRUE(mpt::bf16_bits_is_nan(got));
        EXPECT_EQ(got, uint16_t(h | 0x40u)) << "NaN must stay NaN, quieted, with its sign";
      } else {
        EXPECT_EQ(got, h) << "a BF16 value must not move";
      }
    }
  }
  // The all-ones payload NaN must not carry into the sign.
  EXPECT_EQ(mixprec__f32_to_bf16_sr(mpt::f32_from_bits(0x7fffffffu), 0xffffffffu), 0x7fffu);
  EXPECT_EQ(mixprec__f32_to_bf16_sr(INFINITY, 0xffffffffu), 0x7f80u);
  EXPECT_EQ(mixprec__f32_to_bf16_sr(-INFINITY, 0xffffffffu), 0xff80u);
}

TEST(StochasticRound, ProbabilityIsTheDistance) {
  // Over all 2^16 values of the random bits that matter, x rounds up (in
  // magnitude) exactly low16(bits(x)) times: P(up) = distance / ulp, so the
  // expectation is x itself, for both signs and across binades.
  std::mt19937 rng(mpt::kSeed + 1);
  for (int k = 0; k < 200; k++) {
    uint32_t u = uint32_t(rng());
    if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu;  // finite only
    if ((u & 0x7fff0000u) == 0x7f7f0000u) continue;           // may round to inf
    const float x = mpt::f32_from_bits(u);
    const uint16_t lo = uint16_t(u >> 16);
    int64_t up = 0;
    double mean = 0.0;
    for (uint32_t r16 = 0; r16 < 65536; r16++) {
      const uint16_t got = mixprec__f32_to_bf16_sr(x, r16 << 16);
      ASSERT_TRUE(got == lo || got == bf16_up(lo)) << std::hex << u;
      up += got != lo;
      mean += double(mpt::ref_bf16_to_f32(got));
    }
    EXPECT_EQ(up, int64_t(u & 0xffffu));
    EXPECT_NEAR(mean / 65536.0, double(x), std::fabs(double(x)) * 1e-12) << std::hex << u;
  }
}

TEST(StochasticRound, BitsDependOnEveryInput) {
  const uint32_t k0 = mixprec__sr_key(1, 0, 1.0f);
  EXPECT_NE(k0, mixprec__sr_key(2, 0, 1.0f));
  EXPECT_NE(k0, mixprec__sr_key(1ull << 40, 0, 1.0f));
  EXPECT_NE(k0, mixprec__sr_key(1, 1, 1.0f));
  EXPECT_NE(k0, mixprec__sr_key(1, 0, 2.0f));
  // The top 16 bits of consecutive elements are close to uniform.
  std::vector<int> hist(16, 0);
  for (int64_t i = 0; i < 160000; i++) hist[mixprec__sr_bits(k0, i) >> 28]++;
  for (int c : hist) EXPECT_NEAR(c, 10000, 500);
}

// A BF16 tensor with FP32 state for one optimizer.
struct SrParam {
  Buf param, grad;
  std::vector<float> m, v, master;
  float step = 0.0f;
  SrParam(int64_t n, mixprec_dtype gd, std::mt19937 &rng, float scale = 1.0f)
      : param(MIXPREC_BF16, n, n % 2 == 1), grad(gd, n, false), m(size_t(n)), v(size_t(n)) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < n; i++) {
      param.set_value(i, nd(rng) * scale);
      grad.set_value(i, nd(rng));
      m[size_t(i)] = nd(rng) * 1e-2f;
      const float s = nd(rng) * 1e-2f;
      v[size_t(i)] = s * s;
    }
  }
  mixprec_opt_tensor desc(bool with_master) {
    mixprec_opt_tensor t{};
    t.param = param.data();
    t.grad = grad.data();
    t.master = with_master ? master.data() : nullptr;
    t.exp_avg = m.data();
    t.exp_avg_sq = v.data();
    t.step = &step;
    t.numel = param.numel();
    t.param_dtype = MIXPREC_BF16;
    t.grad_dtype = grad.dtype();
    return t;
  }
  std::vector<uint16_t> bits() const {
    std::vector<uint16_t> b(size_t(param.numel()));
    for (int64_t i = 0; i < param.numel(); i++) b[size_t(i)] = uint16_t(param.raw(i));
    return b;
  }
};

// One step of `run` on master-free copies and on copies with a master equal
// to the widened param: the master-free result of each element must be one
// of the two BF16 neighbours of the master's FP32 result (the same formulas
// on the same values), and the state must be bitwise the same.
template <typename Run>
void check_neighbours(const char *what, Run run) {
  SCOPED_TRACE(what);
  std::mt19937 rng(mpt::kSeed + 7);
  std::vector<SrParam> a, b;
  for (int64_t n : {1, 7, 8, 9, 100, 4099, 70001}) {
    a.emplace_back(n, n % 3 == 0 ? MIXPREC_F32 : MIXPREC_BF16, rng);
    b.push_back(a.back());
  }
  for (SrParam &q : b) {
    q.master.resize(size_t(q.param.numel()));
    for (int64_t i = 0; i < q.param.numel(); i++) q.master[size_t(i)] = q.param.value(i);
  }
  std::vector<mixprec_opt_tensor> la, lb;
  for (SrParam &q : a) la.push_back(q.desc(false));
  for (SrParam &q : b) lb.push_back(q.desc(true));
  ASSERT_EQ(run(la), MIXPREC_OK);
  ASSERT_EQ(run(lb), MIXPREC_OK);
  int64_t moved = 0, exact = 0, total = 0;
  for (size_t j = 0; j < a.size(); j++) {
    EXPECT_EQ(a[j].step, b[j].step);
    EXPECT_TRUE(a[j].m == b[j].m);
    EXPECT_TRUE(a[j].v == b[j].v);
    for (int64_t i = 0; i < a[j].param.numel(); i++) {
      const uint32_t want = mpt::f32_bits(b[j].master[size_t(i)]);
      const uint16_t lo = uint16_t(want >> 16), got = uint16_t(a[j].param.raw(i));
      if ((want & 0xffffu) == 0) {
        EXPECT_EQ(got, lo);
        exact++;
      } else {
        EXPECT_TRUE(got == lo || got == bf16_up(lo))
            << "tensor " << j << " element " << i << std::hex << ": got 0x" << got
            << ", fp32 result 0x" << want;
      }
      moved += got != uint16_t(b[j].param.raw(i));
      total++;
    }
  }
  // Nearest-even and stochastic rounding agree on roughly half the elements
  // (for uniform fractions: 1 - E|f - round(f)| ... ~75%): they must differ
  // somewhere, or the mode is not stochastic at all.
  EXPECT_GT(moved, total / 20);
  EXPECT_LT(exact, total / 10);
}

TEST(OptimSr, AdamWLandsOnANeighbourOfTheFp32Update) {
  check_neighbours("adamw", [](std::vector<mixprec_opt_tensor> &l) {
    mixprec_adamw_params h = mixprec_adamw_params_default();
    h.lr = 1e-2;
    h.sr_seed = 99;
    return mixprec_adamw_step(l.data(), int64_t(l.size()), &h);
  });
}

TEST(OptimSr, SgdLandsOnANeighbourOfTheFp32Update) {
  check_neighbours("sgd", [](std::vector<mixprec_opt_tensor> &l) {
    mixprec_sgd_params h = mixprec_sgd_params_default();
    h.lr = 1e-2;
    h.momentum = 0.9;
    h.weight_decay = 1e-2;
    h.sr_seed = 7;
    return mixprec_sgd_step(l.data(), int64_t(l.size()), &h);
  });
}

// Runs `steps` AdamW steps on a fresh copy of one problem and returns the
// param bits.
std::vector<uint16_t> adamw_run(uint64_t seed, int steps, int threads) {
  mpt::GlobalStateGuard guard;
  if (threads) mixprec_set_num_threads(threads);
  std::mt19937 rng(mpt::kSeed + 11);
  SrParam q(300001, MIXPREC_BF16, rng);
  mixprec_opt_tensor t = q.desc(false);
  mixprec_adamw_params h = mixprec_adamw_params_default();
  h.sr_seed = seed;
  for (int s = 0; s < steps; s++) EXPECT_EQ(mixprec_adamw_step(&t, 1, &h), MIXPREC_OK);
  return q.bits();
}

TEST(OptimSr, ReproducibleAndSeeded) {
  const std::vector<uint16_t> base = adamw_run(5, 3, 0);
  EXPECT_TRUE(adamw_run(5, 3, 0) == base) << "same seed, same bits";
  EXPECT_TRUE(adamw_run(5, 3, 1) == base) << "the thread count must not matter";
  const std::vector<uint16_t> other = adamw_run(6, 3, 0);
  int64_t diff = 0;
  for (size_t i = 0; i < base.size(); i++) diff += base[i] != other[i];
  EXPECT_GT(diff, int64_t(base.size()) / 20) << "another seed must round differently";
}

TEST(OptimSr, TinyUpdatesAreKeptOnAverage) {
  // SGD, lr 1e-4, grad 1: each step moves the param by -1e-4, a fortieth of
  // BF16's spacing near 1 (2^-8). Nearest-even rounding (the BF16 param
  // updated in place) never moves; stochastic rounding drifts by the right
  // amount on average.
  const int64_t n = 8192;
  const int steps = 500;
  Buf param(MIXPREC_BF16, n, false), grad(MIXPREC_F32, n, false);
  for (int64_t i = 0; i < n; i++) {
    param.set_value(i, 0.75f);
    grad.set_value(i, 1.0f);
  }
  float step = 0.0f;
  mixprec_opt_tensor t{};
  t.param = param.data();
  t.grad = grad.data();
  t.step = &step;
  t.numel = n;
  t.param_dtype = MIXPREC_BF16;
  t.grad_dtype = MIXPREC_F32;
  mixprec_sgd_params h = mixprec_sgd_params_default();
  h.lr = 1e-4;
  h.sr_seed = 1234;
  for (int s = 0; s < steps; s++) ASSERT_EQ(mixprec_sgd_step(&t, 1, &h), MIXPREC_OK);
  double mean = 0.0;
  for (int64_t i = 0; i < n; i++) mean += double(param.value(i));
  mean /= double(n);
  const double want = 0.75 - steps * double(float(1e-4));
  EXPECT_NEAR(mean, want, 2e-4) << "stochastic rounding must keep updates on average";
  // Nearest even on the same problem: stuck at 0.75.
  const float x = 0.75f - float(1e-4);
  EXPECT_EQ(mpt::ref_bf16_to_f32(mpt::ref_f32_to_bf16(x)), 0.75f);
  EXPECT_EQ(step, float(steps));
}

TEST(OptimSr, SkippedStepWritesNothing) {
  std::mt19937 rng(mpt::kSeed + 3);
  SrParam q(1001, MIXPREC_F16, rng);
  q.step = 4.0f;
  const SrParam before = q;
  const float inf_found = 1.0f;
  mixprec_opt_tensor t = q.desc(false);
  mixprec_adamw_params h = mixprec_adamw_params_default();
  h.found_inf = &inf_found;
  ASSERT_EQ(mixprec_adamw_step(&t, 1, &h), MIXPREC_OK);
  EXPECT_TRUE(q.bits() == before.bits());
  EXPECT_TRUE(q.m == before.m && q.v == before.v);
  EXPECT_EQ(q.step, 4.0f);
}

TEST(OptimSr, F16StillNeedsAMaster) {
  Buf param(MIXPREC_F16, 4, false), grad(MIXPREC_F16, 4, false);
  std::vector<float> m(4), v(4);
  float step = 0.0f;
  mixprec_opt_tensor t{};
  t.param = param.data();
  t.grad = grad.data();
  t.exp_avg = m.data();
  t.exp_avg_sq = v.data();
  t.step = &step;
  t.numel = 4;
  t.param_dtype = MIXPREC_F16;
  t.grad_dtype = MIXPREC_F16;
  mixprec_adamw_params h = mixprec_adamw_params_default();
  EXPECT_EQ(mixprec_adamw_step(&t, 1, &h), MIXPREC_ERR_NULL_POINTER);
  mixprec_sgd_params hs = mixprec_sgd_params_default();
  EXPECT_EQ(mixprec_sgd_step(&t, 1, &hs), MIXPREC_ERR_NULL_POINTER);
}

}  // namespace
