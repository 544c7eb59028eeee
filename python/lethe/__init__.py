"""lethe: transformers with long memory that learn what to keep and what to forget.

lethe's memory mechanisms as PyTorch modules, computed by lethe's own code (the same as
the ``lethe`` command's): Transformer-XL, Expire-Span, Adaptive-Span, the Compressive
Transformer and the ∞-former. See the guide's page "lethe from Python".
"""

import torch  # noqa: F401  (loads the libtorch that the extension links, first)

from .decoder import POLICIES, Decoder, KvCache
from .layers import (
    AdaptiveSpan,
    Compressive,
    ExpireSpan,
    InfinityFormer,
    MemoryAttention,
    State,
    TransformerXL,
)
from .model import Model, load

__all__ = [
    "AdaptiveSpan",
    "Compressive",
    "Decoder",
    "ExpireSpan",
    "InfinityFormer",
    "KvCache",
    "MemoryAttention",
    "Model",
    "POLICIES",
    "State",
    "TransformerXL",
    "load",
]
