"""Fused master-weight optimizers: ``mixprec.optim.AdamW`` and ``mixprec.optim.SGD``.

Drop them in after ``model.to(torch.bfloat16)`` (or float16): each low-precision
parameter gets an FP32 master copy and FP32 state in the optimizer, one fused
pass per device reads the gradient (any of FP32/FP16/BF16), divides it by the
loss scale if a GradScaler hands one over, updates master and state in FP32
and writes the parameter back rounded to nearest even. FP32 parameters work
too (no master copy). A step is skipped on the device when the GradScaler
found an inf/NaN: no host sync (``_step_supports_amp_scaling = True``).
When a GradScaler hands over the loss scale, the same pass writes the
unscaled gradient back into ``p.grad`` (as torch's fused optimizers do), so
code reading gradients after ``scaler.step(opt)`` sees what torch shows.
They stay scaled (only read) after a skipped step (as torch's fused
optimizers leave them) and on the folded path (``clip_grad_norm_(...,
fold=True)``, ``mixprec.amp.backward_and_step``), which opts out of writing
them.

The update rules are torch's (``torch.optim.AdamW`` / ``torch.optim.SGD``),
and a state_dict of torch's optimizers loads into these (master weights are
then taken from the parameters).

``master_weights=False`` is the memory-saving mode for BF16 parameters: no
master copy (4 bytes per parameter less); the update is computed in FP32 from
the BF16 value and written back with stochastic rounding, so updates far
below BF16's resolution still move the parameter on average (torch's AdamW
on BF16 parameters rounds them away and stalls). The rounding is seeded
(``seed``) and reproducible: the same seed, data and step count give the same
bits on any thread count, CPU ISA or device.

``ema_decay=`` keeps an FP32 exponential moving average of the weights (of
the FP32 master, or of the FP32 param) updated in the same fused pass that
writes the master, while the new value is still in registers: 8 bytes per
parameter, no second read of the weights (timm's ``ModelEmaV3`` on a BF16
model keeps its EMA in BF16, where ``(1 - decay) * (w - ema)`` is below the
resolution and the EMA never moves). The decay follows timm's
``ModelEmaV3.get_decay`` (``ema_min_decay``, ``ema_use_warmup``,
``ema_warmup_gamma``, ``ema_warmup_power``, ``ema_update_after_step``) at the
optimizer's step count; ``ema_update_every`` is torchvision's
``--model-ema-steps``. :meth:`AdamW.swap_ema` swaps it into the model for
evaluation; :func:`ema_model` builds a separate EMA module.
"""

from __future__ import annotations

import contextlib
import copy
import math
import operator
from typing import Any, Iterator

import torch

from ._amp_grads import is_dense
from ._distributed import is_dtensor, local
from ._library import FLOAT_DTYPES as _PARAM_DTYPES

__all__ = ["AdamW", "SGD", "ema_model"]

_SEED_MASK = (1 << 63) - 1
_VERSION = operator.attrgetter("_version")
_FP32_STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "master", "ema")
# The EMA's group keys with timm ModelEmaV3's defaults (ema_decay None: no EMA).
_EMA_DEFAULTS = dict(
    ema_decay=None, ema_min_decay=0.0, ema_use_warmup=False, ema_warmup_gamma=1.0, ema_warmup_power=2 / 3,
    ema_update_after_step=0, ema_update_every=1,
)


def _check_lr(lr) -> None:
    """torch's checks of ``lr``, for floats, ints and tensors (NaN fails
    ``0 <= lr`` and is refused too)."""
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def _torch_flags(foreach, capturable, differentiable, fused) -> dict[str, Any]:
    """torch's implementation flags, accepted so code written for torch's
    optimizers runs unchanged: mixprec's step is always one fused,
    capturable pass, so ``foreach`` / ``fused`` / ``capturable`` change
    nothing (they are kept in the param groups as torch keeps them);
    ``differentiable=True`` (autograd through the step) is not supported."""
    if differentiable:
        raise NotImplementedError(
            "mixprec.optim: differentiable=True (autograd through the optimizer step) is not supported"
        )
    return dict(foreach=foreach, capturable=bool(capturable), differentiable=False, fused=fused)


