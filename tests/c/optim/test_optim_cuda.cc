/* mixprec_cuda_adamw_step and mixprec_cuda_sgd_step against their CPU twins,
 * bit for bit. Built only with CUDA (MIXPREC_TEST_CUDA); every test skips
 * itself when there is no device. */
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_util.h"
#include "mixprec/mixprec.h"
#include "test_util.h"

namespace {

using mpt::HaveDevice;

int ESize(mixprec_dtype d) { return d == MIXPREC_F32 ? 4 : 2; }

/* One tensor of the list. step_id: tensors with the same id share one step
 * count; -1 gives the tensor no step (SGD only). misalign: the device copies
 * of its FP32 state start one float past a 16-byte boundary (scalar path). */
struct Spec {
  mixprec_dtype pd, gd;
  int64_t numel;
  int step_id;
  bool misalign = false;
  bool no_master = false;  // BF16 only: master-free, stochastic rounding
};

struct Hyper {
  bool adamw = true;
  mixprec_adamw_params a = mixprec_adamw_params_default();
  mixprec_sgd_params s = mixprec_sgd_params_default();
  bool lr_tensor = false, grad_scale = false;
  float lr_value = 3e-3f, scale_value = 65536.0f;
};

/* Points p's scalars at scalars[0..2] ([lr, grad_scale, found_inf], host or
 * device): lr_tensor and grad_scale only where h asks for them. */
template <class P>
void PointScalars(P &p, const Hyper &h, float *scalars) {
  p.lr_tensor = h.lr_tensor ? &scalars[0] : nullptr;
  p.grad_scale = h.grad_scale ? &scalars[1] : nullptr;
  p.found_inf = &scalars[2];
}

/* Host and device copies of every buffer of a list. The device scalars are
 * [lr, grad_scale, found_inf]. */
class World {
 public:
  World(const std::vector<Spec> &specs, int n_steps_ids, uint32_t seed)
      : specs_(specs), rng_(seed) {
    const size_t n = specs.size();
    param_.resize(n);
    grad_.resize(n);
    master_.resize(n);
    m_.resize(n);
    v_.resize(n);
    vmax_.resize(n);
    d_param_.resize(n);
    d_grad_.resize(n);
    d_master_.resize(n);
    d_m_.resize(n);
    d_v_.resize(n);
    d_vmax_.resize(n);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), pos(0.0f, 1e-4f);
    for (size_t i = 0; i < n; i++) {
      const Spec &sp = specs[i];
      const int64_t k = sp.numel;
      param_[i].assign((size_t)(k * ESize(sp.pd)), 0xA5);  // poison: never read with a master
      grad_[i].assign((size_t)(k * ESize(sp.gd)), 0);
      if (sp.no_master) {
        for (int64_t j = 0; j < k; j++) {
          const uint16_t h = (uint16_t)mpt::Buf::narrow(MIXPREC_BF16, u(rng_));
          std::memcpy(&param_[i][(size_t)j * 2], &h, 2);
        }
      } else if (sp.pd == MIXPREC_F32) {
        for (int64_t j = 0; j < k; j++) {
          const float f = u(rng_);
          std::memcpy(&param_[i][(size_t)j * 4], &f, 4);
        }
      } else {
        master_[i].resize((size_t)k);
        for (auto &f : master_[i]) f = u(rng_);
      }
      m_[i].resize((size_t)k);
      v_[i].resize((size_t)k);
      vmax_[i].resize((size_t)k);
      for (int64_t j = 0; j < k; j++) {
        m_[i][(size_t)j] = 1e-3f * u(rng_);
        v_[i][(size_t)j] = pos(rng_);
        vmax_[i][(size_t)j] = v_[i][(size_t)j] + pos(rng_) * (float)(j % 2);
      }
      const int off = sp.misalign ? 1 : 0;
      d_param_[i] = (uint8_t *)Alloc(param_[i].size() + (size_t)(off * ESize(sp.pd))) +
                    off * ESize(sp.pd);
      d_grad_[i] = (uint8_t *)Alloc(grad_[i].size() + 4) + off * ESize(sp.gd);
      d_master_[i] = sp.pd == MIXPREC_F32 || sp.no_master ? nullptr : (float *)Alloc(4 * (k + 1)) + off;
      d_m_[i] = (float *)Alloc(4 * (k + 1)) + off;
      d_v_[i] = (float *)Alloc(4 * (k + 1)) + off;
      d_vmax_[i] = (float *)Alloc(4 * (k + 1)) + off;
    }
    steps_.assign((size_t)n_steps_ids, 0.0f);
    d_steps_ = (float *)Alloc(4 * (size_t)(n_steps_ids + 1));
    d_scalars_ = (float *)Alloc(16);
    Upload();
  }
  ~World() {
    for (void *p : allocs_) cudaFree(p);
  }

