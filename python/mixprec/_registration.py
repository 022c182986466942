"""Registration helpers every op family's Python module uses: the device and
one-element checks of the fake kernels, the ADInplaceOrView kernel that bumps
the version counters of what an op writes, and the kernel that names a sparse
argument. One home, so each family imports them from here rather than from
another family's module.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch._library.utils as _library_utils

__all__ = ["_IMPL_LIB", "_same_device", "_one_element", "_bump_versions_on_mutation", "_refuse_sparse"]


# ---- checks shared by the fake kernels of every family ------------------------


def _same_device(op, ref_name, ref, *named):
    """Every tensor of ``named`` (``(name, tensor or None)`` pairs) is on
    ``ref``'s device.

    The dispatcher sends a call to the Meta kernel (the fake kernel) as soon
    as ONE argument is a meta tensor: a meta tensor mixed with CPU tensors
    would otherwise "succeed" without running anything (update_scale_ not
    backing off, cross_entropy returning an uninitialised CPU loss). Under
    FakeTensorMode (torch.compile) every tensor carries its real device, so
    calls whose tensors are all on one device, meta included, pass."""
    for name, t in named:
        if t is not None:
            torch._check(
                t.device == ref.device,
                lambda: f"mixprec::{op}: {name} is on {t.device} but {ref_name} is on {ref.device}",
            )


def _one_element(op, name, t, dtype):
    torch._check(t.layout == torch.strided, lambda: f"mixprec::{op}: {name} must be a strided (dense) tensor")
    torch._check(t.dtype == dtype, lambda: f"mixprec::{op}: {name} must be {dtype}, got {t.dtype}")
    torch._check(t.numel() == 1, lambda: f"mixprec::{op}: {name} must have exactly one element, got {t.numel()}")


# ---- version counters of what an in-place op writes ---------------------------

_IMPL_LIB = torch.library.Library("mixprec", "IMPL")


def _bump_versions_on_mutation(
    name: str,
    lib: torch.library.Library = _IMPL_LIB,
    written_if: dict[str, Callable[[Callable[[str], Any]], bool]] | None = None,
) -> None:
    """Registers an ADInplaceOrView kernel for ``mixprec::<name>`` that
    increments the version counter of every argument its schema marks as
    written (``Tensor(a!)``, ``Tensor(a!)[]``), then redispatches to the
    backend: what torch's own in-place ops and ``torch.library.custom_op``
    do. Ops defined in C++ get no such kernel (the dispatcher falls through
    ADInplaceOrView), so without it autograd could not see that a tensor it
    saved was overwritten. It runs for ``torch.ops.mixprec.<name>`` called
    directly too, and under torch.compile (the compiled graph calls the op
    through the dispatcher); inference tensors have no version counter and
    skip the key, as with torch's ops.

    ``written_if`` is for an argument the op writes only in some calls:
    ``{arg name: predicate}``, the predicate given a function from an
    argument's name to its value in the call (its default when not passed);
    the argument is bumped only when the predicate is true. An op that
    writes a list only on one path (the optimizers' grads, written only with
    ``unscale_grads`` and a ``grad_scale``) then leaves the counters of
    tensors it only read alone, as torch's optimizers do. What is decided on
    the device (a step skipped by ``found_inf``) cannot be seen here: such a
    write counts as made."""
    op = getattr(torch.ops.mixprec, name).default
    schema_args = op._schema.arguments
    idxs, keys = _library_utils.mutated_args_kwargs(op._schema)
    names = [a.name for a in schema_args]
    defaults = {a.name: a.default_value for a in schema_args if a.has_default_value()}
    conditional = dict(written_if or {})
    unknown = set(conditional) - {names[i] for i in idxs} - set(keys)
    if unknown:
        raise ValueError(f"mixprec::{name}: written_if names {sorted(unknown)}, which the schema does not mark as written")
    always_idx = [i for i in idxs if names[i] not in conditional]
    always_keys = [k for k in keys if k not in conditional]
    after = torch._C._after_ADInplaceOrView_keyset

    def ad_inplace_or_view(keyset, *args, **kwargs):
        written = []  # one call for all of them: the loop over a list runs in C++

        def take(v):
            if isinstance(v, torch.Tensor):
                written.append(v)
            elif isinstance(v, (list, tuple)):
                written.extend(t for t in v if isinstance(t, torch.Tensor))

        for v in [args[i] for i in always_idx if i < len(args)] + [kwargs[k] for k in always_keys if k in kwargs]:
            take(v)
        if conditional:
            def value(arg):
                i = names.index(arg)
                return args[i] if i < len(args) else kwargs.get(arg, defaults.get(arg))

            for arg, pred in conditional.items():
                if pred(value):
                    take(value(arg))
        torch.autograd.graph.increment_version(written)
        return op.redispatch(keyset & after, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning only once for all operators", category=UserWarning)
        lib.impl(name, ad_inplace_or_view, "ADInplaceOrView", with_keyset=True)


# ---- sparse arguments ------------------------------------------------------------

_SPARSE_KEYS = ("SparseCPU", "SparseCUDA", "SparseMeta", "SparseCsrCPU", "SparseCsrCUDA", "SparseCsrMeta")


def _refuse_sparse(name: str, lib: torch.library.Library = _IMPL_LIB) -> None:
    """A sparse argument sends a call to the Sparse* dispatch keys, where a
    C++ op has no kernel: torch's "Could not run ... with arguments from the
    'SparseCPU' backend" (a page of registrations, no argument named). This
    kernel names the first sparse argument instead; it writes nothing."""
    op = getattr(torch.ops.mixprec, name).default
    arg_names = [a.name for a in op._schema.arguments]

    def refuse(*args, **kwargs):
        named = list(zip(arg_names, args)) + list(kwargs.items())
        for arg, v in named:
            items = list(enumerate(v)) if isinstance(v, (list, tuple)) else [(None, v)]
            for i, t in items:
                if isinstance(t, torch.Tensor) and t.layout != torch.strided:
                    where = arg if i is None else f"{arg}[{i}]"
                    raise RuntimeError(
                        f"mixprec::{name}: {where} must be a strided tensor, got {t.layout} "
                        "(sparse tensors are not supported; call .to_dense() on it)"
                    )
        raise RuntimeError(f"mixprec::{name}: sparse tensors are not supported")

    for key in _SPARSE_KEYS:
        lib.impl(name, refuse, key)
