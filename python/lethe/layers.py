"""Attention layers with a long memory, as ``torch.nn.Module``\\ s.

Each layer is one attention layer of lethe's backbone with its memory mechanism: the
query, key, value and output projections, the learned relative positions ``key_pe``,
and the mechanism's own parameters. It takes a block of hidden states and the memory
left by the blocks before, and returns the attention output and the memory after the
block::

    y, state = layer(x)          # no state: an empty memory
    y, state = layer(x, state)   # the next block, the memory carried

The arithmetic is lethe's own (its Rust code and fused kernels, the same as the
``lethe`` command's), recorded by autograd like any PyTorch operation: the parameters
are ordinary ``nn.Parameter``\\ s, the very tensors the layer computes with.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from . import _lethe

__all__ = [
    "State",
    "MemoryAttention",
    "TransformerXL",
    "ExpireSpan",
    "AdaptiveSpan",
    "Compressive",
    "InfinityFormer",
]


DEFAULT_BLOCK = 64
"""The longest block a layer takes when its ``block`` is not given (or its span, if shorter)."""


class State:
    """The memory of one layer after a block: named tensors, detached from the graph.

    A state belongs to the kind of layer that made it (its mechanism and shape, written
    in :attr:`owner`); another kind of layer refuses it. It holds the streams of the
    blocks it read: the next block must have as many. Move it with :meth:`to`, save it
    with ``torch.save`` (``torch.load`` reads it back, ``weights_only`` included).
    """

    def __init__(self, owner: str, tensors: List[Tuple[str, Tensor]]) -> None:
        self.owner = owner
        self.tensors = list(tensors)

    def to(self, *args: Any, **kwargs: Any) -> "State":
        """The state with every tensor moved as ``Tensor.to(*args, **kwargs)`` moves it
        (a device; a dtype converts the floating-point tensors only)."""
        return State(self.owner, [(n, _move(t, *args, **kwargs)) for n, t in self.tensors])

    @property
    def device(self) -> Optional[torch.device]:
        """The device of the state's tensors (None for an empty memory)."""
        return self.tensors[0][1].device if self.tensors else None

    def nbytes(self) -> int:
        """Bytes the state's tensors hold."""
        return sum(t.numel() * t.element_size() for _, t in self.tensors)

    def __reduce__(self):
        return (State, (self.owner, self.tensors))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, State)
            and self.owner == other.owner
            and len(self.tensors) == len(other.tensors)
            and all(
                n == m and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
                for (n, a), (m, b) in zip(self.tensors, other.tensors)
            )
        )

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}={tuple(t.shape)}" for n, t in self.tensors)
        return f"State({self.owner}: {shapes or 'empty'})"