def _scalar(x, what: str) -> float:
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"Tensor {what} must be 1-element")
        return float(x.item())
    return x


def _ema_defaults(ema_decay, ema_min_decay, ema_use_warmup, ema_warmup_gamma, ema_warmup_power,
                  ema_update_after_step, ema_update_every) -> dict[str, Any]:
    """The EMA's group keys, checked (the ranges of the C API,
    mixprec_ema_params)."""
    if ema_decay is not None:
        if not 0.0 <= ema_decay <= 1.0:
            raise ValueError(f"Invalid ema_decay value: {ema_decay} (must be in [0, 1])")
        if not 0.0 <= ema_min_decay <= 1.0:
            raise ValueError(f"Invalid ema_min_decay value: {ema_min_decay} (must be in [0, 1])")
        if ema_use_warmup:
            for name, v in (("ema_warmup_gamma", ema_warmup_gamma), ("ema_warmup_power", ema_warmup_power)):
                if not (math.isfinite(v) and v > 0):
                    raise ValueError(f"Invalid {name} value: {v} (must be finite and > 0)")
        if int(ema_update_after_step) != ema_update_after_step or ema_update_after_step < 0:
            raise ValueError(f"Invalid ema_update_after_step value: {ema_update_after_step} (an integer >= 0)")
        if int(ema_update_every) != ema_update_every or ema_update_every < 1:
            raise ValueError(f"Invalid ema_update_every value: {ema_update_every} (an integer >= 1)")
    return dict(
        ema_decay=None if ema_decay is None else float(ema_decay), ema_min_decay=float(ema_min_decay),
        ema_use_warmup=bool(ema_use_warmup), ema_warmup_gamma=float(ema_warmup_gamma),
        ema_warmup_power=float(ema_warmup_power), ema_update_after_step=int(ema_update_after_step),
        ema_update_every=int(ema_update_every),
    )


