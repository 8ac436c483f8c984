"""What a length-regulated graph wrapper (FastPitch, FastSpeech) offers the runners.

Its forward is split where the frame count becomes known: `encode` (symbols -> durations and the
symbol-side encoding), then `decode` (the regulated frames -> mel) at a frame count the caller
picks. Runners read the frame count in between, so they refuse an item past `max_frames` before
the decoder runs (speechrt.runtime.bounds) and the cuda runner compiles each part at its own
bucketed shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn


class RegulatedGraph(nn.Module):
    """forward = assemble(*decode(e.enc, e.reps, frame_lengths(e.reps).max()), e), where
    e = encode(*the contract's inputs) is a NamedTuple with `enc` (B, L, D) and `reps` (B, L)
    (frames per symbol) first."""

    max_frames: int | None = None  # frames per item the runners refuse past (None: no limit)
    encode: Callable[..., Any]  # the contract's inputs -> the encoding (NamedTuple, see above)

    def frame_lengths(self, reps: Tensor) -> Tensor:
        """(B, L) frames per symbol -> (B,) frames per item."""
        raise NotImplementedError

    def decode(self, enc: Tensor, reps: Tensor, n_frames: int | Tensor) -> tuple[Tensor, Tensor]:
        """enc (B, L, D), reps (B, L) -> mel (B, n_mels, n_frames), mel_lengths (B,)."""
        raise NotImplementedError

    def assemble(self, mel: Tensor, mel_lengths: Tensor, e: Any) -> tuple[Tensor, ...]:
        """The contract's outputs, in order, from the decoded mel and the encoding."""
        raise NotImplementedError
