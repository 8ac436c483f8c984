"""The ASR featurizer on a device: host windows -> one padded batch -> `BatchLogMel` -> features.

The eager and cuda backends compute features in torch with the batched log-mel (the onnx
backend with speechrt.audio.features.log_mel_numpy, which it is tested against). The
windows are packed into one host array (pinned on a GPU) and copied to the device once. On the
cuda backend the log-mel is compiled and replayed as one CUDA graph per bucket shape: the batch
goes to its "batch" bucket and the samples to the "feature_frames" bucket times the hop, so the
featurizer's shapes follow the acoustic runner's. Padding rows are silence of the bucket's
length; every output is cropped back to the true (B, n_mels, T) and copied out of graph memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from speechrt.audio.features import FeatureConfig, check_length
from speechrt.audio.mel import mel_filterbank
from speechrt.errors import SpeechRTError
from speechrt.runtime.buckets import Buckets
from speechrt.runtime.cuda import CapturedGraphs, CudaRunner, compile_fn
from speechrt.runtime.eager import to_contract


class BatchLogMel(nn.Module):
    """`log_mel_numpy` of a padded batch in torch: every item on its own samples, all items in
    one pass.

    forward(audio (B, N) float, lengths (B,) int64 >= cfg.min_samples, noise (B, N) | None)
        -> features (B, n_mels, padded_frames(N)), valid frames (B,) int64

    Samples of an item past its length are ignored (any finite values); its frames from
    valid_frames(length) on are zero. `noise`: the item's dither noise (standard normal, as
    `Featurizer` draws it from the item's generator) in its first `length` samples; required when
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
        pad = cfg.n_fft // 2
        if cfg.center_pad == "zeros":  # NeMo: zeros past each item's end, zeros each side
            x = x * (torch.arange(N, device=x.device)[None, :] < n)
            x = nn.functional.pad(x, (pad, pad))
        else:
            # centre=True with reflect padding, each item reflected at its own end: pad samples
            # x[pad], ..., x[1] before every row, and after item i's n samples x[n-2], ...,
            # x[n-1-pad] (written over its padding; its frames past 1 + n // hop read what is
            # left there).
            x = torch.cat((x[:, 1 : pad + 1].flip(1), x, x.new_zeros(B, pad)), dim=1)
            k = torch.arange(pad, device=x.device)[None, :]  # (1, pad)
            tail = x.gather(1, n - 2 - k + pad)  # (B, pad): x[n - 2 - k], in padded coordinates
            x = x.scatter(1, n + pad + k, tail)  # (B, N + 2 pad)
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
        if cfg.valid_rule == "floor":  # (B,) = valid_frames
            valid = lengths // cfg.hop_length
        else:
            valid = (lengths + cfg.hop_length - 1) // cfg.hop_length
        keep = (torch.arange(T, device=x.device)[None, :] < valid[:, None])[:, None, :]
        count = valid[:, None, None].to(mel.dtype)  # (B, 1, 1)
        mean = torch.where(keep, mel, 0.0).sum(dim=2, keepdim=True) / count
        centred = torch.where(keep, mel - mean, 0.0)
        std = (centred.square().sum(dim=2, keepdim=True) / (count - 1)).sqrt()  # unbiased
        mel = centred / (std + cfg.std_eps)
        return nn.functional.pad(mel, (0, cfg.padded_frames(N) - T)), valid


class Featurizer:
    """Windows (N_i,) float32 -> features (B, n_mels, T) and valid frames (B,) on `device`.

    T = cfg.padded_frames(max N_i), as `batch_features_numpy`. buckets None: every call at its own
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

    def host_batch(
        self,
        audios: Sequence[np.ndarray],
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> tuple[list[Tensor], int, int]:
        """The log-mel's arguments for these windows at their bucket shape (b, n): audio (b, n)
        and lengths (b,) in host memory (pinned on a GPU), dither noise (b, n) on the device;
        and the true B windows, N samples. generators: one per window (cfg.dither > 0)."""
        lengths = [a.shape[0] for a in audios]
        if not lengths:
            raise SpeechRTError("no audio to featurise")
        check_length(min(lengths), self.cfg)
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
        args = [host, host_lengths]
        if self.cfg.dither > 0:
            if generators is None or len(generators) != B:
                raise SpeechRTError("dither is on: give one generator per window")
            noise = torch.zeros((b, n), device=self.device)  # (b, n); each window its own draw
            for i, g in enumerate(generators):
                noise[i, : lengths[i]] = torch.randn(lengths[i], generator=g, device=self.device)
            args.append(noise)
        return args, B, N

    @torch.inference_mode()
    def __call__(
        self,
        audios: Sequence[np.ndarray],
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """generators: one per window, each draws its window's dither noise (cfg.dither > 0)."""
        args, B, N = self.host_batch(audios, generators)
        if not self.graphs:  # a replayed graph copies host inputs into its own buffers
            args = [x.to(self.device, non_blocking=True) for x in args]
        feats, valid = self.fn(*args)  # (b, n_mels, padded_frames(n)), (b,)
        feats, valid = feats[:B, :, : self.cfg.padded_frames(N)], valid[:B]
        if self.graphs:  # the next replay overwrites the graph's outputs
            return feats.clone(), valid.clone()
        return feats.contiguous(), valid


