/* Compressed activations on the CPU: the entry points of mixprec/act_pack.h,
 * the scalar instantiation of act_pack_internal.h's bodies, and the split
 * of the blocks over the library's threads. */
#include "act_pack_internal.h"

MIXPREC__FORCE_INLINE void widen16_portable(const uint16_t *h, float *v, int64_t len) {
  for (int64_t i = 0; i < len; i++) v[i] = mixprec__f16_to_f32(h[i]);
}
MIXPREC__FORCE_INLINE void narrow16_portable(const float *v, uint16_t *h, int64_t len) {
  for (int64_t i = 0; i < len; i++) h[i] = mixprec__f32_to_f16(v[i]);
}

MIXPREC__ACT_DEFINE(scalar, widen16_portable, narrow16_portable)
MIXPREC__ACT_DEFINE_EXTRA(scalar)

/* Blocks per task: about 64K elements, so a thread's share is far above the
 * cost of handing it out, and tiny tensors stay on the calling thread. */
#define TASK_ELEMS ((int64_t)1 << 16)
#define PARALLEL_MIN ((int64_t)1 << 17)

static mixprec__act_pack_fn pack_kernel(void) {
#if defined(MIXPREC_X86)
  switch (mixprec__active_isa()) {
    case MIXPREC_ISA_AVX512: return mixprec__act_pack_avx512;
    case MIXPREC_ISA_AVX2: return mixprec__act_pack_avx2;
    default: break;
  }
#endif
  return mixprec__act_pack_scalar;
}

static mixprec__act_unpack_fn unpack_kernel(void) {
#if defined(MIXPREC_X86)
  switch (mixprec__active_isa()) {
    case MIXPREC_ISA_AVX512: return mixprec__act_unpack_avx512;
    case MIXPREC_ISA_AVX2: return mixprec__act_unpack_avx2;
    default: break;
  }
#endif
  return mixprec__act_unpack_scalar;
}

static mixprec__act_mask_fn mask_kernel(void) {
#if defined(MIXPREC_X86)
  switch (mixprec__active_isa()) {
    case MIXPREC_ISA_AVX512: return mixprec__act_mask_avx512;
    case MIXPREC_ISA_AVX2: return mixprec__act_mask_avx2;
    default: break;
  }
#endif
  return mixprec__act_mask_scalar;
}

static mixprec__act_norm_relu_fn norm_relu_kernel(void) {
#if defined(MIXPREC_X86)
  switch (mixprec__active_isa()) {
    case MIXPREC_ISA_AVX512: return mixprec__act_norm_relu_avx512;
    case MIXPREC_ISA_AVX2: return mixprec__act_norm_relu_avx2;
    default: break;
  }
#endif
  return mixprec__act_norm_relu_scalar;
}

mixprec_status mixprec_act_packed_size(int64_t n, int64_t bits, int64_t block, int64_t *code_bytes,
                                       int64_t *n_scales) {
  if (code_bytes == NULL || n_scales == NULL) return MIXPREC_ERR_NULL_POINTER;
  if (n < 0) return MIXPREC_ERR_BAD_SIZE;
  if (!mixprec__act_format_ok(bits, block)) return MIXPREC_ERR_BAD_ARGUMENT;
  *code_bytes = mixprec__act_code_bytes(n, bits);
  *n_scales = mixprec__act_n_scales(n, block);
  return MIXPREC_OK;
}

mixprec_status mixprec_act_pack(const void *x, mixprec_dtype dtype, int64_t n, int64_t bits,
                                int64_t block, uint64_t seed, uint8_t *codes, float *scales) {
  const mixprec_status st = mixprec__act_check(x, dtype, n, bits, block, codes, scales);
  if (st != MIXPREC_OK) return st;
  const int64_t n_blocks = mixprec__act_n_scales(n, block);
  const uint32_t key = mixprec__act_key(seed);
  const mixprec__act_pack_fn pack = pack_kernel();
  const int64_t per_task = TASK_ELEMS / block;
  const int64_t n_tasks = (n_blocks + per_task - 1) / per_task;
  if (n < PARALLEL_MIN) {
    pack(x, dtype, n, bits, block, key, 0, n_blocks, codes, scales);
    return MIXPREC_OK;
  }
  const int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(static) num_threads(n_threads)
  for (int64_t t = 0; t < n_tasks; t++) {
    const int64_t b1 = (t + 1) * per_task < n_blocks ? (t + 1) * per_task : n_blocks;
    pack(x, dtype, n, bits, block, key, t * per_task, b1, codes, scales);
  }
  return MIXPREC_OK;
}

