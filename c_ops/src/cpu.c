/* Run-time choice of the CPU kernels' instruction set, and the thread cap. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(MIXPREC_X86) && defined(__GNUC__)
#include <cpuid.h>

/* F16C from CPUID leaf 1 (ECX bit 29): clang 14 (Debian 12) does not know the
 * "f16c" name of __builtin_cpu_supports. The AVX checks beside it cover the
 * OS's saving of the YMM state, which F16C needs too. */
static int has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif

static int isa_supported(mixprec_cpu_isa isa) {
  switch (isa) {
    case MIXPREC_ISA_AUTO:
    case MIXPREC_ISA_SCALAR:
      return 1;
#if defined(MIXPREC_X86) && defined(__GNUC__)
    case MIXPREC_ISA_AVX2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case MIXPREC_ISA_AVX512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
#else
    case MIXPREC_ISA_AVX2:
    case MIXPREC_ISA_AVX512:
      return 0;
#endif
  }
  return 0;
}

static mixprec_cpu_isa best_isa(void) {
  const char *env = getenv("MIXPREC_CPU_ISA");
  if (env) {
    mixprec_cpu_isa want = MIXPREC_ISA_AUTO;
    if (!strcmp(env, "scalar")) want = MIXPREC_ISA_SCALAR;
    if (!strcmp(env, "avx2")) want = MIXPREC_ISA_AVX2;
    if (!strcmp(env, "avx512")) want = MIXPREC_ISA_AVX512;
    if (want != MIXPREC_ISA_AUTO && isa_supported(want)) return want;
  }
  if (isa_supported(MIXPREC_ISA_AVX512)) return MIXPREC_ISA_AVX512;
  if (isa_supported(MIXPREC_ISA_AVX2)) return MIXPREC_ISA_AVX2;
  return MIXPREC_ISA_SCALAR;
}

/* 0 = not chosen yet. Set once lazily; a benign race writes the same value. */
static mixprec_cpu_isa g_isa = MIXPREC_ISA_AUTO;
static int g_num_threads = 0;

int mixprec_cpu_isa_supported(mixprec_cpu_isa isa) {
  if (isa == MIXPREC_ISA_AUTO) return 1;
  return isa_supported(isa);
}

mixprec_status mixprec_set_cpu_isa(mixprec_cpu_isa isa) {
  switch (isa) {
    case MIXPREC_ISA_AUTO:
      g_isa = best_isa();
      return MIXPREC_OK;
    case MIXPREC_ISA_SCALAR:
    case MIXPREC_ISA_AVX2:
    case MIXPREC_ISA_AVX512:
      if (!isa_supported(isa)) return MIXPREC_ERR_UNSUPPORTED;
      g_isa = isa;
      return MIXPREC_OK;
  }
  return MIXPREC_ERR_BAD_ARGUMENT;
}

mixprec_cpu_isa mixprec__active_isa(void) {
  if (g_isa == MIXPREC_ISA_AUTO) g_isa = best_isa();
  return g_isa;
}

mixprec_cpu_isa mixprec_get_cpu_isa(void) { return mixprec__active_isa(); }

void mixprec_set_num_threads(int n) { g_num_threads = n > 0 ? n : 0; }

int mixprec__num_threads(void) {
#ifdef _OPENMP
  return g_num_threads > 0 ? g_num_threads : omp_get_max_threads();
#else
  return 1;
#endif
}

int mixprec_get_num_threads(void) { return mixprec__num_threads(); }
