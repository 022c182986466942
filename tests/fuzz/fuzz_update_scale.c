/* libFuzzer harness: mixprec_update_scale() (amp.h).
 *
 * One input = one update with any scale, trackers (int32 extremes
 * included), skipped-step counter, found_inf (NaN, -0, subnormal...) and
 * parameters (factors that are 0, negative, NaN, inf, huge; intervals and
 * hysteresis outside [1, INT32_MAX]; min/max scale out of order), and NULL
 * pointers. Checked: the status is one the header documents; on an error no
 * output changed; on success every output equals the header's rule as written
 * here (bit for bit), the same on 1 and 2 threads and on each ISA path. */
#include "fuzz_common.h"

typedef struct state {
  float scale;
  int32_t growth, hyst;
  int64_t skipped;
} state;

/* The rule of the header, written from its text. */
static void reference(state *s, int has_hyst, int has_skipped, float found_inf,
                      const mixprec_update_scale_params *p) {
  if (found_inf != 0.0f || fz_isnan(found_inf)) {
    s->growth = 0;
    int32_t left = 0;
    if (has_hyst) {
      if (s->hyst > 0) s->hyst -= 1;
      left = s->hyst;
    }
    if (left <= 0) {
      const float b = (float)((double)s->scale * p->backoff_factor);
      s->scale = b < p->min_scale ? p->min_scale : b;
    }
    if (has_skipped && s->skipped < INT64_MAX) s->skipped += 1;
  } else {
    if (has_hyst) s->hyst = (int32_t)p->hysteresis;
    const int64_t next = (int64_t)s->growth + 1;
    if (next == p->growth_interval) {
      const float g = (float)((double)s->scale * p->growth_factor);
      if (fz_finite(g)) s->scale = g > p->max_scale ? p->max_scale : g;
      s->growth = 0;
    } else {
      s->growth = next > INT32_MAX ? INT32_MAX : (int32_t)next;
    }
  }
}

static int32_t tracker(fz *f, int64_t interval) {
  const uint8_t m = fz_u8(f);
  if (m < 100) return (int32_t)fz_range(f, 0, 8);
  if (m < 150 && interval >= 1 && interval <= INT32_MAX)
    return (int32_t)(interval - fz_range(f, 0, 3));
  if (m < 170) return INT32_MAX - (int32_t)fz_range(f, 0, 2);
  if (m < 180) return INT32_MIN + (int32_t)fz_range(f, 0, 2);
  return (int32_t)fz_u32(f);
}

static int64_t count_param(fz *f) {
  const uint8_t m = fz_u8(f);
  if (m < 128) return fz_range(f, 1, 5);
  if (m < 160) return 2000;
  if (m < 176) return INT32_MAX;
  if (m < 192) return (int64_t)INT32_MAX + 1;
  if (m < 208) return 0;
  if (m < 216) return -1;
  if (m < 224) return INT64_MAX;
  if (m < 232) return INT64_MIN;
  if (m < 240) return ((int64_t)1 << 32) + 2;
  return (int64_t)fz_u64(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f;
  fz_init(&f, data, size);
  const uint8_t flags = fz_u8(&f);
  mixprec_update_scale_params p = mixprec_update_scale_params_default();
  if (flags & 1) {
    p.growth_factor = fz_param(&f, 1.0, 4.0);
    p.backoff_factor = fz_param(&f, 0.0, 1.0);
    p.growth_interval = count_param(&f);
    p.hysteresis = count_param(&f);
    p.min_scale = (float)fz_param(&f, 0.0, 1.0);
    p.max_scale = fz_u8(&f) < 128 ? INFINITY : (float)fz_param(&f, 1.0, 1e30);
  }
  state s0;
  s0.scale = fz_u8(&f) < 160 ? ldexpf(1.0f, (int)fz_range(&f, -30, 127)) : fz_special(&f);
  s0.growth = tracker(&f, p.growth_interval);
  s0.hyst = tracker(&f, p.hysteresis);
  const uint8_t sk = fz_u8(&f);
  s0.skipped = sk < 200 ? (int64_t)sk : sk < 230 ? INT64_MAX - (sk - 200) : (int64_t)fz_u64(&f);
  const uint8_t fi = fz_u8(&f);
  const float found_inf = fi < 120 ? 0.0f : fi < 200 ? 1.0f : fz_special(&f);

  const int has_hyst = !(flags & 4);
  const int has_skipped = !(flags & 8);
  const int faults = (flags & 0x70) == 0x70;
  const uint8_t null_mask = faults ? fz_u8(&f) : 0;

  fz_allowed errors = 0;
  if (null_mask & 0x0f) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER); /* scale, growth, found, p */
  if (p.hysteresis < 1 || p.hysteresis > INT32_MAX || p.growth_interval < 1 ||
      p.growth_interval > INT32_MAX)
    errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (p.hysteresis > 1 && !has_hyst) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  if (!(p.growth_factor > 0.0 && isfinite(p.growth_factor)) ||
      !(p.backoff_factor > 0.0 && isfinite(p.backoff_factor)))
    errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (!(p.min_scale >= 0.0f) || !(p.min_scale <= p.max_scale))
    errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);

  state want = s0;
  if (!errors) reference(&want, has_hyst, has_skipped, found_inf, &p);

  FZ_CONFIGS(cfg, n_cfg);
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    state s = s0;
    const float fin = found_inf;
    const mixprec_update_scale_params pp = p;
    const mixprec_status st = mixprec_update_scale(
        (null_mask & 1) ? NULL : &s.scale, (null_mask & 2) ? NULL : &s.growth,
        has_hyst ? &s.hyst : NULL, has_skipped ? &s.skipped : NULL,
        (null_mask & 4) ? NULL : &fin, (null_mask & 8) ? NULL : &pp);
    fz_check_status("mixprec_update_scale", st, errors);
    fz_unchanged("found_inf (input)", &found_inf, &fin, sizeof fin, st);
    fz_unchanged("params (input)", &p, &pp, sizeof pp, st);
    if (st != MIXPREC_OK) {
      fz_unchanged("scale", &s0.scale, &s.scale, sizeof s.scale, st);
      fz_unchanged("growth_tracker", &s0.growth, &s.growth, sizeof s.growth, st);
      fz_unchanged("hysteresis_tracker", &s0.hyst, &s.hyst, sizeof s.hyst, st);
      fz_unchanged("skipped_steps", &s0.skipped, &s.skipped, sizeof s.skipped, st);
      break;
    }
    FZ_CHECK(fz_bits(s.scale) == fz_bits(want.scale) && s.growth == want.growth &&
                 s.hyst == want.hyst && s.skipped == want.skipped,
             "update from scale %a growth %d hyst %d skipped %lld found_inf %a "
             "(growth %.17g backoff %.17g interval %lld hysteresis %lld min %a max %a): "
             "got scale %a growth %d hyst %d skipped %lld, the rule gives %a %d %d %lld",
             (double)s0.scale, s0.growth, s0.hyst, (long long)s0.skipped, (double)found_inf,
             p.growth_factor, p.backoff_factor, (long long)p.growth_interval,
             (long long)p.hysteresis, (double)p.min_scale, (double)p.max_scale, (double)s.scale,
             s.growth, s.hyst, (long long)s.skipped, (double)want.scale, want.growth, want.hyst,
             (long long)want.skipped);
  }
  return 0;
}