  /* Host and device count together (the device copy was uploaded already). */
  void SetStep(int id, float v) {
    steps_[(size_t)id] = v;
    EXPECT_EQ(cudaSuccess, cudaMemcpy(d_steps_ + id, &v, sizeof v, cudaMemcpyHostToDevice));
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
  }

  /* Fresh random gradients (times `scale`), on both sides. */
  void NewGrads(float scale) {
    for (size_t i = 0; i < specs_.size(); i++) {
      const Spec &sp = specs_[i];
      mpt::Buf b(sp.gd, sp.numel);
      mpt::fill_random(b, rng_, -20, 1, false);
      for (int64_t j = 0; j < sp.numel; j++) {
        const float g = b.value(j) * scale;
        const uint32_t bits = mpt::Buf::narrow(sp.gd, g);
        std::memcpy(&grad_[i][(size_t)(j * ESize(sp.gd))], &bits, (size_t)ESize(sp.gd));
      }
      EXPECT_EQ(cudaSuccess, cudaMemcpy(d_grad_[i], grad_[i].data(), grad_[i].size(),
                                        cudaMemcpyHostToDevice));
    }
  }

  std::vector<mixprec_opt_tensor> List(bool device) {
    std::vector<mixprec_opt_tensor> l(specs_.size());
    for (size_t i = 0; i < specs_.size(); i++) {
      const Spec &sp = specs_[i];
      mixprec_opt_tensor &t = l[i];
      t.param = device ? d_param_[i] : (void *)param_[i].data();
      t.grad = device ? (const void *)d_grad_[i] : (const void *)grad_[i].data();
      t.master = sp.pd == MIXPREC_F32 || sp.no_master ? nullptr
                 : device                           ? d_master_[i]
                                                    : master_[i].data();
      t.exp_avg = device ? d_m_[i] : m_[i].data();
      t.exp_avg_sq = device ? d_v_[i] : v_[i].data();
      t.max_exp_avg_sq = device ? d_vmax_[i] : vmax_[i].data();
      t.step = sp.step_id < 0 ? nullptr
               : device       ? d_steps_ + sp.step_id
                              : &steps_[(size_t)sp.step_id];
      t.numel = sp.numel;
      t.param_dtype = sp.pd;
      t.grad_dtype = sp.gd;
    }
    return l;
  }

