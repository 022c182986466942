// The overflow family's op (overflow_check_), validated once for both
// devices: a template over a backend B (overflow.cpp: CPU, overflow_cuda.cpp:
// CUDA) that only says how to run the C entry point:
//   B::check_device(op, where)
//   B::check(args) -> mixprec_status
// Every check runs before the kernel, so a failed call writes nothing.
#pragma once

#include <vector>

#include "common.h"

namespace mixprec_shim {
namespace overflow {

struct CheckArgs {
  std::vector<mixprec_tensor> outputs, inputs;
  std::vector<Tensor> keep;  // contiguous copies of non-dense tensors, alive for the call
  float* record;
  int64_t n_slots, slot;
  Where device;
};

// A list of float32/float16/bfloat16 tensors on the record's device. Any
// strides: the op only reads, so a tensor that is not dense is read through
// a contiguous copy (in its own dtype). They may share memory with one
// another (an in-place module's input is its output), never with the record.
inline void add_list(const char* op, const char* name, const std::vector<Tensor>& list,
                     const Where& dev, const Span& rec, std::vector<mixprec_tensor>& out,
                     std::vector<Tensor>& keep) {
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); i++) {
    const Tensor& t = list[i];
    MIXPREC_CHECK(t.defined(), "mixprec::", op, ": ", name, "[", i, "] is undefined");
    MIXPREC_CHECK(t.layout() == Layout::Strided, "mixprec::", op, ": ", name, "[", i,
                  "] must be a strided tensor");
    mixprec_dtype dt;
    MIXPREC_CHECK(to_mixprec_dtype(t.scalar_type(), &dt), "mixprec::", op, ": ", name, "[", i,
                  "] must be float32, float16 or bfloat16, got ", dtype_name(t.scalar_type()));
    MIXPREC_CHECK(where(t) == dev, "mixprec::", op, ": ", name, "[", i, "] is on ",
                  describe(where(t)), " but record is on ", describe(dev));
    std::vector<Span> spans;
    add_span(spans, t, name, static_cast<int64_t>(i));
    MIXPREC_CHECK(spans.empty() || spans[0].hi <= rec.lo || rec.hi <= spans[0].lo, "mixprec::", op,
                  ": ", name, "[", i, "] and record share memory; the record must be its own buffer");
    if (t.numel() == 0) {
      out.push_back({nullptr, 0, dt});
      continue;
    }
    if (is_dense(t)) {
      out.push_back({t.data_ptr(), t.numel(), dt});
    } else {
      keep.push_back(torch::stable::contiguous(t));
      out.push_back({keep.back().data_ptr(), t.numel(), dt});
    }
  }
}

// record: a contiguous float32 tensor of shape [n_slots, MIXPREC_OVERFLOW_SLOT]
// (n_slots >= 1); slot in [0, n_slots).
inline CheckArgs check_args(const char* op, const std::vector<Tensor>& outputs,
                            const std::vector<Tensor>& inputs, const Tensor& record, int64_t slot) {
  CheckArgs a;
  MIXPREC_CHECK(record.defined() && record.layout() == Layout::Strided, "mixprec::", op,
                ": record must be a defined strided tensor");
  MIXPREC_CHECK(record.scalar_type() == ScalarType::Float, "mixprec::", op,
                ": record must be float32, got ", dtype_name(record.scalar_type()));
  MIXPREC_CHECK(record.dim() == 2 && record.sizes()[1] == MIXPREC_OVERFLOW_SLOT &&
                    record.sizes()[0] >= 1,
                "mixprec::", op, ": record must have shape [n_slots, ", MIXPREC_OVERFLOW_SLOT,
                "] with n_slots >= 1, got ", shape_str(record));
  MIXPREC_CHECK(record.is_contiguous(), "mixprec::", op, ": record must be contiguous");
  a.n_slots = record.sizes()[0];
  MIXPREC_CHECK(slot >= 0 && slot < a.n_slots, "mixprec::", op, ": slot must be in [0, ",
                a.n_slots, "), got ", slot);
  a.slot = slot;
  a.device = where(record);
  std::vector<Span> rec;
  add_span(rec, record, "record");
  add_list(op, "outputs", outputs, a.device, rec[0], a.outputs, a.keep);
  add_list(op, "inputs", inputs, a.device, rec[0], a.inputs, a.keep);
  a.record = static_cast<float*>(record.data_ptr());
  return a;
}

template <class B>
void overflow_check_op(std::vector<Tensor> outputs, std::vector<Tensor> inputs, Tensor record,
                       int64_t slot) {
  const char* op = "overflow_check_";
  CheckArgs a = check_args(op, outputs, inputs, record, slot);
  B::check_device(op, a.device);
  check_status(B::check(op, a), op);
}

}  // namespace overflow
}  // namespace mixprec_shim
