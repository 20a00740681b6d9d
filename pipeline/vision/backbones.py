"""torchvision ResNets (and VGG-19, for grids) and their weights, from files the user has.

Weights come from ``--weights PATH`` (a torchvision state_dict), else from
torchvision's usual cache location (``$TORCH_HOME/hub/checkpoints``, where
``torchvision.models.resnet101(weights=...)`` would have saved them), else the
run stops with the exact file to put where. ``random`` must be asked for
explicitly; it is seeded, so a resumed extraction computes the same features.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torchvision.models import resnet, vgg
from torchvision.models.resnet import BasicBlock, ResNet

from pipeline.core.errors import CapstackError
from pipeline.core.hashing import md5_of_file
from pipeline.core.state_dicts import require_fit, tensors_only

RANDOM = "random"
RANDOM_SEED = 0

# name -> (constructor, torchvision ImageNet weights enums whose files we look for)
_RESNETS = {
    "resnet18": (resnet.resnet18, resnet.ResNet18_Weights),
    "resnet34": (resnet.resnet34, resnet.ResNet34_Weights),
    "resnet50": (resnet.resnet50, resnet.ResNet50_Weights),
    "resnet101": (resnet.resnet101, resnet.ResNet101_Weights),
    "resnet152": (resnet.resnet152, resnet.ResNet152_Weights),
}


def resnet10(num_classes: int = 1000) -> ResNet:
    """A one-block-per-stage ResNet: the demo's small backbone (not an ImageNet model)."""
    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=num_classes)


BACKBONES = tuple(_RESNETS) + ("resnet10",)  # ResNets: grids, and the region detectors' trunks
_VGGS = {"vgg19": (vgg.vgg19, vgg.VGG19_Weights)}  # grids only (Show-Attend-Tell's conv5_4)
GRID_BACKBONES = BACKBONES + tuple(_VGGS)


@dataclass(frozen=True)
class Weights:
    """What the metadata records about the weights used."""

    path: str  # a file, or "random"
    md5: str  # the file's md5, or "random-seed-<n>"


def build_resnet(name: str, num_classes: int = 1000) -> ResNet:
    if name == "resnet10":
        return resnet10(num_classes)
    if name not in _RESNETS:
        raise CapstackError(f"unknown backbone {name!r} (choose {', '.join(BACKBONES)})")
    return _RESNETS[name][0](weights=None, num_classes=num_classes)


def build_vgg(name: str, num_classes: int = 1000) -> vgg.VGG:
    if name not in _VGGS:
        raise CapstackError(f"unknown backbone {name!r} (choose {', '.join(GRID_BACKBONES)})")
    return _VGGS[name][0](weights=None, num_classes=num_classes)


def cached_weight_files(name: str) -> list[Path]:
    """Where torchvision would have saved ImageNet weights for ``name``, newest first."""
    known = {**_RESNETS, **_VGGS}
    if name not in known:
        return []
    hub = Path(torch.hub.get_dir()) / "checkpoints"
    enum = known[name][1]
    return [hub / os.path.basename(w.url) for w in reversed(list(enum))]


def weights_source(name: str) -> str:
    """Where backbone ``name``'s weights come from, for a message that lacks them: torchvision's
    ImageNet files (nothing is downloaded at run time), or a training of its own."""
    known = {**_RESNETS, **_VGGS}
    if name not in known:
        return (f"{name} has no ImageNet weights: train it (`capstack train-backbone --backbone "
                f"{name}`, the demo's stage 'backbone') and pass its state_dict with --weights")
    files = ", ".join(f"{w.name} {w.url}" for w in known[name][1])
    hub = Path(torch.hub.get_dir()) / "checkpoints"
    return (f"{name}'s ImageNet weights are torchvision's state_dicts ({files}); capstack "
            f"downloads nothing: fetch one (torchvision.models.{name}(weights=...) saves it in "
            f"{hub}) and pass its path with --weights")


def resolve_weights(name: str, weights: str | None) -> Weights:
    """The weights file to load for backbone ``name`` (or random), with its hash."""
    if weights == RANDOM:
        return Weights(RANDOM, f"random-seed-{RANDOM_SEED}")
    if weights:
        path = Path(weights).expanduser().resolve()
        if not path.is_file():
            raise CapstackError(f"{weights}: backbone weights not found. {weights_source(name)}"
                                f"; --weights random gives meaningless random features")
        return Weights(str(path), md5_of_file(path))
    for path in cached_weight_files(name):
        if path.is_file():
            return Weights(str(path), md5_of_file(path))
    expected = cached_weight_files(name)
    where = (f"put torchvision's ImageNet state_dict at {expected[-1]} (or {expected[0]})"
             if expected else "train it and pass its state_dict")
    raise CapstackError(f"no weights for {name}: {where}, or pass --weights PATH; "
                        f"--weights random gives meaningless random features")


