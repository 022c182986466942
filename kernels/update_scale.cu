/* Dynamic loss-scale update on CUDA: the GPU twin of
 * c_ops/src/update_scale.c. The rule and the argument checks are the very
 * code of c_ops/src/update_scale.h, written so both backends agree bit for
 * bit (not yet run on a GPU). The state stays on the device and is read
 * there: no host synchronisation. */
#include "common.cuh"
#include "update_scale.h"

/* Four scalars: one thread. */
static __global__ void mixprec__update_scale_kernel(
    float *scale, int32_t *growth_tracker, int32_t *hysteresis_tracker,
    int64_t *skipped_steps, const float *found_inf,
    mixprec_update_scale_params p) {
  mixprec__update_scale_step(scale, growth_tracker, hysteresis_tracker,
                             skipped_steps, *found_inf, p.growth_factor,
                             p.backoff_factor, p.growth_interval, p.hysteresis,
                             p.min_scale, p.max_scale);
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_update_scale(
    float *scale, int32_t *growth_tracker, int32_t *hysteresis_tracker,
    int64_t *skipped_steps, const float *found_inf,
    const mixprec_update_scale_params *params, void *stream) {
  const mixprec_status st = mixprec__check_update_scale(
      scale, growth_tracker, hysteresis_tracker, found_inf, params);
  if (st != MIXPREC_OK) return st;
  mixprec__update_scale_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(
      scale, growth_tracker, hysteresis_tracker, skipped_steps, found_inf,
      *params);
  return mixprec__cuda_launch_status();
}
