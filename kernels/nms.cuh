/* Device code of the NMS family shared by kernels/nms.cu (one box list) and
 * kernels/efficient_nms.cu (a batch of images): loads, one 64x64 tile of the
 * IoU bitmask and the one-block greedy walk over the mask. The IoU test, the
 * area and the score key are c_ops/src/nms_rules.h's, the very functions the
 * CPU paths call. */
#ifndef MIXPREC_KERNELS_NMS_CUH
#define MIXPREC_KERNELS_NMS_CUH

#include "common.cuh"
#include "nms_rules.h"

#define MIXPREC__NMS_TILE 64

/* The largest float f with f <= t: `float > t` <=> `float > f` (host; in
 * nms.cu). */
float mixprec__cuda_nms_float_floor(double t);

/* nms_rules.h's test on float4 boxes (x1, y1, x2, y2): kept box a, candidate b. */
MIXPREC__DEVICE bool mixprec__nms_suppresses4(float4 a, float area_a, float4 b, float area_b,
                                              float thr) {
  return mixprec__nms_suppresses(a.x, a.y, a.z, a.w, area_a, b.x, b.y, b.z, b.w, area_b, thr);
}

/* Tile (row, col) of the IoU bitmask of m boxes in score order, computed by
 * a block of MIXPREC__NMS_TILE threads: bit k of mask[i * col_blocks + col]
 * is set when box i suppresses box j = col * 64 + k (j > i, same class). */
MIXPREC__DEVICE void mixprec__nms_mask_tile(const float4 *sboxes, const float *sarea,
                                            const int64_t *scls, int use_cls, int m,
                                            int64_t col_blocks, float thr, int64_t row,
                                            int64_t col, unsigned long long *mask) {
  if (col < row) return;
  if (row * MIXPREC__NMS_TILE >= m) return;
  __shared__ float4 cb[MIXPREC__NMS_TILE];
  __shared__ float ca[MIXPREC__NMS_TILE];
  __shared__ int64_t cc[MIXPREC__NMS_TILE];
  const int t = threadIdx.x;
  const int64_t j0 = col * MIXPREC__NMS_TILE;
  const int ncol = (int)min((int64_t)MIXPREC__NMS_TILE, (int64_t)m - j0);
  if (t < ncol) {
    cb[t] = sboxes[j0 + t];
    ca[t] = sarea[j0 + t];
    cc[t] = use_cls ? scls[j0 + t] : 0;
  }
  __syncthreads();
  const int64_t i = row * MIXPREC__NMS_TILE + t;
  if (i >= m) return;
  const float4 bi = sboxes[i];
  const float ai = sarea[i];
  const int64_t ci = use_cls ? scls[i] : 0;
  unsigned long long bits = 0;
  for (int k = (row == col ? t + 1 : 0); k < ncol; k++) {
    if (cc[k] == ci && mixprec__nms_suppresses4(bi, ai, cb[k], ca[k], thr)) bits |= 1ull << k;
  }
  mask[i * col_blocks + col] = bits;
}

/* The greedy walk over the mask of m boxes by one whole block: per 64-box
 * block, warp 0 resolves the block's own boxes serially from the diagonal
 * tile (in registers, via shuffles), then every thread ORs the rows of the
 * boxes just kept into the `removed` words of later blocks. For the c-th
 * kept box (c = 0, 1, ...) at score position p, a lane of warp 0 calls
 * emit(c, p). Stops after max_keep (< 0: no limit). `removed` has
 * ceil(m / 64) words (shared or global). Returns the kept count (to every
 * thread). */
template <class Emit>
static __device__ __forceinline__ long long mixprec__nms_walk(const unsigned long long *mask,
                                                              int m, int64_t col_blocks,
                                                              unsigned long long *removed,
                                                              int64_t max_keep, Emit emit) {
  __shared__ unsigned long long s_bits;
  __shared__ long long s_count;
  __shared__ int s_stop;
  const int64_t nb_count = (m + MIXPREC__NMS_TILE - 1) / MIXPREC__NMS_TILE;
  for (int64_t j = threadIdx.x; j < nb_count; j += blockDim.x) removed[j] = 0;
  if (threadIdx.x == 0) {
    s_count = 0;
    s_stop = 0;
  }
  for (int64_t nb = 0; nb < nb_count; nb++) {
    __syncthreads();
    const int64_t base = nb * MIXPREC__NMS_TILE;
    if (threadIdx.x < MIXPREC__WARP) {
      const int lane = threadIdx.x;
      unsigned long long rv = removed[nb], kb = 0;
      const long long before = s_count;
      long long cnt = before;
      const int lim = (int)min((int64_t)MIXPREC__NMS_TILE, (int64_t)m - base);
      const unsigned long long all = lim == 64 ? ~0ull : (1ull << lim) - 1ull;
      /* A block whose boxes are all suppressed already (common in dense
       * scenes) needs no mask load at all. */
      const bool live = (rv & all) != all;
      const unsigned long long d0 =
          live && base + lane < m ? mask[(base + lane) * col_blocks + nb] : 0ull;
      const unsigned long long d1 =
          live && base + 32 + lane < m ? mask[(base + 32 + lane) * col_blocks + nb] : 0ull;
      for (int b = 0; live && b < lim; b++) {
        /* Uniform across the warp: every lane holds the same rv and cnt. */
        const unsigned long long db = __shfl_sync(0xffffffffu, b < 32 ? d0 : d1, b & 31);
        if (!((rv >> b) & 1ull)) {
          kb |= 1ull << b;
          rv |= db;
          if (++cnt == max_keep) break;
        }
      }
      for (int b = lane; b < MIXPREC__NMS_TILE; b += MIXPREC__WARP) {
        if ((kb >> b) & 1ull) emit(before + __popcll(kb & ((1ull << b) - 1ull)), base + b);
      }
      __syncwarp();
      if (lane == 0) {
        s_bits = kb;
        s_count = cnt;
        s_stop = cnt == max_keep;
      }
    }
    __syncthreads();
    const unsigned long long kb = s_bits;
    if (s_stop) break;
    if (kb) {
      for (int64_t j = nb + 1 + threadIdx.x; j < nb_count; j += blockDim.x) {
        unsigned long long acc = 0, bits = kb;
        while (bits) {
          const int b = __ffsll((long long)bits) - 1;
          bits &= bits - 1;
          acc |= mask[(base + b) * col_blocks + j];
        }
        removed[j] |= acc;
      }
    }
  }
  __syncthreads();
  return s_count;
}

#endif /* MIXPREC_KERNELS_NMS_CUH */
