/* mixprec C API: Softmax, log_softmax and cross-entropy. Included by mixprec/mixprec.h. */
#ifndef MIXPREC_SOFTMAX_H
#define MIXPREC_SOFTMAX_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MIXPREC_SOFTMAX_H */