def read_state(weights: Weights) -> dict:
    """A weights file's tensors (a ``{"model": ...}`` wrapper unwrapped), or why not."""
    try:
        state = torch.load(weights.path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise CapstackError(f"{weights.path}: cannot read weights ({type(e).__name__}: {e})") \
            from None
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    return tensors_only(state, weights.path)


def random_backbone(build, name: str):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_SEED)
        return build(name)


def load_backbone(name: str, weights: Weights) -> nn.Module:
    """A grid backbone with ``weights`` loaded: a ResNet, or a VGG."""
    return load_vgg(name, weights) if name in _VGGS else load_resnet(name, weights)


def load_vgg(name: str, weights: Weights) -> vgg.VGG:
    """The VGG with ``weights`` loaded (its classifier may be absent: only ``features`` is used)."""
    if weights.path == RANDOM:
        return random_backbone(build_vgg, name)
    state = read_state(weights)
    model = build_vgg(name)
    require_fit(state, model, weights.path, name,
                may_lack=lambda key: key.startswith("classifier."),
                hint="weights of another backbone?")
    model.load_state_dict({k: v for k, v in state.items() if k.startswith("features.")},
                          strict=False)
    return model


def load_resnet(name: str, weights: Weights) -> ResNet:
    """The ResNet with ``weights`` loaded (``fc`` may be absent or of another size)."""
    if weights.path == RANDOM:
        return random_backbone(build_resnet, name)
    state = read_state(weights)
    fc = state.get("fc.weight")
    model = build_resnet(name, num_classes=fc.shape[0] if fc is not None and fc.dim() == 2
                         else 1000)
    # checked before anything is copied: the same words as a detector checkpoint that misfits
    require_fit(state, model, weights.path, name, may_lack=lambda key: key.startswith("fc."),
                hint="weights of another backbone?")
    model.load_state_dict(state, strict=False)  # only fc.* may be left out
    return model


GRID_LAYERS = {"layer3": 16, "layer4": 32,  # a grid layer -> its stride in input pixels
               "conv5_4": 16}  # VGG-19: the 4th conv of the 5th block with its ReLU, unpooled
VGG_LAYERS = {"conv5_4": (36, 512)}  # a VGG grid layer -> (``features`` up to it, channels)


def checked_layer(layer: str, backbone: str | None = None) -> str:
    """``layer`` when it is a grid layer (of ``backbone``, when given)."""
    if layer not in GRID_LAYERS:
        raise CapstackError(f"unknown grid layer {layer!r} (choose {', '.join(GRID_LAYERS)})")
    if backbone is not None and (backbone in _VGGS) != (layer in VGG_LAYERS):
        own = [k for k in GRID_LAYERS if (k in VGG_LAYERS) == (backbone in _VGGS)]
        raise CapstackError(f"--layer {layer} is not a layer of {backbone} (choose "
                            f"{', '.join(own)})")
    return layer


def grid_trunk(model: nn.Module, layer: str) -> nn.Module:
    """The backbone's convolutions up to grid ``layer``, without pooling and classifier."""
    if isinstance(model, vgg.VGG):
        return model.features[:VGG_LAYERS[layer][0]]
    return resnet_body(model, layer)


def grid_channels(backbone: str, layer: str) -> int:
    """The channels grid ``layer`` of ``backbone`` puts out (a VGG's from its table: building
    one to count them would initialise its 100M-weight classifier)."""
    if backbone not in GRID_BACKBONES:
        raise CapstackError(f"unknown backbone {backbone!r} (choose {', '.join(GRID_BACKBONES)})")
    if backbone in _VGGS:
        return VGG_LAYERS[layer][1]
    return feature_channels(build_resnet(backbone), layer)


def resnet_body(model: ResNet, layer: str = "layer4") -> nn.Sequential:
    """conv1 ... ``layer``: the convolutional trunk up to that stage, without pooling and
    classifier (layer3: stride 16, ResNet-101's 1024-d C4; layer4: stride 32, 2048-d)."""
    checked_layer(layer)
    stages = [model.layer1, model.layer2, model.layer3, model.layer4]
    return nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool,
                         *stages[:int(layer[-1])])


def feature_channels(model: ResNet, layer: str = "layer4") -> int:
    """The channels ``layer`` puts out (its last block's last convolution)."""
    block = getattr(model, checked_layer(layer))[-1]
    last = block.conv3 if hasattr(block, "conv3") else block.conv2  # Bottleneck or BasicBlock
    return last.out_channels


def layer_map_size(image_size: int, layer: str) -> int:
    """Cells per side of ``layer``'s map for a square image: each stride-2 step of a ResNet
    (a padded convolution) rounds up, each of VGG's 2x2 max pools rounds down."""
    size = image_size
    for _ in range(GRID_LAYERS[checked_layer(layer)].bit_length() - 1):
        size = size // 2 if layer in VGG_LAYERS else -(-size // 2)
    return size
