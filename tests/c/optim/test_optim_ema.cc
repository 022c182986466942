// The EMA of the weights fused into mixprec_adamw_step / mixprec_sgd_step
// (mixprec_ema_params): on every ISA path the EMA equals, bit for bit, the
// reference lerp applied in this file to the FP32 weights the step wrote (the
// master, or the F32 param), for AdamW and SGD, every (param, grad) dtype
// pair, sizes around the vector width, the 65536-element chunk and the
// streaming threshold, misaligned buffers; an EMA changes no other bit; the
// interval, update_after_step and the warmup follow timm's get_decay; a
// skipped step writes nothing; bad EMA arguments are refused with nothing
// written; zero-filled params mean no EMA.
#include <cmath>
#include <functional>

#include "test_util.h"

namespace {

using mpt::Buf;

const mixprec_dtype kDtypes[3] = {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16};

struct T {
  Buf param, grad;
  std::vector<float> master, m, v, ema;
  size_t ema_off;
  float step = 0.0f;
  T(int64_t n, mixprec_dtype pd, mixprec_dtype gd, int salt)
      : param(pd, n, (salt & 1) != 0),
        grad(gd, n, (salt & 2) != 0),
        master(size_t(n)),
        m(size_t(n)),
        v(size_t(n)),
        ema(size_t(n) + 1),
        ema_off((salt & 4) ? 1 : 0) {}
  int64_t numel() const { return param.numel(); }
  float *ema_ptr() { return ema.data() + ema_off; }
  // sr: a BF16 param goes without a master.
  mixprec_opt_tensor desc(bool sr) {
    mixprec_opt_tensor t{};
    t.param = param.data();
    t.grad = grad.data();
    t.master = param.dtype() == MIXPREC_F32 || (sr && param.dtype() == MIXPREC_BF16) ? nullptr
                                                                                     : master.data();
    t.exp_avg = m.data();
    t.exp_avg_sq = v.data();
    t.step = &step;
    t.numel = numel();
    t.param_dtype = param.dtype();
    t.grad_dtype = grad.dtype();
    return t;
  }
  // The FP32 weights after a step (the EMA's input when there is a master
  // or the param is F32).
  float weight(int64_t i) const {
    return param.dtype() == MIXPREC_F32 ? param.value(i) : master[size_t(i)];
  }
};

std::vector<T> make(const std::vector<int64_t> &sizes, int rotation, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<T> ts;
  ts.reserve(sizes.size());
  for (size_t j = 0; j < sizes.size(); j++) {
    const int pair = int(j + size_t(rotation)) % 9;
    ts.emplace_back(sizes[j], kDtypes[pair / 3], kDtypes[pair % 3], int(j) + rotation);
    T &t = ts.back();
    for (int64_t i = 0; i < t.numel(); i++) {
      const float x = nd(rng);
      t.master[size_t(i)] = x;
      t.param.set_value(i, x);
      t.ema_ptr()[i] = x + nd(rng) * 0.1f;
    }
  }
  return ts;
}

void fill_grads(std::vector<T> &ts, std::mt19937 &rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (T &t : ts)
    for (int64_t i = 0; i < t.numel(); i++) t.grad.set_value(i, nd(rng));
}

// timm ModelEmaV3.get_decay(step), and the EMA's lerp as the header states.
double timm_decay(double step, const mixprec_ema_params &e) {
  const double s = std::max(0.0, step - double(e.update_after_step) - 1.0);
  if (s <= 0.0) return 0.0;
  if (!e.use_warmup) return e.decay;
  double d = 1.0 - std::pow(1.0 + s / e.warmup_gamma, -e.warmup_power);
  return std::max(std::min(d, e.decay), e.min_decay);
}
float ref_lerp(float e, float p, float w) {
  const float d = p - e;
  return std::fabs(w) < 0.5f ? std::fmaf(w, d, e) : std::fmaf(w - 1.0f, d, p);
}

mixprec_ema_params ema_cfg(int k) {
  mixprec_ema_params e = mixprec_adamw_params_default().ema;
  switch (k) {
    case 0: e.decay = 0.9; break;
    case 1: e.decay = 0.99; e.update_every = 3; e.update_after_step = 2; break;
    default:
      e.decay = 0.999; e.use_warmup = 1; e.warmup_gamma = 2.0; e.warmup_power = 0.75; e.min_decay = 0.2;
      break;
  }
  return e;
}

using StepFn = std::function<mixprec_status(std::vector<mixprec_opt_tensor> &, const mixprec_ema_params &)>;

mixprec_status adamw(std::vector<mixprec_opt_tensor> &l, const mixprec_ema_params &e) {
  mixprec_adamw_params p = mixprec_adamw_params_default();
  p.lr = 1e-2;
  p.ema = e;
  return mixprec_adamw_step(l.data(), int64_t(l.size()), &p);
}
mixprec_status sgd(std::vector<mixprec_opt_tensor> &l, const mixprec_ema_params &e) {
  mixprec_sgd_params p = mixprec_sgd_params_default();
  p.lr = 1e-2;
  p.momentum = 0.9;
  p.weight_decay = 1e-3;
  p.ema = e;
  return mixprec_sgd_step(l.data(), int64_t(l.size()), &p);
}

// Runs `steps` steps with and without the EMA on every ISA; checks the EMA
// against the reference lerp of the weights, every other buffer against the
// EMA-free run, and every ISA against the scalar one.
void run(const StepFn &fn, int cfg, bool sr, const std::vector<int64_t> &sizes,
         const std::vector<int> &rotations) {
  mpt::GlobalStateGuard guard;
  const mixprec_ema_params base = ema_cfg(cfg);
  const int kSteps = 6;
  for (int rotation : rotations) {
    SCOPED_TRACE("rotation " + std::to_string(rotation) + " cfg " + std::to_string(cfg));
    std::vector<std::vector<float>> scalar_ema;
    for (mixprec_cpu_isa isa : mpt::supported_isas()) {
      SCOPED_TRACE(mpt::isa_name(isa));
      ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
      const uint32_t seed = mpt::kSeed + uint32_t(rotation) * 7u + uint32_t(cfg);
      std::vector<T> on = make(sizes, rotation, seed), off = make(sizes, rotation, seed);
      std::vector<std::vector<float>> want(on.size());
      for (size_t j = 0; j < on.size(); j++) want[j].assign(on[j].ema_ptr(), on[j].ema_ptr() + on[j].numel());
      std::mt19937 rng(seed ^ 0x1234u), rng2(seed ^ 0x1234u);
      for (int s = 1; s <= kSteps; s++) {
        fill_grads(on, rng);
        fill_grads(off, rng2);
        std::vector<mixprec_opt_tensor> lon, loff;
        std::vector<float *> bufs;
        for (T &t : on) {
          lon.push_back(t.desc(sr));
          bufs.push_back(t.ema_ptr());
        }
        for (T &t : off) loff.push_back(t.desc(sr));
        mixprec_ema_params e = base;
        e.bufs = bufs.data();
        ASSERT_EQ(fn(lon, e), MIXPREC_OK);
        mixprec_ema_params none = base;
        none.bufs = nullptr;
        ASSERT_EQ(fn(loff, none), MIXPREC_OK);
        const bool update = base.update_every <= 1 || s % base.update_every == 0;
        const float w = float(1.0 - timm_decay(double(s), base));
        for (size_t j = 0; j < on.size() && update && !sr; j++)
          for (int64_t i = 0; i < on[j].numel(); i++)
            want[j][size_t(i)] = ref_lerp(want[j][size_t(i)], on[j].weight(i), w);
      }
      for (size_t j = 0; j < on.size(); j++) {
        T &a = on[j], &b = off[j];
        SCOPED_TRACE("tensor " + std::to_string(j) + " n=" + std::to_string(a.numel()) + " " +
                     mpt::dtype_name(a.param.dtype()) + "/" + mpt::dtype_name(a.grad.dtype()));
        int64_t bad = 0, bad_ema = 0;
        for (int64_t i = 0; i < a.numel(); i++) {
          const size_t u = size_t(i);
          if (a.param.raw(i) != b.param.raw(i) || mpt::f32_bits(a.master[u]) != mpt::f32_bits(b.master[u]) ||
              mpt::f32_bits(a.m[u]) != mpt::f32_bits(b.m[u]) || mpt::f32_bits(a.v[u]) != mpt::f32_bits(b.v[u]))
            bad++;
          if (!sr && mpt::f32_bits(a.ema_ptr()[i]) != mpt::f32_bits(want[j][u]) && bad_ema++ < 3)
            ADD_FAILURE() << "ema element " << i << ": " << a.ema_ptr()[i] << " want " << want[j][u];
        }
        EXPECT_EQ(bad, 0) << "the EMA changed other bits";
        EXPECT_EQ(bad_ema, 0);
        EXPECT_EQ(a.step, b.step);
        // Nothing outside [0, numel) of the EMA buffer is written.
        const size_t pad = a.ema_off ? 0 : size_t(a.numel());
        EXPECT_EQ(mpt::f32_bits(a.ema[pad]), mpt::f32_bits(b.ema[pad]));
      }
      std::vector<std::vector<float>> got;
      for (T &t : on) got.emplace_back(t.ema_ptr(), t.ema_ptr() + t.numel());
      if (scalar_ema.empty()) {
        ASSERT_EQ(isa, MIXPREC_ISA_SCALAR);
        scalar_ema = got;
      } else {
        for (size_t j = 0; j < got.size(); j++)
          EXPECT_EQ(0, std::memcmp(got[j].data(), scalar_ema[j].data(), got[j].size() * sizeof(float)))
              << "tensor " << j << " differs from the scalar path";
      }
    }
  }
}

const std::vector<int64_t> kSizes = {1, 7, 8, 9, 17, 4097, 65536 + 13};
const std::vector<int> kRot = {0, 1, 2, 3, 4, 5, 6, 7, 8};

TEST(OptimEma, AdamWEqualsReferenceLerpOnEveryIsa) {
  run(adamw, 0, false, kSizes, kRot);
  for (int cfg = 1; cfg < 3; cfg++) run(adamw, cfg, false, kSizes, {1, 4, 7});
}

TEST(OptimEma, SgdEqualsReferenceLerpOnEveryIsa) {
  run(sgd, 0, false, kSizes, kRot);
  for (int cfg = 1; cfg < 3; cfg++) run(sgd, cfg, false, kSizes, {2, 5, 8});
}

TEST(OptimEma, StochasticRoundingModeChangesNoOtherBitAndIsaAgree) {
  run(adamw, 0, true, kSizes, {2, 5, 8});
  run(sgd, 2, true, kSizes, {2, 5, 8});
}

TEST(OptimEma, StreamingSizes) {
  // Over 2^20 elements in one step: the non-temporal store path.
  run(adamw, 0, false, {(1 << 20) + 5, 9}, {3, 7});
}

TEST(OptimEma, FirstUpdateCopiesAndWarmupFollowsTimm) {
  // update_after_step 2: steps 1..3 copy the weights exactly (decay 0).
  T t(33, MIXPREC_BF16, MIXPREC_F32, 0);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < 33; i++) {
    t.master[size_t(i)] = nd(rng);
    t.param.set_value(i, t.master[size_t(i)]);
    t.ema_ptr()[i] = 100.0f;
  }
  float *bufs[1] = {t.ema_ptr()};
  mixprec_ema_params e = ema_cfg(2);
  e.update_after_step = 2;
  e.bufs = bufs;
  for (int s = 1; s <= 6; s++) {
    for (int64_t i = 0; i < 33; i++) t.grad.set_value(i, nd(rng));
    std::vector<float> before(t.ema_ptr(), t.ema_ptr() + 33);
    std::vector<mixprec_opt_tensor> l = {t.desc(false)};
    ASSERT_EQ(adamw(l, e), MIXPREC_OK);
    const double d = timm_decay(s, e);
    if (s <= 3) EXPECT_EQ(d, 0.0);
    for (int64_t i = 0; i < 33; i++) {
      const float want = ref_lerp(before[size_t(i)], t.master[size_t(i)], float(1.0 - d));
      ASSERT_EQ(mpt::f32_bits(t.ema_ptr()[i]), mpt::f32_bits(want)) << "step " << s << " element " << i;
      if (s <= 3) ASSERT_EQ(t.ema_ptr()[i], t.master[size_t(i)]);
    }
  }
}

