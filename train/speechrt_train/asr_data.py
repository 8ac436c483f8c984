"""Speech + transcripts for the recogniser, and its augmentation, all on the training device.

shards of the training voices (train sentences only) -> 16 kHz audio (band-limited FFT
resampling of the 22.05 kHz TTS voice) + label ids of the spoken text
augmentation per item: speed x U[0.9, 1.1] (tempo and pitch), gain U[-6, 6] dB, white noise
at U[10, 40] dB SNR (half the items); for real recordings (RECORDINGS) also silence before and
after, a room, coloured noise, a microphone EQ and a telephone channel (channel_batch), and a
vocal tract length warp of the spectrum; then SpecAugment masks on the features
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from speechrt.asr.wer import QUOTE_MARK
from speechrt.audio.features import FeatureConfig
from speechrt.models.jasper import LABELS
from speechrt.runtime.featurizer import BatchLogMel
from speechrt_train.channels import channel_batch, uniform, vtlp_source_bins

_NOT_LABEL = re.compile(r"[^a-z' ]+")


def transcript(spoken: str) -> str:
    """What the recogniser should write for a teacher's text: a-z, ' (inside words only) and
    single spaces."""
    return " ".join(QUOTE_MARK.sub(" ", _NOT_LABEL.sub(" ", spoken.lower())).split())


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
    _packed: tuple[Tensor, list[int]] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.audio)

    def packed(self) -> tuple[Tensor, list[int]]:
        """All audio as one tensor (sum N,) + offsets (len + 1 host ints), made on first use;
        the items of `audio` become views into it (no second copy on the device)."""
        if self._packed is None or len(self._packed[1]) != len(self.audio) + 1:
            flat = torch.cat(self.audio)
            sizes = [a.shape[0] for a in self.audio]
            self.audio[:] = list(flat.split(sizes))
            self._packed = (flat, np.concatenate([[0], np.cumsum(sizes)]).tolist())
        return self._packed


def load_speech(
    shards: list[dict],
    heldout: bool,
    sample_rate: int = 16000,
    device: str | torch.device = "cpu",
    limit: int | None = None,
    repeat: dict[str, int] | None = None,
) -> SpeechData:
    """Train (or held-out) utterances of every shard, resampled to `sample_rate`; a voice in
    `repeat` has each of its items listed that many times (the same tensors, not copies)."""
    data = SpeechData([], [], [], [])
    missing = set(repeat or {}) - {shard["voice"] for shard in shards}
    if missing:
        raise ValueError(f"repeat names voices the shards lack: {', '.join(sorted(missing))}")
    for shard in shards:
        picked = [i for i, h in enumerate(shard["heldout"]) if h == heldout][:limit]
        off = shard["audio_offsets"]
        times = (repeat or {}).get(shard["voice"], 1)
        for i in picked:
            text = transcript(shard["spoken"][i])
            if not text:
                continue
            pcm = shard["audio"][int(off[i]) : int(off[i + 1])].to(device).float() / 32768.0
            audio = fft_resample(pcm, shard["sample_rate"], sample_rate)
            target = torch.tensor(label_ids(text), dtype=torch.long)
            for _ in range(times):
                data.audio.append(audio)
                data.texts.append(text)
                data.targets.append(target)
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
    time_share: float = 0.0  # > 0: a time mask's width at most this share of the item (NeMo's)
    # recording conditions (channel_batch) and the speaker's vocal tract length (the features'
    # frequency warp); the defaults leave them off
    pad_prob: float = 0.0  # silence before and after the speech, each up to pad_s
    pad_s: float = 1.0
    reverb_prob: float = 0.0  # a room: exponentially decaying noise, RT60 in rt60_s
    rt60_s: tuple[float, float] = (0.15, 0.8)
    drr_db: tuple[float, float] = (-3.0, 12.0)  # direct-to-reverberant energy ratio
    eq_db: float = 0.0  # a microphone: smooth random gain curve within +- eq_db
    phone_prob: float = 0.0  # a telephone: 300-3400 Hz band, then G.711 mu-law (8 bits)
    colour_noise_prob: float = 0.0  # noise of spectral slope f^-beta, beta in [0, 2]
    colour_snr_db: tuple[float, float] = (5.0, 30.0)
    vtlp: tuple[float, float] = (1.0, 1.0)  # frequency warp factor (Jaitly & Hinton, 2013)

    @property
    def channel(self) -> bool:
        """Whether channel_batch changes anything."""
        probs = (self.pad_prob, self.reverb_prob, self.phone_prob, self.colour_noise_prob)
        return max(probs) > 0 or self.eq_db > 0


# For real recordings: all of the above on a share of the items each.
RECORDINGS = Augment(
    pad_prob=0.5,
    reverb_prob=0.3,
    eq_db=6.0,
    phone_prob=0.15,
    colour_noise_prob=0.3,
    vtlp=(0.88, 1.12),
)
# RECORDINGS with NeMo's FastConformer SpecAugment: 10 time masks of up to 5 % of the item
# each, 2 mel bands of up to 27 of 80 (the trainer scales freq_width by n_mels / 64)
RECORDINGS_MASKED = replace(
    RECORDINGS, time_masks=10, time_share=0.05, freq_width=round(27 * 64 / 80)
)
AUGMENTS = {
    "synthetic": Augment(),
    "recordings": RECORDINGS,
    "recordings-masked": RECORDINGS_MASKED,
}


def narrowband(aug: Augment | None) -> str | None:
    """FeatureConfig.narrowband for a model trained with `aug`: a model that heard telephones
    hears 8 kHz sources through the telephone band (speechrt.audio.telephone) too."""
    return "telephone" if aug is not None and aug.phone_prob > 0 else None


def augment_audio_reference(
    audios: list[Tensor], aug: Augment, g: torch.Generator, g_noise: torch.Generator
) -> list[Tensor]:
    """The per-item form of `augment_batch` (one F.interpolate per item): the reference its
    speed perturbation is tested against; same parameter draws from `g`, noise per item."""
    u = torch.rand(len(audios), 4, generator=g, dtype=torch.float64)
    rates = uniform(aug.speed, u[:, 0]).tolist()
    gains = (10 ** (uniform(aug.gain_db, u[:, 1]) / 20)).tolist()
    noisy = (u[:, 2] < aug.noise_prob).tolist()
    snrs = (10 ** (uniform(aug.snr_db, u[:, 3]) / 10)).tolist()
    out = []
    for audio, rate, gain, add, snr in zip(audios, rates, gains, noisy, snrs, strict=True):
        n = max(int(round(audio.shape[0] / rate)), MIN_SAMPLES)
        x = F.interpolate(audio[None, None], size=n, mode="linear", align_corners=False)[0, 0]
        x = x * gain
        if add:
            power = x.square().mean().clamp(min=1e-10)
            noise = torch.randn(x.shape, generator=g_noise, device=x.device)
            x = x + noise * (power / snr).sqrt()
        out.append(x.clamp(-1.0, 1.0))
    return out


MIN_SAMPLES = 400  # speed-perturbed items are at least this long (the features need 320)


def augment_batch(
    data: SpeechData,
    index: list[int],
    aug: Augment,
    g: torch.Generator,
    g_noise: torch.Generator,
) -> tuple[Tensor, list[int]]:
    """Speed, gain and noise for the items `index` at once -> padded audio (B, N_max) (zeros
    past each item's length) and the lengths (host ints).

    Parameters per item from `g` (CPU, the draws of `augment_audio_reference`); everything
    else is a few batched ops on the device: the speed change is F.interpolate's linear
    interpolation (align_corners=False, its float32 source positions) as one gather from the
    packed audio; noise (drawn for every item from `g_noise`, used on the noisy half) at the
    item's SNR relative to its own mean power. No device-to-host synchronisation."""
    flat, offsets = data.packed()
    u = torch.rand(len(index), 4, generator=g, dtype=torch.float64)
    rates = uniform(aug.speed, u[:, 0]).tolist()
    sizes = [int(offsets[i + 1] - offsets[i]) for i in index]
    lengths = [max(int(round(n / r)), MIN_SAMPLES) for n, r in zip(sizes, rates, strict=True)]
    # F.interpolate's source position of output j: scale * (j + 0.5) - 0.5 with the float32
    # scale = N / n, rounded once to float32 (a fused multiply-add), clamped at 0
    scale = np.float32(sizes) / np.float32(lengths)
    params = torch.tensor(
        np.stack(
            [
                scale.astype(np.float64),
                np.asarray(sizes, np.float64),
                np.asarray(lengths, np.float64),
                np.asarray([offsets[i] for i in index], np.float64),
                (10 ** (uniform(aug.gain_db, u[:, 1]) / 20)).numpy(),
                (u[:, 2] < aug.noise_prob).double().numpy(),
                (10 ** (-uniform(aug.snr_db, u[:, 3]) / 10)).numpy(),
            ],
            axis=1,
        )
    ).to(flat.device)  # (B, 7): one host-to-device copy
    scale_, size, length, offset, gain, noisy, inv_snr = params.unbind(1)
    j = torch.arange(max(lengths), device=flat.device, dtype=torch.float64)
    src = (scale_[:, None] * (j[None] + 0.5) - 0.5).float().clamp(min=0)  # (B, N_max)
    last = (size - 1).long()[:, None]
    i0 = torch.minimum(src.floor().long(), last)
    frac = (src - i0).clamp(0.0, 1.0)
    base = offset.long()[:, None]
    i1 = torch.minimum(i0 + 1, last)
    x0, x1 = flat[base + i0], flat[base + i1]
    valid = j[None] < length[:, None]  # (B, N_max)
    x = (x0 * (1 - frac) + x1 * frac) * gain.float()[:, None] * valid
    power = (x.square().sum(dim=1) / length.float()).clamp(min=1e-10)  # (B,)
    sigma = (power * inv_snr.float() * noisy.float()).sqrt()
    noise = torch.randn(x.shape, generator=g_noise, device=x.device)
    x = (x + noise * sigma[:, None]).clamp(-1.0, 1.0) * valid
    return x, lengths


def spec_augment(feats: Tensor, lengths: list[int], aug: Augment, g: torch.Generator) -> Tensor:
    """feats (B, F, T): zero `freq_masks` bands and `time_masks` spans per item (draws from
    `g` on the CPU; the masks built on the device by broadcast comparisons, no loop)."""
    B, n_freq, T = feats.shape
    k = aug.freq_masks + aug.time_masks
    u = torch.rand(B, k, 2, generator=g, dtype=torch.float64)
    is_freq = torch.arange(k) < aug.freq_masks  # (k,)
    t_len = torch.tensor(lengths, dtype=torch.long)[:, None]  # (B, 1)
    size = torch.where(is_freq, n_freq, t_len)  # (B, k)
    t_width = torch.full_like(t_len, aug.time_width)
    if aug.time_share > 0:
        t_width = (t_len * aug.time_share).long().clamp(max=aug.time_width)
    width = torch.where(is_freq, aug.freq_width, t_width)  # (B, k)
    w = (u[:, :, 0] * (width + 1)).long()  # (B, k): floor, as int() of a positive float
    start = (u[:, :, 1] * (size - w).clamp(min=1)).long()
    spans = torch.stack([start, start + w], dim=2).to(feats.device)  # (B, k, 2), one copy
    f = torch.arange(n_freq, device=feats.device)[None, None, :, None]  # (1, 1, F, 1)
    t = torch.arange(T, device=feats.device)[None, None, None, :]  # (1, 1, 1, T)
    lo, hi = spans[..., 0, None, None], spans[..., 1, None, None]  # (B, k, 1, 1)
    nf = aug.freq_masks
    masked = ((f >= lo[:, :nf]) & (f < hi[:, :nf])).any(dim=1)  # (B, F, 1)
    masked = masked | ((t >= lo[:, nf:]) & (t < hi[:, nf:])).any(dim=1)  # (B, F, T)
    return feats.masked_fill(masked, 0.0)


def spec_augment_reference(
    feats: Tensor, lengths: list[int], aug: Augment, g: torch.Generator
) -> Tensor:
    """The per-item loop `spec_augment` replaces (same draws, same masks): tests only."""
    B, n_freq, T = feats.shape
    u = torch.rand(B, aug.freq_masks + aug.time_masks, 2, generator=g, dtype=torch.float64)
    keep = torch.ones(B, n_freq, T, dtype=torch.bool)
    for b, t_len in enumerate(lengths):
        for k in range(aug.freq_masks + aug.time_masks):
            is_freq = k < aug.freq_masks
            t_width = aug.time_width
            if aug.time_share > 0:
                t_width = min(int(t_len * aug.time_share), aug.time_width)
            size, width = (n_freq, aug.freq_width) if is_freq else (t_len, t_width)
            w = int(u[b, k, 0] * (width + 1))
            start = int(u[b, k, 1] * max(size - w, 1))
            if is_freq:
                keep[b, start : start + w, :] = False
            else:
                keep[b, :, start : start + w] = False
    return feats * keep.to(feats.device)


def padded_audio(data: SpeechData, index: list[int]) -> tuple[Tensor, list[int]]:
    """Items `index` unchanged -> (B, N_max) zero-padded, lengths (host ints)."""
    audios = [data.audio[i] for i in index]
    return torch.nn.utils.rnn.pad_sequence(audios, batch_first=True), [len(a) for a in audios]


@functools.lru_cache(maxsize=8)
def _log_mel(cfg: FeatureConfig, device: torch.device) -> BatchLogMel:
    """speechrt's log-mel on `device`, for its window and mel basis (never written to)."""
    return BatchLogMel(cfg).to(device)


def batched_features(
    audio: Tensor,
    sizes: list[int],
    cfg: FeatureConfig,
    generator: torch.Generator | None,
    warp: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """speechrt's batch_features (DLE's filterbank features, each item on its own samples) for
    a padded batch at once: audio (B, N_max), sizes (host ints) -> features (B, n_mels, T),
    valid frames (B,) on the device. Dither: one (B, N_max) draw from `generator` (or the
    global RNG). `warp` (B,): VTLP factors applied to the power spectra (training only).
    Each item's STFT reflects at its own end (a gather builds the padded rows),
    mean/std are over its own valid frames, and T = max padded_frames as batch_features."""
    B, n_max = audio.shape
    dev = audio.device
    if min(sizes) < cfg.min_samples:
        raise ValueError(f"an item has fewer than {cfg.min_samples} samples")
    x = audio.float()
    if cfg.dither > 0:
        x = x + cfg.dither * torch.randn(x.shape, generator=generator, device=dev)
    if cfg.preemph:
        x = torch.cat((x[:, :1], x[:, 1:] - cfg.preemph * x[:, :-1]), dim=1)
    half = cfg.n_fft // 2
    meta = torch.tensor([[n, cfg.valid_frames(n)] for n in sizes], dtype=torch.long).to(
        dev
    )  # (B, 2): one host-to-device copy
    size, valid = meta[:, 0:1], meta[:, 1:2]
    # centre=True with reflect padding at the item's own ends: position p of the padded row
    # reads sample |p - half| mirrored at size - 1; past the item's end + half, anything
    p = torch.arange(n_max + 2 * half, device=dev)[None] - half  # (1, N_max + n_fft)
    src = p.abs()
    src = torch.where(src > size - 1, 2 * (size - 1) - src, src).clamp(0, n_max - 1)
    rows = torch.gather(x, 1, src)  # (B, N_max + n_fft)
    spec = torch.stft(
        rows,
        n_fft=cfg.n_fft,
        hop_length=cfg.hop_length,
        win_length=cfg.win_length,
        window=_log_mel(cfg, dev).window,
        center=False,
        return_complex=True,
    )  # (B, n_fft // 2 + 1, 1 + N_max // hop)
    power = spec.real.square() + spec.imag.square()
    if warp is not None:  # (B,) VTLP factors: each item's spectrum read at warped bins
        src = vtlp_source_bins(warp, power.shape[1])  # (B, n_bins)
        i0 = src.floor().long().clamp(max=power.shape[1] - 2)
        frac = (src - i0)[:, :, None]
        lo = torch.gather(power, 1, i0[:, :, None].expand_as(power))
        hi = torch.gather(power, 1, (i0 + 1)[:, :, None].expand_as(power))
        power = lo * (1 - frac) + hi * frac
    mel = torch.log(_log_mel(cfg, dev).mel_basis @ power + cfg.log_guard)  # (B, n_mels, frames)
    t = torch.arange(mel.shape[2], device=dev)[None, None]
    inside = t < valid[:, :, None]  # (B, 1, frames)
    n = valid[:, :, None].to(mel.dtype)
    mean = torch.where(inside, mel, 0.0).sum(dim=2, keepdim=True) / n
    var = torch.where(inside, (mel - mean).square(), 0.0).sum(dim=2, keepdim=True) / (n - 1)
    mel = torch.where(inside, (mel - mean) / (var.sqrt() + cfg.std_eps), 0.0)
    t_out = max(cfg.padded_frames(n) for n in sizes)
    return torch.nn.functional.pad(mel, (0, t_out - mel.shape[2])), valid[:, 0]


def speech_batch(
    data: SpeechData,
    index: list[int],
    features: FeatureConfig,
    aug: Augment | None = None,
    gens: tuple[torch.Generator, torch.Generator] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> features (B, F, T), lengths (B,), targets (sum S,) and target lengths (B,).

    With `aug`, gens = (CPU generator for the draws, device generator for noise and dither);
    without, the dither (if any) comes from the global RNG. The features are
    `batched_features`, equal to speechrt's batch_features of the same audio."""
    return speech_batch_host(data, index, features, aug, gens)[:4]


def speech_batch_host(
    data: SpeechData,
    index: list[int],
    features: FeatureConfig,
    aug: Augment | None = None,
    gens: tuple[torch.Generator, torch.Generator] | None = None,
    tap: Callable[[Tensor, list[int]], object] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, list[int], list[int]]:
    """`speech_batch` + the valid frame and target counts as host ints (for the CTC loss,
    which would otherwise copy them back from the device: a synchronisation per step).
    `tap(audio (B, N) padded, sizes)` sees the audio the features are made of."""
    if aug is not None:
        assert gens is not None
        audio, sizes = augment_batch(data, index, aug, *gens)
        if aug.channel:
            audio, sizes = channel_batch(audio, sizes, aug, *gens)
        warp = None
        if aug.vtlp != (1.0, 1.0):
            u = torch.rand(len(index), generator=gens[0], dtype=torch.float64)
            warp = uniform(aug.vtlp, u).float().to(audio.device)
        feats, lengths = batched_features(audio, sizes, features, gens[1], warp)
    else:
        audio, sizes = padded_audio(data, index)
        feats, lengths = batched_features(audio, sizes, features, None)
    if tap is not None:
        tap(audio, sizes)
    valid = [features.valid_frames(n) for n in sizes]  # = lengths, on the host
    if aug is not None:
        feats = spec_augment(feats, valid, aug, gens[0])
    targets = torch.cat([data.targets[i] for i in index]).to(feats.device)
    n_targets = [len(data.targets[i]) for i in index]
    target_lengths = torch.tensor(n_targets, device=feats.device)
    return feats, lengths, targets, target_lengths, valid, n_targets