def _move(t: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """``t.to(...)``, but a dtype leaves integer tensors (counters, flags) as they are,
    and a floating-point tensor is refused an integer dtype (it would be truncated)."""
    moved = t.to(*args, **kwargs)
    if t.is_floating_point():
        if not moved.is_floating_point():
            raise ValueError(
                f"State.to: {moved.dtype} is not a floating-point dtype; "
                "a state's floating-point tensors convert to one only"
            )
        return moved
    return moved if moved.dtype == t.dtype else t.to(device=moved.device)


# `torch.load(..., weights_only=True)`, torch's default, reads back only allowed types.
torch.serialization.add_safe_globals([State])


class MemoryAttention(nn.Module):
    """An attention layer whose memory is one of lethe's mechanisms.

    Use a subclass (:class:`TransformerXL`, :class:`ExpireSpan`, :class:`AdaptiveSpan`,
    :class:`Compressive`, :class:`InfinityFormer`). ``settings`` are the mechanism's
    fields of lethe's config (``[memory.<mechanism>]``); those not given keep lethe's
    defaults (``lethe train --help-config memory``).

    Shapes: ``x`` is ``(batch, length, d_model)`` with ``1 <= length <= block``; the
    output has the shape of ``x``.

    After each call, :attr:`aux_loss` holds the mechanism's auxiliary loss for that block
    (Expire-Span's span loss, Adaptive-Span's span penalty, the ∞-former's KL term; a
    zero for the others), already weighted by its coefficient: add it to the loss that
    trains the layer.
    """

    aux_loss: Tensor

    def __init__(
        self,
        mechanism: str,
        d_model: int,
        heads: int,
        span: int,
        *,
        block: Optional[int],
        dropout: float,
        settings: Dict[str, Any],
    ) -> None:
        super().__init__()
        _check_int("d_model", d_model)
        _check_int("heads", heads)
        _check_int("span", span)
        block = min(DEFAULT_BLOCK, span) if block is None else block
        _check_int("block", block)
        memory: Dict[str, Any] = {"mechanism": mechanism, "span": span}
        given = {k: v for k, v in settings.items() if v is not None}
        for key, value in given.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{key} = {value}: must be a finite number")
        if given:
            memory[mechanism] = given
        self.mechanism = mechanism
        self.d_model = d_model
        self.heads = heads
        self.span = span
        self.block = block
        # What `_lethe.Layer` was made with, to make it again for a copy (`__setstate__`).
        self._made_with = (d_model, heads, block, float(dropout), json.dumps(memory))
        self._layer = _lethe.Layer(*self._made_with)
        # The dtype of each state tensor this module made, by the block's dtype.
        self._state_dtypes: Dict[torch.dtype, Dict[str, torch.dtype]] = {}
        self._owner = f"{type(self).__name__}(d_model={d_model}, heads={heads}, span={span}, {json.dumps(given, sort_keys=True)})"
        for name, tensor in self._layer.parameters():
            _register(self, name, tensor)
        self.aux_loss = torch.zeros(())

    def forward(self, x: Tensor, state: Optional[State] = None) -> Tuple[Tensor, State]:
        """Attends from the block ``x`` ``(batch, length, d_model)`` over the memory
        ``state`` (None: an empty memory) and the block itself, causally; returns the
        attention output ``(batch, length, d_model)`` and the memory after the block."""
        _check_tensor("x", x)
        _check_device("x", x, self)
        made = self._state_dtypes.setdefault(x.dtype, {})
        y, after, aux = self._layer.forward(x, _held(state, self._owner, x.device, made), self.training)
        made.update((name, t.dtype) for name, t in after)
        self.aux_loss = aux if aux is not None else torch.zeros((), dtype=x.dtype, device=x.device)
        return y, State(self._owner, after)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, heads={self.heads}, span={self.span}, block={self.block}"

    def __getstate__(self) -> Dict[str, Any]:
        # `copy.deepcopy` and pickling (`torch.save(module)`) copy everything but the Rust
        # layer, which `__setstate__` makes again around the copied parameters.
        state = self.__dict__.copy()
        state["aux_loss"] = self.aux_loss.detach()  # the last call's, out of its graph
        del state["_layer"]
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        # Making the layer draws initial weights (replaced by the copied ones): the
        # caller's random stream is left where it was.
        with torch.random.fork_rng(devices=[]):
            self._layer = _lethe.Layer(*self._made_with)
        _relink(self, self._layer.parameters())


def _held(
    state: Optional[State], owner: str, device: torch.device, made: Dict[str, torch.dtype]
) -> List[Tuple[str, Tensor]]:
    """The tensors of ``state`` (None: an empty memory), refused unless ``owner`` made it,
    they are on ``device``, and each has the dtype ``made`` gives its name (what this
    module's states held at the block's dtype, where it has made one)."""
    if state is None:
        return []
    if not isinstance(state, State):
        raise TypeError(f"state: expected a lethe.State (or None), got {type(state).__name__}")
    if state.owner != owner:
        raise ValueError(f"state: made by {state.owner}, not by this module, {owner}")
    for name, t in state.tensors:
        if t.device != device:
            raise ValueError(
                f"state: `{name}` is on {t.device}, the block on {device} (move the state: state.to(device))"
            )
        if name in made and t.dtype != made[name]:
            raise ValueError(
                f"state: `{name}` is {t.dtype}, where this module's states hold it as {made[name]}"
                " (convert the state: state.to(dtype))"
            )
    return state.tensors


def _check_tensor(name: str, t: Any) -> None:
    """Refuses ``t`` unless it is a dense tensor on a device lethe computes on (the CPU or
    a CUDA GPU): a sparse block, or one on ``meta``, is named here rather than failing
    inside the computation."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"{name}: a {t.layout} tensor; lethe takes dense ones ({name}.to_dense())")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: on {t.device}; lethe computes on the CPU or a CUDA GPU ({name}.to(\"cpu\"))")


def _check_device(name: str, t: Tensor, module: nn.Module) -> None:
    """Refuses ``t`` unless it is on the device of ``module``'s parameters."""
    device = next(module.parameters()).device
    if t.device != device:
        raise ValueError(f"{name}: on {t.device}, the parameters on {device} (move one: {name}.to(device) or module.to(device))")


def _check_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _register(module: nn.Module, name: str, tensor: Tensor) -> None:
    """Registers the layer's own tensor ``tensor`` as the parameter ``name`` (dots make
    submodules, so that ``state_dict`` keys are lethe's names): the object becomes an
    ``nn.Parameter`` in place, so that what an optimiser updates, and what autograd
    accumulates gradients into, is the tensor the layer computes with."""
    *path, leaf = name.split(".")
    for part in path:
        child = module._modules.get(part)
        if child is None:
            child = nn.Module()
            module.add_module(part, child)
        module = child
    tensor.__class__ = nn.Parameter
    module.register_parameter(leaf, tensor)


def _relink(module: nn.Module, tensors: List[Tuple[str, Tensor]]) -> None:
    """Makes each of ``tensors`` (a new Rust layer's or model's own, by name) the
    parameter of that name in ``module``, holding what the parameter there holds (its
    values, device, dtype, ``requires_grad`` and gradient): after a copy or an unpickling,
    the copied parameters become the tensors the new layer computes with."""
    for name, tensor in tensors:
        *path, leaf = name.split(".")
        owner = module
        for part in path:
            owner = owner._modules[part]
        held = owner._parameters[leaf]
        with torch.no_grad():
            tensor.data = held.data
        tensor.__class__ = nn.Parameter
        tensor.requires_grad_(held.requires_grad)
        tensor.grad = held.grad
        owner._parameters[leaf] = tensor


class TransformerXL(MemoryAttention):
    """Transformer-XL's memory (Dai et al., 2019): the last ``span`` hidden states,
    attended with learned relative positions.

    Args:
        d_model: the width of the hidden states.
        heads: attention heads (``d_model`` a multiple of it).
        span: states kept; a query sees itself and at most ``span`` earlier positions.
        block: the longest block a call takes (default 64, or the span if shorter).
        dropout: dropout on the attention weights in training.
    """

    def __init__(self, d_model: int, heads: int, span: int, *, block: Optional[int] = None, dropout: float = 0.0) -> None:
        super().__init__("fixed", d_model, heads, span, block=block, dropout=dropout, settings={})


class ExpireSpan(MemoryAttention):
    """Expire-Span (Sukhbaatar et al., 2021): each memory predicts its own span
    ``e_i = L sigmoid(w·h_i + b)`` (Eq. 3), is masked softly over the last ``ramp``
    positions of it (Eq. 5) and deleted once it has expired. :attr:`aux_loss` is the
    span loss (Eq. 7).

    Args:
        d_model: the width of the hidden states.
        heads: attention heads (``d_model`` a multiple of it).
        max_span: the largest span ``L``.
        ramp: the soft mask's ramp ``R`` (lethe's default 16).
        alpha: the span loss's coefficient (default 1e-6).
        init_fraction: every span starts at this fraction of ``L`` (default 0.1).
        block: the longest block a call takes (default 64, or the span if shorter).
        dropout: dropout on the attention weights in training.
        settings: any other field of ``[memory.expire]`` (``pre_div``, ``noisy``,
            ``budget``, ``fused``, ...).
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        max_span: int,
        *,
        ramp: Optional[int] = None,
        alpha: Optional[float] = None,
        init_fraction: Optional[float] = None,
        block: Optional[int] = None,
        dropout: float = 0.0,
        **settings: Any,
    ) -> None:
        settings.update(ramp=ramp, alpha=alpha, init_fraction=init_fraction)
        super().__init__("expire", d_model, heads, max_span, block=block, dropout=dropout, settings=settings)


class AdaptiveSpan(MemoryAttention):
    """Adaptive-Span (Sukhbaatar et al., 2019): a learned span per head, masked softly
    over ``ramp`` positions; :attr:`aux_loss` is the span penalty.

    Args:
        d_model: the width of the hidden states.
        heads: attention heads (``d_model`` a multiple of it).
        max_span: the largest span.
        ramp: the soft mask's ramp (lethe's default 32).
        loss_coef: the span penalty's coefficient (default 2e-6).
        block: the longest block a call takes (default 64, or the span if shorter).
        dropout: dropout on the attention weights in training.
        settings: any other field of ``[memory.adaptive]`` (``init_ratio``).
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        max_span: int,
        *,
        ramp: Optional[int] = None,
        loss_coef: Optional[float] = None,
        block: Optional[int] = None,
        dropout: float = 0.0,
        **settings: Any,
    ) -> None:
        settings.update(ramp=ramp, loss_coef=loss_coef)
        super().__init__("adaptive", d_model, heads, max_span, block=block, dropout=dropout, settings=settings)


