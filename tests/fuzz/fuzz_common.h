/* Shared helpers of the libFuzzer harnesses in tests/fuzz/.
 *
 * Each harness decodes the fuzz input into one structured call of a C entry
 * point (with fz_* below), then checks the C contract of mixprec.h:
 *   - the status is one the header documents for that input (the harness
 *     works out which errors apply; OK only when none does);
 *   - on an error status every output buffer is bitwise unchanged;
 *   - on success the outputs are the same bits with 1 and with 2 threads and
 *     on every ISA path this CPU has (where the header promises bit-identical
 *     paths), plus cheap cross-checks against references written here.
 * A violation prints what was seen and aborts, which libFuzzer reports as a
 * crash and saves the input.
 *
 * When the input is used up, bytes come from a PRNG seeded by a hash of the
 * whole input, so a short input can still describe large tensors. */
#ifndef MIXPREC_FUZZ_COMMON_H
#define MIXPREC_FUZZ_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mixprec/mixprec.h"

#define FZ_FAIL(...)                                                         \
  do {                                                                       \
    fprintf(stderr, "mixprec contract violation at %s:%d: ", __FILE__,      \
            __LINE__);                                                       \
    fprintf(stderr, __VA_ARGS__);                                            \
    fputc('\n', stderr);                                                     \
    abort();                                                                 \
  } while (0)

#define FZ_CHECK(cond, ...)   \
  do {                        \
    if (!(cond)) FZ_FAIL(__VA_ARGS__); \
  } while (0)

/* libFuzzer calls this once before the first input. OpenMP workers that
 * spin after a parallel region (libomp's default 200 ms) take the CPU from
 * the next input on a busy machine: let them sleep at once. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  setenv("KMP_BLOCKTIME", "0", 0);
  return 0;
}

/* ---- Input decoding ------------------------------------------------------ */

typedef struct fz {
  const uint8_t *p;
  size_t n;
  uint64_t s; /* PRNG state once the input is used up (and for bulk fills) */
} fz;

static inline void fz_init(fz *f, const uint8_t *data, size_t size) {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)size;
  for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 0x100000001b3ull;
  f->p = data;
  f->n = size;
  f->s = h;
}

