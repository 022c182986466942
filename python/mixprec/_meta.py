"""Fake (meta) kernels for mixprec's ops, so torch.compile, torch.export and
FakeTensor tracing know their outputs without running them."""

from __future__ import annotations

import torch


@torch.library.register_fake("mixprec::unscale_")
def _unscale_fake(grads, found_inf, inv_scale):
    return None


@torch.library.register_fake("mixprec::unscale_norm_")
def _unscale_norm_fake(grads, found_inf, inv_scale):
    per_tensor = found_inf.new_empty((len(grads),), dtype=torch.float32)
    total = found_inf.new_empty((), dtype=torch.float32)
    return per_tensor, total


@torch.library.register_fake("mixprec::update_scale_")
def _update_scale_fake(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    return None


@torch.library.register_fake("mixprec::update_scale_ex_")
def _update_scale_ex_fake(
    scale,
    growth_tracker,
    hysteresis_tracker,
    skipped_steps,
    found_inf,
    growth_factor,
    backoff_factor,
    growth_interval,
    hysteresis,
    min_scale,
    max_scale,
):
    return None
