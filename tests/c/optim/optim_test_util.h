// What the AdamW and SGD C tests (test_adamw.cc, test_sgd.cc) share: the
// list of tensors they step (sizes straddling torch's body/tail split, every
// dtype pair, an empty tensor), the check of the grads a step leaves, and
// the fills. Each test's Param holds its own optimizer's state; these only
// need its `grad` and `numel()`.
#pragma once

#include <random>
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

}  // namespace optim_test
