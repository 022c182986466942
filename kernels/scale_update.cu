/* Dynamic loss-scale update on CUDA: the GPU twin of
 * c_ops/src/scale_update.c. The state lives on the device and is read there,
 * so a training step needs no host synchronisation. */
#include <limits.h>

#include "common.cuh"

/* Four scalars: one thread. Written to mirror torch's
 * _amp_update_scale_cuda_kernel, with hysteresis and bounds added. */
static __global__ void mixprec__update_scale_kernel(float *scale,
                                             int32_t *growth_tracker,
                                             int32_t *hysteresis_tracker,
                                             int64_t *skipped_steps,
                                             const float *found_inf,
                                             mixprec_scale_update_params p) {
  const float s = *scale;
  /* != 0 is true for NaN too: a NaN flag counts as an overflow. */
  if (*found_inf != 0.0f) {
    *growth_tracker = 0;
    int back_off = 1;
    if (hysteresis_tracker != NULL) {
      int32_t h = *hysteresis_tracker;
      if (h > INT32_MIN) h -= 1;
      *hysteresis_tracker = h;
      back_off = h <= 0;
    }
    if (back_off) {
      float b = __fmul_rn(s, p.backoff_factor);
      /* A comparison, not fmaxf: a NaN scale stays NaN as in torch. */
      if (b < p.min_scale) b = p.min_scale;
      *scale = b;
    }
    if (skipped_steps != NULL) *skipped_steps += 1;
  } else {
    if (hysteresis_tracker != NULL)
      *hysteresis_tracker =
          (int32_t)(p.hysteresis < INT32_MAX ? p.hysteresis : INT32_MAX);
    const int64_t successful = (int64_t)*growth_tracker + 1;
    if (successful == p.growth_interval) {
      const float g = __fmul_rn(s, p.growth_factor);
      if (mixprec__f32_is_finite(g)) *scale = g > p.max_scale ? p.max_scale : g;
      *growth_tracker = 0;
    } else {
      *growth_tracker = (int32_t)successful;
    }
  }
}

static int mixprec__positive_finite(float f) {
  return f > 0.0f && mixprec__f32_is_finite(f);
}

extern "C" MIXPREC_API mixprec_status mixprec_cuda_update_scale(
    float *scale, int32_t *growth_tracker, int32_t *hysteresis_tracker,
    int64_t *skipped_steps, const float *found_inf,
    const mixprec_scale_update_params *params, void *stream) {
  if (scale == NULL || growth_tracker == NULL || found_inf == NULL ||
      params == NULL)
    return MIXPREC_ERR_NULL_POINTER;
  const mixprec_scale_update_params p = *params;
  if (p.growth_interval < 1 || p.hysteresis < 1 ||
      !mixprec__positive_finite(p.growth_factor) ||
      !mixprec__positive_finite(p.backoff_factor) || !(p.min_scale >= 0.0f) ||
      !(p.min_scale <= p.max_scale))
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (hysteresis_tracker == NULL && p.hysteresis != 1)
    return MIXPREC_ERR_NULL_POINTER;

  mixprec__update_scale_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(
      scale, growth_tracker, hysteresis_tracker, skipped_steps, found_inf, p);
  return mixprec__cuda_launch_status();
}
