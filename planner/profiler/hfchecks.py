"""What a transformers model split by its structure (``planner.profiler.hfsplit``) must be for its blocks to compute
what the model does: attention the blocks mask themselves (SDPA, or eager where they rebuild their masks), causal
attention, every block run (no layerdrop), a sequence within its learned positions, and no loss beyond the logits' (a
mixture of experts' load-balancing loss over every block's router logits), and a router that can choose its tokens'
experts, and query heads that group over the KV heads. :func:`check_model` raises a TraceError naming the setting
and its fix.
"""

from __future__ import annotations

from torch import nn

from planner.errors import TraceError


def check_model(model: nn.Module, arch: str, seq_len: int, masked: bool) -> None:
    """Every check below; ``masked``: the blocks rebuild their attention masks (eager attention allowed)."""
    _check_sdpa(model, masked)
    _check_causal(model, arch)
    _check_layerdrop(model)
    _check_positions(model, arch, seq_len)
    _check_router_loss(model)
    _check_routing(model)
    _check_heads(model)


def heads_problem(config: object) -> str | None:
    """Why a config's attention heads do not group over its KV heads (``num_attention_heads`` not a multiple of
    ``num_key_value_heads``: every KV head serves a whole group of query heads, and the first forward fails on the
    CPU while the meta device's attention, which analytic profiles run, lets it through); None where they do, and for
    GPT-2-style configs (``n_embd``: GPTBigCode's KV heads follow ``multi_query``, its ``num_key_value_heads`` may be
    stale), as :func:`planner.profiler.hfshape.block_shape` reads them."""
    if hasattr(config, "n_embd"):
        return None
    heads, kv_heads = (getattr(config, f, None) for f in ("num_attention_heads", "num_key_value_heads"))
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads == 0:
        return None
    divisors = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
    return (f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads} (each KV head serves "
            f"a whole group of query heads); num_key_value_heads must be one of {divisors}")


def _check_heads(model: nn.Module) -> None:
    problem = heads_problem(getattr(model, "config", None))
    if problem:
        raise TraceError(f"{type(model).__name__}: {problem}", "build it with KV heads that divide its heads")


EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
"""Config fields that count a mixture of experts' experts a block (Mixtral, Qwen2-MoE and OLMoE, DeepSeek, ERNIE)."""
_PER_TOKEN = ("num_experts_per_tok", "moe_k", "moe_topk")
"""Config fields that count the experts each token runs."""


def _check_routing(model: nn.Module) -> None:
    """A mixture of experts whose tokens would each run more experts than a block has (its router's top-k fails on
    the first forward, as an input the model rejects)."""
    config = getattr(model, "config", None)
    experts = next((getattr(config, f) for f in EXPERT_FIELDS if isinstance(getattr(config, f, None), int)), None)
    for field in _PER_TOKEN:
        k = getattr(config, field, None)
        if isinstance(k, int) and isinstance(experts, int) and k > experts:
            raise TraceError(f"{type(model).__name__} routes each token to {field}={k} experts, more than the "
                             f"{experts} a block has", f"build it with {field} at most {experts}")


def _check_router_loss(model: nn.Module) -> None:
    """A mixture of experts' causal LM built with ``output_router_logits=True`` adds a load-balancing loss over every
    block's router logits to its language-model loss; only hidden states cross a split's cuts, so the engines would
    train the language-model loss alone. Its bare model (``...Model``) has no loss: its hidden states are the
    split's, whatever logits it also returns."""
    config = getattr(model, "config", None)
    if getattr(config, "output_router_logits", False) and type(model).__name__.endswith("ForCausalLM"):
        coef = getattr(config, "router_aux_loss_coef", None)
        raise TraceError(f"{type(model).__name__} is built with output_router_logits=True: its loss adds a "
                         f"load-balancing loss (router_aux_loss_coef={coef}) over every block's router logits, and "
                         "planner's stages pass hidden states only, so the engines would train without it",
                         "build it with output_router_logits=False (the router then trains through the language-"
                         "model loss alone), or train it outside planner's engines")


