"""FastSpeech as a graph: ids, lengths, pace -> mel, mel_lengths.

The model's own blocks in the order of FastSpeech.generate_mel, with the length regulator's frame
count a tensor (dynamic in the exported graph) and `pace` per item. DLE multiplies the durations
by alpha = 1 / pace, computed in double precision on the host: here 1 / pace is computed in
float64 inside the graph from the float32 pace, which is the same number whenever pace is a
float32 value (1.0, 1.25, 0.5, ...).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from speechrt.arch import GraphCode
from speechrt.models.fastspeech import FastSpeech
from speechrt.runtime.graphs.regulated import RegulatedGraph


class Encoded(NamedTuple):
    enc: Tensor  # (B, L, D) phoneme-side output
    reps: Tensor  # (B, L) long: frames per symbol


class FastSpeechGraph(RegulatedGraph):
    """forward(ids (B, L), lengths (B,), pace (B,)) -> (mel (B, n_mels, T), mel_lengths (B,))."""

    max_frames = None  # DLE crops at max_seq_len instead (see frame_lengths)

    def __init__(self, model: FastSpeech) -> None:
        super().__init__()
        self.model = model

    def encode(self, ids: Tensor, lengths: Tensor, pace: Tensor) -> Encoded:
        m = self.model
        pos, keep = self.positions(lengths, ids.shape[1])
        x = m.word_emb(ids) + F.embedding(pos, m.position)
        x = m.phoneme_side(x, keep)
        log_dur = m.length_regulator.duration_predictor(x, keep)
        dur = torch.clamp_min(torch.exp(log_dur) - 1, 0)
        alpha = (1.0 / pace.double()).float()[:, None]
        return Encoded(x, torch.round(dur.float() * alpha).long())

    def positions(self, lengths: Tensor, t: int | Tensor) -> tuple[Tensor, Tensor]:
        """FastSpeech._positions with a traceable size: 1-based positions, 0 at padding."""
        # torch's stubs want a number; a 0-dim tensor (a traced size) works as well
        frames = torch.arange(t, device=lengths.device)  # type: ignore[arg-type]
        valid = frames[None, :] < lengths[:, None]
        return (frames + 1)[None, :] * valid, valid[:, :, None].to(self.model.position.dtype)

    def frame_lengths(self, reps: Tensor) -> Tensor:
        return reps.sum(1).clamp(max=self.model.dims.max_seq_len)  # DLE crops at max_seq_len

    def decode(self, enc: Tensor, reps: Tensor, n_frames: int | Tensor) -> tuple[Tensor, Tensor]:
        """enc (B, L, D), reps (B, L) -> mel (B, n_mels, n_frames), mel_lengths (B,)."""
        m = self.model
        enc = enc.to(m.mel_linear.weight.dtype)
        mel_lengths = self.frame_lengths(reps)
        ends = reps.cumsum(1)
        t = torch.arange(n_frames, device=enc.device)  # type: ignore[arg-type]  # as above
        src = (ends[:, None, :-1] <= t[None, :, None]).sum(2)  # the span holding frame t
        y = torch.gather(enc, 1, src[:, :, None].expand(-1, -1, enc.shape[2]))
        pos, keep = self.positions(mel_lengths, n_frames)
        keep = keep.to(enc.dtype)
        y = y * keep + F.embedding(pos, m.position).to(enc.dtype)
        y = m.mel_side(y, keep)
        return (m.mel_linear(y) * keep).transpose(1, 2), mel_lengths

    @staticmethod
    def assemble(mel: Tensor, mel_lengths: Tensor, e: Encoded) -> tuple[Tensor, Tensor]:
        return mel, mel_lengths

    def forward(self, ids: Tensor, lengths: Tensor, pace: Tensor) -> tuple[Tensor, Tensor]:
        e = self.encode(ids, lengths, pace)
        return self.decode(e.enc, e.reps, self.frame_lengths(e.reps).max())


def build(model: FastSpeech, info: object = None) -> FastSpeechGraph:
    return FastSpeechGraph(model)


def example(graph: FastSpeechGraph, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    d = graph.model.dims
    lengths = torch.tensor(
        [max(1, length - math.ceil(i * length / (batch + 1))) for i in range(batch)]
    )
    ids = torch.randint(1, d.n_symbols, (batch, length), generator=g)
    ids = ids * (torch.arange(length)[None, :] < lengths[:, None])
    return {"ids": ids, "lengths": lengths, "pace": torch.ones(batch)}


CODE = GraphCode(build, example)  # named by its registry entry (speechrt.arch)
