// The emulator's own checks (tests/cuda_emu/README.md): warp operations
// give CUDA's results, and each misuse it promises to catch aborts with its
// message. Built through rewrite.py like kernels/*.cu.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

namespace {

__global__ void warp_ops(int *out) {
  const int l = threadIdx.x;
  out[0 * 32 + l] = __shfl_down_sync(0xffffffffu, l, 3);
  out[1 * 32 + l] = __shfl_up_sync(0xffffffffu, l, 2, 8);
  out[2 * 32 + l] = __shfl_xor_sync(0xffffffffu, l, 5);
  out[3 * 32 + l] = __shfl_sync(0xffffffffu, l * 10, 7);
  out[4 * 32 + l] = (int)__ballot_sync(0xffffffffu, l % 3 == 0);
  out[5 * 32 + l] = (int)__match_any_sync(0xffffffffu, l / 4);
  if (l >= 20) return;
  out[6 * 32 + l] = (int)__activemask();
}

__global__ void block_or(int *out) {
  __shared__ int seen[64];
  seen[threadIdx.x] = (int)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = seen[63 - threadIdx.x] + __syncthreads_count(threadIdx.x < 10);
}

__global__ void read_unwritten(unsigned *out) {
  __shared__ unsigned never;
  out[0] = never;
}

__global__ void deadlock() {
  if (threadIdx.x < 16) (void)__shfl_sync(0xffffffffu, 1, 0);
  else __syncthreads();
}

__global__ void exited_lane() {
  if (threadIdx.x >= 16) return;
  (void)__shfl_sync(0xffffffffu, 1, 0);
}

__global__ void outside_mask() {
  if (threadIdx.x < 16) (void)__shfl_sync(0x0000ffffu, 1, 20);
}

__global__ void divergent() {
  if (threadIdx.x < 32) __syncthreads();
  else __syncthreads();
}

__global__ void __launch_bounds__(64) bounded(int *out) { out[threadIdx.x] = 1; }

__global__ void dyn(int *out) {
  extern __shared__ int buf[];
  buf[threadIdx.x] = 1;
  out[threadIdx.x] = buf[threadIdx.x];
}

struct Dev {
  void *p = nullptr;
  explicit Dev(size_t b) { EXPECT_EQ(cudaMalloc(&p, b), cudaSuccess); }
  ~Dev() { cudaFree(p); }
};

TEST(CudaEmu, WarpOperationsGiveCudaResults) {
  Dev d(7 * 32 * sizeof(int));
  warp_ops<<<1, 32>>>((int *)d.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> h(7 * 32);
  ASSERT_EQ(cudaMemcpy(h.data(), d.p, h.size() * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (int l = 0; l < 32; l++) {
    EXPECT_EQ(h[0 * 32 + l], l + 3 < 32 ? l + 3 : l) << l;
    EXPECT_EQ(h[1 * 32 + l], l % 8 >= 2 ? l - 2 : l) << l;
    EXPECT_EQ(h[2 * 32 + l], l ^ 5) << l;
    EXPECT_EQ(h[3 * 32 + l], 70) << l;
    EXPECT_EQ((unsigned)h[4 * 32 + l], ballot) << l;
    EXPECT_EQ((unsigned)h[5 * 32 + l], 0xfu << (l / 4 * 4)) << l;
    if (l < 20) EXPECT_EQ((unsigned)h[6 * 32 + l], 0xfffffu) << l;
  }
}

TEST(CudaEmu, BarriersOrderSharedMemory) {
  Dev d(64 * sizeof(int));
  block_or<<<3, 64>>>((int *)d.p);
  std::vector<int> h(64);
  ASSERT_EQ(cudaMemcpy(h.data(), d.p, h.size() * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 64; i++) EXPECT_EQ(h[i], 63 - i + 10) << i;
}

TEST(CudaEmu, UnwrittenMemoryHoldsThePattern) {
  Dev d(2 * sizeof(unsigned));
  unsigned h[2];
  read_unwritten<<<1, 32>>>((unsigned *)d.p);
  ASSERT_EQ(cudaMemcpy(h, d.p, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h[0], 0xcdcdcdcdu);  // shared memory never written
  EXPECT_EQ(h[1], 0xcdcdcdcdu);  // cudaMalloc memory never written
}

TEST(CudaEmu, LaunchLimits) {
  Dev d(1024 * sizeof(int));
  bounded<<<1, 1025>>>((int *)d.p);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  dyn<<<1, 32, 48 * 1024 + 4>>>((int *)d.p);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  dyn<<<1, 32, 128>>>((int *)d.p);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

using CudaEmuDeathTest = ::testing::Test;

TEST(CudaEmuDeathTest, MisuseAbortsWithFileAndLine) {
  EXPECT_DEATH(deadlock<<<1, 32>>>(), "deadlock in block .*test_emu.cu:[0-9]+: 16 thread");
  EXPECT_DEATH(exited_lane<<<1, 32>>>(), "test_emu.cu:[0-9]+: mask 0xffffffff names lane 16, which has exited");
  EXPECT_DEATH(outside_mask<<<1, 32>>>(), "shuffle of lane 0 reads lane 20, outside its mask");
  EXPECT_DEATH(divergent<<<1, 64>>>(), "divergent __syncthreads");
  Dev d(128 * sizeof(int));
  EXPECT_DEATH(bounded<<<1, 128>>>((int *)d.p), "exceeds the kernel's __launch_bounds__\\(64\\)");
  EXPECT_DEATH(
      {
        void *p;
        cudaMalloc(&p, 10);
        ((char *)p)[10] = 1;
        cudaFree(p);
      },
      "past the end of the 10-byte allocation");
}

}  // namespace
