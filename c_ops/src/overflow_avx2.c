/* The overflow check's chunk scan compiled for AVX2 (see overflow_body.h). */
#include "internal.h"

#define MIXPREC__OVERFLOW_SCAN mixprec__overflow_scan_avx2
#include "overflow_body.h"
