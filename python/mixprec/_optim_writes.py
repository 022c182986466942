"""Outside writes to parameters that have an FP32 master.

A param with a master is the master rounded, as long as only this
optimizer writes it. Anyone else's in-place write (zero_, copy_ of loaded
weights, a pruning mask, an EMA swap-in, re-initialisation) bumps the
param's version counter, which the optimizer's own op does not: at the
next step the master takes the param's new value wherever the two
disagree (elements the write left alone keep their FP32 bits). Cost in
the common case: one integer compare per param on the host; no device
work and no host sync. Writes through ``p.data`` bypass the version
counter (torch's documented meaning of .data): call
:meth:`sync_master_weights` after those.
"""

from __future__ import annotations

import operator

import torch

from ._distributed import local
from ._args import _takes

_VERSION = operator.attrgetter("_version")


class _OutsideWrites:
    """Mixed into ``mixprec.optim``'s base class."""

    def _versions(self) -> dict:
        """Version counters after this optimizer's last write: per (group
        index, device), the ids of the params stepped there and their
        versions, as two lists (compared whole, in C, in the common case:
        a per-param dict lookup cost ~0.4 us per param and step); and under
        ``"by_id"`` single params' versions (set by load_state_dict and
        sync_master_weights) for the first step after those. Plain ids: a
        param in the optimizer is alive (param_groups holds it), so its id is
        its own; a stale id can only make a master follow a param it already
        equals."""
        if "_mixprec_versions" not in self.__dict__:
            self._mixprec_versions: dict = {"by_id": {}}
        return self._mixprec_versions

    @staticmethod
    @torch.no_grad()
    def _follow_param(p: torch.Tensor, master: torch.Tensor) -> None:
        torch.where(master.to(p.dtype) == p, master, p.float(), out=master)

    @torch.no_grad()
    @_takes()
    def sync_master_weights(self) -> None:
        """Makes every FP32 master follow its parameter wherever the
        parameter no longer equals the rounded master: for writes the
        version counter cannot see (through ``p.data``). A param held with a
        remainder (``param_remainders``) gets its remainder reset: its
        master becomes the param's value (see [note: remainder encoding] in
        _optim_lean.py)."""
        synced = []
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p)
                if st and "master" in st:
                    self._follow_param(local(p), local(st["master"]))
                    synced.append(p)
                elif st and "remainder" in st:
                    self._forget_remainder(st)
                    synced.append(p)
        self._record_param_versions(synced)

    def _follow_outside_writes(self, key, params, locs, states) -> None:
        versions = self._versions()
        ids = list(map(id, params))
        cur = list(map(_VERSION, locs))
        saved = versions.get(key)
        if saved is not None and saved[0] == ids:
            if saved[1] == cur:
                return  # the common case: nobody else wrote any of them
            seen = saved[1]
        else:
            by_id = dict(zip(*saved)) if saved is not None else {}
            by_id.update(versions["by_id"])
            seen = [by_id.get(i, v) for i, v in zip(ids, cur)]
        for p_local, st, v, old in zip(locs, states, cur, seen):
            if v != old and "master" in st:
                self._follow_param(p_local, local(st["master"]))
            elif v != old and "remainder" in st:
                self._forget_remainder(st)

    def _record_versions(self, key, params, locs) -> None:
        versions = self._versions()
        versions[key] = (list(map(id, params)), list(map(_VERSION, locs)))
        if versions["by_id"]:
            for p in params:
                versions["by_id"].pop(id(p), None)

    def _record_param_versions(self, params) -> None:
        """For params whose master was just set from outside a step (a
        loaded checkpoint, sync_master_weights)."""
        versions = self._versions()
        for p in params:
            versions["by_id"][id(p)] = local(p)._version
        for k in [k for k in versions if k != "by_id"]:
            del versions[k]
