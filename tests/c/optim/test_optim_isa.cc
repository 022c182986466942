// The fused optimizer steps on every ISA path: the same multi-step problem
// (mixed dtypes, sizes around the vector width and the 65536-element chunk,
// misaligned buffers, grads with inf and NaN of several bit patterns, NaN
// masters) is run on each supported ISA chosen by mixprec_set_cpu_isa, and
// every buffer (param, master, state, step) must be bit for bit the scalar
// path's. NaNs are compared by their bits too. The lean state
// (mixprec_state_dtype: param remainders, BF16 and 8-bit moments) is run the
// same way, its buffers (codes, scales, remainders) compared byte for byte. With unscale_grads the
// grads written back are compared the same way (every test compares the
// grads: untouched without it).
#include <functional>

#include "test_util.h"

namespace {

using mpt::Buf;

// The tensor sizes of a problem and the rotations of the dtype pairs run.
struct Shape {
  std::vector<int64_t> sizes;
  std::vector<int> rotations;
};
const Shape kSmall = {{1, 7, 8, 9, 15, 16, 17, 4097, 65536 + 13, 100003}, {0, 1, 2, 3, 4, 5, 6, 7, 8}};
// Over a million elements in all: low-precision params are written with
// non-temporal stores (MIXPREC__OPT_STREAM_MIN); the rotations give F16 and
// BF16 params with every grad dtype.
const Shape kLarge = {{600000 + 5, 500000 + 11}, {3, 7}};
const mixprec_dtype kDtypes[3] = {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16};

// How the tensors hold their params and moments: sr, master-free BF16 params
// (stochastic rounding); rem, BF16 params with remainders instead of masters;
// dm / dv, the moments' formats (SGD: dm for the momentum buffer).
struct Mode {
  bool sr = false;
  bool rem = false;
  mixprec_state_dtype dm = MIXPREC_STATE_F32, dv = MIXPREC_STATE_F32;
  bool lean() const { return rem || dm != MIXPREC_STATE_F32 || dv != MIXPREC_STATE_F32; }
};
const Mode kPlain{}, kSr{true};


// A float buffer whose data pointer is one element off the allocator's
// alignment when `misalign` is set.
struct FBuf {
  std::vector<float> store;
  size_t off = 0;
  FBuf() = default;
  FBuf(int64_t n, bool misalign) : store(size_t(n) + 1, 0.0f), off(misalign ? 1 : 0) {}
  float *data() { return store.data() + off; }
  float &operator[](int64_t i) { return store[off + size_t(i)]; }
  bool operator==(const FBuf &o) const {
    return store.size() == o.store.size() &&
           std::memcmp(store.data(), o.store.data(), store.size() * sizeof(float)) == 0;
  }
};

// A lean moment buffer: raw bytes (BF16 or Q8 codes, one element of padding
// past the end) and, for Q8, the block scales.
struct LeanBuf {
  std::vector<uint8_t> bytes;
  std::vector<float> scale;
  void init(mixprec_state_dtype d, FBuf &f, int64_t n, std::mt19937 &rng) {
    if (d == MIXPREC_STATE_BF16) {
      bytes.assign(size_t(n + 1) * 2, 0);
      for (int64_t i = 0; i < n; i++) {
        const uint16_t h = uint16_t(mpt::f32_bits(f[i]) >> 16);
        std::memcpy(&bytes[size_t(i) * 2], &h, 2);
      }
    } else if (d == MIXPREC_STATE_Q8) {
      bytes.assign(size_t(n + 1), 0);
      for (int64_t i = 0; i < n; i++) bytes[size_t(i)] = uint8_t(rng());
      scale.assign(size_t((n + 255) / 256 + 1), 0.0f);
      for (int64_t b = 0; b < (n + 255) / 256; b++)
        scale[size_t(b)] = rng() % 7 == 0 ? 0.0f : float(rng() % 1000 + 1) * 1e-6f;
    }
  }
  bool operator==(const LeanBuf &o) const { return bytes == o.bytes && scale == o.scale; }
};

struct Tensor {
  Buf param, grad;
  FBuf master, m, v, vmax;
  LeanBuf lm, lv;
  std::vector<int16_t> rem;  // one element of padding past the end
  float step = 0.0f;
  Tensor(int64_t n, mixprec_dtype pd, mixprec_dtype gd, int salt)
      : param(pd, n, (salt & 1) != 0),
        grad(gd, n, (salt & 2) != 0),
        master(pd == MIXPREC_F32 ? 0 : n, (salt & 4) != 0),
        m(n, (salt & 1) == 0),
        v(n, (salt & 2) == 0),
        vmax(n, (salt & 4) == 0) {}
  int64_t numel() const { return param.numel(); }
  // The lean buffers of `mode` (a remainder only for a BF16 param).
  void init_lean(const Mode &mode, std::mt19937 &rng) {
    if (mode.rem && param.dtype() == MIXPREC_BF16) {
      rem.assign(size_t(numel() + 1), 0);
      for (int64_t i = 0; i < numel(); i++) rem[size_t(i)] = int16_t(uint16_t(rng()));
    }
    lm.init(mode.dm, m, numel(), rng);
    lv.init(mode.dv, v, numel(), rng);
  }
  // mode.sr: BF16 params go without a master (stochastic rounding); the
  // lean state as init_lean made it.
  mixprec_opt_tensor desc(bool amsgrad, const Mode &mode) {
    const bool sr = mode.sr || !rem.empty();
    mixprec_opt_tensor t{};
    t.param = param.data();
    t.grad = grad.data();
    t.master = param.dtype() == MIXPREC_F32 || (sr && param.dtype() == MIXPREC_BF16)
                   ? nullptr
                   : master.data();
    t.exp_avg = m.data();
    t.exp_avg_sq = v.data();
    if (!rem.empty()) t.remainder = rem.data();
    if (mode.dm != MIXPREC_STATE_F32) {
      t.exp_avg_data = lm.bytes.data();
      t.exp_avg_dtype = mode.dm;
      if (mode.dm == MIXPREC_STATE_Q8) t.exp_avg_scale = lm.scale.data();
    }
    if (mode.dv != MIXPREC_STATE_F32) {
      t.exp_avg_sq_data = lv.bytes.data();
      t.exp_avg_sq_dtype = mode.dv;
      if (mode.dv == MIXPREC_STATE_Q8) t.exp_avg_sq_scale = lv.scale.data();
    }
    t.max_exp_avg_sq = amsgrad ? vmax.data() : nullptr;
    t.step = &step;
    t.numel = numel();
    t.param_dtype = param.dtype();
    t.grad_dtype = grad.dtype();
    return t;
  }
};

// NaN and inf bit patterns of each dtype: quiet, signalling, negative, with
// payloads (one with every payload bit set: a naive BF16 rounding of it would
// carry into the sign).
const uint32_t kF32Special[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u,
                                0x7fffffffu, 0x7f800000u, 0xff800000u};
const uint32_t kF16Special[] = {0x7e00u, 0xfe00u, 0x7c01u, 0xfd23u, 0x7fffu, 0x7c00u, 0xfc00u};
const uint32_t kBF16Special[] = {0x7fc0u, 0xffc0u, 0x7f81u, 0xffa3u, 0x7fffu, 0x7f80u, 0xff80u};

uint32_t special(mixprec_dtype d, std::mt19937 &rng) {
  const size_t k = rng() % 7;
  switch (d) {
    case MIXPREC_F16: return kF16Special[k];
    case MIXPREC_BF16: return kBF16Special[k];
    default: return kF32Special[k];
  }
}

// Random values with a sprinkling of inf and NaN (about 1 in 500).
void fill_grad(Buf &b, std::mt19937 &rng) {
  mpt::fill_random(b, rng, -12, 2);
  for (int64_t i = 0; i < b.numel(); i++)
    if (rng() % 500 == 0) b.set_raw(i, special(b.dtype(), rng));
}

// Each size once per rotation of the nine (param, grad) dtype pairs.
std::vector<Tensor> make_problem(const std::vector<int64_t> &sizes, int rotation, uint32_t seed,
                                 const Mode &mode) {
  std::mt19937 rng(seed);
  std::vector<Tensor> ts;
  ts.reserve(sizes.size());
  for (size_t j = 0; j < sizes.size(); j++) {
    const int pair = int(j + size_t(rotation)) % 9;
    ts.emplace_back(sizes[j], kDtypes[pair / 3], kDtypes[pair % 3], int(j) + rotation);
    Tensor &t = ts.back();
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < t.numel(); i++) {
      float x = nd(rng);
      uint32_t bits = mpt::f32_bits(x);
      // A few NaN masters, including the all-ones payload.
      if (rng() % 1000 == 0) bits = kF32Special[rng() % 5];
      x = mpt::f32_from_bits(bits);
      if (t.param.dtype() == MIXPREC_F32) {
        t.param.set_raw(i, bits);
      } else {
        t.master[i] = x;
        t.param.set_value(i, x);
      }
      // Non-zero state, as after earlier steps.
      t.m[i] = nd(rng) * 1e-3f;
      const float v = nd(rng) * 1e-4f;
      t.v[i] = v * v;
      t.vmax[i] = t.v[i] * (rng() % 2 ? 1.5f : 0.5f);
    }
    if (mode.lean()) t.init_lean(mode, rng);
  }
  return ts;
}

