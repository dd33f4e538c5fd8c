"""The models of ``scripts/validate_fidelity.py``'s table, built here so that every process of a run
builds the same ones (model specs ``fidelity_models:<factory>``, this folder on ``PYTHONPATH``).

A CNN, a residual CNN, a GPT-2-style and a Llama-style decoder (small, built from transformers
configs, no download), and a VGG-like model for the quality check: each factory returns the
model and an example input of 2 samples; :data:`MODELS` gives each its table batch size.
"""

from __future__ import annotations

import torch
from torch import nn


def cnn() -> tuple[nn.Module, torch.Tensor]:
    """A small CNN on 3x32x32 images, 10 classes."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10),
    ), torch.randn(2, 3, 32, 32)


class Residual(nn.Module):
    """``relu(x + conv(relu(conv(x))))``: a basic residual block without batch norm."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(width, width, 3, padding=1)
        self.b = nn.Conv2d(width, width, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b(torch.relu(self.a(x))))


def rescnn() -> tuple[nn.Module, torch.Tensor]:
    """A residual CNN: a stem, four residual blocks (two widths), a classifier."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), Residual(32), Residual(32),
        nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.ReLU(), Residual(64), Residual(64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    ), torch.randn(2, 3, 32, 32)


def gpt2_small() -> tuple[nn.Module, torch.Tensor]:
    """GPT-2 (transformers GPT2Config): 4 blocks of width 128, 4 heads, vocabulary 1024, 64 tokens, tied head."""
    from planner.profiler.hfzoo import gpt2

    return gpt2(n_layer=4, n_embd=128, n_head=4, vocab_size=1024, n_positions=64), torch.randint(0, 1024, (2, 64))


def llama_small() -> tuple[nn.Module, torch.Tensor]:
    """Llama (transformers LlamaConfig): 4 blocks of width 128, 4 heads, 2 KV heads, SwiGLU 256, vocabulary 1024."""
    from planner.profiler.hfzoo import llama

    model = llama(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=256, vocab_size=1024, max_position_embeddings=64)
    return model, torch.randint(0, 1024, (2, 64))


def vgg_like() -> tuple[nn.Module, torch.Tensor]:
    """Compute in the convolutions, parameters in the classifier (like VGG)."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(128 * 4 * 4, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    ), torch.randn(2, 3, 32, 32)


MODELS = {"cnn": (cnn, 32), "rescnn": (rescnn, 32), "gpt2": (gpt2_small, 16), "llama": (llama_small, 16),
          "vgg": (vgg_like, 32)}
"""name -> (factory, batch size)."""


def spec(name: str) -> str:
    """The model spec of table model ``name`` (``fidelity_models:<factory>``)."""
    return f"fidelity_models:{MODELS[name][0].__name__}"
