/* Compressed activations on CUDA: the GPU twin of c_ops/src/act_pack.c,
 * [note: act_pack format] in mixprec/act_pack.h. Every element goes through
 * act_pack_rules.h, as on the CPU (act_pack_internal.h's
 * mixprec__act_pack_block / _unpack_block), so codes, scales and unpacked
 * values are the CPU's bits. Not yet run on a GPU.
 *
 * Geometry: one warp per quantisation block (a power of two in [32, 4096]),
 * MIXPREC__ACT_WARPS warps per CUDA block, grid-strided over the quantisation
 * blocks. Pack reads its block twice: once for the statistics (the largest
 * magnitude's bits, the smallest and largest order key: warp max / min /
 * max, the same folds as the CPU's, which are order-free), once more (from
 * L1/L2) to write the codes. At 4 bits a lane codes an element pair (2k,
 * 2k + 1) and writes its whole byte, so no two lanes share a byte. One
 * launch on the caller's stream, nothing synchronises, capturable in a CUDA
 * graph.
 *
 * The ReLU recompute ([note: norm_relu recompute]) is element-wise: act_mask
 * has one thread per mask byte (its 8 elements, so no two threads share a
 * byte), act_unpack_norm_relu one thread per element; both grid-strided over
 * a grid of at most MIXPREC__ACT_EW_MAX_GRID CUDA blocks.
 *
 * The max-pool index codes ([note: pool codes]) are element-wise too: one
 * thread per element, grid-strided as above, each through
 * mixprec__act_pool_code / _index of act_pack_rules.h (the CPU's rules) with
 * the 9 geometry values passed by value. Encode counts its codes 255 per
 * thread, sums them per CUDA block (warp shuffles, then the warps' sums in
 * shared memory) and adds a block's non-zero sum to *inexact with one
 * atomicAdd; *inexact is zeroed by a cudaMemsetAsync on the same stream
 * first. The sum does not depend on the order of the adds (integers). */
#include "act_pack_check.h"
#include "act_pack_rules.h"
#include "common.cuh"

#define MIXPREC__ACT_THREADS 256
#define MIXPREC__ACT_WARPS (MIXPREC__ACT_THREADS / MIXPREC__WARP)
/* A grid this large already fills any GPU; more blocks are grid-strided. */
#define MIXPREC__ACT_MAX_GRID 65535
/* The element-wise kernels' cap: 4096 * 256 threads, several times what an
 * H100 / H200 holds at once (132 SMs * 2048); more elements are
 * grid-strided. */
#define MIXPREC__ACT_EW_MAX_GRID 4096

