"""Other projects' checkpoints turned into the model repository; the models import nothing here.

checkpoints.py   reading a checkpoint safely, detecting its architecture, writing the
                 model repository (`speechrt convert`)
<kind>.py        one module per architecture family: `detect(keys)` over the checkpoint's
                 state-dict keys and `from_dle(ckpt) -> Converted`, with DLE's key maps
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from speechrt.audio.mel import MelConfig


@dataclass
class Converted:
    """A DLE checkpoint turned into what the model repository stores."""

    kind: str
    dims: Any  # the model's Dims dataclass
    state_dict: dict[str, torch.Tensor]  # inference form, keys matching cls(dims).state_dict()
    mel: MelConfig | None = None
    meta: dict[str, Any] = field(default_factory=dict)
