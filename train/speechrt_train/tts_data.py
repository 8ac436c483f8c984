"""The TTS voice's shard turned into training tensors, all held on the training device.

shard (corpus.py) -> per aligned utterance: audio (N,), log-mel (n_mels, T) with T = N / hop
(speechrt's mel, the one the runtime uses), ids (L,), durations (L,), pitch Hz and energy (L,)
-> padded batches for FastPitch and Tacotron 2; random aligned (mel, audio) segments for HiFi-GAN

TextTrainer: what the two teacher-forced trainers over padded text batches share (step,
held-out evaluation, state), each giving its forward and losses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.profiler import record_function

from speechrt.audio.mel import MelConfig, mel_spectrogram
from speechrt_train.features import normalize_pitch, symbol_targets
from speechrt_train.loop import Batches, Checkpointed, warmup_rsqrt


@dataclass
class VoiceData:
    """Aligned utterances of one voice, as lists of device tensors."""

    mel_config: MelConfig
    keys: list[str]
    audio: list[Tensor]  # (N,) float32, N = T * hop
    mels: list[Tensor]  # (n_mels, T)
    ids: list[Tensor]  # (L,) long
    durations: list[Tensor]  # (L,) long, sums to T
    pitch: list[Tensor]  # (L,) Hz, 0 = unvoiced
    energy: list[Tensor]  # (L,)
    pitch_mean: float = 0.0  # Hz over the voiced frames' symbol averages of the training items
    pitch_std: float = 1.0
    _packed: tuple[Tensor, Tensor, list[int]] | None = field(
        default=None, repr=False, compare=False
    )

    def __len__(self) -> int:
        return len(self.keys)

    def packed(self) -> tuple[Tensor, Tensor, list[int]]:
        """Audio (sum N,) and mels (n_mels, sum T) of all items, frame offsets (len + 1 host
        ints; sample offsets are these x hop), made on first use; the items of `audio` become
        views into the packed audio (no second copy on the device)."""
        if self._packed is None or len(self._packed[2]) != len(self.mels) + 1:
            audio = torch.cat(self.audio)
            self.audio[:] = list(audio.split([a.shape[0] for a in self.audio]))
            frames = self.frames()
            offsets = [0]
            for t in frames:
                offsets.append(offsets[-1] + t)
            self._packed = (audio, torch.cat(self.mels, dim=1), offsets)
        return self._packed

    def frames(self) -> list[int]:
        return [m.shape[1] for m in self.mels]

    def mel_mean(self) -> Tensor:
        """(n_mels,) the mean of every frame: where an acoustic model's output starts."""
        return torch.cat([m.float() for m in self.mels], dim=1).mean(dim=1)

    def replace_mels(self, mels: list[Tensor]) -> None:
        """Other mels of the same items (e.g. an acoustic model's predictions), each (n_mels,
        T) as the one it replaces; the packed mels are rebuilt from them on next use."""
        for key, old, new in zip(self.keys, self.mels, mels, strict=True):
            if new.shape != old.shape:
                raise ValueError(f"{key}: mel {tuple(new.shape)} for {tuple(old.shape)}")
        self.mels[:] = mels
        self._packed = None


def load_voice(
    shard: dict,
    heldout: bool = False,
    device: str | torch.device = "cpu",
    limit: int | None = None,
) -> VoiceData:
    """Aligned training (or, with heldout=True, held-out) utterances of a TTS-voice shard."""
    cfg = MelConfig.from_dict(shard["mel"])
    if shard["sample_rate"] != cfg.sampling_rate:
        raise ValueError(f"shard at {shard['sample_rate']} Hz, mel config {cfg.sampling_rate}")
    picked = [
        i
        for i in range(len(shard["keys"]))
        if shard["heldout"][i] == heldout and int(shard["frames"][i]) > 0
    ][:limit]
    if not picked:
        raise ValueError(f"no aligned {'held-out' if heldout else 'training'} utterances")
    data = VoiceData(cfg, [], [], [], [], [], [], [])
    ao, io = shard["audio_offsets"], shard["id_offsets"]
    for i in picked:
        audio = shard["audio"][int(ao[i]) : int(ao[i + 1])].to(device).float() / 32768.0
        frames = int(shard["frames"][i])
        if audio.shape[0] != frames * cfg.hop_length:
            raise ValueError(f"{shard['keys'][i]}: {audio.shape[0]} samples for {frames} frames")
        mel = mel_spectrogram(audio, cfg)[:, :frames]  # (n_mels, T); the extra centred frame off
        ids = shard["ids"][int(io[i]) : int(io[i + 1])].long().to(device)
        dur = shard["durations"][int(io[i]) : int(io[i + 1])].long()
        if int(dur.sum()) != frames:  # checked on the host: no device sync per utterance
            raise ValueError(f"{shard['keys'][i]}: durations sum to {int(dur.sum())} != {frames}")
        dur = dur.to(device)
        pitch, energy = symbol_targets(audio, mel, dur, cfg.sampling_rate, cfg.hop_length)
        data.keys.append(shard["keys"][i])
        data.audio.append(audio)
        data.mels.append(mel)
        data.ids.append(ids)
        data.durations.append(dur)
        data.pitch.append(pitch)
        data.energy.append(energy)
    voiced = torch.cat([p[p > 0] for p in data.pitch])
    if voiced.numel() > 1:
        data.pitch_mean, data.pitch_std = float(voiced.mean()), float(voiced.std())
    return data


@dataclass
class TextBatch:
    ids: Tensor  # (B, L) zero-padded
    lengths: Tensor  # (B,)
    durations: Tensor  # (B, L)
    pitch: Tensor  # (B, L) normalised
    energy: Tensor  # (B, L)
    mel: Tensor  # (B, n_mels, T) zero-padded
    mel_lengths: Tensor  # (B,)


