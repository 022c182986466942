// The act_pack family (compressed activations, mixprec.memory): its schemas
// and its CPU backend. The validation is act_pack_op.h's, shared with the
// CUDA backend in act_pack_cuda.cpp.
#include "act_pack_op.h"

#if defined(__linux__)
#include <sys/mman.h>

#include <cstdlib>
#endif

namespace mixprec_shim {
namespace act_pack {
namespace {

// [note: huge pages for fresh outputs] Opt-in (MIXPREC_HUGEPAGE=1): the 2
// MB-aligned interior of an output of 4 MB or more is advised MADV_HUGEPAGE
// before it is written (transparent huge pages in "madvise" mode, the common
// default, then back it with 2 MB pages on first touch). Where the allocator
// hands out newly mapped memory each 4 KB page is a fault on first touch: a
// fresh 25.7 MB act_unpack took 7.2 ms that way against 1.3 ms on 2 MB pages
// (this project's 2-core VM, 2026-12-07). But in training the allocator
// mostly reuses memory, and on 2026-12-08 the hint made the step slower:
// resnet18 8-bit at 1.17x AMP with it, 1.12-1.14x without (paired rounds,
// the same machine), and a max-pool index decode 24.8 ms against 2.5 ms, with
// torch's own large allocations slower around it. So it is off by default.
void advise_huge(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  static const bool off = [] {
    const char* e = std::getenv("MIXPREC_HUGEPAGE");
    return e == nullptr || e[0] == '\0' || e[0] == '0';
  }();
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (off || p == nullptr || bytes < 2 * kHuge) return;
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (e > a) (void)madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

size_t esize(mixprec_dtype d) { return d == MIXPREC_F32 ? 4 : 2; }

struct CpuBackend {
  static void check_device(const char* op, const Where& w) { check_cpu_device(op, w); }
  static mixprec_status pack(const void* x, mixprec_dtype dtype, int64_t n, int64_t bits,
                             int64_t block, uint64_t seed, uint8_t* codes, float* scales,
                             const Where&) {
    advise_huge(codes, size_t(code_bytes(n, bits)));
    return mixprec_act_pack(x, dtype, n, bits, block, seed, codes, scales);
  }
  static mixprec_status unpack(const uint8_t* codes, const float* scales, int64_t n, int64_t bits,
                               int64_t block, void* out, mixprec_dtype dtype, const Where&) {
    advise_huge(out, size_t(n) * esize(dtype));
    return mixprec_act_unpack(codes, scales, n, bits, block, out, dtype);
  }
  static mixprec_status mask(const void* x, mixprec_dtype dtype, int64_t n, uint8_t* mask,
                             const Where&) {
    return mixprec_act_mask(x, dtype, n, mask);
  }
  static mixprec_status norm_relu(const uint8_t* codes, const float* scales, int64_t n,
                                  int64_t bits, int64_t block, const float* a, const float* b,
                                  int64_t channels, int64_t inner, const uint8_t* mask, void* out,
                                  mixprec_dtype dtype, const Where&) {
    advise_huge(out, size_t(n) * esize(dtype));
    return mixprec_act_unpack_norm_relu(codes, scales, n, bits, block, a, b, channels, inner, mask,
                                        out, dtype);
  }
  static mixprec_status pool_encode(const int64_t* idx, int64_t n, int64_t HO, int64_t WO,
                                    int64_t s_ho, int64_t s_wo, const int64_t* geom,
                                    uint8_t* codes, int64_t* inexact, const Where&) {
    advise_huge(codes, size_t(n));
    return mixprec_act_pool_encode(idx, n, HO, WO, s_ho, s_wo, geom, codes, inexact);
  }
  static mixprec_status pool_decode(const uint8_t* codes, int64_t n, int64_t HO, int64_t WO,
                                    int64_t s_ho, int64_t s_wo, const int64_t* geom, int64_t* idx,
                                    const Where&) {
    advise_huge(idx, size_t(n) * 8);
    return mixprec_act_pool_decode(codes, n, HO, WO, s_ho, s_wo, geom, idx);
  }
};

}  // namespace
}  // namespace act_pack
}  // namespace mixprec_shim

STABLE_TORCH_LIBRARY_FRAGMENT(mixprec, m) {
  // x's elements (memory order) in blockwise codes + one float32 scale per
  // block, stochastically rounded from seed: [note: act_pack format] in
  // mixprec/act_pack.h.
  m.def("act_pack(Tensor x, int bits, int block, int seed) -> (Tensor codes, Tensor scales)");
  // The numel values of a packed tensor as dtype, shape [numel].
  m.def("act_unpack(Tensor codes, Tensor scales, int numel, int bits, int block, "
        "ScalarType dtype) -> Tensor");
  // The set of x's positive elements (memory order), 1 bit each.
  m.def("act_mask(Tensor x) -> Tensor");
  // A ReLU's output recomputed from its BatchNorm's packed input:
  // [note: norm_relu recompute] in mixprec/act_pack.h.
  m.def("act_unpack_norm_relu(Tensor codes, Tensor scales, Tensor a, Tensor b, Tensor mask, "
        "int numel, int bits, int block, int inner, ScalarType dtype) -> Tensor");
  // A 2-D max pool's int64 indices as window offsets, 1 byte each:
  // [note: pool codes] in mixprec/act_pack.h.
  m.def("act_pool_encode(Tensor idx, int W, int kH, int kW, int sH, int sW, int pH, int pW, "
        "int dH, int dW) -> (Tensor codes, Tensor inexact)");
  m.def("act_pool_decode(Tensor codes, int HO, int WO, int s_ho, int s_wo, int W, int kH, "
        "int kW, int sH, int sW, int pH, int pW, int dH, int dW) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(mixprec, CPU, m) {
  m.impl("act_pack", TORCH_BOX(&mixprec_shim::act_pack::act_pack_op<mixprec_shim::act_pack::CpuBackend>));
  m.impl("act_unpack",
         TORCH_BOX(&mixprec_shim::act_pack::act_unpack_op<mixprec_shim::act_pack::CpuBackend>));
  m.impl("act_mask",
         TORCH_BOX(&mixprec_shim::act_pack::act_mask_op<mixprec_shim::act_pack::CpuBackend>));
  m.impl("act_unpack_norm_relu",
         TORCH_BOX(&mixprec_shim::act_pack::act_unpack_norm_relu_op<
                   mixprec_shim::act_pack::CpuBackend>));
  m.impl("act_pool_encode",
         TORCH_BOX(&mixprec_shim::act_pack::act_pool_encode_op<mixprec_shim::act_pack::CpuBackend>));
  m.impl("act_pool_decode",
         TORCH_BOX(&mixprec_shim::act_pack::act_pool_decode_op<mixprec_shim::act_pack::CpuBackend>));
}
