/* Stochastic rounding of FP32 to BF16 for the optimizers' master-free mode,
 * shared verbatim by the CPU (adamw.c, sgd.c and their AVX2 bodies) and the
 * CUDA kernels (kernels/optim.cuh), so both give the same bits.
 *
 * The random bits are a counter-based hash, not a stream: element i of a
 * tensor at a step gets
 *     r = mix32(key + lo32(i) * 0x9e3779b1 + hi32(i) * 0x85ebca77)
 *     key = mix32(mix32(mix32(mix32(mix32(lo32(seed) ^ 0x9e3779b9)
 *                 ^ hi32(seed)) ^ lo32(tensor)) ^ hi32(tensor))
 *                 ^ bits(new_step))
 * where mix32 is the "lowbias32" integer hash (Chris Wellons' hash-prospector,
 * a bijection of 32-bit words with good avalanche), `tensor` the tensor's
 * index in the call's list, and new_step the float step count after this
 * step. So results depend only on (seed, tensor index, step count, element
 * index): not on threads, chunking, ISA or device, and a replayed CUDA graph
 * reads the advancing step count and draws new bits each step.
 *
 * Rounding: x's 32-bit pattern plus the top 16 random bits, truncated to its
 * top 16 bits. |x| rounds up to the next BF16 magnitude with probability
 * (|x| - lower) / ulp, so E[round(x)] = x (an unbiased rounding: updates
 * far below BF16 resolution still move the parameter on average). A value
 * that is already BF16 is unchanged; inf stays inf; a NaN becomes its
 * quieted top half (as the nearest-even conversion does); a finite value
 * within one ulp of the largest BF16 may round to inf with the probability
 * its distance gives. */
#ifndef MIXPREC_STOCHASTIC_ROUND_H
#define MIXPREC_STOCHASTIC_ROUND_H

#include <stdint.h>
#include <string.h>

#include "compiler.h"

MIXPREC__HD uint32_t mixprec__mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

MIXPREC__HD uint32_t mixprec__sr_float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* The key of one tensor at one step (see above). */
MIXPREC__HD uint32_t mixprec__sr_key(uint64_t seed, uint64_t tensor, float new_step) {
  uint32_t h = mixprec__mix32((uint32_t)seed ^ 0x9e3779b9u);
  h = mixprec__mix32(h ^ (uint32_t)(seed >> 32));
  h = mixprec__mix32(h ^ (uint32_t)tensor);
  h = mixprec__mix32(h ^ (uint32_t)(tensor >> 32));
  return mixprec__mix32(h ^ mixprec__sr_float_bits(new_step));
}

/* The 32 random bits of element i. */
MIXPREC__HD uint32_t mixprec__sr_bits(uint32_t key, int64_t i) {
  const uint64_t u = (uint64_t)i;
  return mixprec__mix32(key + (uint32_t)u * 0x9e3779b1u + (uint32_t)(u >> 32) * 0x85ebca77u);
}

/* x rounded stochastically to BF16 with the random word r. */
MIXPREC__HD uint16_t mixprec__f32_to_bf16_sr(float x, uint32_t r) {
  const uint32_t u = mixprec__sr_float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + (r >> 16)) >> 16);
}

#endif /* MIXPREC_STOCHASTIC_ROUND_H */