  /* One step on both backends. found_inf: the value both see. */
  void Step(Hyper h, float found_inf, cudaStream_t stream, bool check_status = true) {
    float host[3] = {h.lr_value, h.scale_value, found_inf};
    ASSERT_EQ(cudaSuccess, cudaMemcpy(d_scalars_, host, sizeof host, cudaMemcpyHostToDevice));
    /* cudaMemcpy from pageable memory may return before its DMA (on the
     * legacy stream) lands, and `stream` is non-blocking: wait for it (and
     * for NewGrads/Upload's copies) before enqueuing the step. */
    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
    auto hl = List(false), dl = List(true);
    mixprec_status cs, gs;
    /* The CPU step with the host scalars, the CUDA step with the device's. */
    auto both = [&](auto params, auto cpu_step, auto cuda_step) {
      auto hp = params, dp = params;
      PointScalars(hp, h, host);
      PointScalars(dp, h, d_scalars_);
      cs = cpu_step(hl.data(), (int64_t)hl.size(), &hp);
      gs = cuda_step(dl.data(), (int64_t)dl.size(), &dp, stream);
    };
    if (h.adamw)
      both(h.a, mixprec_adamw_step, mixprec_cuda_adamw_step);
    else
      both(h.s, mixprec_sgd_step, mixprec_cuda_sgd_step);
    if (check_status) {
      EXPECT_EQ(MIXPREC_OK, cs);
      EXPECT_EQ(MIXPREC_OK, gs);
    }
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream));
    EXPECT_EQ(cudaSuccess, cudaGetLastError());
  }

  /* Device contents of every buffer, as raw bytes, in a fixed order. */
  std::vector<std::vector<uint8_t>> Snapshot() {
    std::vector<std::vector<uint8_t>> out;
    auto get = [&](const void *d, size_t bytes) {
      std::vector<uint8_t> h(bytes);
      if (bytes) EXPECT_EQ(cudaSuccess, cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
      out.push_back(std::move(h));
    };
    for (size_t i = 0; i < specs_.size(); i++) {
      const int64_t k = specs_[i].numel;
      get(d_param_[i], param_[i].size());
      get(d_grad_[i], grad_[i].size());  /* written only with unscale_grads */
      if (d_master_[i]) get(d_master_[i], (size_t)(4 * k));
      get(d_m_[i], (size_t)(4 * k));
      get(d_v_[i], (size_t)(4 * k));
      get(d_vmax_[i], (size_t)(4 * k));
    }
    get(d_steps_, steps_.size() * 4);
    return out;
  }

  /* Every device buffer equals its host twin bit for bit (a NaN matches any
   * NaN). Returns the number of mismatching elements. */
  int64_t Compare(const std::string &what) {
    int64_t bad = 0;
    auto cmp = [&](const std::string &name, mixprec_dtype d, const void *host, const void *dev,
                   int64_t k) {
      if (k == 0) return;
      std::vector<uint8_t> got((size_t)(k * ESize(d)));
      EXPECT_EQ(cudaSuccess, cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost));
      for (int64_t j = 0; j < k; j++) {
        uint32_t a = 0, b = 0;
        std::memcpy(&a, (const uint8_t *)host + j * ESize(d), (size_t)ESize(d));
        std::memcpy(&b, got.data() + j * ESize(d), (size_t)ESize(d));
        const bool ok = mpt::Buf::is_nan_bits(d, a) ? mpt::Buf::is_nan_bits(d, b) : a == b;
        if (!ok && bad++ < 8)
          ADD_FAILURE() << what << ": " << name << "[" << j << "] of " << k << " cpu 0x"
                        << std::hex << a << " cuda 0x" << b << std::dec;
      }
    };
    for (size_t i = 0; i < specs_.size(); i++) {
      const Spec &sp = specs_[i];
      const std::string t = "tensor " + std::to_string(i) + " (" + mpt::dtype_name(sp.pd) +
                            "/" + mpt::dtype_name(sp.gd) + ", " + std::to_string(sp.numel) + ")";
      cmp(t + " param", sp.pd, param_[i].data(), d_param_[i], sp.numel);
      cmp(t + " grad", sp.gd, grad_[i].data(), d_grad_[i], sp.numel);
      if (d_master_[i]) cmp(t + " master", MIXPREC_F32, master_[i].data(), d_master_[i], sp.numel);
      cmp(t + " exp_avg", MIXPREC_F32, m_[i].data(), d_m_[i], sp.numel);
      cmp(t + " exp_avg_sq", MIXPREC_F32, v_[i].data(), d_v_[i], sp.numel);
      cmp(t + " max_exp_avg_sq", MIXPREC_F32, vmax_[i].data(), d_vmax_[i], sp.numel);
    }
    cmp("steps", MIXPREC_F32, steps_.data(), d_steps_, (int64_t)steps_.size());
    return bad;
  }

  float *d_scalars() { return d_scalars_; }

 private:
  void *Alloc(size_t bytes) {
    void *p = nullptr;
    EXPECT_EQ(cudaSuccess, cudaMalloc(&p, bytes ? bytes : 16));
    allocs_.push_back(p);
    return p;
  }
  void Upload() {
    for (size_t i = 0; i < specs_.size(); i++) {
      const int64_t k = specs_[i].numel;
      auto put = [](void *d, const void *h, size_t bytes) {
        if (bytes) EXPECT_EQ(cudaSuccess, cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
      };
      put(d_param_[i], param_[i].data(), param_[i].size());
      if (d_master_[i]) put(d_master_[i], master_[i].data(), (size_t)(4 * k));
      put(d_m_[i], m_[i].data(), (size_t)(4 * k));
      put(d_v_[i], v_[i].data(), (size_t)(4 * k));
      put(d_vmax_[i], vmax_[i].data(), (size_t)(4 * k));
    }
    EXPECT_EQ(cudaSuccess, cudaMemcpy(d_steps_, steps_.data(), steps_.size() * 4,
                                      cudaMemcpyHostToDevice));
  }

  std::vector<Spec> specs_;
  std::mt19937 rng_;
  std::vector<std::vector<uint8_t>> param_, grad_;
  std::vector<std::vector<float>> master_, m_, v_, vmax_;
  std::vector<float> steps_;
  std::vector<void *> d_param_, d_grad_;
  std::vector<float *> d_master_, d_m_, d_v_, d_vmax_;
  float *d_steps_ = nullptr, *d_scalars_ = nullptr;
  std::vector<void *> allocs_;
};