void expect_same(std::vector<Tensor> &got, std::vector<Tensor> &want, const std::string &what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < got.size(); j++) {
    Tensor &a = got[j], &b = want[j];
    SCOPED_TRACE(what + ": tensor " + std::to_string(j) + " n=" + std::to_string(a.numel()) + " " +
                 mpt::dtype_name(a.param.dtype()) + "/" + mpt::dtype_name(a.grad.dtype()));
    EXPECT_EQ(mpt::f32_bits(a.step), mpt::f32_bits(b.step));
    int64_t bad = 0;
    for (int64_t i = 0; i < a.numel(); i++) {
      const bool ok = a.param.raw(i) == b.param.raw(i) &&
                      (a.param.dtype() == MIXPREC_F32 ||
                       mpt::f32_bits(a.master[i]) == mpt::f32_bits(b.master[i])) &&
                      mpt::f32_bits(a.m[i]) == mpt::f32_bits(b.m[i]) &&
                      mpt::f32_bits(a.v[i]) == mpt::f32_bits(b.v[i]) &&
                      mpt::f32_bits(a.vmax[i]) == mpt::f32_bits(b.vmax[i]);
      if (!ok && bad++ < 3)
        ADD_FAILURE() << "element " << i << std::hex << ": param 0x" << a.param.raw(i) << " want 0x"
                      << b.param.raw(i) << ", m 0x" << mpt::f32_bits(a.m[i]) << " want 0x"
                      << mpt::f32_bits(b.m[i]) << ", v 0x" << mpt::f32_bits(a.v[i]) << " want 0x"
                      << mpt::f32_bits(b.v[i]) << ", vmax 0x" << mpt::f32_bits(a.vmax[i])
                      << " want 0x" << mpt::f32_bits(b.vmax[i]);
    }
    EXPECT_EQ(bad, 0);
    int64_t bad_g = 0;
    for (int64_t i = 0; i <= a.numel(); i++)  // one past the end: never written
      if (a.grad.raw(i) != b.grad.raw(i) && bad_g++ < 3)
        ADD_FAILURE() << "grad element " << i << std::hex << ": 0x" << a.grad.raw(i) << " want 0x"
                      << b.grad.raw(i);
    EXPECT_EQ(bad_g, 0);
    // Whole buffers, padding included: nothing outside [0, numel) is written.
    EXPECT_TRUE(a.m == b.m && a.v == b.v && a.vmax == b.vmax && a.master == b.master);
    EXPECT_TRUE(a.lm == b.lm) << "exp_avg (lean)";
    EXPECT_TRUE(a.lv == b.lv) << "exp_avg_sq (lean)";
    EXPECT_TRUE(a.rem == b.rem) << "remainders";
  }
}

