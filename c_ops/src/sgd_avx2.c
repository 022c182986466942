/* AVX2 + FMA + F16C kernels of the SGD step (sgd.c): the body and lean
 * kernels of sgd_simd.h at 8 lanes. Compiled with -mavx2 -mfma -mf16c,
 * called only when the CPU has them. */
#define MIXPREC__VW 8
#include "sgd_simd.h"
