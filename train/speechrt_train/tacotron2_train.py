"""Tacotron 2 trained on the TTS voice by teacher forcing: the model that shows whether a
half-precision decoder step keeps the stop step (it must attend and stop by itself).

    ids (B, L) -> encoder -> memory; for each mel frame t: DecoderStep(target frame t - 1,
    state, memory) -> frame t, gate t, attention (B, L) -> postnet -> mel (B, n_mels, T)

Losses as DLE's Tacotron2Loss: the mean squared error of the mel before and after the postnet
(over valid frames) and the gate's binary cross-entropy, target 1 from each item's last frame
on. One addition speeds up learning to attend on a corpus of a few thousand sentences: a
guided-attention loss (Tachibana et al., 2017) that penalises attention far from the diagonal,
weight `guide` (0: off). The prenet's dropout is on, as it is at inference. speechrt's
Tacotron 2 folds DLE's BatchNorms at conversion, so these convolutions train without them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from speechrt.arch.tacotron2 import PRESETS, Tacotron2Dims
from speechrt.models.tacotron2 import PRENET_DROPOUT, Tacotron2
from speechrt_train.loop import Batches
from speechrt_train.tts_data import TextBatch, TextTrainer, VoiceData


@dataclass(frozen=True)
class Tacotron2Config:
    preset: str = "default"  # DLE's published dims (speechrt.arch.tacotron2.PRESETS)
    batch_size: int = 32
    max_frames: int = 32 * 800  # padded mel frames per batch
    lr: float = 1e-3
    warmup: int = 500
    weight_decay: float = 1e-6
    grad_clip: float = 1.0
    guide: float = 1.0  # guided-attention loss weight
    guide_sigma: float = 0.2
    seed: int = 0
    amp: bool = True  # bf16 autocast on CUDA


@dataclass
class Tacotron2Out:
    mel: Tensor  # (B, n_mels, T) before the postnet
    mel_post: Tensor  # (B, n_mels, T)
    gate: Tensor  # (B, T) logits
    attention: Tensor  # (B, T, L)


def teacher_forced(
    model: Tacotron2, b: TextBatch, generator: torch.Generator | None = None
) -> Tacotron2Out:
    """The training forward: every decoder step reads the target's previous frame. The prenet's
    dropout masks come from `generator` (None: the global one)."""
    memory, processed = model.encoder(b.ids, b.lengths)  # (B, L, E), (B, L, A)
    L = memory.shape[1]
    pad = torch.arange(L, device=memory.device)[None] >= b.lengths[:, None]  # (B, L)
    B, n_mels, T = b.mel.shape
    previous = F.pad(b.mel, (1, -1)).to(memory.dtype)  # frame t - 1 at t, zeros at t = 0
    P = model.dims.prenet_dim
    u = torch.rand(T, B, 2, P, device=memory.device, generator=generator)
    keep = (u >= PRENET_DROPOUT).to(memory.dtype)
    keep = keep / (1.0 - PRENET_DROPOUT)
    state = model.initial_state(memory)
    frames, gates, attention = [], [], []
    for t in range(T):
        out = model.decoder(previous[:, :, t], *state, memory, processed, pad, keep[t])
        frames.append(out[0])
        gates.append(out[1])
        state = out[2:]
        attention.append(state[4])
    mel = torch.stack(frames, 2)  # (B, n_mels, T)
    return Tacotron2Out(
        mel, model.postnet(mel, b.mel_lengths), torch.cat(gates, 1), torch.stack(attention, 1)
    )


def guide_weights(lengths: Tensor, mel_lengths: Tensor, L: int, T: int, sigma: float) -> Tensor:
    """(B, T, L): 1 - exp(-(l / L_i - t / T_i)^2 / (2 sigma^2)) inside each item, 0 outside."""
    t = torch.arange(T, device=lengths.device)[None, :, None] / mel_lengths[:, None, None]
    l_ = torch.arange(L, device=lengths.device)[None, None, :] / lengths[:, None, None]
    w = 1.0 - torch.exp(-((l_ - t) ** 2) / (2 * sigma**2))
    inside = (t < 1.0) & (l_ < 1.0)
    return w * inside


def losses(out: Tacotron2Out, b: TextBatch, config: Tacotron2Config) -> dict[str, Tensor]:
    T = b.mel.shape[2]
    valid = torch.arange(T, device=b.mel.device)[None] < b.mel_lengths[:, None]  # (B, T)
    n = valid.sum() * b.mel.shape[1]
    target = b.mel.float()

    def masked_mse(pred: Tensor) -> Tensor:
        return ((pred.float() - target) ** 2 * valid[:, None]).sum() / n

    stop = (torch.arange(T, device=b.mel.device)[None] >= b.mel_lengths[:, None] - 1).float()
    parts = {
        "mel": masked_mse(out.mel),
        "mel_post": masked_mse(out.mel_post),
        "gate": F.binary_cross_entropy_with_logits(out.gate.float(), stop),
    }
    if config.guide > 0:
        L = out.attention.shape[2]
        w = guide_weights(b.lengths, b.mel_lengths, L, T, config.guide_sigma)
        parts["guide"] = (out.attention.float() * w).sum() / valid.sum()
    parts["loss"] = sum(
        (v * config.guide if k == "guide" else v for k, v in parts.items()),
        torch.zeros((), device=b.mel.device),
    )
    return parts


def attention_focus(out: Tacotron2Out, b: TextBatch) -> Tensor:
    """Mean over valid frames of the attention's largest weight: near 1 once it attends."""
    T = out.attention.shape[1]
    valid = torch.arange(T, device=b.mel.device)[None] < b.mel_lengths[:, None]
    return (out.attention.float().amax(2) * valid).sum() / valid.sum()


class Tacotron2Trainer(TextTrainer):
    """One Tacotron 2, its optimizer and its data order (see loop.Trainer)."""

    def __init__(
        self,
        train: VoiceData,
        val: VoiceData | None,
        config: Tacotron2Config,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config, self.device = config, torch.device(device)
        self.train, self.val = train, val
        dims = Tacotron2Dims(**PRESETS[config.preset], n_mel_channels=train.mel_config.n_mels)
        torch.manual_seed(config.seed)
        self.model = Tacotron2(dims).to(self.device)
        with torch.no_grad():  # start the frames at the training mean (log-mel is ~ -7)
            self.model.decoder.linear_projection.bias.copy_(train.mel_mean())
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), config.lr, weight_decay=config.weight_decay
        )
        self.batches = Batches(train.frames(), config.batch_size, config.seed, config.max_frames)
        self.step_count = 0

    def _forward(self, b: TextBatch, generator: torch.Generator | None) -> Tacotron2Out:
        return teacher_forced(self.model, b, generator)

    def _losses(self, out: Tacotron2Out, b: TextBatch) -> dict[str, Tensor]:
        return {**losses(out, b, self.config), "focus": attention_focus(out, b)}