// Runs `steps` steps of `step_fn` on the problem of `rotation` on every
// supported ISA, with the same grads, and compares with the scalar path.
using StepFn = std::function<mixprec_status(std::vector<mixprec_opt_tensor> &, int step)>;

void run_all_isas(const std::string &name, bool amsgrad, const StepFn &step_fn, uint32_t salt,
                  const Mode &mode = kPlain, const Shape &shape = kSmall) {
  SCOPED_TRACE(name);
  mpt::GlobalStateGuard guard;
  const int kSteps = 4;
  for (int rotation : shape.rotations) {
    SCOPED_TRACE("rotation " + std::to_string(rotation));
    std::vector<Tensor> want;
    bool have_want = false;
    for (mixprec_cpu_isa isa : mpt::supported_isas()) {
      ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
      ASSERT_EQ(mixprec_get_cpu_isa(), isa);
      const uint32_t seed = mpt::kSeed + salt * 131u + uint32_t(rotation);
      std::vector<Tensor> ts = make_problem(shape.sizes, rotation, seed, mode);
      std::mt19937 rng(seed ^ 0x5a5a5a5au);
      for (int s = 0; s < kSteps; s++) {
        for (Tensor &t : ts) fill_grad(t.grad, rng);
        std::vector<mixprec_opt_tensor> list;
        for (Tensor &t : ts) list.push_back(t.desc(amsgrad, mode));
        ASSERT_EQ(step_fn(list, s), MIXPREC_OK);
      }
      if (!have_want) {
        ASSERT_EQ(isa, MIXPREC_ISA_SCALAR);
        want = std::move(ts);
        have_want = true;
      } else {
        expect_same(ts, want, mpt::isa_name(isa));
      }
    }
  }
}

