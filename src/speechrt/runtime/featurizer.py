"""The ASR featurizer on a device: host windows -> one padded batch -> `BatchLogMel` -> features.

Every backend computes features in torch with the batched log-mel (speechrt.audio.features). The
windows are packed into one host array (pinned on a GPU) and copied to the device once. On the
cuda backend the log-mel is compiled and replayed as one CUDA graph per bucket shape: the batch
goes to its "batch" bucket and the samples to the "feature_frames" bucket times the hop, so the
featurizer's shapes follow the acoustic runner's. Padding rows are silence of the bucket's
length; every output is cropped back to the true (B, n_mels, T) and copied out of graph memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from speechrt.audio.features import FeatureConfig
from speechrt.audio.mel import mel_filterbank
from speechrt.errors import SpeechRTError
from speechrt.runtime.buckets import Buckets
from speechrt.runtime.cuda import compile_fn


class BatchLogMel(nn.Module):
    """`log_mel` of a padded batch: every item on its own samples, all items in one pass.

    forward(audio (B, N) float, lengths (B,) int64 >= cfg.min_samples, noise (B, N) | None)
        -> features (B, n_mels, padded_frames(N)), valid frames (B,) int64

    Samples of an item past its length are ignored (any finite values); its frames from
    valid_frames(length) on are zero. `noise`: the item's dither noise (standard normal, as
    `log_mel` draws it from the item's generator) in its first `length` samples; required when
    cfg.dither > 0, ignored otherwise. The window and mel basis are buffers, so the module moves
    to a device with `.to` and compiles as a whole.
    """

    def __init__(self, cfg: FeatureConfig) -> None:
        super().__init__()
        self.cfg = cfg
        fb = mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax)
        self.window: Tensor
        self.mel_basis: Tensor
        self.register_buffer("window", torch.hann_window(cfg.win_length, periodic=False), False)
        self.register_buffer("mel_basis", torch.from_numpy(fb), False)  # (n_mels, n_fft // 2 + 1)

    def forward(
        self, audio: Tensor, lengths: Tensor, noise: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        cfg = self.cfg
        B, N = audio.shape
        x = audio.float()
        n = lengths[:, None]  # (B, 1)
        if cfg.dither > 0:
            if noise is None:
                raise SpeechRTError("dither is on: BatchLogMel needs each item's noise")
            x = x + cfg.dither * noise
        if cfg.preemph:  # sample t depends on t and t - 1 only: padding never leaks in
            x = torch.cat((x[:, :1], x[:, 1:] - cfg.preemph * x[:, :-1]), dim=1)
        # centre=True with reflect padding, each item reflected at its own end: pad samples
        # x[pad], ..., x[1] before every row, and after item i's n samples x[n-2], ..., x[n-1-pad]
        # (written over its padding; its frames past 1 + n // hop read what is left there).
        pad = cfg.n_fft // 2
        x = torch.cat((x[:, 1 : pad + 1].flip(1), x, x.new_zeros(B, pad)), dim=1)  # (B, N + 2 pad)
        k = torch.arange(pad, device=x.device)[None, :]  # (1, pad)
        tail = x.gather(1, n - 2 - k + pad)  # (B, pad): x[n - 2 - k], in padded coordinates
        x = x.scatter(1, n + pad + k, tail)
        spec = torch.stft(
            x,
            n_fft=cfg.n_fft,
            hop_length=cfg.hop_length,
            win_length=cfg.win_length,
            window=self.window,
            center=False,
            return_complex=True,
        )  # (B, n_fft // 2 + 1, 1 + N // hop)
        power = spec.real.square() + spec.imag.square()
        mel = torch.log(self.mel_basis @ power + cfg.log_guard)  # (B, n_mels, T)
        T = mel.shape[2]
        valid = (lengths + cfg.hop_length - 1) // cfg.hop_length  # (B,) = valid_frames
        keep = (torch.arange(T, device=x.device)[None, :] < valid[:, None])[:, None, :]
        count = valid[:, None, None].to(mel.dtype)  # (B, 1, 1)
        mean = torch.where(keep, mel, 0.0).sum(dim=2, keepdim=True) / count
        centred = torch.where(keep, mel - mean, 0.0)
        std = (centred.square().sum(dim=2, keepdim=True) / (count - 1)).sqrt()  # unbiased
        mel = centred / (std + cfg.std_eps)
        return nn.functional.pad(mel, (0, cfg.padded_frames(N) - T)), valid


class Featurizer:
    """Windows (N_i,) float32 -> features (B, n_mels, T) and valid frames (B,) on `device`.

    T = cfg.padded_frames(max N_i), as `batch_features`. buckets None: every call at its own
    shape; compile_mode: `compile_fn`'s mode (None = run the module as it is).
    """

    def __init__(
        self,
        cfg: FeatureConfig,
        device: torch.device,
        buckets: Buckets | None = None,
        compile_mode: str | None = None,
    ) -> None:
        self.cfg, self.device, self.buckets = cfg, device, buckets
        self.module = BatchLogMel(cfg).to(device).eval()
        self.fn = compile_fn(self.module, compile_mode, device)
        self.graphs = compile_mode == "reduce-overhead"  # outputs live in graph memory

    def padded_shape(self, B: int, N: int) -> tuple[int, int]:
        """(batch, samples) the log-mel runs at for B windows of at most N samples."""
        if self.buckets is None:
            return B, N
        hop = self.cfg.hop_length
        frames = self.buckets.size("feature_frames", -(-N // hop))
        return self.buckets.size("batch", B), frames * hop

    @torch.inference_mode()
    def __call__(
        self,
        audios: Sequence[np.ndarray],
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """generators: one per window, each draws its window's dither noise (cfg.dither > 0)."""
        lengths = [a.shape[0] for a in audios]
        if not lengths:
            raise SpeechRTError("no audio to featurise")
        if min(lengths) < self.cfg.min_samples:
            raise SpeechRTError(f"audio too short: {min(lengths)} samples")
        B, N = len(lengths), max(lengths)
        b, n = self.padded_shape(B, N)
        pin = self.device.type == "cuda"
        host = torch.empty((b, n), dtype=torch.float32, pin_memory=pin)
        rows = host.numpy()
        for i, a in enumerate(audios):  # each sample written once: the window, then silence
            rows[i, : lengths[i]] = a
            rows[i, lengths[i] :] = 0.0
        rows[B:] = 0.0
        host_lengths = torch.tensor(lengths + [n] * (b - B), dtype=torch.long, pin_memory=pin)
        audio = host.to(self.device, non_blocking=True)  # (b, n)
        args = [audio, host_lengths.to(self.device, non_blocking=True)]  # + lengths (b,)
        if self.cfg.dither > 0:
            if generators is None or len(generators) != B:
                raise SpeechRTError("dither is on: give one generator per window")
            noise = torch.zeros((b, n), device=self.device)  # (b, n); each window its own draw
            for i, g in enumerate(generators):
                noise[i, : lengths[i]] = torch.randn(lengths[i], generator=g, device=self.device)
            args.append(noise)
        feats, valid = self.fn(*args)  # (b, n_mels, padded_frames(n)), (b,)
        feats, valid = feats[:B, :, : self.cfg.padded_frames(N)], valid[:B]
        if self.graphs:  # the next replay overwrites the graph's outputs
            return feats.clone(), valid.clone()
        return feats.contiguous(), valid


def make_featurizer(cfg: FeatureConfig, backend: str, device: torch.device) -> Featurizer:
    """The featurizer of a pipeline on `backend`: compiled and bucketed on cuda, else as is."""
    if backend == "cuda":
        return Featurizer(cfg, device, Buckets(), "reduce-overhead")
    return Featurizer(cfg, device)
