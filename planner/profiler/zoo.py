"""The built-in model zoo: the paper's CNNs, an MLP and HF transformers built from configs.

Every model is defined here (torchvision does not install on this machine); the CNNs follow
torchvision's definitions layer for layer (same shapes, same parameter counts: VGG16 has
138,357,544 parameters, ResNet50 25,557,032). Transformers (GPT-2, BERT, Llama 2 and 3)
come from a ``transformers`` config, with no download (``planner.profiler.hfzoo``). Dropout
defaults to 0 so that running the split layers one by one equals running the whole model
bit for bit; dropout costs almost nothing, so the profile's times are unaffected.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from planner.profiler.hfzoo import HF_MODELS, build
from planner.profiler.hfzoo import bert as bert  # the transformer factories, re-exported
from planner.profiler.hfzoo import gpt2 as gpt2
from planner.profiler.hfzoo import llama as llama


@dataclass(frozen=True)
class ZooEntry:
    """How to build one zoo model: factory, default input shape (without batch), input kind."""

    factory: Callable[..., nn.Module]
    input_shape: tuple[int, ...]
    tokens: bool = False
    """True when the input is token ids (integers below the model's ``config.vocab_size``), not floats."""
    description: str = ""
    transformer: str | None = None
    """The ``planner.profiler.hfzoo`` name of a transformer (its config fields can be overridden)."""


# ----------------------------------------------------------------------------- MLP


def mlp(in_features: int = 784, hidden: int = 1024, depth: int = 3, num_classes: int = 10) -> nn.Module:
    """A plain multi-layer perceptron: Flatten, ``depth`` x (Linear, ReLU), Linear."""
    mods: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for _ in range(depth):
        mods += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    mods.append(nn.Linear(width, num_classes))
    return nn.Sequential(*mods)


# ----------------------------------------------------------------------------- VGG

VGG_CFGS: dict[str, list[int | str]] = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "vgg19": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
              512, 512, 512, 512, "M"],
}


class VGG(nn.Module):  # type: ignore[misc]
    """torchvision's VGG: features, adaptive 7x7 average pool, flatten, 3-layer classifier."""

    def __init__(self, cfg: list[int | str], batch_norm: bool = False, num_classes: int = 1000,
                 dropout: float = 0.0, in_channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                assert isinstance(v, int)
                layers.append(nn.Conv2d(c, v, kernel_size=3, padding=1))
                if batch_norm:
                    layers.append(nn.BatchNorm2d(v))
                layers.append(nn.ReLU(inplace=True))
                c = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def _vgg(name: str, batch_norm: bool) -> Callable[..., nn.Module]:
    def make(num_classes: int = 1000, dropout: float = 0.0, in_channels: int = 3) -> nn.Module:
        return VGG(VGG_CFGS[name], batch_norm, num_classes, dropout, in_channels)

    make.__name__ = name + ("_bn" if batch_norm else "")
    return make


# ----------------------------------------------------------------------------- ResNet


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)


def _residual(block: BasicBlock | Bottleneck, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """A residual block's ending: add the (downsampled) input to the branch output, then ReLU."""
    identity = x if block.downsample is None else block.downsample(x)
    return block.relu(out + identity)  # type: ignore[no-any-return]


class BasicBlock(nn.Module):  # type: ignore[misc]
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return _residual(self, x, self.bn2(self.conv2(out)))


class Bottleneck(nn.Module):  # type: ignore[misc]
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(cin, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * 4)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return _residual(self, x, self.bn3(self.conv3(out)))


class ResNet(nn.Module):  # type: ignore[misc]
    """torchvision's ResNet (v1.5: stride in the 3x3 convolution of a bottleneck)."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], counts: list[int], num_classes: int = 1000,
                 in_channels: int = 3) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, counts[0])
        self.layer2 = self._make_layer(block, 128, counts[1], stride=2)
        self.layer3 = self._make_layer(block, 256, counts[2], stride=2)
        self.layer4 = self._make_layer(block, 512, counts[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int,
                    stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(_conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers: list[nn.Module] = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


RESNET_CFGS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], list[int]]] = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
    "resnet101": (Bottleneck, [3, 4, 23, 3]),
    "resnet152": (Bottleneck, [3, 8, 36, 3]),
}


def _resnet(name: str) -> Callable[..., nn.Module]:
    def make(num_classes: int = 1000, in_channels: int = 3) -> nn.Module:
        block, counts = RESNET_CFGS[name]
        return ResNet(block, counts, num_classes, in_channels)

    make.__name__ = name
    return make


# ----------------------------------------------------------------------------- the zoo

IMAGENET = (3, 224, 224)

ZOO: dict[str, ZooEntry] = {"mlp": ZooEntry(mlp, (784,), description="4-layer MLP, 784-1024-1024-1024-10")}
for _name in VGG_CFGS:
    ZOO[_name] = ZooEntry(_vgg(_name, False), IMAGENET, description=f"{_name.upper()} (torchvision layout)")
for _name in VGG_CFGS:
    ZOO[_name + "_bn"] = ZooEntry(_vgg(_name, True), IMAGENET, description=f"{_name.upper()} with batch norm")
for _name in RESNET_CFGS:
    ZOO[_name] = ZooEntry(_resnet(_name), IMAGENET, description=f"ResNet-{_name[6:]} (torchvision layout)")
for _name, _hf in HF_MODELS.items():
    ZOO[_name] = ZooEntry(functools.partial(build, _name), (_hf.seq_len,), tokens=True, description=_hf.description,
                          transformer=_name)

ZOO_NAMES: tuple[str, ...] = tuple(ZOO)
"""Every built-in model name, as ``planner profile MODEL`` accepts it."""
