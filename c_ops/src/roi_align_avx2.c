/* The RoIAlign forward with AVX2 + F16C: 8 channels per vector, each lane
 * one channel, the four corners of a sample gathered (vpgatherdd) from the
 * 8 channel planes at the sample's offsets. Per lane the operations are the
 * scalar path's, in its order, without FMA (_mm256_mul_ps then
 * _mm256_add_ps): the output is bit-identical to mixprec__roi_fwd_scalar.
 * 16-bit values are gathered as 32-bit words at 2-byte scale (the element
 * and the one after it) and narrowed in registers, so a block whose last
 * plane is the input's last one (where that extra 2-byte read would leave
 * the buffer) and channel remainders go to the scalar path. Offsets are
 * int32 lanes: planes of 2^27 elements or more also go to the scalar path. */
#include <immintrin.h>

#include "internal.h"
#include "roi_align_internal.h"

static inline __m256 load8(const void *base, mixprec_dtype dt, __m256i idx) {
  switch (dt) {
    case MIXPREC_F16: {
      const __m256i w = _mm256_and_si256(_mm256_i32gather_epi32((const int *)base, idx, 2),
                                         _mm256_set1_epi32(0xffff));
      const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
      return _mm256_cvtph_ps(h);
    }
    case MIXPREC_BF16:
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_i32gather_epi32((const int *)base, idx, 2), 16));
    default: return _mm256_i32gather_ps((const float *)base, idx, 4);
  }
}

static inline void fwd8(const void *in, mixprec_dtype dt, int64_t C, int64_t plane,
                        const mixprec__roi *r, int64_t k, int64_t c, int64_t bins,
                        int64_t samples, const mixprec__roi_pc *pc, void *out, mixprec_dtype od) {
  const size_t es = (size_t)mixprec_dtype_size(dt);
  const char *base = (const char *)in + (size_t)((r->batch * C + c) * plane) * es;
  const __m256i lanes = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm256_set1_epi32((int)plane));
  const __m256 count = _mm256_set1_ps(r->count);
  const int64_t obase = (k * C + c) * bins;
  const mixprec__roi_pc *e = pc;
  for (int64_t b = 0; b < bins; b++) {
    __m256 val = _mm256_setzero_ps();
    for (int64_t s = 0; s < samples; s++, e++) {
      const __m256 v1 = load8(base, dt, _mm256_add_epi32(lanes, _mm256_set1_epi32((int)e->p1)));
      const __m256 v2 = load8(base, dt, _mm256_add_epi32(lanes, _mm256_set1_epi32((int)e->p2)));
      const __m256 v3 = load8(base, dt, _mm256_add_epi32(lanes, _mm256_set1_epi32((int)e->p3)));
      const __m256 v4 = load8(base, dt, _mm256_add_epi32(lanes, _mm256_set1_epi32((int)e->p4)));
      __m256 t = _mm256_mul_ps(_mm256_set1_ps(e->w1), v1);
      t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_set1_ps(e->w2), v2));
      t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_set1_ps(e->w3), v3));
      t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_set1_ps(e->w4), v4));
      val = _mm256_add_ps(val, t);
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_div_ps(val, count));
    for (int l = 0; l < 8; l++) mixprec__store_f32(out, od, obase + l * bins + b, o[l]);
  }
}

void mixprec__roi_fwd_avx2(const void *in, mixprec_dtype dt, int64_t C, int64_t plane,
                           int64_t total_planes, const mixprec__roi *r, int64_t k, int64_t c0,
                           int64_t c1, int64_t bins, int64_t samples, const mixprec__roi_pc *pc,
                           void *out, mixprec_dtype od) {
  int64_t c = c0;
  if (plane < ((int64_t)1 << 27)) {
    for (; c + 8 <= c1; c += 8) {
      /* 16-bit gathers read 2 bytes past the 8th plane: not past the input */
      if (dt != MIXPREC_F32 && r->batch * C + c + 8 >= total_planes) break;
      fwd8(in, dt, C, plane, r, k, c, bins, samples, pc, out, od);
    }
  }
  if (c < c1)
    mixprec__roi_fwd_scalar(in, dt, C, plane, total_planes, r, k, c, c1, bins, samples, pc, out,
                            od);
}
