/* AVX-512 (F, BW, VL, DQ) kernels of the SGD step (sgd.c): the body and lean
 * kernels of sgd_simd.h at 16 lanes (bit-identical to the scalar body and to
 * AVX2; a range's last whole 8 elements go to the AVX2 kernel). Compiled
 * with the AVX-512 flags (CMakeLists.txt), called only when the CPU has them. */
#define MIXPREC__VW 16
#include "sgd_simd.h"