def _pad(rows: list[Tensor], value: float = 0.0) -> Tensor:
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=value)


def text_batch(data: VoiceData, index: list[int], pitch_mean: float, pitch_std: float) -> TextBatch:
    """Items `index` of `data`, padded (FastPitch's teacher-forced inputs and targets)."""
    mels = [data.mels[i].T for i in index]  # (T, n_mels) for padding along time
    return TextBatch(
        ids=_pad([data.ids[i] for i in index]),
        lengths=torch.tensor([len(data.ids[i]) for i in index], device=mels[0].device),
        durations=_pad([data.durations[i] for i in index]),
        pitch=_pad([normalize_pitch(data.pitch[i], pitch_mean, pitch_std) for i in index]),
        energy=_pad([data.energy[i] for i in index]),
        mel=_pad(mels).transpose(1, 2),
        mel_lengths=torch.tensor([m.shape[0] for m in mels], device=mels[0].device),
    )


def segment_batch(
    data: VoiceData, index: list[int], frames: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """For HiFi-GAN: a random `frames`-long window of each item -> (mel (B, n_mels, frames),
    audio (B, frames * hop)); items shorter than the window are padded (log-mel with its
    floor, audio with silence). Window starts: one CPU draw per item from `generator`; the
    windows are two gathers from the packed data (one small host-to-device copy)."""
    hop = data.mel_config.hop_length
    audio_flat, mel_flat, offsets = data.packed()
    u = torch.rand(len(index), generator=generator, dtype=torch.float64)
    starts, ends = [], []
    for k, i in enumerate(index):
        length = offsets[i + 1] - offsets[i]
        room = max(length - frames, 0)
        starts.append(offsets[i] + min(int(u[k] * (room + 1)), room))
        ends.append(offsets[i + 1])
    span = torch.tensor([starts, ends], dtype=torch.long).to(mel_flat.device)  # (2, B)
    f = span[0, :, None] + torch.arange(frames, device=mel_flat.device)  # (B, frames)
    inside = f < span[1, :, None]
    floor = torch.log(torch.tensor(data.mel_config.log_clamp)).item()  # a host float
    mel = mel_flat[:, f.clamp(max=mel_flat.shape[1] - 1)]  # (n_mels, B, frames)
    mel = torch.where(inside, mel, floor).transpose(0, 1).contiguous()
    s = (span[0, :, None] * hop) + torch.arange(frames * hop, device=mel_flat.device)
    audio = torch.where(s < span[1, :, None] * hop, audio_flat[s.clamp(max=len(audio_flat) - 1)], 0)
    return mel, audio


class TextTrainer(Checkpointed):
    """One model trained on the voice's text batches by teacher forcing, its optimizer and its
    data order (see loop.Trainer). A subclass sets the fields below and gives `_forward` and
    `_losses`; config has lr, warmup, grad_clip, batch_size, seed and amp."""

    config: Any
    device: torch.device
    train: VoiceData
    val: VoiceData | None
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batches: Batches

    def _forward(self, b: TextBatch, generator: torch.Generator | None) -> Any:
        """The teacher-forced forward (under autocast); generator: its randomness, None for the
        global stream"""
        raise NotImplementedError

    def _losses(self, out: Any, b: TextBatch) -> dict[str, Tensor]:
        """The forward's losses, "loss" the one minimised (and any metric to log)"""
        raise NotImplementedError

    def _autocast(self, cache: bool = True) -> Any:
        """bf16 autocast where config.amp and on CUDA; cache=False for a CUDA graph's capture
        (the cache of cast weights would not outlive it)"""
        on = self.config.amp and self.device.type == "cuda"
        return torch.autocast(self.device.type, torch.bfloat16, enabled=on, cache_enabled=cache)

    def _batch(self, data: VoiceData, index: list[int]) -> TextBatch:
        return text_batch(data, index, self.train.pitch_mean, self.train.pitch_std)

    def step(self) -> dict[str, Tensor]:
        self.model.train()
        with record_function("data"):
            b = self._batch(self.train, next(self.batches))
        self.optimizer.zero_grad(set_to_none=True)
        parts = self._gradients(b)
        with record_function("optimizer"):
            for group in self.optimizer.param_groups:
                group["lr"] = self.config.lr * warmup_rsqrt(self.step_count + 1, self.config.warmup)
                group["lr"] *= self.lr_scale
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
            self.optimizer.step()
        self.step_count += 1
        return parts

    def _gradients(self, b: TextBatch) -> dict[str, Tensor]:
        """The batch's losses (detached), their gradients in the parameters' .grad"""
        with record_function("forward"):
            with self._autocast():
                out = self._forward(b, None)
            parts = self._losses(out, b)
        with record_function("backward"):
            parts["loss"].backward()
        return {k: v.detach() for k, v in parts.items()}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Teacher-forced losses on the held-out utterances (never trained on), any randomness
        from a generator of their own (training's random stream stays as it was)."""
        if self.val is None:
            return {}
        self.model.eval()
        generator = torch.Generator(self.device).manual_seed(self.config.seed)
        sums: dict[str, float] = {}
        n = 0
        for start in range(0, len(self.val), self.config.batch_size):
            index = list(range(start, min(start + self.config.batch_size, len(self.val))))
            b = self._batch(self.val, index)
            with self._autocast():
                out = self._forward(b, generator)
            for k, v in self._losses(out, b).items():
                sums[k] = sums.get(k, 0.0) + float(v) * len(index)
            n += len(index)
        return {f"val_{k}": v / n for k, v in sums.items()}

    def _state_parts(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "batches": self.batches}

    def _weight_parts(self) -> dict[str, nn.Module]:
        return {"model": self.model}
