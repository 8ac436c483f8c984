"""Training FastPitch (speechrt.models.fastpitch) with exact durations from the teacher.

The inference module is trained as it is: its encoder, predictors, embeddings and decoder are
called with the ground-truth durations, pitch and energy (teacher forcing, as DLE's forward):

    ids -> encoder -> duration / pitch predictors; + pitch_emb(target pitch)
        -> energy predictor; + energy_emb(target energy) -> repeat by target durations
        -> decoder -> proj -> mel
    loss = MSE(mel) + 0.1 * (MSE(log(1 + dur)) + MSE(pitch) + MSE(energy)), masked (DLE's weights)

A trained component's teacher-forced mels (`predicted_mels`, frame for frame with the real audio)
are what HiFi-GAN is fine-tuned on (`python -m speechrt_train hifigan --mels-from DIR`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from speechrt.audio.mel import MelConfig
from speechrt.models.fastpitch import FastPitch, FastPitchDims, lengths_mask
from speechrt_train.loop import Batches
from speechrt_train.tts_data import TextBatch, TextTrainer, VoiceData, text_batch

# ~7.9 M parameters (15.8 MB in fp16): 4 + 4 FFT layers of width 256.
PRESETS: dict[str, dict[str, Any]] = {
    "fastpitch-small": dict(
        symbols_embedding_dim=256,
        in_fft_n_layers=4,
        in_fft_n_heads=2,
        in_fft_d_head=64,
        in_fft_conv1d_filter_size=512,
        in_fft_output_size=256,
        out_fft_n_layers=4,
        out_fft_n_heads=2,
        out_fft_d_head=64,
        out_fft_conv1d_filter_size=512,
        out_fft_output_size=256,
        dur_predictor_filter_size=128,
        pitch_predictor_filter_size=128,
        energy_predictor_filter_size=128,
    ),
    "fastpitch-tiny": dict(  # tests
        symbols_embedding_dim=32,
        in_fft_n_layers=1,
        in_fft_n_heads=2,
        in_fft_d_head=16,
        in_fft_conv1d_filter_size=64,
        in_fft_output_size=32,
        out_fft_n_layers=1,
        out_fft_n_heads=2,
        out_fft_d_head=16,
        out_fft_conv1d_filter_size=64,
        out_fft_output_size=32,
        dur_predictor_filter_size=32,
        pitch_predictor_filter_size=32,
        energy_predictor_filter_size=32,
    ),
}


@dataclass
class FastPitchConfig:
    preset: str = "fastpitch-small"
    batch_size: int = 32
    max_frames: int = 32 * 800  # padded mel frames per batch
    lr: float = 1e-3
    warmup: int = 1000
    weight_decay: float = 1e-6
    grad_clip: float = 1000.0
    seed: int = 0
    amp: bool = True  # bf16 autocast on CUDA


class FastPitchOut:
    def __init__(self, mel: Tensor, log_dur: Tensor, pitch: Tensor, energy: Tensor) -> None:
        self.mel, self.log_dur, self.pitch, self.energy = mel, log_dur, pitch, energy


def expand(durations: Tensor, enc: Tensor, frames: int) -> Tensor:
    """Repeat symbol j of item b durations[b, j] times: enc (B, L, D) -> (B, frames, D), zero
    past each item's total. As speechrt's regulate_length with integer durations, but with the
    frame count known beforehand, so the GPU is never waited for."""
    ends = durations.cumsum(dim=1)  # (B, L)
    t = torch.arange(frames, device=enc.device)
    index = (ends[:, None, :] <= t[None, :, None]).sum(dim=2)  # (B, T): symbol of frame t
    inside = index < durations.shape[1]
    index = index.clamp(max=enc.size(1) - 1)
    out = enc.gather(1, index[:, :, None].expand(-1, -1, enc.size(2)))
    return out * inside[:, :, None].to(enc.dtype)


def teacher_forced(model: FastPitch, b: TextBatch) -> FastPitchOut:
    """The training forward: predictions from ids, mel from the target durations/pitch/energy."""
    B, L = b.ids.shape
    inside_bl = lengths_mask(b.lengths, L)
    sym_mask = inside_bl & (b.ids != model.dims.padding_idx)
    enc = model.encoder(b.ids, sym_mask, inside_bl)  # (B, L, D)
    mask = sym_mask[:, :, None].to(enc.dtype)
    inside = inside_bl[:, None, :].to(enc.dtype)
    log_dur = model.duration_predictor(enc, mask, inside).squeeze(2)  # (B, L)
    pitch = model.pitch_predictor(enc, mask, inside).squeeze(2)  # (B, L), one formant
    enc = enc + model.pitch_emb(b.pitch[:, None, :].to(enc.dtype)).transpose(1, 2)
    energy = model.energy_predictor(enc, mask, inside).squeeze(2)
    enc = enc + model.energy_emb(b.energy[:, None, :].to(enc.dtype)).transpose(1, 2)
    frames = expand(b.durations, enc, b.mel.shape[2])
    frames_mask = lengths_mask(b.mel_lengths, frames.size(1))
    dec = model.decoder(frames, frames_mask, frames_mask)
    mel = model.proj(dec).permute(0, 2, 1)  # (B, n_mels, T)
    return FastPitchOut(mel, log_dur, pitch, energy)


def load_mel_teacher(
    model_dir: str | Path, mel_config: MelConfig, device: str | torch.device = "cpu"
) -> FastPitch:
    """A FastPitch component (model repository form) that is to predict a voice's mels
    (float32, eval mode): it must make the voice's mels from the corpus's symbol ids, and
    hold the pitch statistics it was trained with (its pitch_mean / pitch_std buffers)."""
    from speechrt.repo import load_component
    from speechrt_train.align import make_processor

    model, info = load_component(model_dir, device)
    if info.kind != "fastpitch":
        raise ValueError(f"{model_dir}: a {info.kind} component, not fastpitch")
    if info.mel is None:
        raise ValueError(f"{model_dir}: model.json has no mel config")
    info.mel.check_matches(mel_config, f"FastPitch {model_dir} and the corpus")
    if info.meta.get("text") != make_processor().to_meta():
        raise ValueError(f"{model_dir}: text front end {info.meta.get('text')} is not the corpus's")
    if not float(model.pitch_std[0]) > 0:  # 0: a checkpoint without its training statistics
        raise ValueError(f"{model_dir}: no pitch statistics (pitch_std buffer is 0)")
    return model


@torch.no_grad()
def predicted_mels(model: FastPitch, data: VoiceData, batch_size: int = 32) -> list[Tensor]:
    """FastPitch's teacher-forced mel of every item of `data`: from its ids with the true
    durations, pitch (normalised by the model's own statistics) and energy, so item i gets
    exactly its T_i frames -> [(n_mels, T_i) float32] in data's order. Batches of similar
    lengths (less padding; each item is independent of its batch-mates)."""
    model.eval()
    mean, std = float(model.pitch_mean[0]), float(model.pitch_std[0])
    frames = data.frames()
    order = sorted(range(len(data)), key=lambda i: frames[i])
    mels: list[Tensor] = [torch.empty(0)] * len(data)
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        mel = teacher_forced(model, text_batch(data, index, mean, std)).mel.float()
        for k, i in enumerate(index):
            mels[i] = mel[k, :, : frames[i]].clone()  # (n_mels, T_i), not a view of the batch
    return mels


def losses(out: FastPitchOut, b: TextBatch) -> dict[str, Tensor]:
    T = min(out.mel.shape[2], b.mel.shape[2])
    fmask = lengths_mask(b.mel_lengths, T)[:, None, :].float()  # (B, 1, T)
    mel_err = (out.mel[:, :, :T].float() - b.mel[:, :, :T]).square() * fmask
    mel = mel_err.sum() / (fmask.sum() * out.mel.shape[1])
    smask = lengths_mask(b.lengths, b.ids.shape[1]).float()

    def masked_mse(pred: Tensor, target: Tensor) -> Tensor:
        return ((pred.float() - target).square() * smask).sum() / smask.sum()

    dur = masked_mse(out.log_dur, torch.log1p(b.durations.float()))
    pitch = masked_mse(out.pitch, b.pitch)
    energy = masked_mse(out.energy, b.energy)
    total = mel + 0.1 * (dur + pitch + energy)
    return {"loss": total, "mel": mel, "dur": dur, "pitch": pitch, "energy": energy}


class FastPitchTrainer(TextTrainer):
    """One FastPitch, its optimizer and its data order (see loop.Trainer)."""

    def __init__(
        self,
        train: VoiceData,
        val: VoiceData | None,
        config: FastPitchConfig,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config, self.device = config, torch.device(device)
        self.train, self.val = train, val
        dims = FastPitchDims(**PRESETS[config.preset], n_mel_channels=train.mel_config.n_mels)
        torch.manual_seed(config.seed)
        self.model = FastPitch(dims).to(self.device)
        self.model.pitch_mean.fill_(train.pitch_mean)
        self.model.pitch_std.fill_(train.pitch_std)
        with torch.no_grad():  # start every output at its training mean (log-mel is ~ -7)
            self.model.proj.bias.copy_(train.mel_mean())
            log_dur = torch.cat([torch.log1p(d.float()) for d in train.durations])
            self.model.duration_predictor.fc.bias.fill_(float(log_dur.mean()))
            energy = torch.cat(train.energy)
            self.model.energy_predictor.fc.bias.fill_(float(energy.mean()))
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), config.lr, (0.9, 0.98), 1e-9, config.weight_decay
        )
        self.batches = Batches(train.frames(), config.batch_size, config.seed, config.max_frames)
        self.step_count = 0

    def _forward(self, b: TextBatch, generator: torch.Generator | None) -> FastPitchOut:
        return teacher_forced(self.model, b)  # its dropout: the global stream, off in evaluate

    def _losses(self, out: FastPitchOut, b: TextBatch) -> dict[str, Tensor]:
        return losses(out, b)
