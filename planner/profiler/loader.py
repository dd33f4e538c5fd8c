"""Turn a model spec (a zoo name or ``package.module:factory``) into a module and an example input."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from planner.errors import ModelLoadError, UsageError
from planner.profiler.zoo import ZOO, ZOO_NAMES

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"`` (or a torch dtype) -> torch dtype; anything else is a usage error."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}", f"use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to profile: ``module`` (train mode) and an ``example_input`` of the whole batch.

    ``input_shape`` is the input's shape without the batch dimension.
    """

    name: str
    module: nn.Module
    example_input: torch.Tensor
    input_shape: tuple[int, ...]

    @property
    def batch_size(self) -> int:
        return int(self.example_input.shape[0])


def _import_factory(spec: str) -> object:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ModelLoadError(f"bad model path {spec!r}", "write package.module:factory")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadError(f"cannot import {module_name!r} from model path {spec!r}: {exc}",
                             "check the module name and that it is on PYTHONPATH") from None
    except Exception as exc:
        raise ModelLoadError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}",
                             "fix the error in that module") from None
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelLoadError(f"module {module_name!r} has no attribute {attr!r}",
                                 "check the factory's name after the colon")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelLoadError(f"{spec!r} is not callable", "point at a function or class returning an nn.Module")
    return obj


def _unknown(spec: str) -> ModelLoadError:
    return ModelLoadError(f"unknown model {spec!r}; built-in models: {', '.join(ZOO_NAMES)}",
                          "or give your own as package.module:factory")


def load_model(spec: str, batch_size: int, input_shape: tuple[int, ...] | None = None,
               dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu") -> LoadedModel:
    """Build the model ``spec`` and a random example input of ``batch_size`` on ``device``.

    ``device="meta"`` builds it without memory or compute (for analytic profiles).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch size must be a positive integer, got {batch_size!r}", "use --batch-size 1 or more")
    if input_shape is not None and (not input_shape or any(int(d) < 1 for d in input_shape)):
        raise UsageError(f"input shape must be positive sizes, got {input_shape!r}", "e.g. --input-shape 3,224,224")
    tdtype = parse_dtype(dtype)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but torch sees no CUDA device", "use --device cpu")
    example: torch.Tensor | None = None
    if spec in ZOO:
        entry = ZOO[spec]
        shape = tuple(int(d) for d in (input_shape or entry.input_shape))
        kwargs: dict[str, object] = {}
        if entry.tokens:
            if len(shape) != 1:
                raise UsageError(f"{spec} takes token ids of shape (sequence length,), got {shape}",
                                 "e.g. --input-shape 128")
        elif spec != "mlp" and len(shape) == 3:
            kwargs["in_channels"] = shape[0]
        elif spec == "mlp":
            n = 1
            for d in shape:
                n *= d
            kwargs["in_features"] = n
        with dev:
            module = entry.factory(**kwargs)
        if entry.tokens:
            if shape[0] > 512 and spec == "bert-base":
                raise UsageError(f"bert-base takes at most 512 tokens, got {shape[0]}", "use --input-shape 512 or less")
            if shape[0] > 1024 and spec.startswith("gpt2"):
                raise UsageError(f"{spec} takes at most 1024 tokens, got {shape[0]}", "use --input-shape 1024 or less")
            example = torch.randint(0, entry.vocab_size, (batch_size, *shape), device=dev)
    elif ":" in spec:
        factory = _import_factory(spec)
        try:
            with dev:
                made = factory()  # type: ignore[operator]
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ModelLoadError(f"model factory {spec!r} raised {type(exc).__name__}: {msg}",
                                 "fix the factory; it must return an nn.Module or (module, example_input)") from None
        if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
            module, ex = made
            if not isinstance(ex, torch.Tensor):
                raise ModelLoadError(f"{spec!r} returned an example input of type {type(ex).__name__}",
                                     "return (module, example_tensor)")
            if input_shape is None:
                shape = tuple(ex.shape[1:])
                reps = [batch_size] + [1] * (ex.dim() - 1)
                example = ex[:1].repeat(*reps) if ex.shape[0] != batch_size else ex
                example = example.to(dev)
            else:
                shape = tuple(int(d) for d in input_shape)
                example = None if ex.is_floating_point() else torch.randint(
                    0, max(int(ex.max()) + 1, 2) if dev.type != "meta" else 2, (batch_size, *shape), device=dev)
                if ex.is_floating_point():
                    example = torch.randn(batch_size, *shape, device=dev, dtype=tdtype)
        elif isinstance(made, nn.Module):
            module = made
            if input_shape is None:
                raise UsageError(f"{spec!r} returned only a module, so its input shape is unknown",
                                 "pass --input-shape (without batch), or return (module, example_input)")
            shape = tuple(int(d) for d in input_shape)
        else:
            raise ModelLoadError(f"{spec!r} returned {type(made).__name__}, not an nn.Module",
                                 "return an nn.Module or (module, example_input)")
    else:
        raise _unknown(spec)
    module = module.to(device=dev)
    if tdtype != torch.float32:
        module = module.to(dtype=tdtype)
    module.train()
    if example is None:
        example = torch.randn(batch_size, *shape, device=dev, dtype=tdtype)
    elif example.is_floating_point():
        example = example.to(dtype=tdtype)
    return LoadedModel(name=spec, module=module, example_input=example, input_shape=tuple(shape))