void run_adamw(const std::string &name, const std::function<void(mixprec_adamw_params &)> &tweak,
               bool use_scale, bool use_lr_tensor, uint32_t salt, const Mode &mode = kPlain,
               const Shape &shape = kSmall) {
  mixprec_adamw_params h = mixprec_adamw_params_default();
  if (tweak) tweak(h);
  float scale = 1024.0f, lr_t = 0.0f;
  run_all_isas(name, h.amsgrad != 0,
               [&](std::vector<mixprec_opt_tensor> &list, int s) {
                 mixprec_adamw_params q = h;
                 if (use_scale) q.grad_scale = &scale;
                 if (use_lr_tensor) {
                   lr_t = float(h.lr * (1.0 + 0.5 * std::cos(s * 0.7)));
                   q.lr_tensor = &lr_t;
                 }
                 return mixprec_adamw_step(list.data(), int64_t(list.size()), &q);
               },
               salt, mode, shape);
}

void run_sgd(const std::string &name, const std::function<void(mixprec_sgd_params &)> &tweak,
             bool use_scale, uint32_t salt, const Mode &mode = kPlain, const Shape &shape = kSmall) {
  mixprec_sgd_params h = mixprec_sgd_params_default();
  h.lr = 0.01;
  if (tweak) tweak(h);
  float scale = 512.0f;
  run_all_isas(name, false,
               [&](std::vector<mixprec_opt_tensor> &list, int) {
                 mixprec_sgd_params q = h;
                 if (use_scale) q.grad_scale = &scale;
                 return mixprec_sgd_step(list.data(), int64_t(list.size()), &q);
               },
               salt, mode, shape);
}

// The lean state on every ISA: remainders, BF16 moments (stochastically
// rounded with the element's bits) and 8-bit blockwise moments (the block
// tails of odd sizes, zero scales, random codes), each with a master, master-
// free (SR) or remainder param; the same bits on every path.
const auto BF = MIXPREC_STATE_BF16, Q8 = MIXPREC_STATE_Q8, F = MIXPREC_STATE_F32;
// Two rotations: every size still meets every dtype pair over the nine
// tensors, the Q8 block tails included (255, 257, 65536 + 13).
const Shape kLean = {{1, 7, 9, 17, 255, 257, 4097, 65536 + 13, 100003}, {0, 4}};
const Mode kLeanModes[] = {{false, true, F, F},  {false, true, BF, BF}, {false, true, Q8, Q8},
                           {false, false, Q8, BF}, {true, false, BF, Q8}, {false, false, F, Q8}};

