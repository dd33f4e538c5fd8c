"""The runnable layers a transformers model is split into: each takes one tensor and returns one.

Only the hidden states cross a cut; what a layer needs besides them is rebuilt inside it from
static shapes: GPT-2's and OPT's position ids (0..s-1), Llama's rotary position embeddings (cos/sin of
positions 0..s-1, as ``LlamaModel.forward`` computes them), BLOOM's, Falcon's and MPT's ALiBi biases, and the
attention mask (``planner.profiler.hfmasks``; none where SDPA applies the causal one itself, ``is_causal``). Each
wrapper uses the model's own submodules (no parameter copies), so running them in order equals the model.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from torch import nn

from planner.profiler.hfmasks import BlockMask


class GPT2Embedding(nn.Module):  # type: ignore[misc]
    """Token plus position embeddings, then dropout; position ids rebuilt from the sequence length."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return self.drop(self.wte(input_ids) + self.wpe(pos))


class TokenEmbedding(nn.Module):  # type: ignore[misc]
    """Token embedding alone (Llama: no learned positions; the rotary ones are computed in each block)."""

    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)  # type: ignore[no-any-return]


class TransformerBlock(nn.Module):  # type: ignore[misc]
    """One HF transformer block on hidden states only (causal masking by SDPA's ``is_causal``)."""

    def __init__(self, block: nn.Module, post: nn.Module | None = None) -> None:
        super().__init__()
        self.block = block
        self.post = post

    def run_block(self, hidden: torch.Tensor) -> object:
        """The wrapped block on ``hidden`` (a tensor or a tuple starting with one)."""
        return self.block(hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.run_block(hidden)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out if self.post is None else self.post(out)


class MaskedBlock(TransformerBlock):
    """A block whose model's forward hands it an attention mask and nothing else it would not rebuild (GPT-BigCode's):
    the mask from ``mask`` (none under SDPA, which masks causally itself; additive under eager attention); no KV
    cache."""

    def __init__(self, block: nn.Module, mask: BlockMask, post: nn.Module | None = None) -> None:
        super().__init__(block, post)
        self.mask = mask

    def extra_repr(self) -> str:
        return f"mask={self.mask}"

    def run_block(self, hidden: torch.Tensor) -> object:
        return self.block(hidden, attention_mask=self.mask.build(hidden), use_cache=False)


class Chain(nn.Module):  # type: ignore[misc]
    """Modules applied one after the other (e.g. final norm then LM head)."""

    def __init__(self, *mods: nn.Module) -> None:
        super().__init__()
        self.mods = nn.ModuleList(mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.mods:
            x = m(x)
        return x


class Scale(nn.Module):  # type: ignore[misc]
    """Its input multiplied (or divided, ``divide``) by a constant, as a model's forward writes it (Granite's
    embedding multiplier and logit scaling, Cohere's logit scale): the same operation, so the same bits."""

    def __init__(self, factor: float, divide: bool = False) -> None:
        super().__init__()
        self.factor, self.divide = factor, divide

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.factor if self.divide else x * self.factor


class OwnedDropout(nn.Module):  # type: ignore[misc]
    """A dropout a model's forward applies as a function (Starcoder2's ``nn.functional.dropout(..., p=
    self.embedding_dropout, training=self.training)``): active only while both this layer and that model train, so
    ``model.eval()`` turns it off as it does the model's own; the model is held without being registered (no
    parameters of its own here)."""

    def __init__(self, p: float, owner: nn.Module) -> None:
        super().__init__()
        self.p = p
        self._owner = (owner,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(x, p=self.p, training=self.training and self._owner[0].training)


class OPTEmbedding(nn.Module):  # type: ignore[misc]
    """OPT's token embedding (projected to the width where the model has ``project_in``) plus its learned positions
    0..s-1 (the table's rows 2..s+1: OPT offsets them by 2), as ``OPTDecoder.forward`` adds them without padding."""

    def __init__(self, embed_tokens: nn.Embedding, embed_positions: nn.Embedding, project_in: nn.Module | None
                 ) -> None:
        super().__init__()
        self.embed_tokens, self.embed_positions, self.project_in = embed_tokens, embed_positions, project_in

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        embeds = self.embed_tokens(input_ids)
        if self.project_in is not None:
            embeds = self.project_in(embeds)
        return embeds + self.embed_positions(None, 0, position_ids=positions)


class BertEmbedding(nn.Module):  # type: ignore[misc]
    """BERT's embeddings (word, position, token type, norm, dropout) from token ids alone."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids=input_ids)


class PatchEmbedding(nn.Module):  # type: ignore[misc]
    """ViT's embeddings (patches, class token, positions, dropout) from pixels, cast to the patch projection's
    dtype first, as ``ViTModel.forward`` casts them."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.embeddings(pixels.to(self.embeddings.patch_embeddings.projection.weight.dtype))


class MeanTokens(nn.Module):  # type: ignore[misc]
    """The mean of each sequence's hidden states over its tokens, as ModernBERT's classifier pools them without an
    attention mask (a mask of ones, in its order of operations, so the same bits)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(hidden.shape[:2], device=hidden.device, dtype=torch.bool)
        return (hidden * ones.unsqueeze(-1)).sum(dim=1) / ones.sum(dim=1, keepdim=True)


class EncoderRotaryBlock(TransformerBlock):
    """A ModernBERT block on hidden states only, given what ``ModernBertModel.forward`` gives it: rotary position
    embeddings of its layer type at positions 0..s-1 (its own copy of the model's ``rotary_emb``), and the mask of its
    layer type made by the model module's own functions (``create_bidirectional_mask`` for full layers,
    ``create_bidirectional_sliding_window_mask`` for sliding ones; none where they return none), without padding."""

    def __init__(self, block: nn.Module, rotary: nn.Module, config: object, layer_type: str,
                 make_mask: Callable[..., torch.Tensor | None], post: nn.Module | None = None) -> None:
        super().__init__(block, post)
        self.rotary, self.layer_type, self.make_mask = copy.deepcopy(rotary), layer_type, make_mask
        self._config = (config,)  # not a module; held, not registered

    def extra_repr(self) -> str:
        return f"layer_type={self.layer_type!r}"

    def run_block(self, hidden: torch.Tensor) -> object:
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = self.make_mask(config=self._config[0], inputs_embeds=hidden, attention_mask=None)
        return self.block(hidden, attention_mask=mask,
                          position_embeddings=self.rotary(hidden, positions, self.layer_type))


class FirstToken(nn.Module):  # type: ignore[misc]
    """The hidden states of each sequence's first token (ViT's class token), as its classifier takes them."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden[:, 0, :]


class RotaryBlock(TransformerBlock):
    """A Llama-family decoder block on hidden states only (``transformers`` >= 4.48 layer API).

    Its rotary position embeddings come from its own copy of the model's ``rotary_emb``
    (buffers only, no parameters) at positions 0..s-1 (of its ``layer_type``, where the model's rotary embedding
    takes one: Gemma 3's local and global bases); its attention mask from ``mask``
    (``planner.profiler.hfmasks``: none, so SDPA masks causally, unless the block attends within a sliding window
    shorter than the sequence or runs eager attention); no KV cache. ``post`` (the final norm of a model without LM
    head) runs after it.
    """

    def __init__(self, block: nn.Module, rotary: nn.Module, post: nn.Module | None = None,
                 mask: BlockMask | None = None, layer_type: str | None = None) -> None:
        super().__init__(block, post)
        self.rotary = copy.deepcopy(rotary)
        self.mask, self.layer_type = mask or BlockMask(), layer_type

    def extra_repr(self) -> str:
        """Its mask and layer type, so that blocks that attend differently print differently (a sliding and a full
        layer of Gemma 3 are not identical layers to ``planner.profiler.repeats``)."""
        return f"mask={self.mask}, layer_type={self.layer_type!r}"

    def run_block(self, hidden: torch.Tensor) -> object:
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        typed = () if self.layer_type is None else (self.layer_type,)
        cos_sin = self.rotary(hidden, positions, *typed)
        return self.block(hidden, attention_mask=self.mask.build(hidden), position_ids=positions,
                          position_embeddings=cos_sin, use_cache=False)


class AlibiBlock(TransformerBlock):
    """A BLOOM block on hidden states only: its ALiBi biases (Press et al., "Train Short, Test Long", ICLR 2022: a
    per-head slope times the key's position) from ``build_alibi`` (the model module's ``build_alibi_tensor``) over a
    sequence without padding, as ``BloomModel.forward`` builds them when given no attention mask, and its additive
    causal mask from ``mask`` (BLOOM attends eagerly, adding the mask to its scores); no KV cache. ``post`` (the final
    norm of a model without LM head) runs after it."""

    def __init__(self, block: nn.Module, build_alibi: Callable[..., torch.Tensor], heads: int,
                 post: nn.Module | None = None, mask: BlockMask | None = None) -> None:
        super().__init__(block, post)
        self.build_alibi, self.heads = build_alibi, heads
        self.mask = mask or BlockMask(additive=True)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, mask={self.mask}"

    def run_block(self, hidden: torch.Tensor) -> object:
        tokens = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        alibi = self.build_alibi(tokens, self.heads, dtype=hidden.dtype)
        return self.block(hidden, alibi=alibi, attention_mask=self.mask.build(hidden), use_cache=False)


class MptBlock(TransformerBlock):
    """An MPT block on hidden states only, given what ``MptModel.forward`` gives each block: the ALiBi biases of its
    ``max_seq_len`` positions from ``build_alibi`` (the model module's ``build_mpt_alibi_tensor``, called as the model
    calls it), which the attention slices to the sequence, and its causal mask as the model makes it (the additive
    mask turned boolean, true where a token may not attend); no KV cache."""

    def __init__(self, block: nn.Module, build_alibi: Callable[..., torch.Tensor], heads: int, max_seq_len: int,
                 post: nn.Module | None = None) -> None:
        super().__init__(block, post)
        self.build_alibi, self.heads, self.max_seq_len = build_alibi, heads, max_seq_len
        self.mask = BlockMask(additive=True)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, max_seq_len={self.max_seq_len}"

    def run_block(self, hidden: torch.Tensor) -> object:
        alibi = self.build_alibi(self.heads, self.max_seq_len, device=hidden.device)
        masked = self.mask.build(hidden)
        assert masked is not None  # an additive mask is always built
        return self.block(hidden, position_bias=alibi, attention_mask=masked.to(torch.bool), use_cache=False)


class FalconBlock(TransformerBlock):
    """A Falcon block on hidden states only, given what ``FalconModel.forward`` gives each block for a sequence
    without padding: rotary position embeddings from its own copy of the model's ``rotary_emb`` at positions 0..s-1;
    the causal mask ``mask`` (always built: Falcon does not let SDPA mask causally itself); and, where the model uses
    ALiBi (``build_alibi`` given: the model module's ``build_alibi_tensor``), the biases per head, which the forward
    also folds into the mask, scaled by the square root of the head size, as additive values; no KV cache."""

    def __init__(self, block: nn.Module, rotary: nn.Module, mask: BlockMask, heads: int, head_dim: int,
                 build_alibi: Callable[..., torch.Tensor] | None = None, post: nn.Module | None = None) -> None:
        super().__init__(block, post)
        self.rotary, self.mask = copy.deepcopy(rotary), mask
        self.heads, self.head_dim, self.build_alibi = heads, head_dim, build_alibi

    def extra_repr(self) -> str:
        return f"heads={self.heads}, mask={self.mask}, alibi={self.build_alibi is not None}"

    def _alibi_mask(self, hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ALiBi biases as (batch, heads, 1, s), the mask with them folded in), as the model's forward makes them."""
        assert self.build_alibi is not None
        batch, seq_len = hidden.shape[:2]
        tokens = torch.ones((batch, seq_len), dtype=torch.long, device=hidden.device)
        alibi = self.build_alibi(tokens, self.heads, dtype=hidden.dtype)
        least = torch.finfo(hidden.dtype).min
        if mask.dtype == torch.bool:
            mask = torch.where(mask, torch.full((), 0.0, device=mask.device, dtype=hidden.dtype), least)
        alibi = alibi.reshape(batch, -1, *alibi.shape[1:])
        return alibi, torch.masked_fill(alibi / math.sqrt(self.head_dim), mask < -1, least)

    def run_block(self, hidden: torch.Tensor) -> object:
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = self.mask.build(hidden)
        assert mask is not None  # an explicit mask is always built
        alibi = None
        if self.build_alibi is not None:
            alibi, mask = self._alibi_mask(hidden, mask)
        return self.block(hidden, alibi=alibi, attention_mask=mask, position_ids=positions,
                          position_embeddings=self.rotary(hidden, position_ids=positions), use_cache=False)


class SoftCap(nn.Module):  # type: ignore[misc]
    """``cap * tanh(x / cap)``, as Gemma 2's and 3's causal LMs cap their logits (``final_logit_softcapping``), in
    the model's order of operations, so the same bits."""

    def __init__(self, cap: float) -> None:
        super().__init__()
        self.cap = cap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / self.cap) * self.cap
