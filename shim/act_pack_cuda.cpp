// The CUDA backend of the act_pack family: after act_pack_op.h's validation,
// one launch on torch's current stream of the tensors' device. No host
// synchronisation.
#include <torch/csrc/stable/accelerator.h>

#include "act_pack_op.h"
#include "cuda_common.h"

namespace mixprec_shim {
namespace act_pack {
namespace {

struct CudaBackend {
  static void check_device(const char* op, const Where& w) { check_cuda_device(op, w); }
  static mixprec_status pack(const void* x, mixprec_dtype dtype, int64_t n, int64_t bits,
                             int64_t block, uint64_t seed, uint8_t* codes, float* scales,
                             const Where& w) {
    torch::stable::accelerator::DeviceGuard guard(w.index);
    return mixprec_cuda_act_pack(x, dtype, n, bits, block, seed, codes, scales,
                                 current_cuda_stream("act_pack", w.index));
  }
  static mixprec_status unpack(const uint8_t* codes, const float* scales, int64_t n, int64_t bits,
                               int64_t block, void* out, mixprec_dtype dtype, const Where& w) {
    torch::stable::accelerator::DeviceGuard guard(w.index);
    return mixprec_cuda_act_unpack(codes, scales, n, bits, block, out, dtype,
                                   current_cuda_stream("act_unpack", w.index));
  }
  static mixprec_status mask(const void* x, mixprec_dtype dtype, int64_t n, uint8_t* mask,
                             const Where& w) {
    torch::stable::accelerator::DeviceGuard guard(w.index);
    return mixprec_cuda_act_mask(x, dtype, n, mask, current_cuda_stream("act_mask", w.index));
  }
  static mixprec_status norm_relu(const uint8_t* codes, const float* scales, int64_t n,
                                  int64_t bits, int64_t block, const float* a, const float* b,
                                  int64_t channels, int64_t inner, const uint8_t* mask, void* out,
                                  mixprec_dtype dtype, const Where& w) {
    torch::stable::accelerator::DeviceGuard guard(w.index);
    return mixprec_cuda_act_unpack_norm_relu(
        codes, scales, n, bits, block, a, b, channels, inner, mask, out, dtype,
        current_cuda_stream("act_unpack_norm_relu", w.index));
  }
  // geom stays on the host (the C entry point passes its values to the
  // kernel); *inexact is written on the device, never read back.
  static mixprec_status pool_encode(const int64_t* idx, int64_t n, int64_t HO, int64_t WO,
                                    int64_t s_ho, int64_t s_wo, const int64_t* geom,
                                    uint8_t* codes, int64_t* inexact, const Where& w) {
    torch::stable::accelerator::DeviceGuard guard(w.index);
    return mixprec_cuda_act_pool_encode(idx, n, HO, WO, s_ho, s_wo, geom, codes, inexact,
                                        current_cuda_stream("act_pool_encode", w.index));
  }
  static mixprec_status pool_decode(const uint8_t* codes, int64_t n, int64_t HO, int64_t WO,
                                    int64_t s_ho, int64_t s_wo, const int64_t* geom, int64_t* idx,
                                    const Where& w) {
    torch::stable::accelerator::DeviceGuard guard(w.index);
    return mixprec_cuda_act_pool_decode(codes, n, HO, WO, s_ho, s_wo, geom, idx,
                                        current_cuda_stream("act_pool_decode", w.index));
  }
};

}  // namespace
}  // namespace act_pack
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_IMPL(mixprec, CUDA, m) {
  namespace ap = mixprec_shim::act_pack;
  using B = ap::CudaBackend;
  m.impl("act_pack", TORCH_BOX(&ap::act_pack_op<B>));
  m.impl("act_unpack", TORCH_BOX(&ap::act_unpack_op<B>));
  m.impl("act_mask", TORCH_BOX(&ap::act_mask_op<B>));
  m.impl("act_unpack_norm_relu", TORCH_BOX(&ap::act_unpack_norm_relu_op<B>));
  m.impl("act_pool_encode", TORCH_BOX(&ap::act_pool_encode_op<B>));
  m.impl("act_pool_decode", TORCH_BOX(&ap::act_pool_decode_op<B>));
}
