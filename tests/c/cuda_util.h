// What the CUDA C tests (test_*_cuda.cc) share: whether there is a device to
// run on, and device memory that is freed when it goes out of scope. Only
// built with MIXPREC_TEST_CUDA.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mixprec/mixprec.h"

namespace mpt {

// The CUDA tests skip themselves (GTEST_SKIP) without a device.
inline bool HaveDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Allocations of one test, freed together.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena &) = delete;
  DeviceArena &operator=(const DeviceArena &) = delete;
  ~DeviceArena() {
    for (void *p : ptrs_) cudaFree(p);
  }
  // nullptr when cudaMalloc fails.
  void *Alloc(size_t bytes) {
    void *p = nullptr;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return nullptr;
    ptrs_.push_back(p);
    return p;
  }

 private:
  std::vector<void *> ptrs_;
};

// One device buffer, optionally a copy of host bytes.
struct DeviceBuffer {
  void *p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t b) : bytes(b) { EXPECT_EQ(cudaMalloc(&p, b ? b : 1), cudaSuccess); }
  DeviceBuffer(const void *host, size_t b) : DeviceBuffer(b) {
    if (b) EXPECT_EQ(cudaMemcpy(p, host, b, cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  ~DeviceBuffer() { cudaFree(p); }
  void to_host(void *host) const {
    if (bytes) EXPECT_EQ(cudaMemcpy(host, p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

// Host values stored in `dt` (16-bit patterns through the library's own
// converters: the CPU entry point is the reference in these tests).
inline std::vector<uint8_t> Store(mixprec_dtype dt, const std::vector<float> &v) {
  std::vector<uint8_t> out(v.size() * (dt == MIXPREC_F32 ? 4 : 2));
  for (size_t i = 0; i < v.size(); i++) {
    if (dt == MIXPREC_F32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      uint16_t h = dt == MIXPREC_F16 ? mixprec_f32_to_f16(v[i]).bits : mixprec_f32_to_bf16(v[i]).bits;
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

}  // namespace mpt