TEST(OptimEma, SkippedStepWritesNothing) {
  T t(100, MIXPREC_BF16, MIXPREC_BF16, 7);
  for (int64_t i = 0; i < 100; i++) {
    t.master[size_t(i)] = float(i) * 0.01f;
    t.param.set_value(i, t.master[size_t(i)]);
    t.grad.set_value(i, 1.0f);
    t.ema_ptr()[i] = -1.0f;
  }
  float *bufs[1] = {t.ema_ptr()};
  const float inf = 1.0f;
  for (int opt = 0; opt < 2; opt++) {
    std::vector<mixprec_opt_tensor> l = {t.desc(false)};
    const std::vector<float> ema0(t.ema.begin(), t.ema.end());
    mixprec_status st;
    if (opt == 0) {
      mixprec_adamw_params p = mixprec_adamw_params_default();
      p.found_inf = &inf;
      p.ema = ema_cfg(0);
      p.ema.bufs = bufs;
      st = mixprec_adamw_step(l.data(), 1, &p);
    } else {
      mixprec_sgd_params p = mixprec_sgd_params_default();
      p.found_inf = &inf;
      p.ema = ema_cfg(0);
      p.ema.bufs = bufs;
      st = mixprec_sgd_step(l.data(), 1, &p);
    }
    EXPECT_EQ(st, MIXPREC_OK);
    EXPECT_EQ(0, std::memcmp(ema0.data(), t.ema.data(), ema0.size() * sizeof(float)));
    EXPECT_EQ(t.step, 0.0f);
  }
}

