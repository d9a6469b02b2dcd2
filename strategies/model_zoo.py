"""Real architectures, built locally from their libraries' code with random
weights (nothing is downloaded), exported once per process for the real-model
family (``etprop.strategies.model_windows``).

Each recipe is small where the architecture allows (few layers, small images)
so that windows of its graph lower quickly, but keeps the real argument values,
weight tying and module reuse of the library's code. The libraries are
optional (``pip install 'etprop[models]'``); a recipe whose library is missing
is left out, and ``available()`` says which are in.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

import torch

INSTALL_HINT = "pip install 'etprop[models]' (torchvision, timm, transformers)"

# Ops torchvision's compiled extension defines; its Python code registers fake
# kernels for them at import.
_TORCHVISION_OPS = (
    "nms",
    "qnms",
    "roi_align",
    "_roi_align_backward",
    "ps_roi_align",
    "_ps_roi_align_backward",
    "roi_pool",
    "_roi_pool_backward",
    "ps_roi_pool",
    "_ps_roi_pool_backward",
    "qroi_align",
    "deform_conv2d",
    "_deform_conv2d_backward",
)
_torchvision_stubs = []


def _import_torchvision():
    """torchvision's PyPI build links CUDA libraries that a CPU build of torch
    lacks, so its extension does not load and its import then fails on a
    missing ``torchvision::nms``. The architectures used here never call those
    detection ops, so when the extension cannot load, they are declared
    without kernels (calling one would raise) and the pure-Python models
    import."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        raise ImportError("torchvision")
    if not _torchvision_stubs:
        try:
            torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), "_C.so"))
        except (OSError, RuntimeError):
            library = torch.library.Library("torchvision", "DEF")
            for name in _TORCHVISION_OPS:
                library.define(f"{name}(Tensor[] operands) -> Tensor")
            _torchvision_stubs.append(library)
        else:
            _torchvision_stubs.append(None)
    return importlib.import_module("torchvision")


def _library(name: str):
    if name == "torchvision":
        return _import_torchvision()
    if name == "timm":
        _import_torchvision()
    return importlib.import_module(name)


@dataclass(frozen=True)
class Recipe:
    name: str
    kind: str  # "vision", "text" or "speech": how coverage is reported
    library: str
    make: Callable  # library module -> (nn.Module, example inputs)


def _image(size: int = 64):
    return (torch.randn(1, 3, size, size),)


def _tokens(length: int = 8, vocab: int = 100):
    return (torch.randint(0, vocab, (1, length)),)


def _vit_tv(tv):
    return tv.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64
    ), _image(32)


def _fpn(tv):
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    return resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5), _image(64)


def _ssdlite_backbone(tv):
    model = tv.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    return model.backbone, _image(64)


def _bert(transformers):
    config = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    return transformers.BertModel(config), _tokens()


def _gpt2(transformers):
    config = transformers.GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=2,
        vocab_size=100,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config), _tokens()


def _wav2vec2(transformers):
    config = transformers.Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        attn_implementation="eager",
    )
    return transformers.Wav2Vec2Model(config), (torch.randn(1, 400),)


def _whisper_encoder(transformers):
    config = transformers.WhisperConfig(
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        num_mel_bins=16,
        max_source_positions=16,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=64,
        vocab_size=100,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        decoder_start_token_id=0,
        attn_implementation="eager",
    )
    return transformers.WhisperModel(config).get_encoder(), (torch.randn(1, 16, 32),)


def _tv(builder: str, size: int = 64):
    return lambda tv: (getattr(tv.models, builder)(), _image(size))


def _timm(name: str, size: int, **kwargs):
    return lambda timm: (timm.create_model(name, pretrained=False, **kwargs), _image(size))


RECIPES: tuple[Recipe, ...] = (
    Recipe("resnet18", "vision", "torchvision", _tv("resnet18")),
    Recipe("mobilenet_v3_small", "vision", "torchvision", _tv("mobilenet_v3_small")),
    Recipe("efficientnet_b0", "vision", "torchvision", _tv("efficientnet_b0")),
    Recipe("shufflenet_v2_x0_5", "vision", "torchvision", _tv("shufflenet_v2_x0_5")),
    Recipe("convnext_tiny", "vision", "torchvision", _tv("convnext_tiny")),
    Recipe("regnet_y_400mf", "vision", "torchvision", _tv("regnet_y_400mf")),
    Recipe("densenet121", "vision", "torchvision", _tv("densenet121")),
    Recipe("squeezenet1_1", "vision", "torchvision", _tv("squeezenet1_1")),
    Recipe("vit", "vision", "torchvision", _vit_tv),
    Recipe("resnet18_fpn", "vision", "torchvision", _fpn),
    Recipe("ssdlite_mobilenet_v3", "vision", "torchvision", _ssdlite_backbone),
    Recipe("timm_vit_tiny", "vision", "timm", _timm("vit_tiny_patch16_224", 32, img_size=32)),
    Recipe("timm_efficientformerv2_s0", "vision", "timm", _timm("efficientformerv2_s0", 224)),
    Recipe("timm_mobilevit_xxs", "vision", "timm", _timm("mobilevit_xxs", 64)),
    Recipe("bert", "text", "transformers", _bert),
    Recipe("gpt2", "text", "transformers", _gpt2),
    Recipe("wav2vec2", "speech", "transformers", _wav2vec2),
    Recipe("whisper_encoder", "speech", "transformers", _whisper_encoder),
)
BY_NAME = {recipe.name: recipe for recipe in RECIPES}


def installed() -> tuple[str, ...]:
    """The recipes whose library is installed, found without importing it
    (importing transformers takes seconds)."""
    return tuple(recipe.name for recipe in RECIPES if importlib.util.find_spec(recipe.library) is not None)


@functools.lru_cache(maxsize=None)
def _has(library: str) -> bool:
    try:
        _library(library)
    except Exception:  # a broken install is as absent as a missing one
        return False
    return True


def available() -> tuple[str, ...]:
    """The recipes whose library imports here, in ``RECIPES`` order."""
    return tuple(recipe.name for recipe in RECIPES if _has(recipe.library))


@functools.lru_cache(maxsize=None)
def exported(name: str) -> torch.export.ExportedProgram:
    """The recipe's model in eval mode, exported once per process with the
    seed fixed (the graph does not depend on the weights, but it stays the
    same program from run to run)."""
    recipe = BY_NAME[name]
    if not _has(recipe.library):
        raise ImportError(f"the real-model recipe '{name}' needs {recipe.library}: {INSTALL_HINT}")
    torch.manual_seed(0)
    module, inputs = recipe.make(_library(recipe.library))
    with torch.no_grad():
        return torch.export.export(module.eval(), inputs)
