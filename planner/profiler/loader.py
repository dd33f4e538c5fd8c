"""Turn a model spec (a zoo name or ``package.module:factory``) into a module and an example input."""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner.errors import ModelLoadError, UsageError, is_whole
from planner.profiler.guards import is_out_of_memory, nbytes_text, out_of_memory, shown_overrides
from planner.profiler.hfzoo import HF_MODELS, build
from planner.profiler.layered import rejects_input
from planner.profiler.zoo import ZOO, ZOO_NAMES
from planner.schemas.build import MAX_BATCH, MAX_BYTES, MAX_DIM

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

    ``input_shape`` is the input's shape without the batch dimension; ``overrides`` the config
    fields a zoo transformer was built with (``planner profile --set``), named in its errors.
    """

    name: str
    module: nn.Module
    example_input: torch.Tensor
    input_shape: tuple[int, ...]
    overrides: Mapping[str, Any] = field(default_factory=dict)

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


_Built = tuple[nn.Module, torch.Tensor | None, tuple[int, ...]]
"""A built model, the example input its source fixes (None: random floats of the shape), its input shape."""


def _check_sizes(batch_size: int, input_shape: tuple[int, ...] | None) -> None:
    """The batch in [1, MAX_BATCH] and every input dimension in [1, MAX_DIM] (the profile format's bounds)."""
    if not is_whole(batch_size, 1, MAX_BATCH):
        raise UsageError(f"batch size must be a whole number from 1 to {MAX_BATCH:,}, got {batch_size!r}",
                         "e.g. --batch-size 32")
    if input_shape is not None and (not input_shape or any(not 1 <= int(d) <= MAX_DIM for d in input_shape)):
        raise UsageError(f"input shape must be sizes from 1 to {MAX_DIM:,}, got {input_shape!r}",
                         "e.g. --input-shape 3,224,224")


def check_input_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """The bytes of an input batch of ``shape`` (batch first); a UsageError above the profile format's MAX_BYTES."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_BYTES:
        raise UsageError(f"the input batch {shape} of {dtype_name(dtype)} is {nbytes_text(nbytes)}, above the "
                         f"{MAX_BYTES:.0e} bytes a profile holds", "use a smaller --batch-size or --input-shape")
    return nbytes


def random_input(shape: tuple[int, ...], dev: torch.device, dtype: torch.dtype, high: int | None = None
                 ) -> torch.Tensor:
    """Random ``dtype`` values of ``shape`` (batch first), or integers in [0, ``high``); a ProfileError
    naming the size when it does not fit in memory."""
    nbytes = check_input_bytes(shape, torch.long if high is not None else dtype)
    try:
        if high is not None:
            return torch.randint(0, high, shape, device=dev)
        return torch.randn(*shape, device=dev, dtype=dtype)
    except (RuntimeError, MemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        raise out_of_memory(f"making the input batch {shape} ({nbytes_text(nbytes)})", dev, exc) from None


def _torch_device(device: str | torch.device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but torch sees no CUDA device", "use --device cpu")
    return dev


def _check_tokens(spec: str, shape: tuple[int, ...]) -> None:
    """A token model's input shape: (sequence length,)."""
    if len(shape) != 1:
        raise UsageError(f"{spec} takes token ids of shape (sequence length,), got {shape}", "e.g. --input-shape 128")


def _zoo_kwargs(spec: str, shape: tuple[int, ...]) -> dict[str, object]:
    """Factory arguments fitting the input shape: the MLP's input features, a CNN's input channels."""
    if spec == "mlp":
        return {"in_features": math.prod(shape)}
    if len(shape) == 3:
        return {"in_channels": shape[0]}
    return {}


def _from_zoo(spec: str, batch_size: int, input_shape: tuple[int, ...] | None, dev: torch.device,
              tdtype: torch.dtype, overrides: Mapping[str, Any]) -> _Built:
    entry = ZOO[spec]
    shape = tuple(int(d) for d in (input_shape or entry.input_shape))
    if overrides and entry.transformer is None:
        raise UsageError(f"--set overrides a transformer's config, and {spec} is no transformer",
                         f"drop --set, or use one of {', '.join(HF_MODELS)}")
    if entry.tokens:
        _check_tokens(spec, shape)
    check_input_bytes((batch_size, *shape), torch.long if entry.tokens else tdtype)
    module = _build_zoo(spec, shape, dev, overrides)
    if not entry.tokens:
        return module, None, shape
    return module, token_ids(module, (batch_size, *shape), dev), shape


def _build_zoo(spec: str, shape: tuple[int, ...], dev: torch.device, overrides: Mapping[str, Any]) -> nn.Module:
    """Zoo model ``spec`` for inputs of ``shape`` on ``dev``; a ProfileError when it does not fit in memory."""
    entry = ZOO[spec]
    try:
        with dev:
            if entry.transformer is not None:
                return build(entry.transformer, seq_len=shape[0], overrides=overrides)
            return entry.factory(**_zoo_kwargs(spec, shape))
    except (RuntimeError, MemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        with_set = f" with --set {shown_overrides(overrides)}" if overrides else ""
        raise out_of_memory(f"building {spec} for input shape {shape}{with_set}", dev, exc,
                            "use a smaller --input-shape or --set sizes, or --mode analytic (no memory needed)"
                            ) from None


def token_ids(module: nn.Module, shape: tuple[int, ...], dev: torch.device) -> torch.Tensor:
    """Random token ids of ``shape`` below the model's ``config.vocab_size``."""
    vocab = int(module.config.vocab_size)
    if vocab < 1:
        raise ModelLoadError(f"the model's config.vocab_size is {vocab}: there is no token id to feed it",
                             "give the model a vocabulary of 1 or more tokens")
    return random_input(shape, dev, torch.long, high=vocab)


def _is_transformers_model(module: object) -> bool:
    return type(module).__module__.startswith("transformers.") and hasattr(getattr(module, "config", None),
                                                                           "vocab_size")


def _call_factory(spec: str, dev: torch.device) -> object:
    from planner.outputs import stdout_to_stderr

    try:
        with stdout_to_stderr():  # a factory's prints must not corrupt --json on stdout
            factory = _import_factory(spec)
            with dev:
                return factory()  # type: ignore[operator]
    except ModelLoadError:
        raise
    except (RuntimeError, MemoryError) as exc:
        if not is_out_of_memory(exc):
            raise _factory_failed(spec, exc) from None
        raise out_of_memory(f"in model factory {spec!r}", dev, exc,
                            "make the model smaller, or use --mode analytic (the factory then builds on 'meta')"
                            ) from None
    except (SystemExit, KeyboardInterrupt) as exc:
        what = f"exit({exc.code!r})" if isinstance(exc, SystemExit) else "KeyboardInterrupt"
        raise ModelLoadError(f"model factory {spec!r} raised {what}",
                             "a factory must return a model, not exit") from None
    except Exception as exc:
        raise _factory_failed(spec, exc) from None


def _factory_failed(spec: str, exc: Exception) -> ModelLoadError:
    msg = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())  # one line, every line's words:
    msg = msg if len(msg) <= 300 else msg[:299] + "…"  # a first line may only introduce the cause ("...error:")
    return ModelLoadError(f"model factory {spec!r} raised {type(exc).__name__}: {msg}",
                          "fix the factory; it must return an nn.Module or (module, example_input)")


def _factory_example(ex: torch.Tensor, batch_size: int, input_shape: tuple[int, ...] | None, dev: torch.device,
                     tdtype: torch.dtype) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The factory's example cut or repeated to ``batch_size``; with ``input_shape``, random values like it."""
    if input_shape is None:
        check_input_bytes((batch_size, *ex.shape[1:]), ex.dtype)
        reps = [batch_size] + [1] * (ex.dim() - 1)
        example = ex[:1].repeat(*reps) if ex.shape[0] != batch_size else ex
        return example.to(dev), tuple(ex.shape[1:])
    shape = tuple(int(d) for d in input_shape)
    if ex.is_floating_point():
        return random_input((batch_size, *shape), dev, tdtype), shape
    high = max(int(ex.max()) + 1, 2) if dev.type != "meta" else 2
    return random_input((batch_size, *shape), dev, tdtype, high=high), shape


def _from_factory(spec: str, batch_size: int, input_shape: tuple[int, ...] | None, dev: torch.device,
                  tdtype: torch.dtype) -> _Built:
    made = _call_factory(spec, dev)
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        module, ex = made
        if not isinstance(ex, torch.Tensor):
            raise ModelLoadError(f"{spec!r} returned an example input of type {type(ex).__name__}",
                                 "return (module, example_tensor)")
        return (module, *_factory_example(ex, batch_size, input_shape, dev, tdtype))
    if isinstance(made, nn.Module):
        if input_shape is None:
            raise UsageError(f"{spec!r} returned only a module, so its input shape is unknown",
                             "pass --input-shape (without batch), or return (module, example_input)")
        shape = tuple(int(d) for d in input_shape)
        if _is_transformers_model(made):  # a transformers language model takes token ids
            _check_tokens(spec, shape)
            return made, token_ids(made, (batch_size, *shape), dev), shape
        return made, None, shape
    raise ModelLoadError(f"{spec!r} returned {type(made).__name__}, not an nn.Module",
                         "return an nn.Module or (module, example_input)")


def _placed(spec: str, module: nn.Module, dev: torch.device, tdtype: torch.dtype) -> nn.Module:
    """``module`` on ``dev`` in ``tdtype``, in train mode; a ProfileError when it does not fit in memory.

    Cast whatever ``tdtype`` is, float32 too: the example input is cast to it, so a factory's float16
    model left as it is would meet float32 inputs (and an analytic profile, whose meta device does not
    check dtypes, would price float16 weights as a float32 model that cannot run)."""
    try:
        module = module.to(device=dev, dtype=tdtype)
    except (RuntimeError, MemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        raise out_of_memory(f"placing {spec} in {dtype_name(tdtype)}", dev, exc) from None
    module.train()
    return module


def _materialize_lazy(module: nn.Module, example: torch.Tensor) -> None:
    """Give lazy modules (``nn.LazyLinear``, ``nn.LazyConv2d``, ...) their weights by one forward of the
    example without gradients, as their first call in training would; a ProfileError when it fails."""
    from torch.nn.modules.lazy import LazyModuleMixin

    if not any(isinstance(m, LazyModuleMixin) and m.has_uninitialized_params() for m in module.modules()):
        return
    try:
        with torch.no_grad():
            module(example)
    except Exception as exc:
        raise rejects_input(example, exc) from None


def load_model(spec: str, batch_size: int, input_shape: tuple[int, ...] | None = None,
               dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu",
               overrides: Mapping[str, Any] | None = None) -> LoadedModel:
    """Build the model ``spec`` and a random example input of ``batch_size`` on ``device``.

    ``device="meta"`` builds it without memory or compute (for analytic profiles). A token
    model's ``input_shape`` is its sequence length (any: the position range grows to it).
    ``overrides`` sets config fields of a zoo transformer (``planner profile --set``).
    """
    _check_sizes(batch_size, input_shape)
    tdtype = parse_dtype(dtype)
    dev = _torch_device(device)
    if spec in ZOO:
        module, example, shape = _from_zoo(spec, batch_size, input_shape, dev, tdtype, overrides or {})
    elif ":" not in spec:
        raise _unknown(spec)
    elif overrides:
        raise UsageError(f"--set overrides a zoo transformer's config, and {spec} is your own model",
                         "set the fields in your factory instead")
    else:
        module, example, shape = _from_factory(spec, batch_size, input_shape, dev, tdtype)
    module = _placed(spec, module, dev, tdtype)
    if example is None:
        example = random_input((batch_size, *shape), dev, tdtype)
    elif example.is_floating_point():
        example = example.to(dtype=tdtype)
    _materialize_lazy(module, example)
    return LoadedModel(name=spec, module=module, example_input=example, input_shape=tuple(shape),
                       overrides=dict(overrides or {}))


def recorded_overrides(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The ``--set`` overrides a profile's zoo transformer was built with (its ``meta["overrides"]``; {}: none)."""
    found = meta.get("overrides") or {}
    if not isinstance(found, Mapping) or not all(isinstance(k, str) for k in found):
        raise ModelLoadError(f"the profile's meta.overrides ({found!r}) is not a mapping of config fields to values",
                             "profile the model again with planner profile --set KEY=VALUE")
    return dict(found)


def overrides_for(spec: str, model: str, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides to build ``spec`` with for a profile of ``model`` with ``meta``: the profile's own when
    ``spec`` is the profiled zoo model (the same model again), none for any other model."""
    return recorded_overrides(meta) if spec == model and spec in ZOO else {}


def overrides_note(model: str, meta: Mapping[str, Any]) -> str:
    """`` (the profile was made from gpt2 with --set n_layer=2)`` when it was, else ''."""
    try:
        found = recorded_overrides(meta)
    except ModelLoadError:
        return ""
    return f" (the profile was made from {model} with --set {shown_overrides(found)})" if found else ""

