// What every family's CUDA backend (shim/<family>_cuda.cpp) uses: torch's
// current stream of a device and the device check of the CUDA backends.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include "common.h"

namespace mixprec_shim {

// torch's current CUDA stream of `device` (a cudaStream_t).
inline void* current_cuda_stream(const char* op, int32_t device) {
  void* stream = nullptr;
  MIXPREC_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS,
                "mixprec::", op, ": could not get the current CUDA stream of device ", device);
  return stream;
}

inline void check_cuda_device(const char* op, const Where& w) {
  MIXPREC_CHECK(w.cuda, "mixprec::", op,
                ": the CUDA kernel got tensors that are not on a CUDA device");
}

}  // namespace mixprec_shim