class Compressive(MemoryAttention):
    """The Compressive Transformer (Rae et al., 2020): the last ``span`` states, and
    older ones compressed ``rate`` to one into ``slots`` more.

    Args:
        d_model: the width of the hidden states.
        heads: attention heads (``d_model`` a multiple of it).
        span: uncompressed states kept.
        slots: compressed slots (lethe's default in ``[memory.compressive]``).
        rate: states per compressed slot.
        block: the longest block a call takes (default 64, or the span if shorter).
        dropout: dropout on the attention weights in training.
        settings: any other field of ``[memory.compressive]`` (``compressor``,
            ``recon_coef``).
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        span: int,
        *,
        slots: Optional[int] = None,
        rate: Optional[int] = None,
        block: Optional[int] = None,
        dropout: float = 0.0,
        **settings: Any,
    ) -> None:
        settings.update(slots=slots, rate=rate)
        super().__init__("compressive", d_model, heads, span, block=block, dropout=dropout, settings=settings)


class InfinityFormer(MemoryAttention):
    """The ∞-former (Martins et al., 2022): the last ``span`` states, and an unbounded
    continuous long-term memory of ``basis`` Gaussian basis functions into which older
    states are absorbed (Eq. 7-12); with ``sticky`` memories (section 3.3) the signal is
    resampled where attention went. :attr:`aux_loss` is the KL term.

    Args:
        d_model: the width of the hidden states.
        heads: attention heads (``d_model`` a multiple of it).
        span: the short-term memory.
        basis: basis functions of the long-term memory (lethe's default 128).
        sticky: sticky memories (default off).
        block: the longest block a call takes (default 64, or the span if shorter).
        dropout: dropout on the attention weights in training.
        settings: any other field of ``[memory.infinity]`` (``tau``, ``widths``,
            ``ridge``, ``kl_coef``, ...).
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        span: int,
        *,
        basis: Optional[int] = None,
        sticky: Optional[bool] = None,
        block: Optional[int] = None,
        dropout: float = 0.0,
        **settings: Any,
    ) -> None:
        settings.update(basis=basis, sticky=sticky)
        super().__init__("infinity", d_model, heads, span, block=block, dropout=dropout, settings=settings)