/* Every param/grad dtype pair, sizes 1, 7, 4097 and 100003 spread over them,
 * some tensors sharing a step count, some with misaligned device state. */
std::vector<Spec> MixedSpecs(bool with_null_step = false) {
  const mixprec_dtype ds[3] = {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16};
  const int64_t sizes[4] = {1, 7, 4097, 100003};
  std::vector<Spec> v;
  int k = 0;
  for (mixprec_dtype pd : ds)
    for (mixprec_dtype gd : ds) {
      for (int s = 0; s < 2; s++) {
        Spec sp{pd, gd, sizes[(k + s) % 4], k % 5, false};
        sp.misalign = (k % 4) == 3 && s == 1;
        if (with_null_step && k % 3 == 2) sp.step_id = -1;
        v.push_back(sp);
      }
      k++;
    }
  v.push_back(Spec{MIXPREC_BF16, MIXPREC_BF16, 0, 4, false});  // empty, still counts its step
  return v;
}

class OptimCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  /* 20 steps of h over the mixed list, then every buffer compared. */
  void Run(const Hyper &h, const std::string &what, uint32_t salt, bool null_steps = false) {
    World w(MixedSpecs(null_steps), 5, mpt::kSeed + salt);
    for (int step = 0; step < 20; step++) {
      w.NewGrads(h.grad_scale ? h.scale_value : 1.0f);
      Hyper hs = h;
      if (!h.adamw && null_steps) hs.s.first_step = step == 0;
      w.Step(hs, 0.0f, stream_);
    }
    EXPECT_EQ(0, w.Compare(what)) << what;
  }

  cudaStream_t stream_ = nullptr;
};

TEST_F(OptimCuda, AdamWMatchesCpu) {
  struct V {
    const char *name;
    void (*set)(Hyper &);
  };
  const V variants[] = {
      {"default", [](Hyper &) {}},
      {"amsgrad", [](Hyper &h) { h.a.amsgrad = 1; }},
      {"maximize", [](Hyper &h) { h.a.maximize = 1; }},
      {"grad_scale", [](Hyper &h) { h.grad_scale = true; }},
      {"lr_tensor", [](Hyper &h) { h.lr_tensor = true; h.a.lr = NAN; }},
      {"no_wd_small_beta1", [](Hyper &h) { h.a.weight_decay = 0.0; h.a.beta1 = 0.3; }},
      {"all", [](Hyper &h) {
         h.a.amsgrad = 1; h.a.maximize = 1; h.grad_scale = true; h.lr_tensor = true;
         h.a.beta2 = 0.95; h.a.eps = 1e-6; h.a.weight_decay = 0.1;
       }},
      /* The grads written back (Compare includes them) equal the CPU's. */
      {"unscale_grads", [](Hyper &h) {
         h.a.unscale_grads = 1; h.a.maximize = 1; h.a.amsgrad = 1; h.grad_scale = true;
       }},
      {"unscale_grads_no_scale", [](Hyper &h) { h.a.unscale_grads = 1; }},
  };
  uint32_t salt = 100;
  for (const V &v : variants) {
    Hyper h;
    h.adamw = true;
    h.a.lr = 1e-2;
    v.set(h);
    Run(h, std::string("AdamW ") + v.name, salt++);
  }
}

