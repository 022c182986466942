/* The chunk scan of the overflow check, stamped once per ISA: overflow.c
 * (baseline) and overflow_avx2.c (-mavx2) define MIXPREC__OVERFLOW_SCAN to
 * their function's name and include this. Integer-only (see [note: overflow
 * bits] in overflow_internal.h), so every stamp gives the same bits; the
 * loops are written for the compiler's vectoriser (no early exit, branch-free
 * selects). */
#include "overflow_internal.h"

MIXPREC__FORCE_INLINE void mixprec__overflow_scan16(const uint16_t *p, int64_t n, uint16_t inf,
                                                    uint32_t *max_bits, int *nonfinite) {
  uint16_t m = 0, bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const uint16_t a = (uint16_t)(p[i] & 0x7fffu);
    const uint16_t finite = a < inf ? a : 0;
    m = finite > m ? finite : m;
    bad |= (uint16_t)(a >= inf);
  }
  if (m > *max_bits) *max_bits = m;
  if (bad) *nonfinite = 1;
}

MIXPREC__FORCE_INLINE void mixprec__overflow_scan32(const uint32_t *p, int64_t n,
                                                    uint32_t *max_bits, int *nonfinite) {
  uint32_t m = 0, bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const uint32_t a = p[i] & 0x7fffffffu;
    const uint32_t finite = a < 0x7f800000u ? a : 0;
    m = finite > m ? finite : m;
    bad |= (uint32_t)(a >= 0x7f800000u);
  }
  if (m > *max_bits) *max_bits = m;
  if (bad) *nonfinite = 1;
}

void MIXPREC__OVERFLOW_SCAN(const void *data, mixprec_dtype dtype, int64_t n,
                            uint32_t *max_bits, int *nonfinite) {
  if (dtype == MIXPREC_F32)
    mixprec__overflow_scan32((const uint32_t *)data, n, max_bits, nonfinite);
  else
    mixprec__overflow_scan16((const uint16_t *)data, n,
                             (uint16_t)mixprec__overflow_inf_bits(dtype), max_bits, nonfinite);
}
