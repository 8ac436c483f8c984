"""Which head a recogniser decodes, and how many of its output frames.

A recogniser's main graph ends in a CTC head (log-probs (B, T', V), Jasper/QuartzNet and
Parakeet CTC), a transducer's joint-projected encoder frames (B, T', J) (Parakeet RNN-T/TDT), or
both (a hybrid). `Head.of` picks what decoding reads from the graph's contract and the decoder
asked for; `Head.__call__` turns the graph's outputs into it and the frames to decode per window:
the valid ones, or (`decode_padding`, as DLE's inference.py decodes at batch size 1) every frame
of the window's padded features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speechrt.audio.features import FeatureConfig
from speechrt.contracts import Contract
from speechrt.errors import SpeechRTError


def output_frames(dims: dict[str, Any], n: int) -> int:
    """Output frames of a Jasper/QuartzNet (model.json dims) for n input frames."""
    from speechrt.arch import as_dims
    from speechrt.arch.jasper import JasperDims
    from speechrt.arch.jasper import output_frames as frames_of

    return frames_of(as_dims(JasperDims, dims), n)


def time_stride(dims: dict[str, Any]) -> int:
    """Feature frames per output frame (model.json dims of Jasper/QuartzNet or Parakeet)."""
    if "strides" in dims:
        return math.prod(dims["strides"])
    return 2 ** int(dims["subsampling_layers"])


@dataclass
class Head:
    transducer: bool  # decode a transducer's joint (greedy), not CTC log-probs
    n_classes: int  # labels + blank
    features: FeatureConfig
    pad_leading: int  # zero feature frames before each window (Jasper: 16)
    dims: dict[str, Any]  # model.json dims
    decode_padding: bool  # decode every frame of the padded features (Jasper/QuartzNet only)
    numpy: bool  # frame counts as numpy arrays (onnx), else torch tensors on the host
    _frames: dict[int, int] = field(default_factory=dict)  # input -> output frames, cached

    @classmethod
    def of(
        cls,
        main: Contract,
        dims: dict[str, Any],
        decoder: str,
        features: FeatureConfig,
        pad_leading: int,
        decode_padding: bool,
        numpy: bool,
        what: str,
    ) -> Head:
        """The head of a recogniser whose main graph has contract `main`; `decoder` "ctc" asks
        for a hybrid transducer's CTC head. `what` names the model in errors."""
        specs = {t.name: t for t in main.outputs}
        # a transducer decodes its joint's scores unless asked for its (hybrid) CTC head
        transducer = "joint_encoded" in specs and decoder != "ctc"
        if decoder == "ctc" and "log_probs" not in specs:
            raise SpeechRTError(f"{what} has no CTC head")
        n_classes = int(dims["vocab_size"]) + 1 if transducer else int(specs["log_probs"].shape[-1])
        # NeMo decodes an item's valid frames only; DLE's inference.py its padded tail too
        decode_padding = decode_padding and "strides" in dims
        return cls(transducer, n_classes, features, pad_leading, dims, decode_padding, numpy)

    @property
    def output(self) -> str:
        """The graph output decoding reads."""
        return "joint_encoded" if self.transducer else "log_probs"

    def __call__(self, out: dict[str, Any], samples: list[int]) -> tuple[Any, Any]:
        """The acoustic graph's outputs -> what decoding reads (CTC log-probs, or a
        transducer's joint-projected frames) and the frames to decode per window."""
        if "encoded_lengths" in out:  # Parakeet
            return out[self.output], self.decode_lengths(out["encoded_lengths"], samples)
        return out["log_probs"], self.decode_lengths(out["log_prob_lengths"], samples)

    def decode_lengths(self, out_lengths: Any, samples: list[int]) -> Any:
        """Frames to decode per window: the valid ones (out_lengths), or with decode_padding
        every frame of its padded features, known on the host (a numpy array on onnx, else a
        torch tensor on the host: decoding reads it there)."""
        if not self.decode_padding:
            return out_lengths
        padded = [self.features.padded_frames(n) + self.pad_leading for n in samples]
        frames = np.array([self.output_frames(n) for n in padded], dtype=np.int64)
        if self.numpy:
            return frames
        import torch

        return torch.from_numpy(frames)

    def output_frames(self, n: int) -> int:
        """Output frames for n input frames (output_frames), cached."""
        if n not in self._frames:
            self._frames[n] = output_frames(self.dims, n)
        return self._frames[n]
