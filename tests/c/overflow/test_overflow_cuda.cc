/* mixprec_cuda_overflow_check against its CPU twin, record bit for bit.
 * Built only with CUDA (MIXPREC_TEST_CUDA); every test skips itself when
 * there is no device. */
#ifdef MIXPREC_TEST_CUDA

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda_util.h"
#include "mixprec/mixprec.h"
#include "test_util.h"

namespace {

constexpr int W = MIXPREC_OVERFLOW_SLOT;

// Runs the same call on the CPU and the GPU (twice on one slot, so the GPU
// scratch must have been cleared by the first) and compares the records.
void compare(std::vector<mpt::Buf>& outs, std::vector<mpt::Buf>& ins, const char* what) {
  mpt::DeviceArena arena;
  std::vector<mixprec_tensor> ho, hi, dout, din;
  for (auto* pair : {&outs, &ins})
    for (mpt::Buf& b : *pair) {
      const size_t bytes = size_t(b.numel()) * mpt::Buf::esize(b.dtype());
      void* d = arena.Alloc(bytes);
      ASSERT_NE(d, nullptr);
      if (bytes) ASSERT_EQ(cudaMemcpy(d, b.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      (pair == &outs ? ho : hi).push_back(b.tensor());
      (pair == &outs ? dout : din).push_back({b.numel() ? d : nullptr, b.numel(), b.dtype()});
    }
  std::vector<float> cpu(3 * W, 0.0f), gpu(3 * W, -1.0f);
  cpu[2 * W + 1] = 2.0f;
  for (int rep = 0; rep < 2; rep++)
    ASSERT_EQ(mixprec_overflow_check(ho.data(), (int64_t)ho.size(), hi.data(), (int64_t)hi.size(),
                                     cpu.data(), 3, 1), MIXPREC_OK);
  std::vector<float> init(3 * W, 0.0f);
  init[2 * W + 1] = 2.0f;
  mpt::DeviceBuffer rec(init.data(), init.size() * sizeof(float));
  for (int rep = 0; rep < 2; rep++)
    ASSERT_EQ(mixprec_cuda_overflow_check(dout.data(), (int64_t)dout.size(), din.data(),
                                          (int64_t)din.size(), (float*)rec.p, 3, 1, nullptr),
              MIXPREC_OK);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  rec.to_host(gpu.data());
  for (int k = 0; k < 3 * W; k++)
    EXPECT_EQ(mpt::f32_bits(gpu[k]), mpt::f32_bits(cpu[k])) << what << " field " << k;
}

TEST(OverflowCuda, MatchesCpu) {
  if (!mpt::HaveDevice()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(mpt::kSeed + 41);
  for (mixprec_dtype dt : {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16})
    for (int bad = 0; bad < 4; bad++) {  // none, output, output + input, input only
      std::vector<mpt::Buf> outs, ins;
      outs.emplace_back(dt, 100003, true);
      outs.emplace_back(MIXPREC_BF16, 17);
      ins.emplace_back(dt, 40000);
      for (auto& b : outs) mpt::fill_random(b, rng);
      mpt::fill_random(ins[0], rng);
      const uint32_t inf = dt == MIXPREC_F32 ? 0x7f800000u : dt == MIXPREC_F16 ? 0x7c00u : 0x7f80u;
      if (bad == 1 || bad == 2) outs[0].set_raw(50001, inf);
      if (bad >= 2) ins[0].set_raw(39999, inf | 1u);
      compare(outs, ins, mpt::dtype_name(dt));
    }
}

// More than one launch's worth of tensors (256): the combine happens once.
TEST(OverflowCuda, LongListsMatchCpu) {
  if (!mpt::HaveDevice()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(mpt::kSeed + 43);
  std::vector<mpt::Buf> outs, ins;
  for (int i = 0; i < 300; i++) outs.emplace_back(i % 2 ? MIXPREC_F16 : MIXPREC_F32, 1 + i * 7);
  for (int i = 0; i < 20; i++) ins.emplace_back(MIXPREC_BF16, 100 + i);
  for (auto& b : outs) mpt::fill_random(b, rng);
  for (auto& b : ins) mpt::fill_random(b, rng);
  compare(outs, ins, "finite");
  outs[3].set_raw(2, 0x7f800000u);  // in the first launch; the combine is in the second
  compare(outs, ins, "inf in the first launch");
}

}  // namespace

#endif  // MIXPREC_TEST_CUDA