static inline uint64_t fz_rng(fz *f) { /* splitmix64 */
  uint64_t z = (f->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint8_t fz_u8(fz *f) {
  if (f->n) {
    f->n--;
    return *f->p++;
  }
  return (uint8_t)fz_rng(f);
}

static inline uint16_t fz_u16(fz *f) {
  uint16_t a = fz_u8(f);
  return (uint16_t)(a | (uint16_t)fz_u8(f) << 8);
}

static inline uint32_t fz_u32(fz *f) {
  uint32_t a = fz_u16(f);
  return a | (uint32_t)fz_u16(f) << 16;
}

static inline uint64_t fz_u64(fz *f) {
  uint64_t a = fz_u32(f);
  return a | (uint64_t)fz_u32(f) << 32;
}

/* Uniform-ish in [lo, hi] (inclusive), hi - lo < 2^32. */
static inline int64_t fz_range(fz *f, int64_t lo, int64_t hi) {
  uint64_t span = (uint64_t)(hi - lo) + 1;
  uint32_t v = span <= 256 ? fz_u8(f) : span <= 65536 ? fz_u16(f) : fz_u32(f);
  return lo + (int64_t)(v % span);
}

static inline float fz_f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static inline uint32_t fz_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static inline int fz_finite(float x) { return (fz_bits(x) & 0x7f800000u) != 0x7f800000u; }
static inline int fz_isnan(float x) { return (fz_bits(x) & 0x7fffffffu) > 0x7f800000u; }

/* Values that break code: signed zeros, infinities, NaNs with payloads,
 * subnormals, the limits of each dtype and the rounding boundaries. */
static inline float fz_special(fz *f) {
  static const uint32_t table[] = {
      0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u, 0x7f800000u,
      0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u,
      0x00000001u, 0x80000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu,
      0xff7fffffu, 0x477fe000u, /* 65504 */ 0x477ff000u, /* 65520 */
      0x47800000u, 0x33000000u, /* 2^-25 */ 0x38800000u, /* 2^-14 */
      0x3f808000u, /* 1 + bf16 half ulp */ 0x3f801000u, 0x5f800000u,
      0x1f800000u, 0x3dcccccdu, 0x4b800000u, 0x7f7f8000u, 0x3f7fffffu,
      0x2edbe6ffu, /* 1e-10 */ 0x501502f9u, /* 1e10 */ 0xc2c80000u /* -100 */};
  return fz_f32_from_bits(table[fz_u8(f) % (sizeof table / sizeof table[0])]);
}

/* A float hyper-parameter or scalar: mostly a value in [lo, hi], sometimes a
 * special one or raw bits. */
static inline double fz_param(fz *f, double lo, double hi) {
  uint8_t m = fz_u8(f);
  if (m < 160) return lo + (hi - lo) * (double)fz_u16(f) / 65535.0;
  if (m < 176) return lo;
  if (m < 192) return hi;
  if (m < 240) return (double)fz_special(f);
  if (m < 248) return (double)fz_f32_from_bits(fz_u32(f));
  uint64_t u = fz_u64(f);
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

/* An element count from a size class: mostly small, sometimes around the
 * kernels' block, chunk (65536) and threading limits. */
static inline int64_t fz_count(fz *f, int64_t big) {
  uint8_t c = fz_u8(f);
  if (c < 16) return 0;
  if (c < 200) return fz_range(f, 1, 40);
  if (c < 240) return fz_range(f, 41, 1100);
  if (c < 253 || big <= 0) return fz_range(f, 1101, 5000);
  return fz_range(f, big - 300, big + 3000);
}

/* ---- Buffers ------------------------------------------------------------- */

static inline size_t fz_dsize(mixprec_dtype d) {
  int s = mixprec_dtype_size(d);
  return s > 0 ? (size_t)s : 4;
}

static inline float fz_load(const void *p, mixprec_dtype d, int64_t i) {
  switch (d) {
    case MIXPREC_F16: {
      mixprec_f16 h;
      memcpy(&h, (const char *)p + 2 * i, 2);
      return mixprec_f16_to_f32(h);
    }
    case MIXPREC_BF16: {
      mixprec_bf16 h;
      memcpy(&h, (const char *)p + 2 * i, 2);
      return mixprec_bf16_to_f32(h);
    }
    default: {
      float x;
      memcpy(&x, (const char *)p + 4 * i, 4);
      return x;
    }
  }
}

static inline void fz_store(void *p, mixprec_dtype d, int64_t i, float v) {
  switch (d) {
    case MIXPREC_F16: {
      mixprec_f16 h = mixprec_f32_to_f16(v);
      memcpy((char *)p + 2 * i, &h, 2);
      break;
    }
    case MIXPREC_BF16: {
      mixprec_bf16 h = mixprec_f32_to_bf16(v);
      memcpy((char *)p + 2 * i, &h, 2);
      break;
    }
    default:
      memcpy((char *)p + 4 * i, &v, 4);
  }
}

/* v rounded to dtype d and widened back. */
static inline float fz_round(mixprec_dtype d, float v) {
  switch (d) {
    case MIXPREC_F16:
      return mixprec_f16_to_f32(mixprec_f32_to_f16(v));
    case MIXPREC_BF16:
      return mixprec_bf16_to_f32(mixprec_f32_to_bf16(v));
    default:
      return v;
  }
}

/* Exactly `bytes` bytes from malloc (so ASan flags one byte past the end);
 * a distinct pointer even for 0 bytes. */
static inline void *fz_alloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) FZ_FAIL("harness out of memory (%zu bytes)", bytes);
  if (bytes == 0) {
    free(p);
    p = malloc(0);
    if (!p) FZ_FAIL("harness out of memory");
  }
  return p;
}

static inline void *fz_dup(const void *src, size_t bytes) {
  void *p = fz_alloc(bytes);
  if (bytes) memcpy(p, src, bytes);
  return p;
}

/* Fills n elements of dtype d from the input: raw bits, values at one of
 * several scales, integers (for ties), a constant, or values with specials
 * sprinkled in. */
static inline void fz_fill(fz *f, void *buf, mixprec_dtype d, int64_t n) {
  const uint8_t mode = fz_u8(f) % 8;
  const int e = (int)fz_range(f, -40, 40);
  const float scale = ldexpf(1.0f, e);
  const uint8_t rate = fz_u8(f);
  const float konst = fz_special(f);
  for (int64_t i = 0; i < n; i++) {
    float v;
    switch (mode) {
      case 0: /* raw bits, from the input while it lasts */
        if (d == MIXPREC_F32) {
          v = fz_f32_from_bits(fz_u32(f));
        } else {
          uint16_t h = fz_u16(f);
          memcpy((char *)buf + 2 * i, &h, 2);
          continue;
        }
        break;
      case 1: /* small integers: many ties and exact values */
        v = (float)((int)(fz_rng(f) % 9) - 4);
        break;
      case 2:
        v = konst;
        break;
      case 3: /* values with specials at a rate of (rate+1)/4096 */
      case 4: {
        uint64_t r = fz_rng(f);
        if ((r & 4095) <= rate)
          v = fz_special(f);
        else
          v = scale * ((float)(int32_t)(uint32_t)(r >> 32) / 2147483648.0f);
        break;
      }
      case 5: { /* mixed magnitudes: sign * 2^[-60, 60) * [1, 2) */
        uint64_t r = fz_rng(f);
        v = ldexpf(1.0f + (float)(r & 0xffffff) / 16777216.0f, (int)((r >> 24) % 120) - 60);
        if (r >> 63) v = -v;
        break;
      }
      default: { /* uniform in [-scale, scale) */
        uint64_t r = fz_rng(f);
        v = scale * ((float)(int32_t)(uint32_t)(r >> 32) / 2147483648.0f);
      }
    }
    fz_store(buf, d, i, v);
  }
}

/* A dtype: valid mostly; with `faults`, sometimes an unknown value. */
static inline mixprec_dtype fz_dtype(fz *f, int faults) {
  uint8_t b = fz_u8(f);
  if (faults && b >= 240) {
    static const int bad[] = {3, 4, -1, 255, 0x7fffffff};
    return (mixprec_dtype)bad[b % 5];
  }
  return (mixprec_dtype)(b % 3);
}

static inline int fz_dtype_ok(mixprec_dtype d) {
  return d == MIXPREC_F32 || d == MIXPREC_F16 || d == MIXPREC_BF16;
}

/* ---- Configurations: threads x ISA paths --------------------------------- */

#define FZ_MAX_CONFIGS 6 /* ISAs x thread counts {1, 2} */

typedef struct fz_config {
  mixprec_cpu_isa isa;
  int threads;
} fz_config;

/* Every (ISA this CPU runs, thread count in {1, 2}); returns the count. */
static inline int fz_configs(fz_config out[FZ_MAX_CONFIGS]) {
  static const mixprec_cpu_isa isas[] = {MIXPREC_ISA_SCALAR, MIXPREC_ISA_AVX2,
                                         MIXPREC_ISA_AVX512};
  int n = 0;
  for (int i = 0; i < 3; i++) {
    if (!mixprec_cpu_isa_supported(isas[i])) continue;
    for (int t = 1; t <= 2; t++) {
      out[n].isa = isas[i];
      out[n].threads = t;
      n++;
    }
  }
  return n;
}

static inline void fz_apply(fz_config c) {
  if (mixprec_set_cpu_isa(c.isa) != MIXPREC_OK) FZ_FAIL("set_cpu_isa(%d) refused", (int)c.isa);
  FZ_CHECK(mixprec_get_cpu_isa() == c.isa, "get_cpu_isa %d != %d", (int)mixprec_get_cpu_isa(),
           (int)c.isa);
  mixprec_set_num_threads(c.threads);
}

/* [note: fuzz harness shape] Each harness's LLVMFuzzerTestOneInput opens
 * with FZ_OPEN (the decoder `f` over the input, its `call c` zeroed, the op
 * byte whose low bits pick the variant and whose top bits, all set, turn on
 * faults: fz_faults), decodes the call and the errors it allows, then runs it
 * once per configuration (FZ_CONFIGS, FZ_FOR_EACH_CONFIG, which applies each
 * one): cfg[0]'s outputs are the reference the others must equal. */
#define FZ_OPEN(f, c, op)  \
  fz f;                    \
  fz_init(&f, data, size); \
  call c;                  \
  memset(&c, 0, sizeof c); \
  const uint8_t op = fz_u8(&f)
#define FZ_CONFIGS(cfg, n_cfg)       \
  fz_config cfg[FZ_MAX_CONFIGS]; \
  int n_cfg = fz_configs(cfg)
#define FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) \
  for (int k = 0; k < (n_cfg); k++)       \
    if (fz_apply(cfg[k]), 1)

static inline int fz_faults(uint8_t op, uint8_t top) { return (op & top) == top; }

static inline const char *fz_isa_name(mixprec_cpu_isa isa) {
  switch (isa) {
    case MIXPREC_ISA_SCALAR: return "scalar";
    case MIXPREC_ISA_AVX2: return "avx2";
    case MIXPREC_ISA_AVX512: return "avx512";
    default: return "auto";
  }
}

/* Bitwise equality of two buffers; on a difference names the buffer, the
 * first differing byte and the two configurations. */
static inline void fz_same(const char *what, const void *a, const void *b, size_t bytes,
                           fz_config ca, fz_config cb) {
  if (bytes == 0 || memcmp(a, b, bytes) == 0) return;
  size_t i = 0;
  while (((const uint8_t *)a)[i] == ((const uint8_t *)b)[i]) i++;
  FZ_FAIL("%s differs at byte %zu (%02x vs %02x) between %s/%d threads and %s/%d threads", what,
          i, ((const uint8_t *)a)[i], ((const uint8_t *)b)[i], fz_isa_name(ca.isa), ca.threads,
          fz_isa_name(cb.isa), cb.threads);
}

/* As fz_same on n elements of dtype d, but any two NaNs count as equal
 * (whatever their sign and payload), unless FZ_STRICT_NAN is set; names the
 * element that differs. For the optimizer steps, whose scalar and AVX2
 * paths give some NaN results opposite signs (see tests/fuzz/README.md). */
static inline void fz_same_nan(const char *what, int tensor, const void *a, const void *b,
                               mixprec_dtype d, int64_t n, fz_config ca, fz_config cb) {
  const size_t es = fz_dsize(d);
  if (n <= 0 || memcmp(a, b, (size_t)n * es) == 0) return;
  for (int64_t i = 0; i < n; i++) {
    if (!memcmp((const char *)a + i * es, (const char *)b + i * es, es)) continue;
    const float x = fz_load(a, d, i), y = fz_load(b, d, i);
    if (fz_isnan(x) && fz_isnan(y) && !getenv("FZ_STRICT_NAN")) continue;
    FZ_FAIL("%s of tensor %d differs at element %lld (%a vs %a) between %s/%d threads and "
            "%s/%d threads", what, tensor, (long long)i, (double)x, (double)y,
            fz_isa_name(ca.isa), ca.threads, fz_isa_name(cb.isa), cb.threads);
  }
}

static inline void fz_unchanged(const char *what, const void *before, const void *after,
                                size_t bytes, mixprec_status st) {
  if (bytes == 0 || memcmp(before, after, bytes) == 0) return;
  size_t i = 0;
  while (((const uint8_t *)before)[i] == ((const uint8_t *)after)[i]) i++;
  FZ_FAIL("%s written (byte %zu: %02x -> %02x) although the status is %d (%s)", what, i,
          ((const uint8_t *)before)[i], ((const uint8_t *)after)[i], (int)st,
          mixprec_status_string(st));
}

/* The set of statuses an input allows, as a bit mask over status values. */
typedef uint32_t fz_allowed;
#define FZ_BIT(s) ((fz_allowed)1u << (unsigned)(s))

/* `errors` holds every error the header documents for this input; the call
 * must return one of them, or MIXPREC_OK if there is none. */
static inline void fz_check_status(const char *fn, mixprec_status st, fz_allowed errors) {
  if (errors == 0) {
    FZ_CHECK(st == MIXPREC_OK, "%s returned %d (%s) for a valid call", fn, (int)st,
             mixprec_status_string(st));
  } else {
    FZ_CHECK(st != MIXPREC_OK && (unsigned)st < 32 && (errors & FZ_BIT(st)),
             "%s returned %d (%s); the documented errors for this input are mask 0x%x", fn,
             (int)st, mixprec_status_string(st), (unsigned)errors);
  }
}

#endif /* MIXPREC_FUZZ_COMMON_H */
