// Creates the mixprec op namespace, which torch lets exactly one library
// define (a second STABLE_TORCH_LIBRARY(mixprec, ...), e.g. another copy of
// libmixprec.so, is refused). Each family's schemas sit beside its op in a
// fragment of it: amp.cpp, optim.cpp, nms.cpp, softmax.cpp,
// cross_entropy.cpp.
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(mixprec, m) { (void)m; }
