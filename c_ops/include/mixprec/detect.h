/* Former name of mixprec/efficient_nms.h, kept so existing includes build. */
#include "mixprec/efficient_nms.h"