namespace {

MIXPREC__DEVICE uint32_t warp_max_u32(uint32_t v) {
  for (int off = MIXPREC__WARP / 2; off > 0; off /= 2) {
    const uint32_t o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}

MIXPREC__DEVICE int32_t warp_min_i32(int32_t v) {
  for (int off = MIXPREC__WARP / 2; off > 0; off /= 2) {
    const int32_t o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o < v ? o : v;
  }
  return v;
}

MIXPREC__DEVICE int32_t warp_max_i32(int32_t v) {
  for (int off = MIXPREC__WARP / 2; off > 0; off /= 2) {
    const int32_t o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}

/* The stored code of element i of a block (the CPU's dst[i]). */
template <int D>
MIXPREC__DEVICE uint32_t code_of(const void *__restrict__ x, int64_t first, int i, float inv,
                                 int32_t z, int32_t qmax, uint32_t block_key, uint32_t lo_first) {
  const float v = mixprec__load_f32(x, (mixprec_dtype)D, first + i);
  const uint32_t r = mixprec__act_elem_bits(block_key, lo_first + (uint32_t)i);
  return (uint32_t)mixprec__act_encode(v, inv, z, qmax, r);
}

/* Quantisation block b of warp (blockIdx.x * warps + warp), grid-strided.
 * Control flow depends only on the block, so every lane of a warp reaches
 * each shuffle. */
template <int D, int BITS>
__global__ void __launch_bounds__(MIXPREC__ACT_THREADS)
    act_pack_kernel(const void *__restrict__ x, int64_t n, int64_t block, int64_t n_blocks,
                    uint32_t key, uint8_t *__restrict__ codes, float *__restrict__ scales) {
  const int lane = threadIdx.x % MIXPREC__WARP;
  const int64_t stride = (int64_t)gridDim.x * MIXPREC__ACT_WARPS;
  for (int64_t b = (int64_t)blockIdx.x * MIXPREC__ACT_WARPS + threadIdx.x / MIXPREC__WARP;
       b < n_blocks; b += stride) {
    const int64_t first = b * block;
    const int len = (int)(n - first < block ? n - first : block);
    uint8_t *dst = codes + (BITS == 8 ? first : first / 2);

    /* Statistics: mixprec__act_pack_block's first loop. */
    uint32_t amax_bits = 0;
    int32_t lo_key = INT32_MAX, hi_key = INT32_MIN;
    for (int i = lane; i < len; i += MIXPREC__WARP) {
      const uint32_t u =
          mixprec__act_f32_bits(mixprec__load_f32(x, (mixprec_dtype)D, first + i));
      const uint32_t a = u & 0x7fffffffu;
      const int32_t k = mixprec__act_order_key(u);
      amax_bits = a > amax_bits ? a : amax_bits;
      lo_key = k < lo_key ? k : lo_key;
      hi_key = k > hi_key ? k : hi_key;
    }
    amax_bits = warp_max_u32(amax_bits);
    lo_key = warp_min_i32(lo_key);
    hi_key = warp_max_i32(hi_key);

    if (amax_bits >= 0x7f800000u) {
      const int bytes = BITS == 8 ? len : (len + 1) / 2;
      for (int i = lane; i < bytes; i += MIXPREC__WARP) dst[i] = 0;
      if (lane == 0) scales[b] = mixprec__act_f32_of_bits(MIXPREC__ACT_NAN_F32);
      continue;
    }
    const float stored =
        mixprec__act_stored_scale(mixprec__act_of_order_key(lo_key),
                                  mixprec__act_of_order_key(hi_key), BITS);
    const int32_t qmax = (1 << BITS) - 1;
    const int32_t z = mixprec__act_zero_of(stored);
    const float inv = mixprec__act_inverse(mixprec__act_scale_of(stored));
    const uint32_t block_key = mixprec__act_block_key(key, first);
    const uint32_t lo_first = (uint32_t)first;

    if (BITS == 8) {
      for (int i = lane; i < len; i += MIXPREC__WARP)
        dst[i] = (uint8_t)code_of<D>(x, first, i, inv, z, qmax, block_key, lo_first);
    } else {
      /* Pair k: element 2k in the low nibble, 2k + 1 (if any) in the high. */
      const int pairs = (len + 1) / 2;
      for (int k = lane; k < pairs; k += MIXPREC__WARP) {
        uint32_t byte = code_of<D>(x, first, 2 * k, inv, z, qmax, block_key, lo_first);
        if (2 * k + 1 < len)
          byte |= code_of<D>(x, first, 2 * k + 1, inv, z, qmax, block_key, lo_first) << 4;
        dst[k] = (uint8_t)byte;
      }
    }
    if (lane == 0) scales[b] = stored;
  }
}

/* Element i of out as value v, rounded to nearest even (element.h). */
template <int D>
MIXPREC__DEVICE void put(void *__restrict__ out, int64_t i, float v) {
  mixprec__store_f32(out, (mixprec_dtype)D, i, v);
}

/* Same geometry; no shuffles. A non-finite stored scale gives the dtype's
 * one NaN (written as bits: a conversion would give the hardware's NaN). */
template <int D, int BITS>
__global__ void __launch_bounds__(MIXPREC__ACT_THREADS)
    act_unpack_kernel(const uint8_t *__restrict__ codes, const float *__restrict__ scales,
                      int64_t n, int64_t block, int64_t n_blocks, void *__restrict__ out) {
  const int lane = threadIdx.x % MIXPREC__WARP;
  const int64_t stride = (int64_t)gridDim.x * MIXPREC__ACT_WARPS;
  for (int64_t b = (int64_t)blockIdx.x * MIXPREC__ACT_WARPS + threadIdx.x / MIXPREC__WARP;
       b < n_blocks; b += stride) {
    const int64_t first = b * block;
    const int len = (int)(n - first < block ? n - first : block);
    const uint8_t *src = codes + (BITS == 8 ? first : first / 2);
    const float stored = scales[b];
    if (mixprec__act_scale_nonfinite(stored)) {
      if (D == MIXPREC_F32) {
        uint32_t *o = (uint32_t *)out + first;
        for (int i = lane; i < len; i += MIXPREC__WARP) o[i] = MIXPREC__ACT_NAN_F32;
      } else {
        uint16_t *o = (uint16_t *)out + first;
        const uint16_t nan = D == MIXPREC_F16 ? MIXPREC__ACT_NAN_F16 : MIXPREC__ACT_NAN_BF16;
        for (int i = lane; i < len; i += MIXPREC__WARP) o[i] = nan;
      }
      continue;
    }
    const int32_t z = mixprec__act_zero_of(stored);
    const float s = mixprec__act_scale_of(stored);
    const float vmax = mixprec__act_max_of((mixprec_dtype)D);
    if (BITS == 8) {
      for (int i = lane; i < len; i += MIXPREC__WARP)
        put<D>(out, first + i, mixprec__act_decode(src[i], z, s, vmax));
    } else {
      const int pairs = (len + 1) / 2;
      for (int k = lane; k < pairs; k += MIXPREC__WARP) {
        const int32_t c = src[k];
        put<D>(out, first + 2 * k, mixprec__act_decode(c & 15, z, s, vmax));
        if (2 * k + 1 < len) put<D>(out, first + 2 * k + 1, mixprec__act_decode(c >> 4, z, s, vmax));
      }
    }
  }
}

/* The bits of element i of x (a 16-bit element in the low half). */
template <int D>
MIXPREC__DEVICE uint32_t bits_at(const void *__restrict__ x, int64_t i) {
  return D == MIXPREC_F32 ? ((const uint32_t *)x)[i] : ((const uint16_t *)x)[i];
}

/* [note: norm_relu recompute] Mask byte j (elements 8j .. 8j + 7 that
 * exist; the others' bits 0), one thread per byte, grid-strided. */
template <int D>
__global__ void __launch_bounds__(MIXPREC__ACT_THREADS)
    act_mask_kernel(const void *__restrict__ x, int64_t n, int64_t n_bytes,
                    uint8_t *__restrict__ mask) {
  const int64_t stride = (int64_t)gridDim.x * MIXPREC__ACT_THREADS;
  for (int64_t j = (int64_t)blockIdx.x * MIXPREC__ACT_THREADS + threadIdx.x; j < n_bytes;
       j += stride) {
    const int64_t first = j * 8;
    const int len = (int)(n - first < 8 ? n - first : 8);
    uint32_t byte = 0;
    for (int k = 0; k < len; k++)
      byte |= (uint32_t)mixprec__act_positive(bits_at<D>(x, first + k), (mixprec_dtype)D) << k;
    mask[j] = (uint8_t)byte;
  }
}

/* One element per thread, grid-strided: x_i as act_unpack_kernel<F32> gives
 * it (the fixed NaN for a non-finite stored scale), then
 * mixprec__act_norm_relu with its channel's a, b and its mask bit. A NaN
 * result is written as the dtype's fixed NaN bits (a conversion would give
 * the hardware's NaN); any other value rounded to nearest even as put()
 * does. block_log2 = log2(block). */
template <int D, int BITS>
__global__ void __launch_bounds__(MIXPREC__ACT_THREADS)
    act_norm_relu_kernel(const uint8_t *__restrict__ codes, const float *__restrict__ scales,
                         int64_t n, int block_log2, const float *__restrict__ a,
                         const float *__restrict__ b, int64_t channels, int64_t inner,
                         const uint8_t *__restrict__ mask, void *__restrict__ out) {
  const int64_t stride = (int64_t)gridDim.x * MIXPREC__ACT_THREADS;
  const float vmax = mixprec__act_max_of(MIXPREC_F32);
  const float tiny = mixprec__act_tiny_of((mixprec_dtype)D);
  for (int64_t i = (int64_t)blockIdx.x * MIXPREC__ACT_THREADS + threadIdx.x; i < n;
       i += stride) {
    const float stored = scales[i >> block_log2];
    float x;
    if (mixprec__act_scale_nonfinite(stored)) {
      x = mixprec__act_f32_of_bits(MIXPREC__ACT_NAN_F32);
    } else {
      const int32_t byte = codes[BITS == 8 ? i : i >> 1];
      const int32_t c = BITS == 8 ? byte : (i & 1) ? byte >> 4 : byte & 15;
      x = mixprec__act_decode(c, mixprec__act_zero_of(stored), mixprec__act_scale_of(stored),
                              vmax);
    }
    const int64_t ch = (inner == 1 ? i : i / inner) % channels;
    const int keep = (mask[i >> 3] >> (i & 7)) & 1;
    const float f = mixprec__act_norm_relu(x, a[ch], b[ch], keep, tiny);
    if (f != f) {
      if (D == MIXPREC_F32)
        ((uint32_t *)out)[i] = MIXPREC__ACT_NAN_F32;
      else
        ((uint16_t *)out)[i] = D == MIXPREC_F16 ? MIXPREC__ACT_NAN_F16 : MIXPREC__ACT_NAN_BF16;
    } else {
      put<D>(out, i, f);
    }
  }
}

/* [note: pool codes] geom = {W, kH, kW, sH, sW, pH, pW, dH, dW} by value
 * (the caller's array is host memory). */
struct PoolGeom {
  int64_t g[9];
};

/* Codes of elements i, grid-strided, one thread per element; each CUDA
 * block adds its number of codes 255 to *inexact (zeroed before the
 * launch). Every thread reaches the shuffles and the barrier: the
 * grid-stride loop is above them. */
__global__ void __launch_bounds__(MIXPREC__ACT_THREADS)
    act_pool_encode_kernel(const int64_t *__restrict__ idx, int64_t n, int64_t HO, int64_t WO,
                           int64_t s_ho, int64_t s_wo, PoolGeom geom,
                           uint8_t *__restrict__ codes, unsigned long long *__restrict__ inexact) {
  __shared__ unsigned long long warp_bad[MIXPREC__ACT_WARPS];
  const int64_t stride = (int64_t)gridDim.x * MIXPREC__ACT_THREADS;
  unsigned long long bad = 0;
  for (int64_t i = (int64_t)blockIdx.x * MIXPREC__ACT_THREADS + threadIdx.x; i < n;
       i += stride) {
    const uint8_t c = mixprec__act_pool_code(idx[i], (i / s_ho) % HO, (i / s_wo) % WO, geom.g);
    codes[i] = c;
    bad += c == 255;
  }
  for (int off = MIXPREC__WARP / 2; off > 0; off /= 2)
    bad += __shfl_xor_sync(0xffffffffu, bad, off);
  if (threadIdx.x % MIXPREC__WARP == 0) warp_bad[threadIdx.x / MIXPREC__WARP] = bad;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long sum = 0;
    for (int w = 0; w < MIXPREC__ACT_WARPS; w++) sum += warp_bad[w];
    if (sum != 0) atomicAdd(inexact, sum);
  }
}

/* Indices of elements i, grid-strided, one thread per element. */
__global__ void __launch_bounds__(MIXPREC__ACT_THREADS)
    act_pool_decode_kernel(const uint8_t *__restrict__ codes, int64_t n, int64_t HO, int64_t WO,
                           int64_t s_ho, int64_t s_wo, PoolGeom geom,
                           int64_t *__restrict__ idx) {
  const int64_t stride = (int64_t)gridDim.x * MIXPREC__ACT_THREADS;
  for (int64_t i = (int64_t)blockIdx.x * MIXPREC__ACT_THREADS + threadIdx.x; i < n;
       i += stride)
    idx[i] = mixprec__act_pool_index(codes[i], (i / s_ho) % HO, (i / s_wo) % WO, geom.g);
}

PoolGeom pool_geom_of(const int64_t *geom) {
  PoolGeom p;
  for (int k = 0; k < 9; k++) p.g[k] = geom[k];
  return p;
}

/* Enough CUDA blocks for one thread per item (element or mask byte), capped. */
unsigned ew_grid_for(int64_t items) {
  const int64_t g = (items + MIXPREC__ACT_THREADS - 1) / MIXPREC__ACT_THREADS;
  return (unsigned)(g < MIXPREC__ACT_EW_MAX_GRID ? g : MIXPREC__ACT_EW_MAX_GRID);
}

/* Enough CUDA blocks for one warp per quantisation block, capped. */
unsigned grid_for(int64_t n_blocks) {
  const int64_t g = (n_blocks + MIXPREC__ACT_WARPS - 1) / MIXPREC__ACT_WARPS;
  return (unsigned)(g < MIXPREC__ACT_MAX_GRID ? g : MIXPREC__ACT_MAX_GRID);
}

/* A device load or store of an element not aligned to its size faults and
 * ruins the CUDA context: such pointers are refused up front. */
bool misaligned(const void *data, mixprec_dtype dtype, const float *scales) {
  return (uintptr_t)data % (uintptr_t)mixprec_dtype_size(dtype) != 0 ||
         (uintptr_t)scales % sizeof(float) != 0;
}

}  // namespace

extern "C" MIXPREC_API mixprec_status mixprec_cuda_act_pack(const void *x, mixprec_dtype dtype,
                                                            int64_t n, int64_t bits, int64_t block,
                                                            uint64_t seed, uint8_t *codes,
                                                            float *scales, void *stream) {
  const mixprec_status st = mixprec__act_check(x, dtype, n, bits, block, codes, scales);
  if (st != MIXPREC_OK || n == 0) return st;
  if (misaligned(x, dtype, scales)) return MIXPREC_ERR_BAD_ARGUMENT;
  const int64_t n_blocks = mixprec__act_n_scales(n, block);
  const uint32_t key = mixprec__act_key(seed);
  const unsigned grid = grid_for(n_blocks);
  const cudaStream_t s = (cudaStream_t)stream;
  MIXPREC__DISPATCH(dtype, D, {
    if (bits == 8)
      act_pack_kernel<D, 8><<<grid, MIXPREC__ACT_THREADS, 0, s>>>(x, n, block, n_blocks, key,
                                                                   codes, scales);
    else
      act_pack_kernel<D, 4><<<grid, MIXPREC__ACT_THREADS, 0, s>>>(x, n, block, n_blocks, key,
                                                                   codes, scales);
  });
  return mixprec__cuda_launch_status();
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_act_unpack(const uint8_t *codes,
                                                              const float *scales, int64_t n,
                                                              int64_t bits, int64_t block,
                                                              void *out, mixprec_dtype dtype,
                                                              void *stream) {
  const mixprec_status st = mixprec__act_check(out, dtype, n, bits, block, codes, scales);
  if (st != MIXPREC_OK || n == 0) return st;
  if (misaligned(out, dtype, scales)) return MIXPREC_ERR_BAD_ARGUMENT;
  const int64_t n_blocks = mixprec__act_n_scales(n, block);
  const unsigned grid = grid_for(n_blocks);
  const cudaStream_t s = (cudaStream_t)stream;
  MIXPREC__DISPATCH(dtype, D, {
    if (bits == 8)
      act_unpack_kernel<D, 8><<<grid, MIXPREC__ACT_THREADS, 0, s>>>(codes, scales, n, block,
                                                                     n_blocks, out);
    else
      act_unpack_kernel<D, 4><<<grid, MIXPREC__ACT_THREADS, 0, s>>>(codes, scales, n, block,
                                                                     n_blocks, out);
  });
  return mixprec__cuda_launch_status();
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_act_mask(const void *x, mixprec_dtype dtype,
                                                            int64_t n, uint8_t *mask,
                                                            void *stream) {
  const mixprec_status st = mixprec__act_mask_check(x, dtype, n, mask);
  if (st != MIXPREC_OK || n == 0) return st;
  if ((uintptr_t)x % (uintptr_t)mixprec_dtype_size(dtype) != 0) return MIXPREC_ERR_BAD_ARGUMENT;
  const int64_t n_bytes = n / 8 + (n % 8 != 0);
  const unsigned grid = ew_grid_for(n_bytes);
  const cudaStream_t s = (cudaStream_t)stream;
  MIXPREC__DISPATCH(dtype, D, {
    act_mask_kernel<D><<<grid, MIXPREC__ACT_THREADS, 0, s>>>(x, n, n_bytes, mask);
  });
  return mixprec__cuda_launch_status();
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_act_unpack_norm_relu(
    const uint8_t *codes, const float *scales, int64_t n, int64_t bits, int64_t block,
    const float *a, const float *b, int64_t channels, int64_t inner, const uint8_t *mask,
    void *out, mixprec_dtype dtype, void *stream) {
  const mixprec_status st = mixprec__act_norm_relu_check(codes, scales, n, bits, block, a, b,
                                                         channels, inner, mask, out, dtype);
  if (st != MIXPREC_OK || n == 0) return st;
  if (misaligned(out, dtype, scales) || (uintptr_t)a % sizeof(float) != 0 ||
      (uintptr_t)b % sizeof(float) != 0)
    return MIXPREC_ERR_BAD_ARGUMENT;
  int block_log2 = 0;
  while (((int64_t)1 << block_log2) < block) block_log2++;  /* block: a power of two */
  const unsigned grid = ew_grid_for(n);
  const cudaStream_t s = (cudaStream_t)stream;
  MIXPREC__DISPATCH(dtype, D, {
    if (bits == 8)
      act_norm_relu_kernel<D, 8><<<grid, MIXPREC__ACT_THREADS, 0, s>>>(
          codes, scales, n, block_log2, a, b, channels, inner, mask, out);
    else
      act_norm_relu_kernel<D, 4><<<grid, MIXPREC__ACT_THREADS, 0, s>>>(
          codes, scales, n, block_log2, a, b, channels, inner, mask, out);
  });
  return mixprec__cuda_launch_status();
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_act_pool_encode(
    const int64_t *idx, int64_t n, int64_t HO, int64_t WO, int64_t s_ho, int64_t s_wo,
    const int64_t *geom, uint8_t *codes, int64_t *inexact, void *stream) {
  const mixprec_status st =
      mixprec__act_pool_check(idx, n, HO, WO, s_ho, s_wo, geom, codes, inexact, 1);
  if (st != MIXPREC_OK) return st;
  if ((uintptr_t)idx % sizeof(int64_t) != 0 || (uintptr_t)inexact % sizeof(int64_t) != 0)
    return MIXPREC_ERR_BAD_ARGUMENT;
  const cudaStream_t s = (cudaStream_t)stream;
  /* Zeroed on the stream even for n == 0: *inexact is always written. */
  if (cudaMemsetAsync(inexact, 0, sizeof(int64_t), s) != cudaSuccess) return MIXPREC_ERR_CUDA;
  if (n == 0) return MIXPREC_OK;
  act_pool_encode_kernel<<<ew_grid_for(n), MIXPREC__ACT_THREADS, 0, s>>>(
      idx, n, HO, WO, s_ho, s_wo, pool_geom_of(geom), codes, (unsigned long long *)inexact);
  return mixprec__cuda_launch_status();
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_act_pool_decode(
    const uint8_t *codes, int64_t n, int64_t HO, int64_t WO, int64_t s_ho, int64_t s_wo,
    const int64_t *geom, int64_t *idx, void *stream) {
  const mixprec_status st =
      mixprec__act_pool_check(codes, n, HO, WO, s_ho, s_wo, geom, idx, NULL, 0);
  if (st != MIXPREC_OK) return st;
  if ((uintptr_t)idx % sizeof(int64_t) != 0) return MIXPREC_ERR_BAD_ARGUMENT;
  if (n == 0) return MIXPREC_OK;
  const cudaStream_t s = (cudaStream_t)stream;
  act_pool_decode_kernel<<<ew_grid_for(n), MIXPREC__ACT_THREADS, 0, s>>>(
      codes, n, HO, WO, s_ho, s_wo, pool_geom_of(geom), idx);
  return mixprec__cuda_launch_status();
}
