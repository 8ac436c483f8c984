"""Speech + transcripts for the recogniser, and its augmentation, all on the training device.

shards of the training voices (train sentences only) -> 16 kHz audio (band-limited FFT
resampling of the 22.05 kHz TTS voice) + label ids of the spoken text
augmentation per item: speed x U[0.9, 1.1] (tempo and pitch), gain U[-6, 6] dB, white noise
at U[10, 40] dB SNR (half the items), then SpecAugment masks on the features
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from speechrt.audio.features import FeatureConfig, batch_features
from speechrt.models.jasper import LABELS

_NOT_LABEL = re.compile(r"[^a-z' ]+")


def transcript(spoken: str) -> str:
    """What the recogniser should write for a teacher's text: a-z, ' and single spaces."""
    return " ".join(_NOT_LABEL.sub(" ", spoken.lower()).split())


def label_ids(text: str) -> list[int]:
    index = {c: i for i, c in enumerate(LABELS)}
    return [index[c] for c in transcript(text)]


def fft_resample(audio: Tensor, orig_sr: int, target_sr: int) -> Tensor:
    """(N,) -> (round(N * target / orig),), band-limited (spectrum truncated) via one FFT."""
    if orig_sr == target_sr:
        return audio
    n = audio.shape[-1]
    m = round(n * target_sr / orig_sr)
    spec = torch.fft.rfft(audio.float())
    keep = min(spec.shape[-1], m // 2 + 1)
    out = torch.zeros(m // 2 + 1, dtype=spec.dtype, device=audio.device)
    out[:keep] = spec[:keep]
    return torch.fft.irfft(out, m) * (m / n)


@dataclass
class SpeechData:
    audio: list[Tensor]  # (N,) float32 at 16 kHz
    texts: list[str]  # reference transcripts (labels only)
    targets: list[Tensor]  # (S,) label ids
    voices: list[str]

    def __len__(self) -> int:
        return len(self.audio)


def load_speech(
    shards: list[dict],
    heldout: bool,
    sample_rate: int = 16000,
    device: str | torch.device = "cpu",
    limit: int | None = None,
) -> SpeechData:
    """Train (or held-out) utterances of every shard, resampled to `sample_rate`."""
    data = SpeechData([], [], [], [])
    for shard in shards:
        picked = [i for i, h in enumerate(shard["heldout"]) if h == heldout][:limit]
        off = shard["audio_offsets"]
        for i in picked:
            text = transcript(shard["spoken"][i])
            if not text:
                continue
            pcm = shard["audio"][int(off[i]) : int(off[i + 1])].to(device).float() / 32768.0
            data.audio.append(fft_resample(pcm, shard["sample_rate"], sample_rate))
            data.texts.append(text)
            data.targets.append(torch.tensor(label_ids(text), dtype=torch.long))
            data.voices.append(shard["voice"])
    if not data.audio:
        raise ValueError(f"no {'held-out' if heldout else 'training'} speech in the shards")
    return data


@dataclass(frozen=True)
class Augment:
    speed: tuple[float, float] = (0.9, 1.1)
    gain_db: tuple[float, float] = (-6.0, 6.0)
    noise_prob: float = 0.5
    snr_db: tuple[float, float] = (10.0, 40.0)
    freq_masks: int = 2
    freq_width: int = 12  # of 64 mel bins
    time_masks: int = 2
    time_width: int = 30  # frames (10 ms)


def _uniform(lo_hi: tuple[float, float], u: Tensor) -> Tensor:
    return lo_hi[0] + (lo_hi[1] - lo_hi[0]) * u


def augment_audio(
    audios: list[Tensor], aug: Augment, g: torch.Generator, g_noise: torch.Generator
) -> list[Tensor]:
    """Speed, gain and noise per item: parameters from `g` (CPU), noise samples from `g_noise`
    (on the audio's device), so a batch costs no device-to-host synchronisation."""
    u = torch.rand(len(audios), 4, generator=g, dtype=torch.float64)
    rates = _uniform(aug.speed, u[:, 0]).tolist()
    gains = (10 ** (_uniform(aug.gain_db, u[:, 1]) / 20)).tolist()
    noisy = (u[:, 2] < aug.noise_prob).tolist()
    snrs = (10 ** (_uniform(aug.snr_db, u[:, 3]) / 10)).tolist()
    out = []
    for audio, rate, gain, add, snr in zip(audios, rates, gains, noisy, snrs, strict=True):
        n = max(int(round(audio.shape[0] / rate)), 400)
        x = F.interpolate(audio[None, None], size=n, mode="linear", align_corners=False)[0, 0]
        x = x * gain
        if add:
            power = x.square().mean().clamp(min=1e-10)
            noise = torch.randn(x.shape, generator=g_noise, device=x.device)
            x = x + noise * (power / snr).sqrt()
        out.append(x.clamp(-1.0, 1.0))
    return out


def spec_augment(feats: Tensor, lengths: list[int], aug: Augment, g: torch.Generator) -> Tensor:
    """feats (B, F, T): zero `freq_masks` bands and `time_masks` spans per item (draws from
    `g` on the CPU; one mask tensor built on the device)."""
    B, n_freq, T = feats.shape
    u = torch.rand(B, aug.freq_masks + aug.time_masks, 2, generator=g, dtype=torch.float64)
    keep = torch.ones(B, n_freq, T, dtype=torch.bool)
    for b, t_len in enumerate(lengths):
        for k in range(aug.freq_masks + aug.time_masks):
            is_freq = k < aug.freq_masks
            size, width = (n_freq, aug.freq_width) if is_freq else (t_len, aug.time_width)
            w = int(u[b, k, 0] * (width + 1))
            start = int(u[b, k, 1] * max(size - w, 1))
            if is_freq:
                keep[b, start : start + w, :] = False
            else:
                keep[b, :, start : start + w] = False
    return feats * keep.to(feats.device)


def speech_batch(
    data: SpeechData,
    index: list[int],
    features: FeatureConfig,
    aug: Augment | None = None,
    gens: tuple[torch.Generator, torch.Generator] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> features (B, F, T), lengths (B,), targets (sum S,) and target lengths (B,).

    With `aug`, gens = (CPU generator for the draws, device generator for noise and dither)."""
    audios = [data.audio[i] for i in index]
    dither = None
    if aug is not None:
        assert gens is not None
        audios = augment_audio(audios, aug, *gens)
        dither = [gens[1]] * len(audios) if features.dither > 0 else None
    feats, lengths = batch_features(audios, features, dither)
    if aug is not None:
        assert gens is not None
        valid = [features.valid_frames(a.shape[0]) for a in audios]  # = lengths, on the host
        feats = spec_augment(feats, valid, aug, gens[0])
    targets = torch.cat([data.targets[i] for i in index]).to(feats.device)
    target_lengths = torch.tensor([len(data.targets[i]) for i in index], device=feats.device)
    return feats, lengths, targets, target_lengths
