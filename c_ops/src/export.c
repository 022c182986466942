/* The pure C API as a shared library (libmixprec_capi.so): every public
 * symbol comes from the static mixprec_c archive linked whole; this file only
 * gives the target a source of its own. */
#include "mixprec/mixprec.h"

int mixprec__capi_anchor(void);
int mixprec__capi_anchor(void) { return mixprec_version(); }