TEST(OptimEma, BadArgumentsRefusedNothingWritten) {
  T t(40, MIXPREC_F32, MIXPREC_F32, 0);
  for (int64_t i = 0; i < 40; i++) {
    t.param.set_value(i, 1.0f);
    t.grad.set_value(i, 0.5f);
    t.ema_ptr()[i] = 2.0f;
  }
  float *bufs[1] = {t.ema_ptr()};
  const double nan = std::nan("");
  const std::vector<std::function<void(mixprec_ema_params &)>> bad = {
      [](mixprec_ema_params &e) { e.decay = 1.5; },
      [&](mixprec_ema_params &e) { e.decay = nan; },
      [](mixprec_ema_params &e) { e.decay = -0.1; },
      [&](mixprec_ema_params &e) { e.min_decay = nan; },
      [](mixprec_ema_params &e) { e.min_decay = 1.01; },
      [](mixprec_ema_params &e) { e.use_warmup = 1; e.warmup_gamma = 0.0; },
      [](mixprec_ema_params &e) { e.use_warmup = 1; e.warmup_power = INFINITY; },
      [&](mixprec_ema_params &e) { e.use_warmup = 1; e.warmup_power = nan; },
      [](mixprec_ema_params &e) { e.update_after_step = -1; },
      [](mixprec_ema_params &e) { e.update_every = -2; },
  };
  for (size_t k = 0; k < bad.size(); k++) {
    SCOPED_TRACE("case " + std::to_string(k));
    for (int opt = 0; opt < 2; opt++) {
      std::vector<mixprec_opt_tensor> l = {t.desc(false)};
      mixprec_ema_params e = ema_cfg(0);
      e.bufs = bufs;
      bad[k](e);
      const float step0 = t.step;
      mixprec_status st;
      if (opt == 0) {
        mixprec_adamw_params p = mixprec_adamw_params_default();
        p.ema = e;
        st = mixprec_adamw_step(l.data(), 1, &p);
      } else {
        mixprec_sgd_params p = mixprec_sgd_params_default();
        p.ema = e;
        st = mixprec_sgd_step(l.data(), 1, &p);
      }
      EXPECT_EQ(st, MIXPREC_ERR_BAD_ARGUMENT);
      for (int64_t i = 0; i < 40; i++) {
        ASSERT_EQ(t.param.value(i), 1.0f);
        ASSERT_EQ(t.ema_ptr()[i], 2.0f);
      }
      EXPECT_EQ(t.step, step0);
      // The same fields with bufs NULL are not looked at.
      e.bufs = nullptr;
      mixprec_sgd_params q = mixprec_sgd_params_default();
      q.lr = 0.0;
      q.ema = e;
      EXPECT_EQ(mixprec_sgd_step(l.data(), 1, &q), MIXPREC_OK);
    }
  }
  // SGD: a tensor with an EMA needs a step count.
  std::vector<mixprec_opt_tensor> l = {t.desc(false)};
  l[0].step = nullptr;
  mixprec_sgd_params p = mixprec_sgd_params_default();
  p.ema = ema_cfg(0);
  p.ema.bufs = bufs;
  EXPECT_EQ(mixprec_sgd_step(l.data(), 1, &p), MIXPREC_ERR_NULL_POINTER);
  // ... unless its entry is NULL (no EMA for that tensor).
  float *none[1] = {nullptr};
  p.ema.bufs = none;
  EXPECT_EQ(mixprec_sgd_step(l.data(), 1, &p), MIXPREC_OK);
  for (int64_t i = 0; i < 40; i++) ASSERT_EQ(t.ema_ptr()[i], 2.0f);
}