mixprec_status mixprec_act_unpack(const uint8_t *codes, const float *scales, int64_t n,
                                  int64_t bits, int64_t block, void *out, mixprec_dtype dtype) {
  const mixprec_status st = mixprec__act_check(out, dtype, n, bits, block, codes, scales);
  if (st != MIXPREC_OK) return st;
  const int64_t n_blocks = mixprec__act_n_scales(n, block);
  const mixprec__act_unpack_fn unpack = unpack_kernel();
  const int64_t per_task = TASK_ELEMS / block;
  const int64_t n_tasks = (n_blocks + per_task - 1) / per_task;
  if (n < PARALLEL_MIN) {
    unpack(codes, scales, n, bits, block, 0, n_blocks, out, dtype);
    return MIXPREC_OK;
  }
  const int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(static) num_threads(n_threads)
  for (int64_t t = 0; t < n_tasks; t++) {
    const int64_t b1 = (t + 1) * per_task < n_blocks ? (t + 1) * per_task : n_blocks;
    unpack(codes, scales, n, bits, block, t * per_task, b1, out, dtype);
  }
  return MIXPREC_OK;
}

mixprec_status mixprec_act_mask(const void *x, mixprec_dtype dtype, int64_t n, uint8_t *mask) {
  const mixprec_status st = mixprec__act_mask_check(x, dtype, n, mask);
  if (st != MIXPREC_OK) return st;
  const int64_t n_bytes = (n + 7) / 8;
  const mixprec__act_mask_fn fn = mask_kernel();
  if (n < PARALLEL_MIN) {
    fn(x, dtype, n, 0, n_bytes, mask);
    return MIXPREC_OK;
  }
  const int64_t per_task = TASK_ELEMS / 8;
  const int64_t n_tasks = (n_bytes + per_task - 1) / per_task;
  const int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(static) num_threads(n_threads)
  for (int64_t t = 0; t < n_tasks; t++) {
    const int64_t k1 = (t + 1) * per_task < n_bytes ? (t + 1) * per_task : n_bytes;
    fn(x, dtype, n, t * per_task, k1, mask);
  }
  return MIXPREC_OK;
}

/* Elements per piece of mixprec_act_unpack_norm_relu: a multiple of every
 * block (blocks are powers of two <= MIXPREC_ACT_BLOCK_MAX) and of 8 (a mask
 * byte), decoded into a buffer on the stack, then made the ReLU's output. */
#define NR_PIECE MIXPREC_ACT_BLOCK_MAX

/* Elements [e0, e1) (e0 a multiple of NR_PIECE) of the recomputed output. */
static void norm_relu_range(const uint8_t *codes, const float *scales, int64_t n, int64_t bits,
                            int64_t block, const float *a, const float *b, int64_t channels,
                            int64_t inner, const uint8_t *mask, void *out, mixprec_dtype dtype,
                            int64_t e0, int64_t e1, mixprec__act_unpack_fn unpack,
                            mixprec__act_norm_relu_fn nr) {
  float v[NR_PIECE];
  uint8_t keep[NR_PIECE];
  (void)n;
  for (int64_t first = e0; first < e1; first += NR_PIECE) {
    const int64_t len = e1 - first < NR_PIECE ? e1 - first : NR_PIECE;
    /* the piece's blocks, as a tensor of len elements of its own */
    unpack(codes + (bits == 8 ? first : first / 2), scales + first / block, len, bits, block, 0,
           (len + block - 1) / block, v, MIXPREC_F32);
    for (int64_t k = 0; k < (len + 7) / 8; k++) {
      const uint64_t t = ((uint64_t)mask[first / 8 + k] * 0x0101010101010101ull) &
                         0x8040201008040201ull;
      const uint64_t e = ((t + 0x7f7f7f7f7f7f7f7full) >> 7) & 0x0101010101010101ull;
      memcpy(keep + 8 * k, &e, 8);
    }
    nr(v, keep, a, b, channels, inner, first, len, out, dtype);
  }
}

mixprec_status mixprec_act_unpack_norm_relu(const uint8_t *codes, const float *scales, int64_t n,
                                            int64_t bits, int64_t block, const float *a,
                                            const float *b, int64_t channels, int64_t inner,
                                            const uint8_t *mask, void *out, mixprec_dtype dtype) {
  const mixprec_status st = mixprec__act_norm_relu_check(codes, scales, n, bits, block, a, b,
                                                         channels, inner, mask, out, dtype);
  if (st != MIXPREC_OK) return st;
  const mixprec__act_unpack_fn unpack = unpack_kernel();
  const mixprec__act_norm_relu_fn nr = norm_relu_kernel();
  if (n < PARALLEL_MIN) {
    norm_relu_range(codes, scales, n, bits, block, a, b, channels, inner, mask, out, dtype, 0, n,
                    unpack, nr);
    return MIXPREC_OK;
  }
  const int64_t n_tasks = (n + TASK_ELEMS - 1) / TASK_ELEMS;
  const int n_threads = mixprec__num_threads();
  (void)n_threads;
#pragma omp parallel for schedule(static) num_threads(n_threads)
  for (int64_t t = 0; t < n_tasks; t++) {
    const int64_t e1 = (t + 1) * TASK_ELEMS < n ? (t + 1) * TASK_ELEMS : n;
    norm_relu_range(codes, scales, n, bits, block, a, b, channels, inner, mask, out, dtype,
                    t * TASK_ELEMS, e1, unpack, nr);
  }
  return MIXPREC_OK;
}
