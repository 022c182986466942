// The lean optimizer state (mixprec_state_dtype in mixprec/optim.h):
//  - param remainders: the split is a bijection (every hi with the lo values
//    that matter, every param with the remainders that matter), the param is
//    the master rounded to nearest with ties away (against an independent
//    nearest-even rounding), and training with remainders follows the
//    FP32-master mode bit for bit on every ISA (EMA, amsgrad, unscale_grads,
//    a skipped step);
//  - BF16 moments: each stored value is a BF16 neighbour of the exact new
//    moment, unbiased, reproducible, independent of the ISA;
//  - 8-bit moments: the map is the dynamic tree map (built here from its
//    definition in double), encoding picks the nearest map value, the code
//    is a non-decreasing function of the value and the vector encoders'
//    threshold search gives the scalar codes on every threshold and its
//    neighbours, a step is dequantise - the FP32 step - requantise at the
//    block's absmax;
//  - bad lean arguments return their status and write nothing.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "optim_math.h"
#include "optim_test_util.h"
#include "internal_api.h"
extern "C" {
#include "optim_common.h"
}
#include "test_util.h"

namespace {

using mpt::Buf;
using mpt::f32_bits;
using mpt::f32_from_bits;

uint16_t rne_bf16(float x) { return uint16_t(Buf::narrow(MIXPREC_BF16, x)); }
bool bf16_is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

// ---- remainders: the split ---------------------------------------------------

TEST(OptimLean, RemainderSplitIsExactAndRoundsToNearestTiesAway) {
  std::mt19937 rng(mpt::kSeed);
  std::vector<uint32_t> los = {0, 1, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff};
  for (int k = 0; k < 9; k++) los.push_back(rng() & 0xffffu);
  int64_t bad = 0;
  for (uint32_t hi = 0; hi < 0x10000u; hi++) {
    for (uint32_t lo : los) {
      const uint32_t M = (hi << 16) | lo;
      uint16_t P;
      int16_t R;
      mixprec__rem_split(f32_from_bits(M), &P, &R);
      bool ok = f32_bits(mixprec__rem_join(P, R)) == M && uint16_t(R) == lo;
      const bool nan = (M & 0x7fffffffu) > 0x7f800000u;
      if (!nan) {
        // Nearest, ties away from zero: nearest even plus one ulp of
        // magnitude exactly at a tie with an even hi.
        const uint16_t want = lo == 0x8000u && (hi & 1u) == 0 ? uint16_t(hi + 1) : rne_bf16(f32_from_bits(M));
        ok = ok && P == want;
      } else if ((hi & 0x7fffu) == 0x7f80u) {
        ok = ok && P == (lo >= 0x8000u ? (hi & 0x8000u) : hi);  // the documented signalling NaNs
      } else {
        ok = ok && bf16_is_nan(P);
      }
      if (!ok && bad++ < 5)
        ADD_FAILURE() << std::hex << "M 0x" << M << " -> P 0x" << P << " R 0x" << uint16_t(R);
    }
  }
  EXPECT_EQ(bad, 0);
  // The other direction: every param with the remainders that matter.
  const int16_t rs[] = {0, 1, 0x7fff, -32768, -1, -2, 12345, -12345};
  for (uint32_t P = 0; P < 0x10000u; P++) {
    for (int16_t R : rs) {
      uint16_t P2;
      int16_t R2;
      mixprec__rem_split(mixprec__rem_join(uint16_t(P), R), &P2, &R2);
      if ((P2 != P || R2 != R) && bad++ < 5)
        ADD_FAILURE() << std::hex << "P 0x" << P << " R 0x" << uint16_t(R) << " -> 0x" << P2;
    }
  }
  EXPECT_EQ(bad, 0);
}

// ---- a small problem both ways -----------------------------------------------

// One tensor of a step run in a given mode. Moments are FP32 vectors or raw
// bytes in their format; the param is BF16 (or F32).
struct LTensor {
  Buf param, grad;
  std::vector<float> master, m, v, vmax, ema;
  std::vector<int16_t> rem;
  std::vector<uint8_t> mq, vq;  // BF16 (2 bytes each) or Q8 codes
  std::vector<float> msc, vsc;
  mixprec_state_dtype mf = MIXPREC_STATE_F32, vf = MIXPREC_STATE_F32;
  float step = 0.0f;
  LTensor(int64_t n, mixprec_dtype pd, mixprec_dtype gd) : param(pd, n), grad(gd, n) {}
  int64_t numel() const { return param.numel(); }
  static size_t esize(mixprec_state_dtype f) {
    return f == MIXPREC_STATE_F32 ? 4 : f == MIXPREC_STATE_BF16 ? 2 : 1;
  }
  void set_formats(mixprec_state_dtype a, mixprec_state_dtype b) {
    mf = a;
    vf = b;
    const size_t n = size_t(numel()), blocks = (n + 255) / 256;
    if (a != MIXPREC_STATE_F32) mq.assign(n * esize(a), 0);
    if (b != MIXPREC_STATE_F32) vq.assign(n * esize(b), 0);
    if (a == MIXPREC_STATE_Q8) msc.assign(blocks, 0.0f);
    if (b == MIXPREC_STATE_Q8) vsc.assign(blocks, 0.0f);
  }
  mixprec_opt_tensor desc(bool amsgrad) {
    mixprec_opt_tensor t{};
    t.param = param.data();
    t.grad = grad.data();
    t.master = master.empty() ? nullptr : master.data();
    t.exp_avg_data = mf == MIXPREC_STATE_F32 ? (void *)m.data() : (void *)mq.data();
    t.exp_avg_sq_data = vf == MIXPREC_STATE_F32 ? (void *)v.data() : (void *)vq.data();
    t.max_exp_avg_sq = amsgrad ? vmax.data() : nullptr;
    t.step = &step;
    t.numel = numel();
    t.param_dtype = param.dtype();
    t.grad_dtype = grad.dtype();
    t.remainder = rem.empty() ? nullptr : rem.data();
    t.exp_avg_dtype = mf;
    t.exp_avg_sq_dtype = vf;
    t.exp_avg_scale = msc.empty() ? nullptr : msc.data();
    t.exp_avg_sq_scale = vsc.empty() ? nullptr : vsc.data();
    return t;
  }
};

// Sizes around the vector width, the Q8 block and the chunk.
const int64_t kSizes[] = {1, 7, 9, 255, 257, 4097, 65536 + 300};

std::vector<LTensor> make_list(std::mt19937 &rng, bool remainders, mixprec_dtype pd) {
  std::vector<LTensor> ps;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int k = 0;
  for (int64_t n : kSizes) {
    const mixprec_dtype gd = k % 3 == 0 ? MIXPREC_BF16 : k % 3 == 1 ? MIXPREC_F16 : MIXPREC_F32;
    k++;
    LTensor t(n, pd, gd);
    for (int64_t i = 0; i < n; i++) t.param.set_value(i, nd(rng));
    if (pd == MIXPREC_BF16) {
      if (remainders)
        t.rem.assign(size_t(n), 0);
      else
        for (int64_t i = 0; i < n; i++) t.master.push_back(t.param.value(i));
    }
    t.m.assign(size_t(n), 0.0f);
    t.v = t.vmax = t.m;
    t.ema.assign(size_t(n), 0.0f);
    for (int64_t i = 0; i < n; i++) t.ema[size_t(i)] = t.param.value(i);
    ps.push_back(std::move(t));
  }
  return ps;
}

void fill_grads(std::vector<LTensor> &ps, std::mt19937 &rng, float mult) {
  for (LTensor &t : ps) {
    mpt::fill_random(t.grad, rng, -10, 1, /*random_bits=*/false);
    for (int64_t i = 0; i < t.numel(); i++) t.grad.set_value(i, t.grad.value(i) * mult);
  }
}

// One step of AdamW or SGD over a list (EMA buffers when ema).
mixprec_status step_list(std::vector<LTensor> &ps, bool adamw, bool amsgrad, bool ema,
                         const float *scale, const float *found_inf, bool unscale, uint64_t seed) {
  std::vector<mixprec_opt_tensor> list;
  std::vector<float *> emas;
  for (LTensor &t : ps) {
    list.push_back(t.desc(amsgrad));
    emas.push_back(t.ema.data());
  }
  float *const *e = ema ? emas.data() : nullptr;
  if (adamw) {
    mixprec_adamw_params h = mixprec_adamw_params_default();
    optim_test::set_lean_step(h, scale, found_inf, unscale, seed, e);
    h.amsgrad = amsgrad;
    return mixprec_adamw_step(list.data(), int64_t(list.size()), &h);
  }
  mixprec_sgd_params h = mixprec_sgd_params_default();
  optim_test::set_lean_step(h, scale, found_inf, unscale, seed, e);
  h.momentum = 0.9;
  h.weight_decay = 1e-3;
  return mixprec_sgd_step(list.data(), int64_t(list.size()), &h);
}

// ---- remainders: training ------------------------------------------------------

struct RemCase {
  const char *name;
  bool adamw, amsgrad, ema, scale, unscale;
};

TEST(OptimLean, RemaindersFollowTheMasterModeBitForBit) {
  mpt::GlobalStateGuard guard;
  const RemCase cases[] = {{"adamw", true, false, false, false, false},
                           {"adamw amsgrad ema", true, true, true, false, false},
                           {"adamw unscale_grads", true, false, false, true, true},
                           {"sgd", false, false, false, false, false},
                           {"sgd ema unscale_grads", false, false, true, true, true}};
  for (mixprec_cpu_isa isa : mpt::supported_isas()) {
    mixprec_set_cpu_isa(isa);
    for (const RemCase &c : cases) {
      SCOPED_TRACE(std::string(c.name) + " isa " + std::to_string(int(isa)));
      std::mt19937 rng(mpt::kSeed + 7);
      std::vector<LTensor> a = make_list(rng, false, MIXPREC_BF16);
      std::mt19937 rng2(mpt::kSeed + 7);
      std::vector<LTensor> b = make_list(rng2, true, MIXPREC_BF16);
      float scale = 512.0f;
      for (int s = 0; s < 8; s++) {
        const float inf = s == 5 ? 1.0f : 0.0f;  // one skipped step
        fill_grads(a, rng, c.scale ? scale : 1.0f);
        for (size_t t = 0; t < a.size(); t++) b[t].grad = a[t].grad;
        ASSERT_EQ(step_list(a, c.adamw, c.amsgrad, c.ema, c.scale ? &scale : nullptr, &inf, c.unscale, 3), MIXPREC_OK);
        ASSERT_EQ(step_list(b, c.adamw, c.amsgrad, c.ema, c.scale ? &scale : nullptr, &inf, c.unscale, 3), MIXPREC_OK);
      }
      for (size_t t = 0; t < a.size(); t++) {
        int64_t bad = 0;
        EXPECT_EQ(f32_bits(a[t].step), f32_bits(b[t].step));
        for (int64_t i = 0; i < a[t].numel(); i++) {
          const size_t k = size_t(i);
          const float M = a[t].master[k];
          const uint16_t P = uint16_t(b[t].param.raw(i));
          const uint32_t lo = f32_bits(M) & 0xffffu, hi = f32_bits(M) >> 16;
          const uint16_t want = lo == 0x8000u && (hi & 1u) == 0 ? uint16_t(hi + 1) : uint16_t(a[t].param.raw(i));
          const bool ok = f32_bits(mixprec__rem_join(P, b[t].rem[k])) == f32_bits(M) && P == want &&
                          f32_bits(a[t].m[k]) == f32_bits(b[t].m[k]) &&
                          f32_bits(a[t].v[k]) == f32_bits(b[t].v[k]) &&
                          f32_bits(a[t].ema[k]) == f32_bits(b[t].ema[k]) &&
                          a[t].grad.raw(i) == b[t].grad.raw(i);
          if (!ok && bad++ < 3)
            ADD_FAILURE() << "tensor " << t << " element " << i << ": master " << M << " param 0x" << std::hex
                          << P << " remainder 0x" << uint16_t(b[t].rem[k]);
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

// ---- BF16 moments -------------------------------------------------------------------

uint16_t bf16_down(float x) { return uint16_t(f32_bits(x) >> 16); }  // toward zero

TEST(OptimLean, Bf16MomentsAreUnbiasedNeighboursOfTheFp32Moments) {
  mpt::GlobalStateGuard guard;
  std::vector<std::vector<uint8_t>> first_run;
  for (mixprec_cpu_isa isa : mpt::supported_isas()) {
    mixprec_set_cpu_isa(isa);
    SCOPED_TRACE("isa " + std::to_string(int(isa)));
    std::mt19937 rng(mpt::kSeed + 11);
    // A: FP32 moments set to B's BF16 moments before each step (the exact
    // moments B rounds); B: BF16 moments. F32 params, reset each step.
    std::vector<LTensor> a = make_list(rng, false, MIXPREC_F32);
    std::mt19937 rng2(mpt::kSeed + 11);
    std::vector<LTensor> b = make_list(rng2, false, MIXPREC_F32);
    for (LTensor &t : b) t.set_formats(MIXPREC_STATE_BF16, MIXPREC_STATE_BF16);
    double up_m = 0, expect_up_m = 0;
    int64_t count = 0, bad = 0;
    for (int s = 0; s < 6; s++) {
      fill_grads(a, rng, 1.0f);
      for (size_t t = 0; t < a.size(); t++) {
        b[t].grad = a[t].grad;
        for (int64_t i = 0; i < a[t].numel(); i++) {
          uint16_t hm, hv;
          std::memcpy(&hm, &b[t].mq[size_t(i) * 2], 2);
          std::memcpy(&hv, &b[t].vq[size_t(i) * 2], 2);
          a[t].m[size_t(i)] = f32_from_bits(uint32_t(hm) << 16);
          a[t].v[size_t(i)] = f32_from_bits(uint32_t(hv) << 16);
          a[t].param.set_raw(i, b[t].param.raw(i));
        }
        a[t].step = b[t].step;
      }
      ASSERT_EQ(step_list(a, true, false, false, nullptr, nullptr, false, 9), MIXPREC_OK);
      ASSERT_EQ(step_list(b, true, false, false, nullptr, nullptr, false, 9), MIXPREC_OK);
      for (size_t t = 0; t < a.size(); t++) {
        for (int64_t i = 0; i < a[t].numel(); i++) {
          const size_t k = size_t(i);
          uint16_t hm, hv;
          std::memcpy(&hm, &b[t].mq[k * 2], 2);
          std::memcpy(&hv, &b[t].vq[k * 2], 2);
          const float em = a[t].m[k], ev = a[t].v[k];
          // The update used the unrounded moments: the params agree exactly.
          bool ok = a[t].param.raw(i) == b[t].param.raw(i);
          const uint16_t dm = bf16_down(em), dv = bf16_down(ev);
          const bool exact_m = (f32_bits(em) & 0xffffu) == 0, exact_v = (f32_bits(ev) & 0xffffu) == 0;
          ok = ok && (hm == dm || (!exact_m && hm == uint16_t(dm + 1)));
          ok = ok && (hv == dv || (!exact_v && hv == uint16_t(dv + 1)));
          if (!ok && bad++ < 3)
            ADD_FAILURE() << "tensor " << t << " element " << i << ": m " << em << " -> 0x" << std::hex << hm;
          if (!exact_m) {
            up_m += hm != dm;
            expect_up_m += double(f32_bits(em) & 0xffffu) / 65536.0;
            count++;
          }
        }
      }
    }
    EXPECT_EQ(bad, 0);
    // Rounds up as often as the distance says (binomial: 5 sigma).
    const double sigma = std::sqrt(double(count) * 0.25);
    EXPECT_LT(std::fabs(up_m - expect_up_m), 5 * sigma) << up_m << " vs " << expect_up_m;
    std::vector<uint8_t> all;
    for (LTensor &t : b) all.insert(all.end(), t.mq.begin(), t.mq.end());
    first_run.push_back(all);
  }
  // The same bits on every ISA.
  for (size_t r = 1; r < first_run.size(); r++) EXPECT_TRUE(first_run[r] == first_run[0]);
}

TEST(OptimLean, Bf16MomentsReproducibleAndSeeded) {
  std::vector<uint8_t> runs[3];
  const uint64_t seeds[3] = {5, 5, 6};
  for (int r = 0; r < 3; r++) {
    std::mt19937 rng(mpt::kSeed + 13);
    std::vector<LTensor> b = make_list(rng, false, MIXPREC_F32);
    for (LTensor &t : b) t.set_formats(MIXPREC_STATE_BF16, MIXPREC_STATE_BF16);
    for (int s = 0; s < 3; s++) {
      fill_grads(b, rng, 1.0f);
      ASSERT_EQ(step_list(b, true, false, false, nullptr, nullptr, false, seeds[r]), MIXPREC_OK);
    }
    for (LTensor &t : b) runs[r].insert(runs[r].end(), t.mq.begin(), t.mq.end());
  }
  EXPECT_TRUE(runs[0] == runs[1]);
  EXPECT_FALSE(runs[0] == runs[2]);
}

// ---- 8-bit moments --------------------------------------------------------------

// bitsandbytes' / torchao's create_dynamic_map(signed, 7, 8), in double.
std::vector<double> dynamic_map(bool is_signed) {
  std::vector<double> d;
  for (int i = 0; i < 7; i++) {
    const int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    const double scale = std::pow(10.0, -6 + i);
    for (int j = 0; j + 1 < items; j++) {
      const double b0 = 0.1 + 0.9 * j / (items - 1), b1 = 0.1 + 0.9 * (j + 1) / (items - 1);
      d.push_back(scale * (b0 + b1) / 2);
      if (is_signed) d.push_back(-scale * (b0 + b1) / 2);
    }
  }
  d.push_back(0.0);
  d.push_back(1.0);
  std::sort(d.begin(), d.end());
  return d;
}

TEST(OptimLean, Q8MapIsTheDynamicTreeMapAndEncodingIsNearest) {
  for (int sg = 0; sg < 2; sg++) {
    const std::vector<double> want = dynamic_map(sg == 1);
    ASSERT_EQ(want.size(), 256u);
    std::vector<double> got;
    for (int c = 0; c < 256; c++) got.push_back(mixprec__q8_decode(uint8_t(c), sg));
    std::sort(got.begin(), got.end());
    for (int c = 0; c < 256; c++)
      EXPECT_NEAR(got[size_t(c)], want[size_t(c)], 1e-7 * std::fabs(want[size_t(c)]) + 1e-30) << c;
    // Nearest: random magnitudes, uniform and log-uniform, and the map's
    // own values and midpoints.
    std::mt19937 rng(mpt::kSeed + 17 + sg);
    std::uniform_real_distribution<double> u(0.0, 1.0), e(-9.0, 0.0);
    std::vector<float> xs;
    for (int k = 0; k < 100000; k++) xs.push_back(float(k % 2 ? u(rng) : std::pow(10.0, e(rng))));
    for (size_t c = 0; c + 1 < want.size(); c++) {
      xs.push_back(float(want[c]));
      xs.push_back(float((want[c] + want[c + 1]) / 2));
    }
    int64_t bad = 0;
    for (float x0 : xs) {
      for (int neg = 0; neg < 1 + sg; neg++) {
        const float x = neg ? -x0 : x0;
        if (x < 0 && !sg) continue;
        const double got_v = mixprec__q8_decode(mixprec__q8_encode(x, 1.0f, sg), sg);
        double best = 1e300;
        for (double w : want) best = std::min(best, std::fabs(w - double(x)));
        // (floats: the map within 1e-7 relative of the double one, x within an ulp
        // of a midpoint may go either way)
        if (std::fabs(got_v - double(x)) > best + 3e-7 * std::fabs(double(x)) + 1e-15 && bad++ < 5)
          ADD_FAILURE() << "x " << x << " -> " << got_v << ", nearest at " << best;
      }
    }
    EXPECT_EQ(bad, 0);
  }
  // Non-finite values: NaN -> 0, inf -> the largest magnitude of its sign.
  const float inf = INFINITY;
  EXPECT_EQ(mixprec__q8_decode(mixprec__q8_encode(NAN, 1.0f, 1), 1), 0.0f);
  EXPECT_EQ(mixprec__q8_decode(mixprec__q8_encode(inf, 1.0f, 0), 0), 1.0f);
  EXPECT_LT(mixprec__q8_decode(mixprec__q8_encode(-inf, 1.0f, 1), 1), -0.99f);
}

// [note: q8 thresholds] (c_ops/src/optim_common.h): the scalar code of
// y >= 0 never decreases as y grows (checked on a sweep of every float of
// [0, 1.5] at a stride, and at each threshold and its neighbours); each
// threshold is the least float of its rank; and each vector block store
// gives the scalar store's codes and scale on blocks of those values (and
// of negatives, NaN, inf and random values) at several scales.
TEST(OptimLean, Q8CodesAreMonotoneAndVectorEncodersMatchTheScalarOne) {
  for (int sg = 0; sg < 2; sg++) {
    SCOPED_TRACE(sg ? "signed" : "unsigned");
    const mixprec__q8_tabs *tb = mixprec__q8_tabs_get(sg);
    auto rank = [&](float y) {
      const int c = mixprec__q8_encode(y, 1.0f, sg);
      return sg ? (c == 0x80 ? 128 : c) : (c == 0 ? 0 : c == 1 ? 255 : c - 1);
    };
    int64_t bad = 0;
    int last = 0;
    for (uint32_t u = 0; u <= f32_bits(1.5f); u += 257) {
      const int r = rank(f32_from_bits(u));
      if (r < last && bad++ < 5) ADD_FAILURE() << "rank drops at " << f32_from_bits(u);
      last = r;
    }
    const int top = sg ? 128 : 255;
    std::vector<float> xs;
    for (int r = 1; r <= top; r++) {
      const float t = tb->thr[r];
      if (!(rank(t) >= r && rank(f32_from_bits(f32_bits(t) - 1)) < r) && bad++ < 5)
        ADD_FAILURE() << "threshold " << r << " = " << t << " is not its rank's least float";
      for (int d = -2; d <= 2; d++) xs.push_back(f32_from_bits(f32_bits(t) + uint32_t(d)));
    }
    EXPECT_EQ(bad, 0);
    std::mt19937 rng(mpt::kSeed + 41 + sg);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int k = 0; k < 3000; k++) xs.push_back(sg ? u(rng) : std::fabs(u(rng)));
    xs.push_back(NAN);
    xs.push_back(INFINITY);
    xs.push_back(0.0f);
    xs.push_back(-0.0f);
    if (sg)
      for (size_t k = 0, n = xs.size(); k < n; k += 3) xs.push_back(-xs[k]);
    struct Isa {
      mixprec_cpu_isa isa;
      mixprec__q8_store_fn store;
    };
#if defined(MIXPREC_X86)
    const Isa isas[] = {{MIXPREC_ISA_AVX2, mixprec__q8_store_block_avx2},
                        {MIXPREC_ISA_AVX512, mixprec__q8_store_block_avx512}};
#else
    const Isa isas[] = {{MIXPREC_ISA_SCALAR, mixprec__q8_store_block_scalar}};
#endif
    for (const Isa &is : isas) {
      if (!mixprec_cpu_isa_supported(is.isa)) continue;
      SCOPED_TRACE(int(is.isa));
      // Blocks of 256 (and one short block) whose absmax is the scale s:
      // at s = 1 the encoded values are the thresholds themselves.
      for (float s : {1.0f, 3.0f, 1e-4f}) {
        for (size_t b0 = 0; b0 < xs.size(); b0 += 255) {
          const int n = int(std::min<size_t>(256, xs.size() - b0 + 1));
          std::vector<float> x(static_cast<size_t>(n));
          x[0] = s;
          for (int j = 1; j < n; j++) x[size_t(j)] = xs[b0 + size_t(j) - 1] * s;
          std::vector<uint8_t> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
          float want_s = -1.0f, got_s = -2.0f;
          mixprec__q8_store_block(x.data(), n, want.data(), &want_s, sg);
          is.store(x.data(), n, got.data(), &got_s, tb, sg);
          EXPECT_EQ(f32_bits(got_s), f32_bits(want_s));
          for (int j = 0; j < n; j++)
            if (got[size_t(j)] != want[size_t(j)] && bad++ < 5)
              ADD_FAILURE() << "x " << x[size_t(j)] << " scale " << s << ": code " << int(got[size_t(j)])
                            << ", scalar " << int(want[size_t(j)]);
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// Dequantise - FP32 step - requantise: the params equal those of the FP32
// state mode started from the dequantised moments, and each new code is the
// map's nearest value to the new FP32 moment over its block's absmax.
TEST(OptimLean, Q8StepIsDequantiseUpdateRequantise) {
  mpt::GlobalStateGuard guard;
  const std::vector<double> maps[2] = {dynamic_map(false), dynamic_map(true)};
  std::vector<std::vector<uint8_t>> per_isa;
  for (mixprec_cpu_isa isa : mpt::supported_isas()) {
    mixprec_set_cpu_isa(isa);
    SCOPED_TRACE("isa " + std::to_string(int(isa)));
    for (int adamw = 0; adamw < 2; adamw++) {
      std::mt19937 rng(mpt::kSeed + 19);
      std::vector<LTensor> a = make_list(rng, false, MIXPREC_F32);
      std::mt19937 rng2(mpt::kSeed + 19);
      std::vector<LTensor> b = make_list(rng2, false, MIXPREC_F32);
      for (LTensor &t : b) t.set_formats(MIXPREC_STATE_Q8, adamw ? MIXPREC_STATE_Q8 : MIXPREC_STATE_F32);
      int64_t bad = 0;
      std::vector<uint8_t> codes;
      for (int s = 0; s < 5; s++) {
        fill_grads(a, rng, 1.0f);
        for (size_t t = 0; t < a.size(); t++) {
          b[t].grad = a[t].grad;
          a[t].step = b[t].step;
          for (int64_t i = 0; i < a[t].numel(); i++) {
            const size_t k = size_t(i);
            a[t].param.set_raw(i, b[t].param.raw(i));
            a[t].m[k] = mixprec__q8_decode(b[t].mq[k], 1) * b[t].msc[k / 256];
            if (adamw) a[t].v[k] = mixprec__q8_decode(b[t].vq[k], 0) * b[t].vsc[k / 256];
          }
        }
        ASSERT_EQ(step_list(a, adamw, false, false, nullptr, nullptr, false, 1), MIXPREC_OK);
        ASSERT_EQ(step_list(b, adamw, false, false, nullptr, nullptr, false, 1), MIXPREC_OK);
        for (size_t t = 0; t < a.size(); t++) {
          const int64_t n = a[t].numel();
          for (int64_t b0 = 0; b0 < n; b0 += 256) {
            const int64_t b1 = std::min(n, b0 + 256);
            for (int which = 0; which < (adamw ? 2 : 1); which++) {
              const std::vector<float> &x = which ? a[t].v : a[t].m;
              const std::vector<uint8_t> &q = which ? b[t].vq : b[t].mq;
              const float sc = which ? b[t].vsc[size_t(b0 / 256)] : b[t].msc[size_t(b0 / 256)];
              float mx = 0;
              for (int64_t i = b0; i < b1; i++) mx = std::max(mx, std::fabs(x[size_t(i)]));
              if (f32_bits(sc) != f32_bits(mx) && bad++ < 3) ADD_FAILURE() << "scale " << sc << " want " << mx;
              const std::vector<double> &map = maps[which ? 0 : 1];
              const float inv = mx > 0 ? 1.0f / mx : 0.0f;
              // The nearest-value search once (the other ISAs: same codes, below).
              for (int64_t i = b0; i < b1 && per_isa.empty(); i++) {
                const double y = double(x[size_t(i)] * inv);
                double best = 1e300;
                for (double w : map) best = std::min(best, std::fabs(w - y));
                const double got = mixprec__q8_decode(q[size_t(i)], !which);
                if (std::fabs(got - y) > best + 3e-7 * std::fabs(y) + 1e-15 && bad++ < 3)
                  ADD_FAILURE() << "tensor " << t << " element " << i << ": " << y << " -> " << got;
              }
            }
          }
          for (int64_t i = 0; i < a[t].numel(); i++)
            if (a[t].param.raw(i) != b[t].param.raw(i) && bad++ < 3)
              ADD_FAILURE() << "tensor " << t << " param " << i;
          codes.insert(codes.end(), b[t].mq.begin(), b[t].mq.end());
          if (adamw) codes.insert(codes.end(), b[t].vq.begin(), b[t].vq.end());
        }
      }
      EXPECT_EQ(bad, 0) << (adamw ? "adamw" : "sgd");
      if (adamw) per_isa.push_back(codes);
    }
  }
  for (size_t r = 1; r < per_isa.size(); r++) EXPECT_TRUE(per_isa[r] == per_isa[0]);
}

// ---- bad lean arguments -------------------------------------------------------------

TEST(OptimLean, BadLeanArgumentsWriteNothing) {
  struct Bad {
    const char *name;
    mixprec_status want;
    std::function<void(LTensor &)> set;
    bool adamw = true;
  };
  const Bad bads[] = {
      {"remainder on an F16 param", MIXPREC_ERR_BAD_ARGUMENT,
       [](LTensor &t) {
         t = LTensor(t.numel(), MIXPREC_F16, MIXPREC_F32);
         t.master.assign(size_t(t.numel()), 0.5f);
         t.rem.assign(size_t(t.numel()), 0);
       }},
      {"remainder on an F32 param", MIXPREC_ERR_BAD_ARGUMENT,
       [](LTensor &t) {
         t = LTensor(t.numel(), MIXPREC_F32, MIXPREC_F32);
         t.master.clear();
         t.rem.assign(size_t(t.numel()), 0);
       }},
      {"remainder beside a master", MIXPREC_ERR_BAD_ARGUMENT,
       [](LTensor &t) { t.master.assign(size_t(t.numel()), 0.5f); }},
      {"q8 exp_avg without scales", MIXPREC_ERR_NULL_POINTER,
       [](LTensor &t) {
         t.set_formats(MIXPREC_STATE_Q8, MIXPREC_STATE_F32);
         t.msc.clear();
       }},
      {"q8 exp_avg_sq without scales", MIXPREC_ERR_NULL_POINTER,
       [](LTensor &t) {
         t.set_formats(MIXPREC_STATE_F32, MIXPREC_STATE_Q8);
         t.vsc.clear();
       }},
      {"scales for a bf16 moment", MIXPREC_ERR_BAD_ARGUMENT,
       [](LTensor &t) {
         t.set_formats(MIXPREC_STATE_BF16, MIXPREC_STATE_F32);
         t.msc.assign(1, 1.0f);
       }},
      // 3: unknown to the C API, yet inside the enum's value range in C++
      // (enumerators 0..2 give 0..3): a larger value would be UB to load.
      {"unknown format", MIXPREC_ERR_BAD_DTYPE, [](LTensor &t) { t.vf = mixprec_state_dtype(3); }},
      {"sgd q8 buffer without scales", MIXPREC_ERR_NULL_POINTER,
       [](LTensor &t) {
         t.set_formats(MIXPREC_STATE_Q8, MIXPREC_STATE_F32);
         t.msc.clear();
       },
       false},
  };
  for (const Bad &c : bads) {
    SCOPED_TRACE(c.name);
    std::mt19937 rng(mpt::kSeed + 23);
    std::vector<LTensor> ps = make_list(rng, true, MIXPREC_BF16);
    fill_grads(ps, rng, 1.0f);
    c.set(ps[2]);
    const std::vector<LTensor> before = ps;
    EXPECT_EQ(step_list(ps, c.adamw, false, false, nullptr, nullptr, false, 0), c.want);
    for (size_t t = 0; t < ps.size(); t++) {
      for (int64_t i = 0; i < ps[t].numel(); i++) ASSERT_EQ(ps[t].param.raw(i), before[t].param.raw(i));
      EXPECT_TRUE(ps[t].rem == before[t].rem && ps[t].m == before[t].m && ps[t].mq == before[t].mq &&
                  ps[t].vq == before[t].vq && ps[t].step == before[t].step);
    }
  }
}

}  // namespace