TEST(OptimEma, ZeroFilledEmaIsOffAndDefaultsAreTimms) {
  const mixprec_adamw_params a = mixprec_adamw_params_default();
  const mixprec_sgd_params s = mixprec_sgd_params_default();
  for (const mixprec_ema_params *e : {&a.ema, &s.ema}) {
    EXPECT_EQ(e->bufs, nullptr);
    EXPECT_EQ(e->decay, 0.9999);
    EXPECT_EQ(e->min_decay, 0.0);
    EXPECT_EQ(e->use_warmup, 0);
    EXPECT_EQ(e->warmup_gamma, 1.0);
    EXPECT_EQ(e->warmup_power, 2.0 / 3.0);
    EXPECT_EQ(e->update_after_step, 0);
    EXPECT_EQ(e->update_every, 1);
  }
  // A zero-filled struct (a caller that memsets) runs with no EMA, and an
  // EMA with update_every 0 updates every step.
  T t(20, MIXPREC_F32, MIXPREC_F32, 0);
  for (int64_t i = 0; i < 20; i++) t.grad.set_value(i, 1.0f);
  std::vector<mixprec_opt_tensor> l = {t.desc(false)};
  mixprec_adamw_params p;
  std::memset(&p, 0, sizeof p);
  p.lr = 1e-2;
  p.beta1 = 0.9;
  p.beta2 = 0.999;
  ASSERT_EQ(mixprec_adamw_step(l.data(), 1, &p), MIXPREC_OK);
  float *bufs[1] = {t.ema_ptr()};
  p.ema.bufs = bufs;
  p.ema.decay = 0.5;
  for (int k = 0; k < 2; k++) {
    std::vector<float> before(t.ema_ptr(), t.ema_ptr() + 20);
    ASSERT_EQ(mixprec_adamw_step(l.data(), 1, &p), MIXPREC_OK);
    for (int64_t i = 0; i < 20; i++)
      ASSERT_EQ(mpt::f32_bits(t.ema_ptr()[i]), mpt::f32_bits(ref_lerp(before[size_t(i)], t.param.value(i), 0.5f)));
  }
}

}  // namespace
