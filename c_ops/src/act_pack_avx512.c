/* The AVX-512 path of the act_pack family: act_pack_avx2_body.h's 256-bit
 * intrinsics body, compiled with AVX-512 enabled. */
#include "act_pack_avx2_body.h"

MIXPREC__ACT_DEFINE_SIMD256(avx512)
MIXPREC__ACT_DEFINE_EXTRA(avx512)
