"""The stochastic-rounding seeds of master-free groups: drawn when a group is
added (from torch's default generator), made the same on every rank at the
first step, and mixed per group and device for the kernel.
"""

from __future__ import annotations

from typing import Any

import torch

_SEED_MASK = (1 << 63) - 1


class _RoundingSeeds:
    """Mixed into ``mixprec.optim``'s base class."""

    def _draw_seed(self, group: dict[str, Any]) -> None:
        """A group that rounds stochastically (master-free, or BF16 moments:
        ``_rounds_stochastically``) without a seed gets one drawn from
        torch's default generator, so torch.manual_seed makes it
        reproducible."""
        if group.get("seed") is None and self._rounds_stochastically(group):
            group["seed"] = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
            self._drawn_seed_groups().append(group)

    def _drawn_seed_groups(self) -> list[dict[str, Any]]:
        """Groups whose seed was drawn here (not given by the user) and not
        yet made the same on every rank."""
        if "_mixprec_drawn_seeds" not in self.__dict__:
            self._mixprec_drawn_seeds: list[dict[str, Any]] = []
        return self._mixprec_drawn_seeds

    def _share_drawn_seeds(self) -> None:
        """Data-parallel replicas must round alike, but recipes seed torch's
        generator per rank (``manual_seed(seed + rank)``), so a drawn seed
        differs between ranks: at the first step under an initialised
        torch.distributed, rank 0's drawn seeds are broadcast to every rank
        (one small collective, once; every rank steps, as in DDP). A seed the
        user gave is theirs: never overwritten, so a per-rank seed is had by
        passing one."""
        pending = self._drawn_seed_groups()
        if not pending:
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            backend = str(dist.get_backend())
            dev = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
            seeds = torch.tensor([g["seed"] for g in pending], dtype=torch.int64, device=dev)
            dist.broadcast(seeds, src=0)
            for g, v in zip(pending, seeds.tolist()):
                g["seed"] = int(v)
        pending.clear()

    @staticmethod
    def _sr_seed(group: dict[str, Any], group_index: int, first_param: int) -> int:
        """The seed handed to the kernel: the group's seed mixed with the
        group's index and the index (in the group) of the first param of this
        device's list, so two groups (or devices) stepping in lockstep do not
        round alike. Nothing rank- or device-specific goes in: replicas that
        see the same gradients stay bit-identical."""
        seed = group.get("seed") or 0
        return (
            int(seed) + 0x9E3779B97F4A7C15 * (group_index + 1) + 0xC2B2AE3D27D4EB4F * (first_param + 1)
        ) & _SEED_MASK
