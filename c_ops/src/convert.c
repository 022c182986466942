#include "internal.h"

float mixprec_f16_to_f32(mixprec_f16 h) { return mixprec__f16_to_f32(h.bits); }

mixprec_f16 mixprec_f32_to_f16(float f) {
  mixprec_f16 h = {mixprec__f32_to_f16(f)};
  return h;
}

float mixprec_bf16_to_f32(mixprec_bf16 h) { return mixprec__bf16_to_f32(h.bits); }

mixprec_bf16 mixprec_f32_to_bf16(float f) {
  mixprec_bf16 h = {mixprec__f32_to_bf16(f)};
  return h;
}
