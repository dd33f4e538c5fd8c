"""What each block of a split decoder attends over, as its model's forward masks it.

A Llama-style decoder's forward builds the attention masks once and hands each block its own: every token attends
to itself and those before it, and in the layers its forward slides only to the ``sliding_window`` tokens ending at
it (transformers' ``sliding_window_overlay``: ``q - k < window``). Which layers slide is the forward's, not the
config's (:func:`sliding_of`): those its config's ``layer_types`` marks ``sliding_attention`` where the forward reads
the layer types (Qwen2, Gemma 2/3, OLMo 3, EXAONE 4, Cohere 2), every layer where it slides without them and the
config sets ``sliding_window`` (Mistral, Phi-3, Starcoder2, whatever layer types the config carries), none where
it builds only the causal mask (Llama's, whatever window the config carries). Split into
blocks, each block rebuilds its mask from the sequence length (``planner.profiler.hfmodules.RotaryBlock``), as
:class:`BlockMask` says: under SDPA no mask where the model gives none (a causal window of the whole sequence,
SDPA's ``is_causal``; transformers' ``_ignore_causal_mask_sdpa`` skips the mask only where the sequence is shorter
than the window), else a boolean one; under eager attention (Gemma 2's soft-capped scores, which SDPA refuses) an
additive one, 0 where a token may attend and the dtype's least value elsewhere, as transformers' ``eager_mask``.

Owns :class:`BlockMask`, :func:`sliding_of` and :func:`block_masks` (a model's masks, one per block; TraceError
where the config asks for attention the blocks do not rebuild: bidirectional, chunked or of an unknown layer type).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from planner.errors import TraceError

_TYPES = ("full_attention", "sliding_attention")
"""The layer types whose masks :class:`BlockMask` rebuilds."""


@dataclass(frozen=True)
class BlockMask:
    """One block's attention mask: causal, within ``window`` tokens where set; ``additive`` for eager attention;
    ``explicit``: built even where SDPA could mask causally itself (Falcon's forward asks for it so,
    ``allow_is_causal_skip=False``)."""

    window: int | None = None
    additive: bool = False
    explicit: bool = False

    def build(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """The mask for ``hidden`` (batch, sequence, width), broadcast over the batch and heads; None where SDPA
        masks causally itself, as the model's forward leaves it."""
        seq_len = int(hidden.shape[1])
        if not (self.additive or self.explicit) and (self.window is None or seq_len < self.window):
            return None
        index = torch.arange(seq_len, device=hidden.device)
        allowed = index[None, :] <= index[:, None]  # [query, key]: keys at or before the query
        if self.window is not None:
            allowed = allowed & (index[:, None] - index[None, :] < self.window)
        allowed = allowed[None, None]
        if not self.additive:
            return allowed
        zero = torch.zeros((), dtype=hidden.dtype, device=hidden.device)
        return torch.where(allowed, zero, torch.finfo(hidden.dtype).min)


Sliding = Literal["none", "every", "typed"]
"""Which layers a decoder's forward masks to a sliding window: none, every one (where the config sets a window) or
those its config's ``layer_types`` marks ``sliding_attention``."""


def sliding_of(forward: Callable[..., Any]) -> Sliding:
    """Which layers a decoder model's ``forward`` slides, read off the names its code uses (module doc): a forward
    that never calls transformers' ``create_sliding_window_causal_mask`` slides none (Llama's, though its config may
    carry a ``sliding_window`` it ignores); one that calls it and reads ``layer_types`` slides the layers they mark
    (Qwen2's); one that calls it without them slides every layer (Mistral's, though its config may carry layer
    types it ignores)."""
    code = getattr(inspect.unwrap(forward), "__code__", None)
    names = code.co_names if code is not None else ()
    if "create_sliding_window_causal_mask" not in names:
        return "none"
    return "typed" if "layer_types" in names else "every"


def block_masks(config: Any, blocks: int, sliding: Sliding) -> tuple[BlockMask, ...]:
    """The masks of a decoder's first ``blocks`` blocks, from its config, sliding as its forward does
    (:func:`sliding_of`; module doc)."""
    _check_attention(config)
    additive = getattr(config, "_attn_implementation", None) == "eager"
    window = getattr(config, "sliding_window", None) if sliding != "none" else None
    types = getattr(config, "layer_types", None) if sliding == "typed" else None
    masks = []
    for i in range(blocks):
        kind = types[i] if types is not None and i < len(types) else "sliding_attention"
        if kind not in _TYPES:
            raise TraceError(f"{type(config).__name__}'s layer {i} is of type {kind!r}; planner's split blocks rebuild "
                             f"the masks of {' and '.join(_TYPES)} layers only",
                             "build it with those layer types, or split it yourself as an nn.Sequential")
        if types is not None and kind == "sliding_attention" and window is None:
            raise TraceError(f"{type(config).__name__}'s layer {i} is a sliding_attention layer and its "
                             "sliding_window is None: transformers' forward refuses such a model (it needs the "
                             "window), and the split blocks would attend over the whole sequence",
                             "give it a sliding_window (one of the sequence's length or more attends fully)")
        masks.append(BlockMask(int(window) if window is not None and kind == "sliding_attention" else None, additive))
    return tuple(masks)


def _check_attention(config: Any) -> None:
    """Attention the blocks' masks do not rebuild: Gemma 3's ``use_bidirectional_attention`` (every token sees every
    other, within the window where it slides), a chunked attention (Llama 4's ``attention_chunk_size``)."""
    name = type(config).__name__
    if getattr(config, "use_bidirectional_attention", False):
        raise TraceError(f"{name} sets use_bidirectional_attention: its forward lets every token attend to every "
                         "other, and planner's split blocks attend causally",
                         "build it with use_bidirectional_attention=False, or split it yourself as an nn.Sequential")
    if getattr(config, "attention_chunk_size", None) is not None:
        raise TraceError(f"{name} attends within chunks of {config.attention_chunk_size} tokens, which planner's "
                         "split blocks do not mask", "build it with attention_chunk_size=None")
