"""compressed_activations inside torch.compile'd regions.

AOTAutograd inlines saved-tensor hooks into the graphs it compiles when the
hooks on top of autograd's stack are ``torch.fx.GraphModule`` objects: it
calls the pack hook on each tensor the forward graph saves (an intermediate
of the graph: parameters and the region's inputs are not offered), traces
what it does into the end of the forward graph, and the unpack hook into
the start of the backward graph; at run time the compiled function then
saves the packed form and calls no Python hook. So ``compressed_activations``
pushes a pair of ``_Hook`` modules (one pair per configuration, so a new
``with`` block does not make torch.compile recompile: its guard is on the
hooks' identity). Called by eager autograd they hand the tensor to the
innermost active block's eager hooks; called by AOTAutograd (its hook
context is set) they pack by a policy decided per saved tensor at compile
time (``_compiled_pack``).

In a compiled region (every decision made once, when it is compiled):

* packed: float32 / float16 / bfloat16 tensors of at least ``min_numel``
  elements on the CPU (or CUDA with mixprec's CUDA library) that are not
  a view or cast of the region's inputs or parameters (autocast's weight
  copies stay exact, as in eager), at ``bits``; at ``norm_bits`` what a
  normalisation layer's decomposition reads (its input), at
  ``nonlinear_bits`` what attention, softmax or a smooth nonlinearity
  reads or makes (the widths and blocks of the eager policy; a LayerNorm's
  input in blocks that divide its last dimension).
* kept: everything else (integer tensors: inductor already saves max-pool
  offsets as int8; the statistics; small tensors), and everything a region
  compiled for dynamic shapes saves (``dynamic=True``, or automatic dynamic
  after a second batch size): AOTAutograd traces the inlined unpack at the
  compiling call's sizes, which would fix the backward graph to them.
* the rounding seed of each saved tensor is fixed when the region is
  compiled (from the block's seed then and the tensor's name in the
  graph): every call of the compiled region rounds with the same bits,
  where an eager block rounds with new ones (a fixed dither per position;
  the values it rounds change every step).
* nothing is counted in the block's ``stats`` (no Python runs at run time).
"""

from __future__ import annotations

import hashlib
import threading

import torch

from .. import _act_pack
from .._library import cuda_ops_loaded

try:  # torch 2.13 and 2.14 have it (without it, compiled regions are kept uncompressed)
    from torch._functorch._aot_autograd.graph_compile import _get_saved_tensor_hook_context
    from torch._functorch._aot_autograd.utils import saved_tensors_hooks_are_inlineable

    INLINE = True
except ImportError:  # pragma: no cover - depends on the torch version
    INLINE = False

# The packed form's tag in the tuple the compiled pack hook returns.
_TAG = "mixprec.act_pack"

# Version of the compiled policy: part of the hooks' cache hash, so a
# compiled region cached by an older policy is not reused (bump it when
# _compiled_pack changes what it does).
_POLICY_VERSION = 1

_aten = torch.ops.aten
_prims = torch.ops.prims

# Ops through which a saved tensor is only a view or a cast of what it was
# made from: one made from a graph input (a parameter, the region's input)
# through these alone is kept exactly, as eager keeps a parameter's copies.
_VIEW_OR_CAST = frozenset(
    {
        "aten::view",
        "aten::_unsafe_view",
        "aten::reshape",
        "aten::permute",
        "aten::t",
        "aten::transpose",
        "aten::expand",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::alias",
        "aten::clone",
        "aten::slice",
        "aten::select",
        "aten::_to_copy",
        "aten::contiguous",
        "prims::convert_element_type",
    }
)

_NORM_OPS = frozenset(
    {
        "aten::native_batch_norm",
        "aten::_native_batch_norm_legit",
        "aten::_native_batch_norm_legit_functional",
        "aten::_native_batch_norm_legit_no_training",
        "aten::batch_norm",
        "aten::native_layer_norm",
        "aten::layer_norm",
        "aten::native_group_norm",
        "aten::group_norm",
        "aten::instance_norm",
    }
)
_LAYER_NORM_OPS = frozenset({"aten::native_layer_norm", "aten::layer_norm"})

