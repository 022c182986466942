/* The lean optimizer state on CUDA (remainders, BF16 and 8-bit moments; see
 * mixprec_state_dtype) against the CPU, bit for bit: one list mixing every
 * format with every param kind, several steps (a skipped one, EMA, unscaled
 * grads written back), then every byte of every buffer compared. Built only
 * with CUDA (MIXPREC_TEST_CUDA); skips itself without a device. */
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_util.h"
#include "mixprec/mixprec.h"
#include "optim_test_util.h"
#include "test_util.h"

namespace {

struct LeanSpec {
  int64_t n;
  mixprec_dtype pd, gd;
  int kind;  // 0: master (F16/BF16) or F32 param, 1: remainder (BF16), 2: master-free (BF16)
  mixprec_state_dtype mf, vf;
};

size_t state_size(mixprec_state_dtype f) { return f == MIXPREC_STATE_F32 ? 4 : f == MIXPREC_STATE_BF16 ? 2 : 1; }

// The host buffers of one tensor, as bytes; dev holds their device copies.
struct LeanTensor {
  LeanSpec s;
  std::vector<uint8_t> param, grad, master, rem, m, v, msc, vsc, ema;
  float step = 0.0f;
  std::vector<std::unique_ptr<mpt::DeviceBuffer>> dev;
  std::vector<std::vector<uint8_t> *> host() { return {&param, &grad, &master, &rem, &m, &v, &msc, &vsc, &ema}; }
  LeanTensor(const LeanSpec &sp, std::mt19937 &rng) : s(sp) {
    const size_t n = size_t(sp.n), blocks = (n + 255) / 256;
    mpt::Buf p(sp.pd, sp.n);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < sp.n; i++) p.set_value(i, nd(rng));
    param.resize(n * (sp.pd == MIXPREC_F32 ? 4 : 2));
    if (n) std::memcpy(param.data(), p.data(), param.size());
    grad.resize(n * (sp.gd == MIXPREC_F32 ? 4 : 2));
    if (sp.pd != MIXPREC_F32 && sp.kind == 0) {
      master.resize(n * 4);
      for (int64_t i = 0; i < sp.n; i++) {
        const float f = p.value(i);
        std::memcpy(&master[size_t(i) * 4], &f, 4);
      }
    }
    if (sp.kind == 1) rem.assign(n * 2, 0);
    m.assign(n * state_size(sp.mf), 0);
    v.assign(n * state_size(sp.vf), 0);
    if (sp.mf == MIXPREC_STATE_Q8) msc.assign(blocks * 4, 0);
    if (sp.vf == MIXPREC_STATE_Q8) vsc.assign(blocks * 4, 0);
    ema = param.size() ? std::vector<uint8_t>(n * 4, 0) : std::vector<uint8_t>();
    for (auto *b : host()) dev.emplace_back(b->empty() ? nullptr : new mpt::DeviceBuffer(b->data(), b->size()));
    dev.emplace_back(new mpt::DeviceBuffer(&step, 4));
  }
  void new_grads(std::mt19937 &rng, float mult) {
    mpt::Buf g(s.gd, s.n);
    mpt::fill_random(g, rng, -10, 1, false);
    for (int64_t i = 0; i < s.n; i++) g.set_value(i, g.value(i) * mult);
    if (s.n) std::memcpy(grad.data(), g.data(), grad.size());
    if (dev[1]) ASSERT_EQ(cudaMemcpy(dev[1]->p, grad.data(), grad.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  // The descriptor over the host buffers (device: false) or their copies.
  mixprec_opt_tensor desc(bool device, bool use_v) {
    auto ptr = [&](int k) -> void * {
      std::vector<uint8_t> *b = host()[size_t(k)];
      if (b->empty()) return nullptr;
      return device ? dev[size_t(k)]->p : (void *)b->data();
    };
    mixprec_opt_tensor t{};
    t.param = ptr(0);
    t.grad = ptr(1);
    t.master = (float *)ptr(2);
    t.remainder = (int16_t *)ptr(3);
    t.exp_avg_data = ptr(4);
    t.exp_avg_sq_data = use_v ? ptr(5) : nullptr;
    t.exp_avg_scale = (float *)ptr(6);
    t.exp_avg_sq_scale = use_v ? (float *)ptr(7) : nullptr;
    t.step = device ? (float *)dev.back()->p : &step;
    t.numel = s.n;
    t.param_dtype = s.pd;
    t.grad_dtype = s.gd;
    t.exp_avg_dtype = s.mf;
    t.exp_avg_sq_dtype = use_v ? s.vf : MIXPREC_STATE_F32;
    return t;
  }
  float *ema_ptr(bool device) { return ema.empty() ? nullptr : device ? (float *)dev[8]->p : (float *)ema.data(); }
  // Mismatching bytes between the host buffers and the device copies.
  int64_t compare(const std::string &what) {
    int64_t bad = 0;
    const char *names[] = {"param", "grad", "master", "rem", "m", "v", "m scales", "v scales", "ema"};
    for (size_t k = 0; k < 9; k++) {
      std::vector<uint8_t> *b = host()[k];
      if (b->empty()) continue;
      std::vector<uint8_t> got(b->size());
      dev[k]->to_host(got.data());
      for (size_t i = 0; i < got.size(); i++)
        if (got[i] != (*b)[i] && bad++ < 3) ADD_FAILURE() << what << ": " << names[k] << " byte " << i;
    }
    float st;
    dev.back()->to_host(&st);
    if (st != step) bad++;
    return bad;
  }
};

std::vector<LeanSpec> lean_specs() {
  const mixprec_state_dtype F = MIXPREC_STATE_F32, B = MIXPREC_STATE_BF16, Q = MIXPREC_STATE_Q8;
  return {
      {257, MIXPREC_BF16, MIXPREC_BF16, 1, F, F},   {4097, MIXPREC_BF16, MIXPREC_F16, 1, Q, Q},
      {70001, MIXPREC_BF16, MIXPREC_F32, 1, B, B},  {9, MIXPREC_BF16, MIXPREC_BF16, 2, B, Q},
      {1000, MIXPREC_F32, MIXPREC_F32, 0, Q, B},    {513, MIXPREC_F16, MIXPREC_BF16, 0, Q, F},
      {16384 * 2 + 77, MIXPREC_BF16, MIXPREC_BF16, 0, F, Q}, {1, MIXPREC_BF16, MIXPREC_F16, 1, Q, Q},
  };
}

void run(bool adamw, bool ema, bool unscale, uint32_t salt) {
  if (!mpt::HaveDevice()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(mpt::kSeed + salt);
  std::vector<std::unique_ptr<LeanTensor>> ts;
  for (const LeanSpec &s : lean_specs()) ts.emplace_back(new LeanTensor(s, rng));
  float scale = 256.0f, inf = 0.0f;
  mpt::DeviceBuffer d_scale(&scale, 4), d_inf(&inf, 4);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (int s = 0; s < 6; s++) {
    inf = s == 3 ? 1.0f : 0.0f;
    ASSERT_EQ(cudaMemcpy(d_inf.p, &inf, 4, cudaMemcpyHostToDevice), cudaSuccess);
    for (auto &t : ts) t->new_grads(rng, scale);
    for (int device = 0; device < 2; device++) {
      std::vector<mixprec_opt_tensor> list;
      std::vector<float *> emas;
      for (auto &t : ts) {
        list.push_back(t->desc(device, adamw));
        emas.push_back(t->ema_ptr(device));
      }
      const float *sc = device ? (const float *)d_scale.p : &scale;
      const float *fi = device ? (const float *)d_inf.p : &inf;
      mixprec_status st;
      if (adamw) {
        mixprec_adamw_params h = mixprec_adamw_params_default();
        optim_test::set_lean_step(h, sc, fi, unscale, 77, ema ? emas.data() : nullptr);
        st = device ? mixprec_cuda_adamw_step(list.data(), int64_t(list.size()), &h, stream)
                    : mixprec_adamw_step(list.data(), int64_t(list.size()), &h);
      } else {
        mixprec_sgd_params h = mixprec_sgd_params_default();
        optim_test::set_lean_step(h, sc, fi, unscale, 77, ema ? emas.data() : nullptr);
        h.momentum = 0.9;
        h.weight_decay = 1e-3;
        st = device ? mixprec_cuda_sgd_step(list.data(), int64_t(list.size()), &h, stream)
                    : mixprec_sgd_step(list.data(), int64_t(list.size()), &h);
      }
      ASSERT_EQ(st, MIXPREC_OK);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  cudaStreamDestroy(stream);
  int64_t bad = 0;
  for (size_t t = 0; t < ts.size(); t++) bad += ts[t]->compare("tensor " + std::to_string(t));
  EXPECT_EQ(bad, 0);
}

TEST(OptimLeanCuda, AdamWMatchesCpu) { run(true, false, false, 1); }
TEST(OptimLeanCuda, AdamWEmaUnscaleMatchesCpu) { run(true, true, true, 2); }
TEST(OptimLeanCuda, SgdMatchesCpu) { run(false, false, false, 3); }
TEST(OptimLeanCuda, SgdEmaUnscaleMatchesCpu) { run(false, true, true, 4); }

}  // namespace

#endif  // MIXPREC_TEST_CUDA