/* Master-free BF16 params: the stochastic rounding hashes (seed, tensor
 * index in the whole list, step count, element index), so the GPU must give
 * the CPU's bits, across groups of one call (ListLongerThanOneGroup covers
 * the group offsets with masters; here 21 x 19 = 399 tensors span two
 * launch groups of at most 384). */
TEST_F(OptimCuda, StochasticRoundingMatchesCpu) {
  std::vector<Spec> specs = MixedSpecs();
  for (int r = 0; r < 20; r++)
    for (const Spec &sp : MixedSpecs()) specs.push_back(sp);
  for (Spec &sp : specs)
    if (sp.pd == MIXPREC_BF16) sp.no_master = true;
  for (int variant = 0; variant < 2; variant++) {
    World w(specs, 5, mpt::kSeed + 300 + variant);
    Hyper h;
    h.adamw = variant == 0;
    h.a.lr = 1e-2;
    h.a.amsgrad = 1;
    h.a.sr_seed = 0xfeedfacecafebeefull;
    h.s.lr = 1e-2;
    h.s.momentum = 0.9;
    h.s.sr_seed = 77;
    h.grad_scale = true;
    h.a.unscale_grads = h.s.unscale_grads = 1;
    for (int step = 0; step < 8; step++) {
      w.NewGrads(h.scale_value);
      w.Step(h, 0.0f, stream_);
    }
    EXPECT_EQ(0, w.Compare(variant == 0 ? "AdamW stochastic rounding" : "SGD stochastic rounding"));
  }
}

TEST_F(OptimCuda, SgdMatchesCpu) {
  struct V {
    const char *name;
    void (*set)(Hyper &);
  };
  const V variants[] = {
      {"plain", [](Hyper &) {}},
      {"momentum", [](Hyper &h) { h.s.momentum = 0.9; }},
      {"nesterov", [](Hyper &h) { h.s.momentum = 0.9; h.s.nesterov = 1; }},
      {"dampening_wd", [](Hyper &h) { h.s.momentum = 0.8; h.s.dampening = 0.1; h.s.weight_decay = 1e-4; }},
      {"wd_maximize_scale_lr", [](Hyper &h) {
         h.s.momentum = 0.9; h.s.weight_decay = 5e-4; h.s.maximize = 1; h.grad_scale = true;
         h.lr_tensor = true; h.s.lr = -1.0;
       }},
      {"unscale_grads", [](Hyper &h) {
         h.s.momentum = 0.9; h.s.maximize = 1; h.grad_scale = true; h.s.unscale_grads = 1;
       }},
  };
  uint32_t salt = 200;
  for (const V &v : variants) {
    Hyper h;
    h.adamw = false;
    h.s.lr = 0.05;
    v.set(h);
    Run(h, std::string("SGD ") + v.name, salt++);
    Run(h, std::string("SGD (some steps NULL) ") + v.name, salt++, true);
  }
}

/* found_inf 1, NaN, 2 and inf skip the step: every device buffer (grads
 * too, with unscale_grads set), step counts included, stays bit for bit as
 * it was; -0 does not skip. */