_NONLINEAR_OPS = frozenset(
    {
        "aten::gelu",
        "aten::silu",
        "aten::mish",
        "aten::elu",
        "aten::selu",
        "aten::celu",
        "aten::softplus",
        "aten::hardswish",
        "aten::glu",
        "aten::log_sigmoid_forward",
        "aten::sigmoid",
        "aten::tanh",
        "aten::_softmax",
        "aten::softmax",
        "aten::_safe_softmax",
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_attention_math",
    }
)


def _name(op) -> str | None:
    schema = getattr(op, "_schema", None)
    return schema.name if schema is not None else None


def _op_names(node: torch.fx.Node) -> set:
    """The aten op ``node`` computes and the one it comes from (a decomposed
    op's ``original_aten``), without overloads."""
    return {n for n in (_name(node.meta.get("original_aten")), _name(node.target)) if n}


def _from_graph_input(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a graph input, or made from one by views and casts alone."""
    for _ in range(16):
        if node.op == "placeholder":
            return True
        if node.op != "call_function" or _name(node.target) not in _VIEW_OR_CAST:
            return False
        inputs = [a for a in node.all_input_nodes]
        if len(inputs) != 1:
            return False
        node = inputs[0]
    return False


def _kind(node: torch.fx.Node) -> str:
    """'layer_norm', 'norm', 'nonlinear' or 'plain': which width the eager
    policy gives what ``node`` holds (by what made it and what reads it)."""
    seen = _op_names(node)
    for user in node.users:
        seen |= _op_names(user)
    if seen & _LAYER_NORM_OPS:
        return "layer_norm"
    if seen & _NORM_OPS:
        return "norm"
    if seen & _NONLINEAR_OPS:
        return "nonlinear"
    return "plain"


def _seed(base: int, name: str) -> int:
    h = int.from_bytes(hashlib.blake2b(f"{base}:{name}".encode(), digest_size=8).digest(), "little")
    return h - 2**64 if h >= 2**63 else h


def _dense_permutation(t: torch.Tensor) -> bool:
    try:
        return _act_pack._is_dense(t)
    except Exception:  # symbolic strides that cannot be compared: copy instead
        return False


def _compiled_pack(cfg: "_Config", ctx, x: torch.Tensor, info: dict):
    """The compiled region's pack of one saved tensor (see the module's docstring)."""
    node = info.get("_node")
    if (
        not isinstance(x, torch.Tensor)
        or x.dtype not in _act_pack._FLOAT
        or node is None
    ):
        return x
    dev = x.device.type
    if dev != "cpu" and not (dev == "cuda" and cuda_ops_loaded()):
        return x
    if not all(type(d) is int for d in x.shape):
        # Dynamic shapes: kept. AOTAutograd traces the inlined unpack with
        # the sizes of the call that compiled, so the backward graph would
        # be fixed to them (torch 2.14: a BatchNorm's backward then failed
        # in inductor; without one it would run the wrong sizes).
        return x
    n = x.numel()
    if n < max(cfg.min_numel, 1) or _from_graph_input(node):
        return x
    kind = _kind(node)
    bits = {"norm": cfg.norm_bits, "layer_norm": cfg.norm_bits, "nonlinear": cfg.nonlinear_bits}.get(kind, cfg.bits)
    if bits == 16:
        return x
    block = cfg.block if cfg.block_given or bits == cfg.bits else _DEFAULT_BLOCK[bits]
    src, order = x, None
    if x.is_contiguous():
        pass
    elif _dense_permutation(x):
        # Packed in memory order; unpacked as a contiguous tensor of the
        # dimensions outermost first, then permuted back (a view and a
        # permute: inductor lowers them where as_strided with symbolic
        # strides failed).
        order = tuple(sorted(range(x.dim()), key=lambda d: (x.stride(d), x.shape[d]), reverse=True))
    else:
        src = x.contiguous()
    if kind == "layer_norm" and not cfg.block_given and src.dim() > 0:
        from . import _row_block

        block = _row_block(block, int(src.shape[-1]) if src.is_contiguous() else 1)
    base = ctx._base if ctx is not None else 0
    codes, scales = torch.ops.mixprec.act_pack.default(src, bits, block, _seed(base, node.name))
    return (_TAG, codes, scales, n, bits, block, x.dtype, tuple(x.shape), order)


def _compiled_unpack(p):
    _, codes, scales, n, bits, block, dtype, shape, order = p
    flat = torch.ops.mixprec.act_unpack.default(codes, scales, n, bits, block, dtype)
    if order is None:
        return flat.view(shape)
    inverse = [0] * len(order)
    for i, d in enumerate(order):
        inverse[d] = i
    return flat.view([shape[d] for d in order]).permute(inverse)


def compiled_saved_bytes(loss: torch.Tensor, exclude=()) -> int:
    """Bytes of the distinct storages that torch.compile's compiled
    functions in ``loss``'s autograd graph saved for backward (their packed
    forms when a block was on), storages whose ``data_ptr`` is in
    ``exclude`` (parameters) left out. For tests and benchmarks: no Python
    hook runs for a compiled region, so the block's ``stats`` do not see it."""
    total, seen, todo, visited = 0, set(exclude), [loss.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        if "CompiledFunction" in type(node).__name__:
            for t in node.saved_tensors:
                key = t.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total += t.untyped_storage().nbytes()
        todo.extend(n for n, _ in node.next_functions)
    return total


# ---- the hook modules -------------------------------------------------------


class _Config(tuple):
    """What the compiled policy depends on (not the seed: a new seed per
    step must not recompile)."""

    __slots__ = ()

    def __new__(cls, bits, block, block_given, norm_bits, nonlinear_bits, min_numel):
        return super().__new__(cls, (bits, block, block_given, norm_bits, nonlinear_bits, min_numel))

    bits = property(lambda s: s[0])
    block = property(lambda s: s[1])
    block_given = property(lambda s: s[2])
    norm_bits = property(lambda s: s[3])
    nonlinear_bits = property(lambda s: s[4])
    min_numel = property(lambda s: s[5])


def _marker(x):  # the graph's one node: only for torch.compile's cache key
    return x


class _Hook(torch.fx.GraphModule):
    """A saved-tensor hook AOTAutograd can inline (a GraphModule). Its graph
    (one call node with a cache hash naming the configuration) is what
    torch.compile's caches see; calls go to ``_call``."""

    def __init__(self, cfg: _Config, role: str, stack: threading.local):
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        out = graph.call_function(_marker, (x,))
        out.meta["is_wrapped"] = True
        out.meta["user_cache_hash"] = f"mixprec.memory:{role}:v{_POLICY_VERSION}:{tuple(cfg)}"
        graph.output(out)
        super().__init__(torch.nn.Module(), graph)
        self._cfg, self._role, self._stack = cfg, role, stack
        # Straight to _call: not through nn.Module's __call__ (per saved
        # tensor in eager) nor the generated forward. GraphModule made this
        # instance its own class, so this changes no other module.
        type(self).__call__ = _Hook._call

    def _contexts(self) -> list:
        s = getattr(self._stack, "contexts", None)
        if s is None:
            s = self._stack.contexts = []
        return s

    def _call(self, x):
        info = _get_saved_tensor_hook_context() if INLINE else None
        contexts = self._contexts()
        ctx = contexts[-1] if contexts else None
        if self._role == "pack":
            if info is not None:
                return _compiled_pack(self._cfg, ctx, x, info)
            if ctx is None:  # (the block is gone: a hook kept by someone else)
                return x
            return ctx._pack(x, depth=2)
        if isinstance(x, tuple) and len(x) == 9 and x[0] == _TAG:
            return _compiled_unpack(x)
        if isinstance(x, torch.Tensor):
            return x
        return x.unpack()


_HOOKS: dict[_Config, tuple[_Hook, _Hook]] = {}
_HOOKS_LOCK = threading.Lock()


def hooks_for(cfg: _Config) -> tuple[_Hook, _Hook]:
    """The (pack, unpack) modules of a configuration, made once per process."""
    with _HOOKS_LOCK:
        pair = _HOOKS.get(cfg)
        if pair is None:
            stack = threading.local()
            pair = _HOOKS[cfg] = (_Hook(cfg, "pack", stack), _Hook(cfg, "unpack", stack))
        return pair


def push(pair, ctx) -> None:
    pair[0]._contexts().append(ctx)


def pop(pair, ctx) -> None:
    contexts = pair[0]._contexts()
    if contexts and contexts[-1] is ctx:
        contexts.pop()
    elif ctx in contexts:
        contexts.remove(ctx)


_DEFAULT_BLOCK = {8: 256, 4: 32}
