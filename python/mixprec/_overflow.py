"""The forward-overflow check (``torch.ops.mixprec.overflow_check_``): the
public function, its fake kernel and its sparse refusal. ``mixprec.guard``
calls it once per module per forward.

The record is a float32 tensor of shape ``[n_slots, RECORD_WIDTH]``, zeroed
before first use; ``overflow_check_`` folds one call into row ``slot``:

====  =======================================================================
col   meaning (values only grow; zero the record to start over)
====  =======================================================================
0     1.0: an output element was inf or NaN
1     the largest finite ``|output element|``
2     1.0: a call with a non-finite output also had a non-finite input
3     1.0: a call had a non-finite output from finite inputs only
4-7   scratch of the CUDA kernel (zero between calls)
====  =======================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._registration import _refuse_sparse, _same_device
from ._library import FLOAT_DTYPES as _FLOAT

__all__ = ["overflow_check_", "new_record", "RECORD_WIDTH", "NONFINITE", "AMAX", "INPUT_NONFINITE", "FROM_FINITE"]

RECORD_WIDTH = 8  # MIXPREC_OVERFLOW_SLOT
NONFINITE, AMAX, INPUT_NONFINITE, FROM_FINITE = 0, 1, 2, 3

# No version-counter kernel (unlike the amp family's in-place ops): the
# record is a buffer autograd never saves, and a Python kernel on this op
# would cost more than the check itself on every module of every forward.
_refuse_sparse("overflow_check_")


def new_record(n_slots: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A zeroed record of ``n_slots`` rows on ``device``."""
    return torch.zeros((n_slots, RECORD_WIDTH), dtype=torch.float32, device=device)


def overflow_check_(
    outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], record: torch.Tensor, slot: int
) -> None:
    """Folds the non-finite check of ``outputs`` (and, only when one of them
    has an inf/NaN, of ``inputs``) into ``record[slot]``: read-only on the
    tensors, one kernel, no host sync. Tensors may have any of float32 /
    float16 / bfloat16, any strides, and share memory with one another."""
    torch.ops.mixprec.overflow_check_.default(list(outputs), list(inputs), record, slot)


@torch.library.register_fake("mixprec::overflow_check_")
def _overflow_check_fake(outputs, inputs, record, slot):
    op = "overflow_check_"
    torch._check(record.dtype == torch.float32, lambda: f"mixprec::{op}: record must be float32, got {record.dtype}")
    torch._check(
        record.dim() == 2 and record.shape[1] == RECORD_WIDTH and record.shape[0] >= 1,
        lambda: f"mixprec::{op}: record must have shape [n_slots, {RECORD_WIDTH}] with n_slots >= 1, "
        f"got {list(record.shape)}",
    )
    torch._check(record.is_contiguous(), lambda: f"mixprec::{op}: record must be contiguous")
    torch._check(
        0 <= slot < record.shape[0], lambda: f"mixprec::{op}: slot must be in [0, {record.shape[0]}), got {slot}"
    )
    for name, lst in (("outputs", outputs), ("inputs", inputs)):
        for i, t in enumerate(lst):
            torch._check(
                t.dtype in _FLOAT,
                lambda: f"mixprec::{op}: {name}[{i}] must be float32, float16 or bfloat16, got {t.dtype}",
            )
            _same_device(op, "record", record, (f"{name}[{i}]", t))
    return None
