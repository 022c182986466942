/* Dynamic loss-scale update (torch._amp_update_scale_ plus hysteresis and
 * bounds). The rule itself lives in update_scale.h so the CUDA kernel runs the
 * very same code. */
#include "internal.h"
#include "update_scale.h"

mixprec_update_scale_params mixprec_update_scale_params_default(void) {
  mixprec_update_scale_params p;
  p.growth_factor = 2.0f;
  p.backoff_factor = 0.5f;
  p.growth_interval = 2000;
  p.hysteresis = 1;
  p.min_scale = 0.0f;
  p.max_scale = mixprec__f32_from_bits(0x7f800000u);
  return p;
}

mixprec_update_scale_params mixprec_scale_update_params_default(void) {
  return mixprec_update_scale_params_default();
}

mixprec_status mixprec_update_scale(float *scale, int32_t *growth_tracker,
                                    int32_t *hysteresis_tracker,
                                    int64_t *skipped_steps,
                                    const float *found_inf,
                                    const mixprec_update_scale_params *params) {
  mixprec_status st = mixprec__check_update_scale(
      scale, growth_tracker, hysteresis_tracker, found_inf, params);
  if (st != MIXPREC_OK) return st;
  mixprec__update_scale_step(scale, growth_tracker, hysteresis_tracker,
                             skipped_steps, *found_inf, params->growth_factor,
                             params->backoff_factor, params->growth_interval,
                             params->hysteresis, params->min_scale,
                             params->max_scale);
  return MIXPREC_OK;
}
