#include "internal.h"

const char *mixprec_status_string(mixprec_status status) {
  switch (status) {
#define MIXPREC_X_CASE(name, value, text) \
  case name:                              \
    return #name ": " text;
    MIXPREC_STATUS_LIST(MIXPREC_X_CASE)
#undef MIXPREC_X_CASE
  }
  return "unknown status";
}

int mixprec_version(void) {
  return MIXPREC_VERSION_MAJOR * 10000 + MIXPREC_VERSION_MINOR * 100 +
         MIXPREC_VERSION_PATCH;
}

int mixprec_dtype_size(mixprec_dtype dtype) {
  switch (dtype) {
    case MIXPREC_F32:
      return 4;
    case MIXPREC_F16:
    case MIXPREC_BF16:
      return 2;
  }
  return 0;
}
