/* mixprec C API: Non-maximum suppression. Included by mixprec/mixprec.h. */
#ifndef MIXPREC_NMS_H
#define MIXPREC_NMS_H

#include "mixprec/mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MIXPREC_NMS_H */