TEST_F(OptimCuda, SkippedStepWritesNothing) {
  for (int adamw = 0; adamw < 2; adamw++) {
    World w(MixedSpecs(!adamw), 5, mpt::kSeed + 300 + adamw);
    Hyper h;
    h.adamw = adamw != 0;
    h.s.momentum = 0.9;
    h.a.amsgrad = 1;
    h.grad_scale = true;
    h.a.unscale_grads = h.s.unscale_grads = 1; /* a skipped step writes no grad either */
    w.NewGrads(h.scale_value);
    w.Step(h, 0.0f, stream_);  // a real step first, so buffers are not fresh
    w.NewGrads(h.scale_value);
    for (float f : {1.0f, NAN, 2.0f, INFINITY, -1.0f}) {
      const auto before = w.Snapshot();
      w.Step(h, f, stream_);
      EXPECT_TRUE(before == w.Snapshot()) << (adamw ? "AdamW" : "SGD") << " found_inf " << f;
    }
    w.Step(h, -0.0f, stream_);  // not a skip
    EXPECT_EQ(0, w.Compare(adamw ? "AdamW after skips" : "SGD after skips"));
  }
}

/* A list longer than one launch group (groups of at most 384 tensors), with
 * a step count shared by tensors of different groups: it must be read by all
 * before it is advanced, and advanced once. */
TEST_F(OptimCuda, ListLongerThanOneGroup) {
  std::mt19937 rng(mpt::kSeed + 400);
  const mixprec_dtype ds[3] = {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16};
  std::vector<Spec> specs;
  for (int i = 0; i < 1000; i++) {
    Spec sp{ds[rng() % 3], ds[rng() % 3], (int64_t)(rng() % 300), i % 7 == 0 ? 0 : 1 + i % 40,
            (i % 11) == 5};
    specs.push_back(sp);
  }
  for (int adamw = 0; adamw < 2; adamw++) {
    World w(specs, 41, mpt::kSeed + 401 + adamw);
    w.SetStep(3, 7.0f);
    Hyper h;
    h.adamw = adamw != 0;
    h.s.momentum = 0.9;
    h.s.nesterov = 1;
    for (int step = 0; step < 4; step++) {
      w.NewGrads(1.0f);
      w.Step(h, 0.0f, stream_);
    }
    EXPECT_EQ(0, w.Compare(adamw ? "AdamW long list" : "SGD long list"));
  }
}

/* Captured once in a CUDA graph, replayed with new gradients and found_inf
 * values: the same results as the CPU run eagerly (no host sync inside). */
TEST_F(OptimCuda, GraphReplayMatchesCpu) {
  World w(MixedSpecs(), 5, mpt::kSeed + 500);
  Hyper h;
  h.a.amsgrad = 1;
  h.grad_scale = true;
  h.lr_tensor = true;
  auto dl = w.List(true);
  mixprec_adamw_params dp = h.a;
  dp.lr_tensor = w.d_scalars();
  dp.grad_scale = w.d_scalars() + 1;
  dp.found_inf = w.d_scalars() + 2;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  const mixprec_status st = mixprec_cuda_adamw_step(dl.data(), (int64_t)dl.size(), &dp, stream_);
  ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(stream_, &g));
  ASSERT_EQ(MIXPREC_OK, st);
  ASSERT_EQ(cudaSuccess, cudaGraphInstantiate(&exec, g, 0));
  auto hl = w.List(false);
  const float found[6] = {0.0f, 0.0f, 1.0f, 0.0f, NAN, 0.0f};
  for (int r = 0; r < 6; r++) {
    w.NewGrads(h.scale_value);
    float host[3] = {h.lr_value * (1.0f + 0.1f * (float)r), h.scale_value, found[r]};
    ASSERT_EQ(cudaSuccess, cudaMemcpy(w.d_scalars(), host, sizeof host, cudaMemcpyHostToDevice));
    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());  // legacy-stream copies vs non-blocking stream_
    ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, stream_));
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
    mixprec_adamw_params hp = h.a;
    hp.lr_tensor = &host[0];
    hp.grad_scale = &host[1];
    hp.found_inf = &host[2];
    ASSERT_EQ(MIXPREC_OK, mixprec_adamw_step(hl.data(), (int64_t)hl.size(), &hp));
  }
  EXPECT_EQ(0, w.Compare("AdamW graph replay"));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
}

/* Bad arguments: the CUDA entry points return the CPU's status and write
 * nothing. Each case breaks the host list and the device list the same way. */
