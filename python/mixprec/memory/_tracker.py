"""A live-tensor memory tracker for the CPU (and any device): the bytes of
every storage an op creates while the tracker is active, from its creation
until it is freed, and their peak. What ``torch.cuda.max_memory_allocated``
says on a GPU, measured without one.

It is a ``TorchDispatchMode``: it sees each op's outputs below autograd, so
what autograd saves, what backward allocates and what a saved-tensor hook
packs are all counted, each storage once; storages made before the tracker
started (parameters, the input batch) are not. A storage is counted at the
size of its allocation (``untyped_storage().nbytes()``), as an allocator
would hold it.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .._args import as_list_of

__all__ = ["LiveTracker"]


class LiveTracker(TorchDispatchMode):
    """``with LiveTracker() as t: ...`` then ``t.peak`` (bytes), ``t.current``
    (bytes still alive from inside the block) and ``t.mark(name)`` to record
    the current bytes at a point (``t.marks[name]``)."""

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self.marks: dict[str, int] = {}
        self._live: dict[int, int] = {}  # storage key -> bytes
        self._serial: dict[int, int] = {}  # storage key -> the number of its allocation
        self._events: list[tuple[int, int]] = []  # (allocation number, +bytes / -bytes) in order

    def mark(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"mixprec.memory.LiveTracker.mark: name must be a str, got {type(name).__name__} {name!r}")
        self.marks[name] = self.current

    def peak_excluding(self, tensors) -> int:
        """The peak of the bytes alive without the storages of ``tensors``
        (still alive now; e.g. the gradients backward made, which a planner
        counts elsewhere), at whatever point of the run it falls.
        ``tensors``: an iterable of tensors (a list; ``[]`` gives ``peak``)."""
        tensors = as_list_of("mixprec.memory.LiveTracker.peak_excluding", "tensors", tensors, torch.Tensor,
                             "torch.Tensor", empty=True)
        skip = set()
        for t in tensors:
            try:
                serial = self._serial.get(t.untyped_storage().data_ptr())
            except (RuntimeError, NotImplementedError):
                continue
            if serial is not None:
                skip.add(serial)
        cur = peak = 0
        for serial, delta in self._events:
            if serial not in skip:
                cur += delta
                peak = max(peak, cur)
        return peak

    def _free(self, key: int) -> None:
        nbytes = self._live.pop(key, None)
        if nbytes is not None:
            self.current -= nbytes
            self._events.append((self._serial.pop(key), -nbytes))

    def _track(self, t: torch.Tensor) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = st.data_ptr()
        if key == 0 or key in self._live:
            return
        nbytes = st.nbytes()
        try:
            weakref.finalize(st, self._free, key)
        except TypeError:
            return
        self._live[key] = nbytes
        self._serial[key] = len(self._events)
        self._events.append((len(self._events), nbytes))
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    @staticmethod
    def _key(t) -> int:
        try:
            return t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # A view or an in-place op returns a storage an input already has:
        # not an allocation (one made before the tracker started, as the
        # input batch a hook detaches, is not counted).
        inputs = None
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                if inputs is None:
                    inputs = {self._key(a) for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
                if self._key(t) not in inputs:
                    self._track(t)
        return out