using AdamWTweak = std::function<void(mixprec_adamw_params &)>;
using SgdTweak = std::function<void(mixprec_sgd_params &)>;
using Run = std::function<void()>;

// A case's run: run_adamw / run_sgd of these arguments.
Run adamw(const std::string &name, const AdamWTweak &tweak, bool use_scale, bool use_lr_tensor,
          uint32_t salt, const Mode &mode = kPlain, const Shape &shape = kSmall) {
  return [=] { run_adamw(name, tweak, use_scale, use_lr_tensor, salt, mode, shape); };
}
Run sgd(const std::string &name, const SgdTweak &tweak, bool use_scale, uint32_t salt,
        const Mode &mode = kPlain, const Shape &shape = kSmall) {
  return [=] { run_sgd(name, tweak, use_scale, salt, mode, shape); };
}
// A case's run over every lean mode (salts salt, salt + 1, ...; SGD with
// the mode's dm for its one buffer).
Run adamw_lean(const AdamWTweak &tweak, bool scale, uint32_t salt) {
  return [=] {
    uint32_t k = salt;
    for (const Mode &m : kLeanModes)
      run_adamw("adamw lean rem " + std::to_string(m.rem) + " sr " + std::to_string(m.sr) +
                    " dm " + std::to_string(int(m.dm)) + " dv " + std::to_string(int(m.dv)),
                tweak, scale, false, k++, m, kLean);
  };
}
Run sgd_lean(const SgdTweak &tweak, bool scale, uint32_t salt) {
  return [=] {
    uint32_t k = salt;
    for (const Mode &m0 : kLeanModes) {
      Mode m = m0;
      m.dv = F;  // SGD has one buffer
      run_sgd("sgd lean rem " + std::to_string(m.rem) + " sr " + std::to_string(m.sr) + " db " +
                  std::to_string(int(m.dm)),
              tweak, scale, k++, m, kLean);
    }
  };
}

