"""Architectures, one file each, and a registry from kind name to class (imported lazily).

Every model class follows one contract:
    cls.kind / cls.role         registry name; "acoustic", "vocoder", "denoiser" or "asr"
    cls.Dims                    frozen dataclass of architecture hyper-parameters
    cls(dims)                   builds the inference module
    cls.from_dle(ckpt) -> Converted
                                turns a DLE/NGC checkpoint dict (already torch.load-ed with
                                weights_only=True) into dims + an inference-form state dict
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any

import torch

from speechrt.audio.mel import MelConfig
from speechrt.errors import SpeechRTError

# kind -> (module, class name); lazily imported so `import speechrt` stays light.
KINDS: dict[str, tuple[str, str]] = {
    "fastpitch": ("speechrt.models.fastpitch", "FastPitch"),
    "hifigan": ("speechrt.models.hifigan", "HiFiGAN"),
    "tacotron2": ("speechrt.models.tacotron2", "Tacotron2"),
    "waveglow": ("speechrt.models.waveglow", "WaveGlow"),
    "fastspeech": ("speechrt.models.fastspeech", "FastSpeech"),
    "jasper": ("speechrt.models.jasper", "Jasper"),
    "quartznet": ("speechrt.models.jasper", "QuartzNet"),
}


@dataclass
class Converted:
    """A DLE checkpoint turned into what the model repository stores."""

    kind: str
    dims: Any  # the model's Dims dataclass
    state_dict: dict[str, torch.Tensor]  # inference form, keys matching cls(dims).state_dict()
    mel: MelConfig | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def model_class(kind: str) -> type[Any]:
    try:
        module, name = KINDS[kind]
    except KeyError:
        raise SpeechRTError(
            f"unknown model kind {kind!r}; known: {', '.join(sorted(KINDS))}"
        ) from None
    return getattr(importlib.import_module(module), name)


def build_model(kind: str, dims: dict[str, Any] | Any) -> torch.nn.Module:
    cls = model_class(kind)
    if isinstance(dims, dict):
        known = {f.name for f in dataclasses.fields(cls.Dims)}
        unknown = set(dims) - known
        if unknown:
            raise SpeechRTError(f"{kind}: unknown dims {sorted(unknown)}")
        dims = cls.Dims(**{k: _untuple(v) for k, v in dims.items()})
    return cls(dims)


def _untuple(v: Any) -> Any:
    # JSON gives lists; Dims use tuples so that they stay hashable and frozen.
    return tuple(_untuple(x) for x in v) if isinstance(v, list) else v
