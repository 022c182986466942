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
