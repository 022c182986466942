/* Dynamic loss-scale update on CUDA: the GPU twin of
 * c_ops/src/scale_update.c. The rule and the argument checks are the very
 * code of c_ops/src/scale_update.h, so both backends agree bit for bit. The
 * state stays on the device and is read there: no host synchronisation. */
#include "common.cuh"
#include "scale_update.h"

/* Four scalars: one thread. */
static __global__ void mixprec__update_scale_kernel(
    float *scale, int32_t *growth_tracker, int32_t *hysteresis_tracker,
    int64_t *skipped_steps, const float *found_inf,
    mixprec_scale_update_params p) {
  mixprec__scale_update_step(scale, growth_tracker, hysteresis_tracker,
                             skipped_steps, *found_inf, p.growth_factor,
                             p.backoff_factor, p.growth_interval, p.hysteresis,
                             p.min_scale, p.max_scale);
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_update_scale(
    float *scale, int32_t *growth_tracker, int32_t *hysteresis_tracker,
    int64_t *skipped_steps, const float *found_inf,
    const mixprec_scale_update_params *params, void *stream) {
  const mixprec_status st = mixprec__check_scale_update(
      scale, growth_tracker, hysteresis_tracker, found_inf, params);
  if (st != MIXPREC_OK) return st;
  mixprec__update_scale_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(
      scale, growth_tracker, hysteresis_tracker, skipped_steps, found_inf,
      *params);
  return mixprec__cuda_launch_status();
}
