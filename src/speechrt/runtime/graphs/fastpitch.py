"""FastPitch as a named-tensor graph: ids, lengths, per-item options -> mel, lengths, predictions.

The wrapper calls the model's own submodules in the order of `FastPitch.infer`, with two changes
that leave the result unchanged (tested bit-exact against `infer`):
- the options are per-item tensors (`pace`, `pitch_shift`, `pitch_scale`, `speaker`), so the graph
  has no Python branches on them: the pitch transforms are always applied (x1 + 0 is exact) and
  flattening is `pitch_scale = 0`;
- the length regulator's output length is a tensor (`reps.sum(1).max()`), not a Python int, so
  the exported graph has a dynamic number of frames.

It is split into `encode` (symbols -> durations, predictions, conditioned encoding) and
`decode` (regulated frames -> mel) so that the cuda runner can run each at bucketed static shapes
(and keep `encode`, which decides the whole-frame durations, in float32).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from speechrt.arch import GraphCode
from speechrt.device import batch_invariant
from speechrt.models.fastpitch import (
    LJ_PITCH_STD,
    MAX_DURATION,
    MAX_FRAMES,
    FastPitch,
    FFTransformer,
    lengths_mask,
)
from speechrt.runtime.graphs.regulated import RegulatedGraph


class Encoded(NamedTuple):
    enc: Tensor  # (B, L, D) encoding + pitch (+ energy) embeddings
    reps: Tensor  # (B, L) long: frames per symbol after pace and rounding
    durations: Tensor  # (B, L) float
    pitch: Tensor  # (B, formants, L)
    energy: Tensor | None  # (B, L)


def positions(length: int | Tensor, inv_freq: Tensor, dtype: torch.dtype) -> Tensor:
    """(T, dim) sinusoidal embedding computed in float32, then cast.

    Positions past 2048 are not representable in float16, so half-precision runs compute them in
    float32 (in float32 this equals the model's own PositionalEmbedding).
    """
    # torch's stubs want a number; a 0-dim tensor (a traced size) works as well
    pos = torch.arange(length, device=inv_freq.device).to(torch.float32)  # type: ignore[arg-type]
    angles = torch.outer(pos, inv_freq.float())
    return torch.cat([angles.sin(), angles.cos()], dim=1).to(dtype)


class FastPitchGraph(RegulatedGraph):
    """forward(ids, lengths, pace, pitch_shift, pitch_scale[, speaker]) -> contract outputs."""

    max_frames = MAX_FRAMES  # the cuda runner refuses longer outputs, as FastPitch.infer does

    def __init__(self, model: FastPitch, batch_invariant: bool = False) -> None:
        super().__init__()
        self.model = model
        # each item attends over its own length (eager CPU only: a Python loop over the batch)
        self.batch_invariant = batch_invariant
        # FastPitch._pitch_std, decided at build: the checkpoint's std, or LJSpeech's when it is 0
        self.lj_std = float(model.pitch_std[0]) == 0.0

    def encode(
        self,
        ids: Tensor,
        lengths: Tensor,
        pace: Tensor,
        pitch_shift: Tensor,
        pitch_scale: Tensor,
        speaker: Tensor | None = None,
    ) -> Encoded:
        """ids (B, L), lengths/pace/pitch_shift/pitch_scale/speaker (B,) -> Encoded."""
        m = self.model
        L = ids.shape[1]
        inside_bl = lengths_mask(lengths, L)  # (B, L)
        sym_mask = inside_bl & (ids != m.dims.padding_idx)
        conditioning: Tensor | int = 0
        if m.speaker_emb is not None:
            assert speaker is not None
            conditioning = m.speaker_emb(speaker)[:, None, :] * m.dims.speaker_emb_weight
        assert m.encoder.word_emb is not None  # the encoder stack embeds its ids
        enc = self.stack(m.encoder, m.encoder.word_emb(ids), sym_mask, inside_bl, conditioning)
        dtype = enc.dtype
        mask = sym_mask[:, :, None].to(dtype)  # (B, L, 1)
        inside = inside_bl[:, None, :].to(dtype)  # (B, 1, L)

        log_dur = m.duration_predictor(enc, mask, inside).squeeze(2)
        durations = torch.clamp(torch.exp(log_dur) - 1, 0, MAX_DURATION)
        pitch = m.pitch_predictor(enc, mask, inside).permute(0, 2, 1)  # (B, formants, L)
        scale = pitch_scale.to(dtype)[:, None, None]
        # Hz -> normalised units, rounded as FastPitch.infer rounds `float / std`
        if self.lj_std:
            shift = (pitch_shift.double() / LJ_PITCH_STD).to(dtype)[:, None, None]
        else:
            std = m.pitch_std[0]
            shift = (pitch_shift.to(std.dtype) * torch.reciprocal(std)).to(dtype)[:, None, None]
        pitch = (pitch * scale + shift) * inside
        enc = enc + m.pitch_emb(pitch).transpose(1, 2)
        energy = None
        if m.dims.energy_conditioning:
            energy = m.energy_predictor(enc, mask, inside).squeeze(2)
            enc = enc + m.energy_emb(energy[:, None, :]).transpose(1, 2)
        # floor(d / pace + 0.5), as FastPitch's regulate_length (in float32 like it)
        reps = (durations.float() / pace[:, None] + 0.5).long()
        return Encoded(enc, reps, durations, pitch, energy)

    @staticmethod
    def regulate(enc: Tensor, reps: Tensor, n_frames: int | Tensor) -> tuple[Tensor, Tensor]:
        """enc (B, L, D), reps (B, L) -> frames (B, n_frames, D) zero past lengths, lengths (B,).

        Frame t copies the symbol whose span contains it; n_frames >= every item's length.
        """
        lengths = reps.sum(dim=1)
        ends = reps.cumsum(dim=1)
        t = torch.arange(n_frames, device=enc.device)  # type: ignore[arg-type]  # as in positions
        # counting only the first L - 1 ends keeps the index < L without a size-dependent clamp
        index = (ends[:, None, :-1] <= t[None, :, None]).sum(dim=2)
        frames = enc.gather(1, index[:, :, None].expand(-1, -1, enc.shape[2]))
        keep = t[None, :] < lengths[:, None]
        return frames * keep[:, :, None].to(frames.dtype), lengths

    def decode(self, enc: Tensor, reps: Tensor, n_frames: int | Tensor) -> tuple[Tensor, Tensor]:
        """enc (B, L, D), reps (B, L) -> mel (B, n_mels, n_frames), mel_lengths (B,)."""
        m = self.model
        frames, mel_lengths = self.regulate(enc.to(m.proj.weight.dtype), reps, n_frames)
        mask = lengths_mask(mel_lengths, frames.shape[1])
        dec = self.stack(m.decoder, frames, mask, mask)
        return m.proj(dec).permute(0, 2, 1), mel_lengths

    @staticmethod
    def frame_lengths(reps: Tensor) -> Tensor:
        """(B, L) frames per symbol -> (B,) frames per item."""
        return reps.sum(dim=1)

    @staticmethod
    def assemble(mel: Tensor, mel_lengths: Tensor, e: Encoded) -> tuple[Tensor, ...]:
        """The contract's outputs, in order."""
        out = (mel, mel_lengths, e.durations, e.pitch)
        return out if e.energy is None else (*out, e.energy)

    def stack(
        self,
        fft: FFTransformer,
        x: Tensor,
        mask: Tensor,
        inside: Tensor,
        conditioning: Tensor | int = 0,
    ) -> Tensor:
        """FFTransformer.forward on embedded input x (B, T, D), positions computed in float32."""
        keep = mask[:, :, None].to(x.dtype)
        x = x + positions(x.shape[1], fft.pos_emb.inv_freq, x.dtype)[None] * keep + conditioning
        inside_ = inside[:, None, :].to(x.dtype)
        per_item = self.batch_invariant and x.shape[0] > 1
        lengths = inside.sum(1).tolist() if per_item else None
        for layer in fft.layers:
            x = layer(x, mask, keep, inside_, lengths)
        return x

    def forward(
        self,
        ids: Tensor,
        lengths: Tensor,
        pace: Tensor,
        pitch_shift: Tensor,
        pitch_scale: Tensor,
        speaker: Tensor | None = None,
    ) -> tuple[Tensor, ...]:
        e = self.encode(ids, lengths, pace, pitch_shift, pitch_scale, speaker)
        mel, mel_lengths = self.decode(e.enc, e.reps, e.reps.sum(dim=1).max())
        return self.assemble(mel, mel_lengths, e)


def build(model: FastPitch, info: object = None) -> FastPitchGraph:
    """The graph; built while batch-invariant mode is on (speechrt.device.set_batch_invariant,
    eager CPU only), it attends per item."""
    return FastPitchGraph(model, batch_invariant())


def example(graph: FastPitchGraph, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    """Random valid inputs: `batch` items, the longest `length` symbols, lengths decreasing."""
    g = torch.Generator().manual_seed(seed)
    d = graph.model.dims
    lengths = torch.tensor(
        [max(1, length - math.ceil(i * length / (batch + 1))) for i in range(batch)]
    )
    ids = torch.randint(1, d.n_symbols, (batch, length), generator=g)
    ids = ids * lengths_mask(lengths, length)
    feeds = {
        "ids": ids,
        "lengths": lengths,
        "pace": torch.full((batch,), 1.0),
        "pitch_shift": torch.zeros(batch),
        "pitch_scale": torch.ones(batch),
    }
    if d.n_speakers > 1:
        feeds["speaker"] = torch.randint(0, d.n_speakers, (batch,), generator=g)
    return feeds


CODE = GraphCode(build, example)  # named by its registry entry (speechrt.arch)
