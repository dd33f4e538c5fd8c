"""Synthetic transformer profiles and clusters from closed forms, for benchmarks without torch.

A GPT/Llama-style decoder as profile layers: the embedding, ``layers`` blocks and the final
norm + logit layer, at a global batch ``batch`` of ``seq`` tokens, in 16-bit. Per block
(Narayanan et al. SC'21, section 5.1): forward FLOPs ``24 B s h^2 + 4 B s^2 h``, backward
twice that, ``12 h^2`` parameters (Llama's gated blocks: ``2 h^2 + 2 h^2 kv/a + 3 h f`` parameters,
``2 B s`` FLOPs each, plus the attention core's); the logit layer ``2 B s h V`` forward FLOPs and ``h V``
parameters; activations saved per block ``s B h (34 + 5 a s / h)`` bytes (Korthikanti et al.
2022, Table 2), output ``2 s B h`` bytes. Times are FLOPs over ``peak * efficiency``.
Clusters: ``nodes`` servers of ``gpus`` A100 80GB or H100 80GB (NVIDIA data sheets) on
NVLink with one InfiniBand NIC per GPU (the shipped presets' links).
"""

from __future__ import annotations

from typing import Any

from planner import ir

GPUS: dict[str, dict[str, Any]] = {
    "a100": {"flops": 19.5e12, "memory_bytes": 80 * 2**30, "memory_bandwidth_Bps": 2.039e12,
             "peak_flops": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
             "intra": (3e11, 3e-6), "inter": (2.5e10, 5e-6)},
    "h100": {"flops": 67e12, "memory_bytes": 80 * 2**30, "memory_bandwidth_Bps": 3.35e12,
             "peak_flops": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
             "intra": (4.5e11, 2e-6), "inter": (5e10, 5e-6)},
}


def gpt_profile(name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int, batch: int, *,
                kv_heads: int | None = None, ffn: int | None = None, peak: float = 312e12,
                efficiency: float = 0.5, gated: bool = False) -> ir.ModelProfile:
    """A decoder of ``layers`` blocks as a profile for the whole ``batch`` (module doc); ``gated``: Llama's
    blocks (grouped-query attention, a gated MLP of three ``h x ffn`` matrices) instead of GPT's."""
    b, s, h, v = batch, seq, hidden, vocab
    rate = peak * efficiency
    ffn = ffn or 4 * h
    kv = kv_heads or heads
    block_params = 2 * h * h + 2 * h * (h * kv // heads) + 3 * h * ffn if gated else 4 * h * h + 2 * h * ffn
    block_f = 2 * b * s * block_params + 4 * b * s * s * h
    act = int(s * b * h * (34 + 5 * heads * s / h))
    out = 2 * s * b * h
    shape = {"hidden": h, "heads": heads, "kv_heads": kv, "ffn": ffn, "seq_len": s, "gated": gated}
    rows: list[dict[str, Any]] = [_layer("embed", "Embedding", 0.0, v * h, out, out, rate)]
    rows[0].update(in_features=v, out_features=h)
    for i in range(layers):
        row = _layer(f"block{i}", "Block", block_f, block_params, out, act, rate)
        row.update(in_features=h, out_features=h, block=shape)
        rows.append(row)
    head = _layer("head", "Head", 2.0 * b * s * h * v, h * v, 2 * s * b * v, 2 * s * b * v, rate)
    head.update(in_features=h, out_features=v)
    rows.append(head)
    doc = {"kind": "profile", "version": 1, "model": name, "batch_size": b, "dtype": "bfloat16",
           "mode": "analytic", "device": "synthetic", "device_flops": peak, "input_bytes": 8 * b * s,
           "input_shape": [s], "layers": rows}
    return ir.ModelProfile.from_dict(doc)


def _layer(name: str, kind: str, flops_f: float, params: int, out: int, saved: int, rate: float) -> dict[str, Any]:
    return {"name": name, "type": kind, "forward_s": flops_f / rate, "backward_s": 2 * flops_f / rate,
            "forward_flops": flops_f, "backward_flops": 2 * flops_f, "param_count": params,
            "param_bytes": 2 * params, "output_bytes": out, "saved_bytes": saved}


def cluster(gpu: str, nodes: int, gpus: int = 8, inter_Bps: float | None = None) -> ir.Cluster:
    """``nodes`` servers of ``gpus`` GPUs of kind ``gpu`` (a100, h100) on NVLink + InfiniBand
    (``inter_Bps``: another inter-server bandwidth per GPU)."""
    spec = dict(GPUS[gpu])
    if inter_Bps is not None:
        spec["inter"] = (inter_Bps, GPUS[gpu]["inter"][1])
    dev = {k: spec[k] for k in ("flops", "memory_bytes", "memory_bandwidth_Bps", "peak_flops")}
    doc = {"kind": "cluster", "version": 1, "name": f"{gpu}-{nodes}x{gpus}",
           "nodes": [{"name": f"s{n}", "gpus": [{"name": f"s{n}.g{g}", **dev} for g in range(gpus)]}
                     for n in range(nodes)],
           "links": {"intra_node": {"bandwidth_Bps": spec["intra"][0], "latency_s": spec["intra"][1]},
                     "inter_node": {"bandwidth_Bps": spec["inter"][0], "latency_s": spec["inter"][1]}}}
    return ir.Cluster.from_dict(doc)