def _check_sdpa(model: nn.Module, masked: bool) -> None:
    """SDPA, which masks causally itself, or eager attention where the blocks rebuild their masks (``masked``,
    planner.profiler.hfmasks)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl not in ("sdpa", None) and not (masked and impl == "eager"):
        kinds = "'sdpa' or 'eager'" if masked else "'sdpa'"
        raise TraceError(f"{type(model).__name__} uses attn_implementation={impl!r}; its attention mask is built "
                         "outside the blocks", f"build the model with attn_implementation={kinds}")


def _check_positions(model: nn.Module, arch: str, seq_len: int) -> None:
    """GPT-2, GPT-BigCode, GPT-Neo, OPT, BERT and RoBERTa look up learned positions 0..s-1 in a table (``wpe``;
    OPT's ``embed_positions``, whose first 2 rows are an offset; RoBERTa's, whose first ``pad_token_id + 1`` are),
    GPT-J and CodeGen their rotary positions' sines in a table, MPT its ALiBi biases of ``max_seq_len`` positions: a
    longer sequence cannot run (on the meta device the lookup is not checked, so an analytic profile would be
    written for a model that fails)."""
    kind = "learned positions"
    if arch in ("gpt2", "gpt_bigcode", "gpt_neo"):
        rows = int(getattr(model, "transformer", model).wpe.num_embeddings)
        field = "max_position_embeddings" if arch == "gpt_neo" else "n_positions"
    elif arch in ("gptj", "codegen"):  # sinusoidal positions, a table of n_positions rows
        rows, field, kind = int(model.config.n_positions), "n_positions", "rotary positions"
    elif arch == "opt":
        rows = int(getattr(model, "model", model).decoder.embed_positions.num_embeddings) - 2
        field = "max_position_embeddings"
    elif arch in ENCODERS - {"vit", "deit", "modernbert"}:  # RoBERTa's (CamemBERT's) start after its padding index
        offset = int(model.config.pad_token_id) + 1 if arch in ("roberta", "xlm-roberta", "camembert") else 0
        rows, field = int(model.config.max_position_embeddings) - offset, "max_position_embeddings"
    elif arch == "mpt":
        rows, field, kind = int(model.config.max_seq_len), "max_seq_len", "positions of ALiBi biases"
    else:
        return
    if seq_len > rows:
        raise TraceError(f"{type(model).__name__} has {rows} {kind} ({field}), fewer than the "
                         f"{seq_len}-token sequence; it cannot run at that length",
                         f"profile at --input-shape {rows} or less, or build it with {field}={seq_len} or more")


ENCODERS = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "modernbert", "vit",
                      "deit"})
"""The architectures whose blocks attend both ways (no mask: every token sees every other)."""


def _check_causal(model: nn.Module, arch: str) -> None:
    """A decoder built with ``is_causal=False`` (transformers' bidirectional attention for decoders: the mask its
    forward builds lets every token see every other) is refused: the split blocks get no mask, so SDPA masks them
    causally. The encoders (:data:`ENCODERS`) attend both ways as their blocks run here, so one built as a decoder
    (``is_decoder=True``: BERT's or RoBERTa's causal mask) is refused."""
    config = getattr(model, "config", None)
    if arch in ENCODERS:
        if getattr(config, "is_decoder", False):
            raise TraceError(f"{type(model).__name__} is built with is_decoder=True: its forward masks attention "
                             "causally, and planner's split encoder blocks attend both ways",
                             "build it with is_decoder=False (the default), or split it yourself as an nn.Sequential")
        return
    causal = getattr(config, "is_causal", True)
    if not causal:
        raise TraceError(f"{type(model).__name__} is built with is_causal={causal!r}: its forward lets every token "
                         "attend to every other, and its split blocks would attend causally",
                         "build it with is_causal=True (the default), or split it yourself as an nn.Sequential")


def _check_layerdrop(model: nn.Module) -> None:
    """OPT's ``layerdrop`` skips blocks at random while training; the split layers run every block."""
    drop = float(getattr(getattr(model, "config", None), "layerdrop", 0.0) or 0.0)
    if drop > 0:
        raise TraceError(f"{type(model).__name__} skips its blocks at random while training (layerdrop={drop}); "
                         "a pipeline runs every block", "build it with layerdrop=0.0")
