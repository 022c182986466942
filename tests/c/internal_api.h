// The library's internal C declarations, for the white-box C tests:
// internal.h (a C header without extern "C" of its own), with MIXPREC_X86 set
// as CMakeLists.txt sets it for the library target alone (the x86 kernels are
// declared only with it).
#ifndef MIXPREC_TESTS_INTERNAL_API_H
#define MIXPREC_TESTS_INTERNAL_API_H

#if (defined(__x86_64__) || defined(__i386__)) && !defined(MIXPREC_X86)
#define MIXPREC_X86 1
#endif
extern "C" {
#include "internal.h"
}

#endif  // MIXPREC_TESTS_INTERNAL_API_H