TEST_F(OptimCuda, InvalidArgumentsMatchCpuAndWriteNothing) {
  std::vector<Spec> specs = {{MIXPREC_F16, MIXPREC_F32, 33, 0},
                             {MIXPREC_F32, MIXPREC_BF16, 17, 1},
                             {MIXPREC_BF16, MIXPREC_BF16, 9, 1}};
  World w(specs, 2, mpt::kSeed + 600);
  w.NewGrads(1.0f);
  const auto before = w.Snapshot();

  using Mut = void (*)(std::vector<mixprec_opt_tensor> &, mixprec_adamw_params &,
                       mixprec_sgd_params &, int64_t &);
  struct Case {
    const char *name;
    Mut mut;
    mixprec_status adamw, sgd;
  };
  const Case cases[] = {
      {"n < 0", [](auto &, auto &, auto &, int64_t &n) { n = -1; }, MIXPREC_ERR_BAD_SIZE,
       MIXPREC_ERR_BAD_SIZE},
      {"lr NaN", [](auto &, auto &a, auto &s, int64_t &) { a.lr = NAN; s.lr = NAN; },
       MIXPREC_ERR_BAD_ARGUMENT, MIXPREC_ERR_BAD_ARGUMENT},
      {"lr < 0", [](auto &, auto &a, auto &s, int64_t &) { a.lr = -1; s.lr = -1; },
       MIXPREC_ERR_BAD_ARGUMENT, MIXPREC_ERR_BAD_ARGUMENT},
      {"eps inf / momentum inf",
       [](auto &, auto &a, auto &s, int64_t &) { a.eps = INFINITY; s.momentum = INFINITY; },
       MIXPREC_ERR_BAD_ARGUMENT, MIXPREC_ERR_BAD_ARGUMENT},
      {"beta1 1 / dampening NaN",
       [](auto &, auto &a, auto &s, int64_t &) { a.beta1 = 1.0; s.dampening = NAN; },
       MIXPREC_ERR_BAD_ARGUMENT, MIXPREC_ERR_BAD_ARGUMENT},
      {"beta2 < 0 / nesterov without momentum",
       [](auto &, auto &a, auto &s, int64_t &) { a.beta2 = -0.1; s.momentum = 0; s.nesterov = 1; },
       MIXPREC_ERR_BAD_ARGUMENT, MIXPREC_ERR_BAD_ARGUMENT},
      {"wd NaN", [](auto &, auto &a, auto &s, int64_t &) { a.weight_decay = NAN; s.weight_decay = NAN; },
       MIXPREC_ERR_BAD_ARGUMENT, MIXPREC_ERR_BAD_ARGUMENT},
      {"nesterov with dampening",
       [](auto &, auto &, auto &s, int64_t &) { s.nesterov = 1; s.dampening = 0.1; }, MIXPREC_OK,
       MIXPREC_ERR_BAD_ARGUMENT},
      {"numel < 0", [](auto &l, auto &, auto &, int64_t &) { l[2].numel = -3; },
       MIXPREC_ERR_BAD_SIZE, MIXPREC_ERR_BAD_SIZE},
      {"bad param dtype", [](auto &l, auto &, auto &, int64_t &) { mpt::poke_enum(&l[1].param_dtype, 7); },
       MIXPREC_ERR_BAD_DTYPE, MIXPREC_ERR_BAD_DTYPE},
      {"bad grad dtype", [](auto &l, auto &, auto &, int64_t &) { mpt::poke_enum(&l[2].grad_dtype, 3); },
       MIXPREC_ERR_BAD_DTYPE, MIXPREC_ERR_BAD_DTYPE},
      {"master with F32 param", [](auto &l, auto &, auto &, int64_t &) { l[1].master = l[0].master; },
       MIXPREC_ERR_BAD_ARGUMENT, MIXPREC_ERR_BAD_ARGUMENT},
      {"F16 param without master", [](auto &l, auto &, auto &, int64_t &) { l[0].master = nullptr; },
       MIXPREC_ERR_NULL_POINTER, MIXPREC_ERR_NULL_POINTER},
      {"grad NULL", [](auto &l, auto &, auto &, int64_t &) { l[2].grad = nullptr; },
       MIXPREC_ERR_NULL_POINTER, MIXPREC_ERR_NULL_POINTER},
      {"step NULL", [](auto &l, auto &, auto &, int64_t &) { l[1].step = nullptr; },
       MIXPREC_ERR_NULL_POINTER, MIXPREC_OK},
      {"exp_avg NULL", [](auto &l, auto &, auto &, int64_t &) { l[0].exp_avg = nullptr; },
       MIXPREC_ERR_NULL_POINTER, MIXPREC_ERR_NULL_POINTER},
      {"amsgrad without max_exp_avg_sq",
       [](auto &l, auto &a, auto &, int64_t &) { a.amsgrad = 1; l[2].max_exp_avg_sq = nullptr; },
       MIXPREC_ERR_NULL_POINTER, MIXPREC_OK},
      {"bad tensor after a bad hyper-parameter (hyper-parameter reported)",
       [](auto &l, auto &a, auto &s, int64_t &) { l[0].numel = -1; a.lr = NAN; s.lr = NAN; },
       MIXPREC_ERR_BAD_ARGUMENT, MIXPREC_ERR_BAD_ARGUMENT},
  };
  for (const Case &c : cases) {
    for (int adamw = 0; adamw < 2; adamw++) {
      auto hl = w.List(false), dl = w.List(true);
      mixprec_adamw_params ha = mixprec_adamw_params_default(), da = ha;
      mixprec_sgd_params hs = mixprec_sgd_params_default(), ds = hs;
      hs.momentum = ds.momentum = 0.9;
      int64_t hn = (int64_t)hl.size(), dn = hn;
      c.mut(hl, ha, hs, hn);
      c.mut(dl, da, ds, dn);
      const mixprec_status want = adamw ? c.adamw : c.sgd;
      if (want == MIXPREC_OK) continue;  // not an error for this optimizer
      mixprec_status cpu, gpu;
      if (adamw) {
        cpu = mixprec_adamw_step(hl.data(), hn, &ha);
        gpu = mixprec_cuda_adamw_step(dl.data(), dn, &da, stream_);
      } else {
        cpu = mixprec_sgd_step(hl.data(), hn, &hs);
        gpu = mixprec_cuda_sgd_step(dl.data(), dn, &ds, stream_);
      }
      EXPECT_EQ(want, cpu) << c.name << (adamw ? " (AdamW CPU)" : " (SGD CPU)");
      EXPECT_EQ(cpu, gpu) << c.name << (adamw ? " (AdamW CUDA)" : " (SGD CUDA)");
    }
  }
  /* NULL params / NULL list. */
  auto dl = w.List(true);
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER, mixprec_cuda_adamw_step(dl.data(), 3, nullptr, stream_));
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER, mixprec_cuda_sgd_step(dl.data(), 3, nullptr, stream_));
  mixprec_adamw_params a = mixprec_adamw_params_default();
  mixprec_sgd_params s = mixprec_sgd_params_default();
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER, mixprec_cuda_adamw_step(nullptr, 1, &a, stream_));
  EXPECT_EQ(MIXPREC_ERR_NULL_POINTER, mixprec_cuda_sgd_step(nullptr, 1, &s, stream_));
  EXPECT_EQ(MIXPREC_OK, mixprec_cuda_adamw_step(nullptr, 0, &a, stream_));
  EXPECT_EQ(MIXPREC_OK, mixprec_cuda_sgd_step(nullptr, 0, &s, stream_));
  /* CUDA only: a buffer not aligned to its element faults on the device, so
   * it is refused (the CPU accepts it). */
  dl[1].exp_avg = (float *)((char *)dl[1].exp_avg + 2);
  EXPECT_EQ(MIXPREC_ERR_BAD_ARGUMENT, mixprec_cuda_adamw_step(dl.data(), 3, &a, stream_));

  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
  EXPECT_TRUE(before == w.Snapshot()) << "a refused call wrote to the device";
}

}  // namespace

#endif  // MIXPREC_TEST_CUDA