class FeaturesToLogProbs:
    """The cuda backend's acoustic front in one CUDA graph: the featurizer's log-mel, the
    leading padding frames and the acoustic runner's compiled graph, replayed per (batch,
    samples, feature frames) bucket. What runs is what `Featurizer` then `CudaRunner.run` run
    (the same compiled modules on the same values); one graph launch replaces two, and the
    features are never cropped, copied out and padded again between them.

    __call__(windows, generators) -> the graph's outputs (log_probs (B, T', V) and
    log_prob_lengths (B,), ...) on the device, cropped to the windows' true sizes as the runner
    crops them. Uncompiled (a runner
    and featurizer without graphs, e.g. on the CPU) it runs the same steps unreplayed.
    """

    def __init__(self, featurizer: Featurizer, runner: CudaRunner, pad_leading: int) -> None:
        self.featurizer, self.runner, self.pad_leading = featurizer, runner, pad_leading
        graphs = featurizer.graphs and runner.graphs
        # the compiled callables inside the two CapturedGraphs; uncompiled: the modules
        log_mel, acoustic = featurizer.fn, runner.compiled["graph"]
        if graphs:
            assert isinstance(log_mel, CapturedGraphs) and isinstance(acoustic, CapturedGraphs)
            log_mel, acoustic = log_mel.fn, acoustic.fn
        contract, device = runner.contract, featurizer.device

        def forward(frames: int, audio: Tensor, lengths: Tensor, *noise: Tensor) -> Any:
            feats, valid = log_mel(audio, lengths, *noise)  # (b, n_mels, padded_frames(n))
            keep = frames - pad_leading  # frames past the true ones are zero: crop or pad them
            feats = feats[:, :, :keep]
            feats = nn.functional.pad(feats, (pad_leading, keep - feats.shape[2]))
            return to_contract(contract, acoustic(feats, valid + pad_leading))

        def uncompiled(frames: int, *args: Tensor) -> Any:
            return forward(frames, *(x.to(device) for x in args))

        self.graph = CapturedGraphs(forward, device) if graphs else uncompiled

    @torch.inference_mode()
    def __call__(
        self,
        audios: Sequence[np.ndarray],
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> dict[str, Tensor]:
        """-> the acoustic graph's outputs (log_probs, log_prob_lengths, ...)"""
        args, B, N = self.featurizer.host_batch(audios, generators)
        true = {
            "batch": B,
            "feature_frames": self.featurizer.cfg.padded_frames(N) + self.pad_leading,
        }
        frames = self.runner.buckets.size("feature_frames", true["feature_frames"])
        return self.runner.crop(self.graph(frames, *args), self.runner.with_derived(true))


def batch_features(
    audios: Sequence[Tensor],
    cfg: FeatureConfig,
    generators: Sequence[torch.Generator | None] | None = None,
) -> tuple[Tensor, Tensor]:
    """(N_i,) waveforms -> features (B, n_mels, T) and valid frame counts (B,) int64 on the
    waveforms' device, T = the largest padded_frames(N_i): `Featurizer` on tensors (training
    and tests). generators: one per waveform, each draws its dither noise (cfg.dither > 0)."""
    device = audios[0].device if audios else torch.device("cpu")
    windows = [a.detach().float().cpu().numpy() for a in audios]
    feats, valid = Featurizer(cfg, device)(windows, generators)
    return feats.clone(), valid.clone()  # ordinary tensors, not inference-mode ones


def make_featurizer(cfg: FeatureConfig, backend: str, device: torch.device) -> Featurizer:
    """The featurizer of a pipeline on `backend`: compiled and bucketed on cuda, else as is."""
    if backend == "cuda":
        return Featurizer(cfg, device, Buckets(), "reduce-overhead")
    return Featurizer(cfg, device)
