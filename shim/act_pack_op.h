// The act_pack family's ops (act_pack, act_unpack, act_mask,
// act_unpack_norm_relu, act_pool_encode, act_pool_decode), validated once for both
// devices: templates over a backend B (act_pack.cpp: CPU, act_pack_cuda.cpp:
// CUDA) that only says how to run the C entry points:
//   B::check_device(op, where)
//   B::pack(x, dtype, n, bits, block, seed, codes, scales, device) -> mixprec_status
//   B::unpack(codes, scales, n, bits, block, out, dtype, device) -> mixprec_status
//   B::mask(x, dtype, n, mask, device) -> mixprec_status
//   B::norm_relu(codes, scales, n, bits, block, a, b, channels, inner, mask, out, dtype,
//                device) -> mixprec_status
//   B::pool_encode(idx, n, HO, WO, s_ho, s_wo, geom, codes, inexact, device)
//   B::pool_decode(codes, n, HO, WO, s_ho, s_wo, geom, idx, device)
// Every check runs before anything is allocated or written.
#pragma once

#include <tuple>

#include "common.h"

namespace mixprec_shim {
namespace act_pack {

// bits and block as the C format takes them (act_pack_check.h), with the
// message naming the argument.
inline void check_format(const char* op, int64_t bits, int64_t block) {
  MIXPREC_CHECK(bits == 8 || bits == 4, "mixprec::", op, ": bits must be 8 or 4, got ", bits);
  MIXPREC_CHECK(block >= MIXPREC_ACT_BLOCK_MIN && block <= MIXPREC_ACT_BLOCK_MAX &&
                    (block & (block - 1)) == 0,
                "mixprec::", op, ": block must be a power of two in [", MIXPREC_ACT_BLOCK_MIN,
                ", ", MIXPREC_ACT_BLOCK_MAX, "], got ", block);
}

inline int64_t code_bytes(int64_t n, int64_t bits) { return bits == 8 ? n : n / 2 + (n & 1); }
inline int64_t n_scales(int64_t n, int64_t block) { return n / block + (n % block != 0); }

// x: float32 / float16 / bfloat16, dense in memory (contiguous, channels_last,
// any permutation without gaps); its elements are packed in memory order.
// Returns (codes uint8 [code_bytes], scales float32 [n_scales]) on x's device.
template <class B>
std::tuple<Tensor, Tensor> act_pack_op(Tensor x, int64_t bits, int64_t block, int64_t seed) {
  const char* op = "act_pack";
  const mixprec_dtype xd = float_arg(op, "x", x);
  check_format(op, bits, block);
  MIXPREC_CHECK(is_dense(x), "mixprec::", op,
                ": x must be dense in memory (contiguous, channels_last or another "
                "permutation without gaps); call .contiguous() on it");
  const Where dev = where(x);
  B::check_device(op, dev);
  const int64_t n = x.numel();
  Tensor codes = torch::stable::new_empty(x, {code_bytes(n, bits)}, ScalarType::Byte);
  Tensor scales = torch::stable::new_empty(x, {n_scales(n, block)}, ScalarType::Float);
  if (n == 0) return {codes, scales};
  check_status(B::pack(x.data_ptr(), xd, n, bits, block, static_cast<uint64_t>(seed),
                       static_cast<uint8_t*>(codes.data_ptr()), static_cast<float*>(scales.data_ptr()),
                       dev),
               op);
  return {codes, scales};
}

// codes: uint8 [code_bytes(numel)], scales: float32 [n_scales(numel)], both
// contiguous on one device. Returns the numel values as dtype, shape [numel].
template <class B>
Tensor act_unpack_op(Tensor codes, Tensor scales, int64_t numel, int64_t bits, int64_t block,
                     ScalarType dtype) {
  const char* op = "act_unpack";
  check_format(op, bits, block);
  MIXPREC_CHECK(numel >= 0, "mixprec::", op, ": numel must be >= 0, got ", numel);
  mixprec_dtype od;
  MIXPREC_CHECK(to_mixprec_dtype(dtype, &od), "mixprec::", op,
                ": dtype must be float32, float16 or bfloat16, got ", dtype_name(dtype));
  MIXPREC_CHECK(codes.defined() && codes.layout() == Layout::Strided &&
                    codes.scalar_type() == ScalarType::Byte,
                "mixprec::", op, ": codes must be a uint8 tensor");
  MIXPREC_CHECK(scales.defined() && scales.layout() == Layout::Strided &&
                    scales.scalar_type() == ScalarType::Float,
                "mixprec::", op, ": scales must be a float32 tensor, got ",
                dtype_name(scales.scalar_type()));
  MIXPREC_CHECK(codes.dim() == 1 && codes.numel() == code_bytes(numel, bits), "mixprec::", op,
                ": codes must have shape [", code_bytes(numel, bits), "] for numel ", numel,
                " at ", bits, " bits, got ", shape_str(codes));
  MIXPREC_CHECK(scales.dim() == 1 && scales.numel() == n_scales(numel, block), "mixprec::", op,
                ": scales must have shape [", n_scales(numel, block), "] for numel ", numel,
                " and block ", block, ", got ", shape_str(scales));
  MIXPREC_CHECK(codes.is_contiguous(), "mixprec::", op, ": codes must be contiguous");
  MIXPREC_CHECK(scales.is_contiguous(), "mixprec::", op, ": scales must be contiguous");
  const Where dev = where(codes);
  same_device(op, "scales", scales, dev, "codes");
  B::check_device(op, dev);
  Tensor out = torch::stable::new_empty(codes, {numel}, dtype);
  if (numel == 0) return out;
  check_status(B::unpack(static_cast<const uint8_t*>(codes.data_ptr()),
                         static_cast<const float*>(scales.data_ptr()), numel, bits, block,
                         out.data_ptr(), od, dev),
               op);
  return out;
}

// x: float32 / float16 / bfloat16, dense in memory. Returns uint8
// [ceil(numel / 8)] on x's device: bit (i & 7) of byte i >> 3 is x's element
// i (memory order) > 0.
template <class B>
Tensor act_mask_op(Tensor x) {
  const char* op = "act_mask";
  const mixprec_dtype xd = float_arg(op, "x", x);
  MIXPREC_CHECK(is_dense(x), "mixprec::", op,
                ": x must be dense in memory (contiguous, channels_last or another "
                "permutation without gaps); call .contiguous() on it");
  const Where dev = where(x);
  B::check_device(op, dev);
  const int64_t n = x.numel();
  Tensor mask = torch::stable::new_empty(x, {(n + 7) / 8}, ScalarType::Byte);
  if (n == 0) return mask;
  check_status(B::mask(x.data_ptr(), xd, n, static_cast<uint8_t*>(mask.data_ptr()), dev), op);
  return mask;
}

// A float32 1-D contiguous tensor of `channels` elements (a / b).
inline void check_affine(const char* op, const char* name, const Tensor& t, int64_t channels) {
  MIXPREC_CHECK(t.defined() && t.layout() == Layout::Strided &&
                    t.scalar_type() == ScalarType::Float,
                "mixprec::", op, ": ", name, " must be a float32 tensor");
  MIXPREC_CHECK(t.dim() == 1 && t.numel() == channels && t.is_contiguous(), "mixprec::", op,
                ": ", name, " must be a contiguous 1-D tensor of ", channels,
                " elements (a's), got ", shape_str(t));
}

// [note: norm_relu recompute] in mixprec/act_pack.h: the numel values of a
// ReLU's output recomputed from the packed BatchNorm input (codes, scales),
// the per-channel a and b (float32 [channels], channels = a.numel() >= 1),
// channel c of element i = (i / inner) % channels, and the ReLU's mask
// (act_mask's uint8 [ceil(numel / 8)]). Returns dtype [numel].
template <class B>
Tensor act_unpack_norm_relu_op(Tensor codes, Tensor scales, Tensor a, Tensor b, Tensor mask,
                               int64_t numel, int64_t bits, int64_t block, int64_t inner,
                               ScalarType dtype) {
  const char* op = "act_unpack_norm_relu";
  check_format(op, bits, block);
  MIXPREC_CHECK(numel >= 0, "mixprec::", op, ": numel must be >= 0, got ", numel);
  MIXPREC_CHECK(inner >= 1, "mixprec::", op, ": inner must be >= 1, got ", inner);
  mixprec_dtype od;
  MIXPREC_CHECK(to_mixprec_dtype(dtype, &od), "mixprec::", op,
                ": dtype must be float32, float16 or bfloat16, got ", dtype_name(dtype));
  MIXPREC_CHECK(codes.defined() && codes.layout() == Layout::Strided &&
                    codes.scalar_type() == ScalarType::Byte,
                "mixprec::", op, ": codes must be a uint8 tensor");
  MIXPREC_CHECK(scales.defined() && scales.layout() == Layout::Strided &&
                    scales.scalar_type() == ScalarType::Float,
                "mixprec::", op, ": scales must be a float32 tensor");
  MIXPREC_CHECK(codes.dim() == 1 && codes.numel() == code_bytes(numel, bits) && codes.is_contiguous(),
                "mixprec::", op, ": codes must be a contiguous [", code_bytes(numel, bits),
                "] tensor for numel ", numel, " at ", bits, " bits, got ", shape_str(codes));
  MIXPREC_CHECK(scales.dim() == 1 && scales.numel() == n_scales(numel, block) && scales.is_contiguous(),
                "mixprec::", op, ": scales must be a contiguous [", n_scales(numel, block),
                "] tensor for numel ", numel, " and block ", block, ", got ", shape_str(scales));
  MIXPREC_CHECK(a.defined() && a.dim() == 1 && a.numel() >= 1, "mixprec::", op,
                ": a must be a 1-D tensor of at least one element");
  const int64_t channels = a.numel();
  check_affine(op, "a", a, channels);
  check_affine(op, "b", b, channels);
  MIXPREC_CHECK(mask.defined() && mask.layout() == Layout::Strided &&
                    mask.scalar_type() == ScalarType::Byte && mask.dim() == 1 &&
                    mask.numel() == (numel + 7) / 8 && mask.is_contiguous(),
                "mixprec::", op, ": mask must be a contiguous uint8 [", (numel + 7) / 8,
                "] tensor for numel ", numel, ", got ", shape_str(mask));
  const Where dev = where(codes);
  same_device(op, "scales", scales, dev, "codes");
  same_device(op, "a", a, dev, "codes");
  same_device(op, "b", b, dev, "codes");
  same_device(op, "mask", mask, dev, "codes");
  B::check_device(op, dev);
  Tensor out = torch::stable::new_empty(codes, {numel}, dtype);
  if (numel == 0) return out;
  check_status(B::norm_relu(static_cast<const uint8_t*>(codes.data_ptr()),
                            static_cast<const float*>(scales.data_ptr()), numel, bits, block,
                            static_cast<const float*>(a.data_ptr()),
                            static_cast<const float*>(b.data_ptr()), channels, inner,
                            static_cast<const uint8_t*>(mask.data_ptr()), out.data_ptr(), od, dev),
               op);
  return out;
}

// A max pool's geometry {W, kH, kW, sH, sW, pH, pW, dH, dW} as the C entry
// points take it, each checked with the argument's name.
inline void check_pool_geom(const char* op, const int64_t* g) {
  static const char* names[9] = {"W", "kH", "kW", "sH", "sW", "pH", "pW", "dH", "dW"};
  for (int k = 0; k < 9; k++) {
    const int64_t lo = k == 5 || k == 6 ? 0 : 1;
    MIXPREC_CHECK(g[k] >= lo, "mixprec::", op, ": ", names[k], " must be >= ", lo, ", got ",
                  g[k]);
  }
  MIXPREC_CHECK(g[1] <= 255 && g[2] <= 255 && g[1] * g[2] <= 255, "mixprec::", op,
                ": the window must have at most 255 elements (kH * kW), got ", g[1], " x ", g[2]);
}

// [note: pool codes] in mixprec/act_pack.h. idx: int64, dense in memory, at
// least 2-D (its last two dimensions are the pool's output rows and
// columns). Returns (codes uint8 [numel] in idx's memory order, inexact
// int64 [1]: how many codes are 255).
template <class B>
std::tuple<Tensor, Tensor> act_pool_encode_op(Tensor idx, int64_t W, int64_t kH, int64_t kW,
                                              int64_t sH, int64_t sW, int64_t pH, int64_t pW,
                                              int64_t dH, int64_t dW) {
  const char* op = "act_pool_encode";
  MIXPREC_CHECK(idx.defined() && idx.layout() == Layout::Strided &&
                    idx.scalar_type() == ScalarType::Long,
                "mixprec::", op, ": idx must be an int64 tensor, got ",
                idx.defined() ? dtype_name(idx.scalar_type()) : "undefined");
  MIXPREC_CHECK(idx.dim() >= 2, "mixprec::", op, ": idx must have at least 2 dimensions, got ",
                shape_str(idx));
  MIXPREC_CHECK(is_dense(idx), "mixprec::", op,
                ": idx must be dense in memory (contiguous, channels_last or another "
                "permutation without gaps); call .contiguous() on it");
  const int64_t g[9] = {W, kH, kW, sH, sW, pH, pW, dH, dW};
  check_pool_geom(op, g);
  const Where dev = where(idx);
  B::check_device(op, dev);
  const int64_t d = idx.dim(), n = idx.numel();
  const int64_t HO = idx.size(d - 2), WO = idx.size(d - 1);
  MIXPREC_CHECK(n == 0 || (HO >= 1 && WO >= 1), "mixprec::", op, ": idx has an empty plane");
  const int64_t s_ho = HO == 1 ? 1 : idx.stride(d - 2), s_wo = WO == 1 ? 1 : idx.stride(d - 1);
  Tensor codes = torch::stable::new_empty(idx, {n}, ScalarType::Byte);
  Tensor inexact = torch::stable::new_empty(idx, {1}, ScalarType::Long);
  check_status(B::pool_encode(static_cast<const int64_t*>(idx.data_ptr()), n, HO < 1 ? 1 : HO,
                              WO < 1 ? 1 : WO, s_ho, s_wo, g,
                              static_cast<uint8_t*>(codes.data_ptr()),
                              static_cast<int64_t*>(inexact.data_ptr()), dev),
               op);
  return {codes, inexact};
}

// The indices back from act_pool_encode's codes (uint8 [numel], contiguous):
// int64 [numel] in the same memory order; HO, WO, s_ho, s_wo: the pool
// output's last two sizes and their strides (elements).
template <class B>
Tensor act_pool_decode_op(Tensor codes, int64_t HO, int64_t WO, int64_t s_ho, int64_t s_wo,
                          int64_t W, int64_t kH, int64_t kW, int64_t sH, int64_t sW, int64_t pH,
                          int64_t pW, int64_t dH, int64_t dW) {
  const char* op = "act_pool_decode";
  MIXPREC_CHECK(codes.defined() && codes.layout() == Layout::Strided &&
                    codes.scalar_type() == ScalarType::Byte && codes.dim() == 1 &&
                    codes.is_contiguous(),
                "mixprec::", op, ": codes must be a contiguous 1-D uint8 tensor");
  MIXPREC_CHECK(HO >= 1 && WO >= 1 && s_ho >= 1 && s_wo >= 1, "mixprec::", op,
                ": HO, WO, s_ho and s_wo must be >= 1, got ", HO, ", ", WO, ", ", s_ho, ", ",
                s_wo);
  const int64_t g[9] = {W, kH, kW, sH, sW, pH, pW, dH, dW};
  check_pool_geom(op, g);
  const Where dev = where(codes);
  B::check_device(op, dev);
  const int64_t n = codes.numel();
  Tensor idx = torch::stable::new_empty(codes, {n}, ScalarType::Long);
  if (n == 0) return idx;
  check_status(B::pool_decode(static_cast<const uint8_t*>(codes.data_ptr()), n, HO, WO, s_ho,
                              s_wo, g, static_cast<int64_t*>(idx.data_ptr()), dev),
               op);
  return idx;
}

}  // namespace act_pack
}  // namespace mixprec_shim
