"""A pretrained Llama-family decoder under a key-value cache policy: :class:`Decoder`."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

from . import _lethe
from .layers import _check_tensor
from .model import _prompt_ids, _sampling, _whole

__all__ = ["Decoder", "KvCache", "POLICIES"]

POLICIES = ("full", "window", "streaming", "h2o", "tova", "snapkv")
"""The key-value cache policies, as ``lethe generate --policy`` names them."""

KvCache = _lethe.KvCache
"""The keys and values a :class:`Decoder` holds: ``KvCache(policy, budget)``, see :meth:`Decoder.cache`."""

_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
"""The precisions a :class:`Decoder` computes in, as ``--precision`` names them."""


def _precision(dtype: Optional[torch.dtype]) -> str:
    """``dtype`` as ``--precision`` names it; a ``ValueError`` for another."""
    if dtype is None:
        return "f32"
    for name, known in _DTYPES.items():
        if dtype == known:
            return name
    raise ValueError(f"dtype: {dtype!r}; a decoder computes in torch.float32, torch.bfloat16 or torch.float16")


class Decoder:
    """A Llama-family model (Llama, Mistral, Qwen2/3, SmolLM2) from its Hugging Face
    folder, run by lethe's inference path with its key-value cache kept by one of the
    training-free policies (``lethe generate --init-from FOLDER --policy ...``)::

        decoder = lethe.Decoder("SmolLM2-135M")
        cache = decoder.cache("h2o", budget=256)
        logits = decoder(ids, cache)        # (batch, length, vocab); the cache holds ids too
        logits = decoder(next_ids, cache)   # each token predicted from what H2O kept
        fork = cache.copy()                 # continued apart from here (copy.deepcopy too)
        ids = decoder.generate("The cache keeps", 20, fork, temperature=0.8, seed=1)

    ``path`` may also be a lethe run (its folder or checkpoint) of Expire-Span fitted onto
    such a model (``lethe train --init-from FOLDER --set memory.mechanism=expire``): the
    decoder then has the run's weights (its low-rank adapters folded in), and
    ``cache("learned")`` keeps what the run's span predictors say (``lethe generate
    --checkpoint RUN``), beside the training-free policies at the same budget.

    Inference only (no gradients), on the CPU or, with ``device="cuda"``, a GPU: the
    weights are read there and the caches hold their entries there; ``ids`` are given
    on :attr:`device` and the logits come back on it. ``dtype`` (``torch.float32``, the
    default, ``torch.bfloat16`` or ``torch.float16``) is the precision of the weights,
    the activations and the caches' entries, computed as ``transformers`` computes in it
    (RMSNorm's statistics, RoPE's angles and the softmax in float32); the logits come
    back in float32 whatever it is.
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        device: Union[str, torch.device, None] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        try:
            where = "cpu" if device is None else str(torch.device(device))
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device: {e}") from None
        self._decoder = _lethe.Decoder(os.fspath(path), where, _precision(dtype))
        self.device: torch.device = torch.device(self._decoder.device())
        """Where the weights are, and so the caches' entries, the ids and the logits."""
        self.dtype: torch.dtype = _DTYPES[self._decoder.precision()]
        """The precision of the weights and the caches' entries."""
        self.vocab: int = self._decoder.vocab()
        self.learned: bool = self._decoder.learned()
        """Whether the decoder is a lethe run's, whose caches can keep what its learned
        memory says (``cache("learned")``)."""
        self.memory: Optional[str] = self._decoder.memory()
        """What names a run's learned memory (``crc32 ...``, a checksum of its span
        predictors and their settings): every decoder of the run has the same, and reads
        the learned caches of the others, saved ones too. None for a Hugging Face folder."""
        self._path = os.fspath(path)

    def __repr__(self) -> str:
        kind = f"a lethe run, learned memory {self.memory}" if self.learned else "a Hugging Face folder"
        return f"lethe.Decoder({self._path!r}: {kind}, vocab {self.vocab}, {self.device}, {self.dtype})"

    def cache(self, policy: str = "full", budget: Optional[int] = None) -> KvCache:
        """An empty cache that keeps what ``policy`` says (one of :data:`POLICIES`, with
        settings as ``"snapkv:window=16,kernel=5"`` or ``"streaming:sinks=4"``) within
        ``budget`` entries per layer and key-value head (None for ``full``); or, for a
        run's decoder, ``"learned"``: what its span predictors keep, within ``budget``
        (None: the run's own ``memory.expire.budget``). Each call of the decoder adds to
        it in place; ``entries()`` gives what each layer holds,
        ``nbytes()`` its bytes, ``position()`` the tokens read, and ``copy()`` an
        independent copy (what it holds and what its policy keeps about it) that reads on
        apart: a prompt read once, continued several ways."""
        if budget is not None:
            _whole("budget", budget, 2**63 - 1)
        if policy == "learned":
            return self._decoder.learned_cache(budget)
        return KvCache(policy, budget)

    def __call__(self, ids: Tensor, cache: KvCache) -> Tensor:
        """The logits ``(batch, length, vocab)`` of ``ids`` ``(batch, length)`` read after
        what ``cache`` holds; the cache then holds them too, as its policy keeps them."""
        _check_tensor("ids", ids)
        if not isinstance(cache, KvCache):
            raise TypeError(f"cache: expected a lethe.KvCache, got {type(cache).__name__}")
        return self._decoder.forward(ids, cache)

    def encode(self, text: str) -> List[int]:
        """``text`` as the model's token ids (the folder's ``tokenizer.json``, or the run's
        tokenizer)."""
        return self._decoder.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids as text."""
        return self._decoder.decode([int(i) for i in ids])

    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        count: int,
        cache: KvCache,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> List[int]:
        """``count`` token ids after ``prompt`` (text, or token ids) read after what ``cache``
        holds, as ``lethe generate --init-from FOLDER --policy ...`` makes them (a learned
        cache: ``lethe generate --checkpoint RUN``): greedy at ``temperature`` 0 (the
        default), else sampled from the ``top_k`` most likely tokens (0: all) within
        ``top_p`` of the probability, seeded by ``seed``. The cache then holds the prompt
        and every generated token, as its policy keeps them; Ctrl-C stops a long
        generation (a ``KeyboardInterrupt``), the cache keeping what it read."""
        ids = _prompt_ids(prompt, count, self.encode)
        if not isinstance(cache, KvCache):
            raise TypeError(f"cache: expected a lethe.KvCache, got {type(cache).__name__}")
        out = self._decoder.generate(ids, count, cache, _sampling(temperature, top_k, top_p, seed))
        if out:  # the last token, chosen but not yet read
            self(torch.tensor([out[-1:]], device=self.device), cache)
        return out