class _FusedMasterWeightOptimizer(torch.optim.Optimizer):
    """Shared machinery: state creation, per-device grouping, GradScaler
    hand-over, state_dict loading that keeps FP32 state FP32."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        """As torch's optimizers do in theirs: a loaded (or unpickled) group
        that lacks a newer key gets its default, so a state dict from an
        older torch or mixprec steps."""
        super().__setstate__(state)
        for group in self.param_groups:
            for k, v in getattr(self, "defaults", {}).items():
                group.setdefault(k, v)

    _step_supports_amp_scaling = True
    # FP32 master weights and state: float16 gradients are safe here (see
    # mixprec.amp.GradScaler.unscale_).
    _accepts_fp16_grads = True

    def _check_group_mode(self, group: dict[str, Any]) -> None:
        if group.get("master_weights", True):
            return
        for p in group["params"]:
            if p.dtype == torch.float16:
                raise ValueError(
                    f"{type(self).__name__}: master_weights=False is for bfloat16 (and float32) "
                    "parameters; float16 parameters need FP32 master weights"
                )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, plus: a master-free group may not hold float16 params,
        and gets its stochastic-rounding seed now (drawn from torch's default
        generator when not given, so torch.manual_seed makes it
        reproducible)."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self._check_group_mode(group)
        if group.get("seed") is None and not group.get("master_weights", True):
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

    def _check_param(self, p: torch.Tensor, group_index: int, index: int) -> None:
        if p.dtype not in _PARAM_DTYPES:
            raise RuntimeError(
                f"{type(self).__name__}: param_groups[{group_index}]['params'][{index}] is {p.dtype} "
                f"(shape {tuple(p.shape)}); parameters must be float32, float16 or bfloat16"
            )
        if p.grad is not None and p.grad.is_sparse:
            raise RuntimeError(
                f"{type(self).__name__}: param_groups[{group_index}]['params'][{index}] (shape "
                f"{tuple(p.shape)}) has a sparse gradient; mixprec's optimizers take dense gradients "
                "(torch.optim.SparseAdam is torch's for sparse ones)"
            )

    def _base_state(self, p: torch.Tensor, master_weights: bool = True) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        if p.dtype != torch.float32 and master_weights and "master" not in state:
            state["master"] = p.detach().float()
        if p.dtype == torch.bfloat16 and not master_weights:
            # A master loaded from a checkpoint: its value lives on in the
            # parameter (rounded); this mode keeps none.
            state.pop("master", None)
        return state

    @staticmethod
    def _op_param(p: torch.Tensor) -> torch.Tensor:
        """What the op steps for ``p``: its local tensor, or a contiguous copy
        of it when it is not dense (a strided view such as
        ``randn(10, 5, 2)[..., 0]``), written back after the op."""
        lp = local(p)
        return lp if is_dense(lp) else lp.contiguous()

    @staticmethod
    def _fitted(st: dict[str, Any], key: str, op_p: torch.Tensor) -> torch.Tensor:
        """``st[key]`` (local) laid out like ``op_p``. State created before
        the param changed layout (``model.to(memory_format=channels_last)``
        after some steps) is re-laid out once, values unchanged."""
        t = st[key]
        lt = local(t)
        if lt.stride() != op_p.stride() and not is_dtensor(t) and lt.shape == op_p.shape:
            lt = st[key] = torch.empty_like(op_p, dtype=lt.dtype).copy_(lt)
        return lt

    def _master_of(self, p: torch.Tensor, st: dict[str, torch.Tensor], op_p: torch.Tensor) -> torch.Tensor:
        """The local FP32 master handed to the op (an empty tensor: none)."""
        return self._fitted(st, "master", op_p) if "master" in st else op_p.new_empty(0, dtype=torch.float32)

    @staticmethod
    def _fp32_zeros(p: torch.Tensor) -> torch.Tensor:
        """New FP32 state laid out like ``p``: a DTensor with the param's
        mesh and placements when the param is one (so
        torch.distributed.checkpoint saves and reshards it)."""
        return torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)

    @staticmethod
    def _grad_of(p: torch.Tensor, op_p: torch.Tensor) -> torch.Tensor:
        """The local gradient handed to the op, laid out like ``op_p``."""
        g = local(p.grad)
        if g.stride() != op_p.stride():
            # The fused kernel walks param, grad and state as one flat array.
            g = torch.empty_like(op_p, dtype=g.dtype).copy_(g)
        return g

    def _writes_unscaled_grads(self) -> bool:
        """A GradScaler hands over grad_scale with the grads still scaled:
        the op writes ``g / grad_scale`` back into each grad in the same
        pass (as torch's fused optimizers do), unless the scaler folded the
        clip into the step (``clip_grad_norm_(fold=True)``,
        ``backward_and_step``), where the grads are only read."""
        return getattr(self, "grad_scale", None) is not None and not getattr(self, "_grads_read_only", False)

    def _scaler_tensors(self, device: torch.device):
        """grad_scale / found_inf handed over by a GradScaler, on ``device``."""
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if grad_scale is not None:
            grad_scale = grad_scale.to(device, torch.float32, non_blocking=True).reshape(())
        if found_inf is not None:
            found_inf = found_inf.to(device, torch.float32, non_blocking=True).reshape(())
        return grad_scale, found_inf

    @staticmethod
    def _lr_args(lr, device: torch.device):
        if isinstance(lr, torch.Tensor):
            return 0.0, lr.to(device, torch.float32, non_blocking=True).reshape(())
        return float(lr), None

    def _by_device(self, group: dict[str, Any], group_index: int) -> dict[torch.device, tuple[int, list[torch.Tensor]]]:
        """The group's params with a grad, per device, with the group index
        of each device's first one."""
        out: dict[torch.device, tuple[int, list[torch.Tensor]]] = {}
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            self._check_param(p, group_index, i)
            out.setdefault(p.device, (i, []))[1].append(p)
        return out

    # ---- outside writes -------------------------------------------------------
    # A param with a master is the master rounded, as long as only this
    # optimizer writes it. Anyone else's in-place write (zero_, copy_ of loaded
    # weights, a pruning mask, an EMA swap-in, re-initialisation) bumps the
    # param's version counter, which the optimizer's own op does not: at the
    # next step the master takes the param's new value wherever the two
    # disagree (elements the write left alone keep their FP32 bits). Cost in
    # the common case: one integer compare per param on the host; no device
    # work and no host sync. Writes through ``p.data`` bypass the version
    # counter (torch's documented meaning of .data): call
    # :meth:`sync_master_weights` after those.

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
    def sync_master_weights(self) -> None:
        """Makes every FP32 master follow its parameter wherever the
        parameter no longer equals the rounded master: for writes the
        version counter cannot see (through ``p.data``)."""
        synced = []
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p)
                if st and "master" in st:
                    self._follow_param(local(p), local(st["master"]))
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

    # Eager under torch.compile: the step is one fused op per device already,
    # and its bookkeeping (lazy state, the params' version counters) is
    # Python state that must not be traced into a graph.
    @torch._dynamo.disable
    @torch.no_grad()
    def step(self, closure=None):
        """One fused step per param group and device (grads, masters and
        state of the group's params on that device in one op call)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._share_drawn_seeds()
        for gi, group in enumerate(self.param_groups):
            master_weights = group.get("master_weights", True)
            for device, (first, params) in self._by_device(group, gi).items():
                states = [self._base_state(p, master_weights) for p in params]
                locs = list(map(local, params))
                self._follow_outside_writes((gi, device), params, locs, states)
                op_params = [self._op_param(p) for p in params]
                grads = [self._grad_of(p, w) for p, w in zip(params, op_params)]
                masters = [self._master_of(p, st, w) for p, st, w in zip(params, states, op_params)]
                steps = [st["step"] for st in states]
                ema = self._ema_args(group, params, states, op_params)
                lr, lr_tensor = self._lr_args(group["lr"], device)
                grad_scale, found_inf = self._scaler_tensors(device)
                write_grads = self._writes_unscaled_grads()
                self._step_device(
                    group, params, op_params, states, grads, masters, steps, lr, lr_tensor, grad_scale,
                    found_inf, self._sr_seed(group, gi, first), write_grads, ema,
                )
                for p, w, g in zip(params, op_params, grads):
                    if w is not local(p):
                        local(p).copy_(w)
                    if write_grads and g is not local(p.grad):
                        local(p.grad).copy_(g)  # the op wrote the re-laid-out copy
                self._record_versions((gi, device), params, locs)
        return loss

    def _ema_args(self, group, params, states, op_params) -> dict[str, Any]:
        """The op's EMA keywords for one (group, device) list ({} without an
        EMA). A missing EMA starts as the FP32 weights as they are now (the
        master, the FP32 param, or the BF16 param widened): what timm's
        ``deepcopy(model)`` holds before the first update."""
        if group.get("ema_decay") is None:
            return {}
        for p, st in zip(params, states):
            if "ema" not in st:
                src = st["master"] if "master" in st else p
                st["ema"] = src.detach().to(dtype=torch.float32, copy=True)
        return dict(
            emas=self._op_state(states, "ema", op_params), ema_decay=float(group["ema_decay"]),
            ema_min_decay=float(group["ema_min_decay"]), ema_use_warmup=bool(group["ema_use_warmup"]),
            ema_warmup_gamma=float(group["ema_warmup_gamma"]), ema_warmup_power=float(group["ema_warmup_power"]),
            ema_update_after_step=int(group["ema_update_after_step"]),
            ema_update_every=int(group["ema_update_every"]),
        )

    # ---- the EMA of the weights ---------------------------------------------------

    def _ema_pairs(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(param, its FP32 EMA) for every param that has one."""
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p)
                if st and "ema" in st:
                    yield p, st["ema"]

    @contextlib.contextmanager
    @torch.no_grad()
    def swap_ema(self) -> Iterator[None]:
        """Context manager: the params hold their EMA (rounded to nearest
        even to each param's dtype) inside the block, and their training
        values, bit for bit, after it (also when the block raises). For
        evaluating the EMA weights: ``with opt.swap_ema(): evaluate(model)``.
        Only parameters are swapped: buffers (BatchNorm running stats) are
        the model's own, which is timm ModelEmaV3's ``exclude_buffers=True``
        (the optimizer never sees buffers). Params without an EMA yet (no
        step taken) keep their values. Masters and state are untouched; the
        restore is recorded as the optimizer's own write, so the next step
        does not take it for an outside one. Do not step inside the block."""
        saved = []
        try:
            for p, ema in self._ema_pairs():
                saved.append((p, p.detach().clone()))
                p.detach().copy_(ema)
            yield
        finally:
            for p, v in saved:
                p.detach().copy_(v)
            self._record_param_versions([p for p, _ in saved])

    def _step_device(self, group, params, op_params, states, grads, masters, steps, lr, lr_tensor, grad_scale,
                     found_inf, sr_seed, unscale_grads, ema) -> None:
        """Creates the optimizer's own state where missing and calls its op.
        ``params`` and ``states`` as the optimizer holds them (DTensors
        under FSDP2 / tensor parallel); ``op_params``, ``grads`` and
        ``masters``: the local, dense tensors the op takes (state goes in
        through :meth:`_op_state`); ``ema``: the op's EMA keywords."""
        raise NotImplementedError

    def _op_state(self, states, key: str, op_params) -> list[torch.Tensor]:
        return [self._fitted(st, key, w) for st, w in zip(states, op_params)]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state dict of this class or of torch's optimizer of the
        same kind. torch casts floating state to each parameter's dtype;
        this keeps FP32 state (and master weights) in FP32, exactly."""
        # Saved state keys map to params by position in the groups' "params"
        # lists, as torch's loader maps them: integers from state_dict(),
        # parameter names (FQNs) from torch.distributed.checkpoint's
        # set_optimizer_state_dict.
        saved_groups = state_dict.get("param_groups", [])
        id_map = dict(
            zip(
                (k for g in saved_groups for k in g["params"]),
                (p for g in self.param_groups for p in g["params"]),
            )
        )
        originals: dict[Any, dict[str, torch.Tensor]] = {}
        for key, st in state_dict.get("state", {}).items():
            if isinstance(st, dict):
                originals[key] = {
                    k: v for k, v in st.items() if k in _FP32_STATE_KEYS and isinstance(v, torch.Tensor)
                }
        super().load_state_dict(state_dict)
        for key, saved in originals.items():
            p = id_map.get(key)
            if p is None:
                continue
            st = self.state[p]
            for k, v in saved.items():
                st[k] = v.to(device=p.device, dtype=torch.float32, copy=True)
            if "step" in st:
                step = st["step"]
                st["step"] = (
                    step.detach().to(device=local(p).device, dtype=torch.float32).reshape(()).clone()
                    if isinstance(step, torch.Tensor)
                    else torch.tensor(float(step), dtype=torch.float32, device=local(p).device)
                )
        # A loaded master is the truth about its param from here on (and the
        # seeds are the checkpoint's, shared by every rank that loads it).
        self._record_param_versions(list(id_map.values()))
        self._drawn_seed_groups().clear()
        self._after_load()

    def _after_load(self) -> None:
        pass


class AdamW(_FusedMasterWeightOptimizer):
    """``torch.optim.AdamW`` with FP32 master weights and state for FP16/BF16
    parameters, fused into one pass per device.

    Args are torch's: ``lr`` (float or 0-dim tensor) 1e-3, ``betas``
    (0.9, 0.999), ``eps`` 1e-8, ``weight_decay`` 1e-2, ``amsgrad`` False,
    keyword ``maximize`` False. Keyword ``master_weights`` (True): False
    keeps no FP32 master for BF16 parameters and rounds their updates
    stochastically (float16 parameters are then refused); ``seed`` (None:
    drawn from torch's generator) seeds that rounding. Both may be set per
    param group.

    EMA of the weights (keywords, per param group too): ``ema_decay`` (None:
    no EMA; timm's ``--model-ema-decay`` default is 0.9998, ModelEmaV3's
    0.9999), and timm ModelEmaV3's ``ema_min_decay`` 0, ``ema_use_warmup``
    False, ``ema_warmup_gamma`` 1, ``ema_warmup_power`` 2/3,
    ``ema_update_after_step`` 0; ``ema_update_every`` 1 (torchvision's
    ``--model-ema-steps``). With it, ``state[p]["ema"]`` is an FP32 EMA of
    the FP32 weights, ``ema.lerp_(w, 1 - decay)`` with ``decay =
    ModelEmaV3.get_decay(step)`` at the param's step count after the step
    (timm's ``num_updates``), on steps that are multiples of
    ``ema_update_every``, in the same fused pass as the update. The first
    update (step 1 + ``ema_update_after_step``) copies the weights, as
    timm's. A step skipped by the GradScaler (inf/NaN) changes neither the
    EMA nor the step count, so it is not counted (timm's train loop would
    count it and average in the unchanged weights). Master-free BF16
    params: the EMA is of the FP32 value before its stochastic rounding
    (the unbiased value the rounding scatters around). The EMA is in
    ``state_dict()``; :meth:`swap_ema` and :func:`ema_model` use it.
    """

    def __init__(
        self,
        params,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        master_weights: bool = True,
        seed: int | None = None,
        ema_decay: float | None = None,
        ema_min_decay: float = 0.0,
        ema_use_warmup: bool = False,
        ema_warmup_gamma: float = 1.0,
        ema_warmup_power: float = 2 / 3,
        ema_update_after_step: int = 0,
        ema_update_every: int = 1,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        _check_lr(lr)
        ema = _ema_defaults(ema_decay, ema_min_decay, ema_use_warmup, ema_warmup_gamma, ema_warmup_power,
                            ema_update_after_step, ema_update_every)
        betas = (_scalar(betas[0], "betas[0]"), _scalar(betas[1], "betas[1]"))
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
            master_weights=bool(master_weights), seed=seed, **ema,
            **_torch_flags(foreach, capturable, differentiable, fused),
        )
        super().__init__(params, defaults)

    def _step_device(self, group, params, op_params, states, grads, masters, steps, lr, lr_tensor, grad_scale,
                     found_inf, sr_seed, unscale_grads, ema) -> None:
        for p, st in zip(params, states):
            if "exp_avg" not in st:
                st["exp_avg"] = self._fp32_zeros(p)
                st["exp_avg_sq"] = self._fp32_zeros(p)
            if group["amsgrad"] and "max_exp_avg_sq" not in st:
                st["max_exp_avg_sq"] = self._fp32_zeros(p)
        beta1, beta2 = group["betas"]
        torch.ops.mixprec.adamw_step_(
            op_params, grads, masters,
            self._op_state(states, "exp_avg", op_params), self._op_state(states, "exp_avg_sq", op_params),
            self._op_state(states, "max_exp_avg_sq", op_params) if group["amsgrad"] else [],
            steps, lr, float(beta1), float(beta2), float(group["weight_decay"]), float(group["eps"]),
            bool(group["amsgrad"]), bool(group["maximize"]), lr_tensor, grad_scale, found_inf, sr_seed,
            unscale_grads, **ema,
        )


class SGD(_FusedMasterWeightOptimizer):
    """``torch.optim.SGD`` (momentum, dampening, nesterov, weight decay,
    maximize) with FP32 master weights and momentum for FP16/BF16
    parameters, fused into one pass per device.

    Args are torch's: ``lr`` 1e-3, ``momentum`` 0, ``dampening`` 0,
    ``weight_decay`` 0, ``nesterov`` False, keyword ``maximize`` False;
    keywords ``master_weights``, ``seed`` and the ``ema_*`` ones as in
    :class:`AdamW`.
    """

    def __init__(
        self,
        params,
        lr: float | torch.Tensor = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        master_weights: bool = True,
        seed: int | None = None,
        ema_decay: float | None = None,
        ema_min_decay: float = 0.0,
        ema_use_warmup: bool = False,
        ema_warmup_gamma: float = 1.0,
        ema_warmup_power: float = 2 / 3,
        ema_update_after_step: int = 0,
        ema_update_every: int = 1,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        _check_lr(lr)
        ema = _ema_defaults(ema_decay, ema_min_decay, ema_use_warmup, ema_warmup_gamma, ema_warmup_power,
                            ema_update_after_step, ema_update_every)
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(
            lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
            nesterov=nesterov, maximize=maximize, master_weights=bool(master_weights), seed=seed, **ema,
            **_torch_flags(foreach, capturable, differentiable, fused),
        )
        super().__init__(params, defaults)

    def _after_load(self) -> None:
        # torch's SGD keeps no step count: a loaded momentum buffer means the
        # first step is behind us.
        for st in self.state.values():
            buf = st.get("momentum_buffer")
            if isinstance(buf, torch.Tensor) and "step" not in st:
                st["step"] = torch.ones((), dtype=torch.float32, device=buf.device)

    def _step_device(self, group, params, op_params, states, grads, masters, steps, lr, lr_tensor, grad_scale,
                     found_inf, sr_seed, unscale_grads, ema) -> None:
        momentum = float(group["momentum"])
        bufs = []
        if momentum != 0.0:
            for p, st in zip(params, states):
                if st.get("momentum_buffer") is None:
                    st["momentum_buffer"] = self._fp32_zeros(p)
            bufs = self._op_state(states, "momentum_buffer", op_params)
        torch.ops.mixprec.sgd_step_(
            op_params, grads, masters, bufs, steps,
            lr, momentum, float(group["dampening"]), float(group["weight_decay"]),
            bool(group["nesterov"]), bool(group["maximize"]),
            lr_tensor, grad_scale, found_inf, sr_seed, unscale_grads, **ema,
        )


@torch.no_grad()
def ema_model(model: torch.nn.Module, optimizer: _FusedMasterWeightOptimizer,
              dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A separate copy of ``model`` holding the optimizer's EMA weights, for
    code that wants an EMA module (timm's ``ModelEmaV3(model).module``,
    torchvision's ``ExponentialMovingAverage``): ``copy.deepcopy(model)`` in
    eval mode, each parameter that has an EMA in ``optimizer`` set to it
    (rounded to nearest even to the parameter's dtype, or to ``dtype`` when
    given: ``dtype=torch.float32`` gives the FP32 EMA itself and makes every
    floating parameter and buffer of the copy FP32). Buffers (BatchNorm
    running stats) are the model's, copied as they are now (timm's
    ``exclude_buffers=True``). A snapshot: call again for a fresh one after
    more steps (or use :meth:`AdamW.swap_ema`, which needs no copy)."""
    emas = {id(p): e for p, e in optimizer._ema_pairs()}
    copy_ = copy.deepcopy(model)
    if dtype is not None:
        copy_.to(dtype)
    for (name, p), q in zip(model.named_parameters(), copy_.parameters()):
        e = emas.get(id(p))
        if e is not None:
            q.detach().copy_(e)
    return copy_.eval()
