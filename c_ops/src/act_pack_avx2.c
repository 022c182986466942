/* The AVX2 + F16C path of the act_pack family: the 256-bit intrinsics body
 * of act_pack_avx2_body.h (full blocks; a tensor's partial last block
 * through the scalar body), bit for bit the scalar rules. */
#include "act_pack_avx2_body.h"

MIXPREC__ACT_DEFINE_SIMD256(avx2)
MIXPREC__ACT_DEFINE_EXTRA(avx2)
