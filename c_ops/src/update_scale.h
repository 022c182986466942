/* The loss-scale update rule, shared verbatim by the CPU entry point and the
 * CUDA kernel (compiled as host+device code there). */
#ifndef MIXPREC_UPDATE_SCALE_H
#define MIXPREC_UPDATE_SCALE_H

#include <stdint.h>

#include "compiler.h"
#include "mixprec/mixprec.h"

/* Host-side argument check, the same for both backends. */
MIXPREC__HD mixprec_status mixprec__check_update_scale(
    const float *scale, const int32_t *growth_tracker,
    const int32_t *hysteresis_tracker, const float *found_inf,
    const mixprec_update_scale_params *p) {
  if (!scale || !growth_tracker || !found_inf || !p) return MIXPREC_ERR_NULL_POINTER;
  /* hysteresis is stored in the int32 tracker: above INT32_MAX it would be
   * truncated (2^32 + 2 would act as 2), so it is refused. */
  if (p->hysteresis < 1 || p->hysteresis > INT32_MAX || p->growth_interval < 1 ||
      p->growth_interval > INT32_MAX)
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (p->hysteresis > 1 && !hysteresis_tracker) return MIXPREC_ERR_NULL_POINTER;
  /* x - x is 0 only for finite x (inf - inf and NaN give NaN). */
  if (!(p->growth_factor > 0.0 && p->growth_factor - p->growth_factor == 0.0) ||
      !(p->backoff_factor > 0.0 && p->backoff_factor - p->backoff_factor == 0.0))
    return MIXPREC_ERR_BAD_ARGUMENT;
  if (!(p->min_scale >= 0.0f) || !(p->max_scale >= p->min_scale))
    return MIXPREC_ERR_BAD_ARGUMENT;
  return MIXPREC_OK;
}

MIXPREC__HD int mixprec__is_finite_f(float f) {
  union { float f; uint32_t u; } v;
  v.f = f;
  return (v.u & 0x7f800000u) != 0x7f800000u;
}

/* One update; see mixprec_update_scale() in mixprec/amp.h. With hysteresis 1,
 * min 0 and max inf this is exactly torch's _amp_update_scale_ (same double
 * products rounded to float). */
MIXPREC__HD void mixprec__update_scale_step(
    float *scale, int32_t *growth_tracker, int32_t *hysteresis_tracker,
    int64_t *skipped_steps, float found_inf, double growth_factor,
    double backoff_factor, int64_t growth_interval, int64_t hysteresis,
    float min_scale, float max_scale) {
  if (found_inf != 0.0f || found_inf != found_inf) {
    *growth_tracker = 0;
    int32_t left = 0;
    if (hysteresis_tracker) {
      if (*hysteresis_tracker > 0) --*hysteresis_tracker; /* no int32 underflow */
      left = *hysteresis_tracker;
    }
    if (left <= 0) {
      float s = (float)(*scale * backoff_factor);
      *scale = s < min_scale ? min_scale : s;
    }
    /* Saturates: INT64_MAX + 1 would be undefined behaviour. */
    if (skipped_steps && *skipped_steps < INT64_MAX) ++*skipped_steps;
  } else {
    if (hysteresis_tracker) *hysteresis_tracker = (int32_t)hysteresis;
    /* torch compares with ==: a tracker loaded above the interval never
     * grows the scale again. Kept for bit-compatibility; int64 arithmetic
     * and saturation avoid int32 overflow. */
    int64_t successful = (int64_t)*growth_tracker + 1;
    if (successful == growth_interval) {
      float s = (float)(*scale * growth_factor);
      if (mixprec__is_finite_f(s)) *scale = s > max_scale ? max_scale : s;
      *growth_tracker = 0;
    } else {
      *growth_tracker = successful > INT32_MAX ? INT32_MAX : (int32_t)successful;
    }
  }
}

#endif /* MIXPREC_UPDATE_SCALE_H */