// The cases, each the test OptimIsa.<test>, in the order they are listed.
// sr: master-free BF16 params (stochastic rounding): the random bits depend
// on the element index, not on the path, so every ISA gives the same bits.
// large: a step of over a million elements: the non-temporal stores of the
// params (with the unaligned head before the first 32-byte boundary) give
// the same bits as the scalar path, and nothing outside the tensors is
// written; with unscale_grads the grads are written beside the streamed
// params and the blocked master update.
struct IsaCase {
  const char *test;
  Run run;
};
const IsaCase kCases[] = {
    {"AdamWDefault", adamw("adamw default", nullptr, false, false, 1)},
    {"AdamWAmsgrad", adamw("adamw amsgrad", [](auto &h) { h.amsgrad = 1; }, false, false, 2)},
    {"AdamWMaximize", adamw("adamw maximize", [](auto &h) { h.maximize = 1; }, false, false, 3)},
    {"AdamWGradScale", adamw("adamw grad_scale", nullptr, true, false, 4)},
    {"AdamWOtherLerpBranchNoDecay",
     adamw("adamw beta1 0.3, wd 0",
           [](auto &h) { h.beta1 = 0.3; h.weight_decay = 0.0; }, false, false, 5)},
    {"AdamWEverything",
     adamw("adamw amsgrad maximize grad_scale lr_tensor",
           [](auto &h) { h.amsgrad = 1; h.maximize = 1; h.lr = 0.05; h.weight_decay = 0.1; h.beta2 = 0.95; h.eps = 1e-6; },
           true, true, 6)},
    {"SgdPlain", sgd("sgd plain", nullptr, false, 11)},
    {"SgdMomentum", sgd("sgd momentum", [](auto &h) { h.momentum = 0.9; }, false, 12)},
    {"SgdNesterovWeightDecay",
     sgd("sgd nesterov wd",
         [](auto &h) { h.momentum = 0.9; h.nesterov = 1; h.weight_decay = 0.01; }, false, 13)},
    {"SgdDampeningMaximizeScale",
     sgd("sgd dampening maximize grad_scale",
         [](auto &h) { h.momentum = 0.8; h.dampening = 0.3; h.weight_decay = 0.05; h.maximize = 1; },
         true, 14)},
    {"AdamWUnscaleGrads",
     adamw("adamw unscale_grads maximize amsgrad",
           [](auto &h) { h.unscale_grads = 1; h.maximize = 1; h.amsgrad = 1; }, true, false, 7)},
    {"SgdUnscaleGrads",
     sgd("sgd unscale_grads momentum maximize",
         [](auto &h) { h.unscale_grads = 1; h.momentum = 0.9; h.weight_decay = 1e-3; h.maximize = 1; },
         true, 16)},
    {"SgdWeightDecayNoMomentum", sgd("sgd wd", [](auto &h) { h.weight_decay = 0.02; }, false, 15)},
    {"AdamWLargeStepStreams",
     adamw("adamw large", [](auto &h) { h.amsgrad = 1; }, true, false, 21, kPlain, kLarge)},
    {"SgdLargeStepStreams",
     sgd("sgd large", [](auto &h) { h.momentum = 0.9; }, false, 22, kPlain, kLarge)},
    {"AdamWLargeStepStreamsUnscaleGrads",
     adamw("adamw large unscale_grads",
           [](auto &h) { h.unscale_grads = 1; }, true, false, 23, kPlain, kLarge)},
    {"SgdLargeStepStreamsUnscaleGrads",
     sgd("sgd large unscale_grads",
         [](auto &h) { h.momentum = 0.9; h.unscale_grads = 1; }, true, 24, kPlain, kLarge)},
    {"AdamWStochasticRounding",
     adamw("adamw stochastic rounding",
           [](auto &h) { h.amsgrad = 1; h.sr_seed = 0x123456789abcdefull; }, true, false, 11, kSr)},
    {"AdamWStochasticRoundingUnscaleGrads",
     adamw("adamw stochastic rounding unscale_grads",
           [](auto &h) { h.unscale_grads = 1; h.sr_seed = 7; }, true, false, 13, kSr)},
    {"SgdStochasticRoundingUnscaleGrads",
     sgd("sgd stochastic rounding unscale_grads",
         [](auto &h) { h.momentum = 0.9; h.unscale_grads = 1; h.sr_seed = 9; }, true, 14, kSr)},
    {"SgdStochasticRounding",
     sgd("sgd stochastic rounding",
         [](auto &h) { h.momentum = 0.9; h.nesterov = 1; h.weight_decay = 1e-3; h.sr_seed = 42; },
         true, 12, kSr)},
    {"AdamWLean", adamw_lean([](auto &h) { h.sr_seed = 5; }, false, 31)},
    {"AdamWLeanAmsgradMaximizeUnscaleGrads",
     adamw_lean([](auto &h) { h.amsgrad = 1; h.maximize = 1; h.unscale_grads = 1; h.beta1 = 0.3; h.sr_seed = 6; },
                true, 41)},
    {"SgdLeanMomentum",
     sgd_lean([](auto &h) { h.momentum = 0.9; h.weight_decay = 1e-3; h.sr_seed = 8; }, false, 51)},
    {"SgdLeanNesterovMaximizeUnscaleGrads",
     sgd_lean([](auto &h) { h.momentum = 0.8; h.nesterov = 1; h.maximize = 1; h.unscale_grads = 1; h.sr_seed = 10; },
              true, 61)},
};

TEST(OptimIsa, SeveralIsasToCompare) {
  // Not a failure on a CPU without AVX2, but then nothing below compares.
  if (mpt::supported_isas().size() < 2) GTEST_SKIP() << "only the scalar path on this CPU";
}

// Each case of kCases registered as OptimIsa.<test> after
// SeveralIsasToCompare (the plain ::testing::Test fixture TEST uses).
class IsaCaseTest : public ::testing::Test {
 public:
  explicit IsaCaseTest(const IsaCase &c) : c_(c) {}
  void TestBody() override { c_.run(); }

 private:
  const IsaCase &c_;
};
[[maybe_unused]] const bool kRegistered = [] {
  for (const IsaCase &c : kCases)
    ::testing::RegisterTest("OptimIsa", c.test, nullptr, nullptr, __FILE__, __LINE__,
                            [&c]() -> ::testing::Test * { return new IsaCaseTest(c); });
  return true;
}();

}  // namespace
