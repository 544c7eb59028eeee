"""A whole lethe model as a ``torch.nn.Module``: :func:`load`."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from . import _lethe
from .layers import State, _check_device, _check_tensor, _held, _register, _relink

__all__ = ["Model", "load"]


class Model(nn.Module):
    """A lethe language model: the embedding, the backbone's layers each with its memory,
    the output head, as the ``lethe`` command trains and evaluates it. Make one with
    :func:`load`.

    Attributes:
        config: the model's lethe config (the run's ``config.toml``) as a dict.
        vocab: the size of the vocabulary.
        block: the longest block :meth:`forward` takes (the config's ``train.block``).
        aux_loss: the sum of the layers' auxiliary losses of the last :meth:`forward`.
    """

    aux_loss: Tensor

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        super().__init__()
        self._model = _lethe.Model(os.fspath(path))
        self.config: Dict[str, Any] = json.loads(self._model.config())
        self.vocab: int = self.config["model"]["vocab"]
        self.block: int = self.config["train"]["block"]
        m = self.config["model"]
        self._owner = (
            f"lethe.Model({m['arch']}, {m['layers']} layers x {m['d_model']}, "
            f"{self.config['memory']['mechanism']} memory of span {self.config['memory']['span']})"
        )
        for name, tensor in self._model.parameters():
            _register(self, name, tensor)
        # The dtype of each state tensor this model made, by the parameters' dtype.
        self._state_dtypes: Dict[torch.dtype, Dict[str, torch.dtype]] = {}
        self.aux_loss = torch.zeros(())

    def forward(self, tokens: Tensor, state: Optional[State] = None) -> Tuple[Tensor, State]:
        """Reads the block ``tokens`` ``(batch, length)`` (int64 ids, ``length <= block``)
        over the memory ``state`` (None: empty); returns the next-token logits ``(batch,
        length, vocab)`` and every layer's memory after the block."""
        _check_tensor("tokens", tokens)
        _check_device("tokens", tokens, self)
        made = self._state_dtypes.setdefault(next(self.parameters()).dtype, {})
        held = _held(state, self._owner, tokens.device, made)
        logits, after, aux = self._model.forward(tokens, held, self.training)
        made.update((name, t.dtype) for name, t in after)
        self.aux_loss = aux
        return logits, State(self._owner, after)

    def encode(self, text: str) -> List[int]:
        """``text`` as the model's token ids (its tokenizer's, or UTF-8 bytes)."""
        return self._model.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids as text."""
        return self._model.decode([int(i) for i in ids])

    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        count: int,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> List[int]:
        """``count`` token ids after ``prompt`` (text, or token ids) from an empty memory,
        as ``lethe generate`` makes them: greedy at ``temperature`` 0 (the default), else
        sampled from the ``top_k`` most likely tokens (0: all) within ``top_p`` of the
        probability, seeded by ``seed``."""
        ids = _prompt_ids(prompt, count, self.encode)
        return self._model.generate(ids, count, _sampling(temperature, top_k, top_p, seed))

    def extra_repr(self) -> str:
        return self._owner

    def __getstate__(self) -> Dict[str, Any]:
        # `copy.deepcopy` and pickling (`torch.save(model)`) copy the parameters and the
        # model's config and tokenizer; `__setstate__` makes the Rust model again from
        # these, around the copied parameters, without reading the folder again.
        state = self.__dict__.copy()
        state["aux_loss"] = self.aux_loss.detach()  # the last call's, out of its graph
        state["_model"] = self._model.parts()
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        config, tokenizer = state.pop("_model")
        super().__setstate__(state)
        # The model is made with its parameters zero, nothing drawn from the caller's
        # random stream, and the copied ones take their place.
        self._model = _lethe.Model.from_parts(config, tokenizer)
        _relink(self, self._model.parameters())


def _prompt_ids(prompt: Union[str, Sequence[int]], count: int, encode: Callable[[str], List[int]]) -> List[int]:
    """The ids of a generation's ``prompt`` (text through ``encode``), once its ``count``
    of tokens is checked."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a whole number, 0 or more, got {count!r}")
    return encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]


def _whole(name: str, value: Any, most: int) -> int:
    """``value``, refused unless it is a whole number (a ``TypeError``) from 0 to ``most``
    (a ``ValueError``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected a whole number, got {value!r}")
    if not 0 <= value <= most:
        raise ValueError(f"{name} = {value}: must be from 0 to {most}")
    return value


def _sampling(temperature: float, top_k: int, top_p: float, seed: int) -> Tuple[float, int, float, int]:
    """A generation's sampling settings as the Rust side takes them, the whole numbers
    checked here (the Rust side checks the others): ``top_k`` and ``seed`` from 0."""
    return (float(temperature), _whole("top_k", top_k, 2**63 - 1), float(top_p), _whole("seed", seed, 2**64 - 1))


def load(path: Union[str, os.PathLike]) -> Model:
    """The lethe model at ``path``: a run folder (or its ``checkpoint.safetensors``), or a
    Hugging Face folder lethe reads (GPT-2, Llama, Mistral, Qwen, SmolLM2) with lethe's
    default memory settings."""
    return Model(path)
