"""Jasper / QuartzNet in the DLE layout, written for the tests: a DLE-layout reference module
(unfolded BatchNorm with random running statistics, ReLU/Dropout modules between convs, hence
conv.{4j} / mconv.{5j} indices, masked convolutions that update lengths, dense or plain
residuals as DLE wires them), tiny block configs, speech-like audio and a talkative model."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

LABELS = [" ", *"abcdefghijklmnopqrstuvwxyz", "'"]


def block_cfg(f, k, repeat, stride=1, dil=1, sep=False, res=False, dense=False) -> dict:
    cfg = {"filters": f, "kernel_size": [k], "repeat": repeat, "stride": [stride]}
    cfg.update(dilation=[dil], residual=res, dropout=0.1, separable=sep)
    return {**cfg, "residual_dense": dense} if dense else cfg


TINY = {
    "jasper": [
        block_cfg(16, 5, 1, stride=2),
        block_cfg(16, 5, 2, res=True, dense=True),
        block_cfg(24, 7, 2, res=True, dense=True),
        block_cfg(24, 7, 3, res=True, dense=True),
        block_cfg(32, 9, 1, dil=2),
        block_cfg(40, 1, 1),
    ],
    "quartznet": [
        block_cfg(16, 7, 1, stride=2, sep=True),
        block_cfg(16, 9, 3, sep=True, res=True),
        block_cfg(24, 11, 2, sep=True, res=True),
        block_cfg(24, 13, 1, dil=2, sep=True),
        block_cfg(40, 1, 1),
    ],
}


class DLEBlock(nn.Module):
    def __init__(self, c_in: int, cfg: dict, panes: list[int], name: str) -> None:
        super().__init__()
        f, k, d = cfg["filters"], cfg["kernel_size"][0], cfg["dilation"][0]
        s, pad = cfg["stride"][0], (cfg["kernel_size"][0] // 2) * cfg["dilation"][0]
        mods: list[nn.Module] = []
        for j in range(cfg["repeat"]):
            ci = c_in if j == 0 else f
            if cfg["separable"]:
                mods.append(nn.Conv1d(ci, ci, k, s, pad, d, groups=ci, bias=False))
                mods.append(nn.Conv1d(ci, f, 1, bias=False))
            else:
                mods.append(nn.Conv1d(ci, f, k, s, pad, d, bias=False))
            mods.append(nn.BatchNorm1d(f, eps=1e-3))
            if j < cfg["repeat"] - 1:
                mods += [nn.ReLU(), nn.Dropout(0.1)]
        self.name = name
        setattr(self, name, nn.ModuleList(mods))
        self.dense = cfg["residual"] and bool(panes)
        srcs = panes if self.dense else [c_in] if cfg["residual"] else []
        self.res = nn.ModuleList(
            nn.ModuleList([nn.Conv1d(c, f, 1, bias=False), nn.BatchNorm1d(f, eps=1e-3)])
            for c in srcs
        )

    @staticmethod
    def masked(conv: nn.Conv1d, x: torch.Tensor, lens: torch.Tensor):
        t = torch.arange(x.shape[2])
        x = x.masked_fill((t[None] >= lens[:, None])[:, None], 0)
        p, k, d, s = conv.padding[0], conv.kernel_size[0], conv.dilation[0], conv.stride[0]
        return conv(x), (lens + 2 * p - d * (k - 1) - 1) // s + 1

    def forward(self, xs: list[torch.Tensor], lens: torch.Tensor):
        out, out_lens = xs[-1], lens
        for m in getattr(self, self.name):
            if isinstance(m, nn.Conv1d):
                out, out_lens = self.masked(m, out, out_lens)
            else:
                out = m(out)
        for i, (conv, bn) in enumerate(self.res):
            out = out + bn(self.masked(conv, xs[i], lens)[0])
        out = torch.relu(out)
        return (xs + [out] if self.dense else [out]), out_lens


class DLEEncoder(nn.Module):
    def __init__(self, n_feats: int, blocks: list[dict], name: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        panes: list[int] = []
        c_in = n_feats
        for cfg in blocks:
            if cfg.get("residual_dense"):
                panes = panes + [c_in]
            self.layers.append(
                DLEBlock(c_in, cfg, panes if cfg.get("residual_dense") else [], name)
            )
            c_in = cfg["filters"]


class DLEModel(nn.Module):
    """The DLE module tree: encoder.layers.{b}.(m)conv / res, decoder.layers.0."""

    def __init__(self, kind: str, blocks: list[dict], n_feats: int = 64, n_classes: int = 29):
        super().__init__()
        self.encoder = DLEEncoder(n_feats, blocks, "conv" if kind == "jasper" else "mconv")
        self.decoder = nn.Module()
        self.decoder.layers = nn.Sequential(nn.Conv1d(blocks[-1]["filters"], n_classes, 1))

    def forward(self, x: torch.Tensor, lens: torch.Tensor):
        xs = [x]
        for layer in self.encoder.layers:
            xs, lens = layer(xs, lens)
        logits = self.decoder.layers(xs[-1]).transpose(1, 2)
        return torch.log_softmax(logits, dim=-1), lens


def randomize_bn(model: nn.Module, gen: torch.Generator) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=gen) * 0.2)
            m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=gen) * 0.2)
    return model.eval()


def dle_model(kind: str, seed: int = 0, blocks: list[dict] | None = None) -> DLEModel:
    torch.manual_seed(seed)
    model = DLEModel(kind, blocks or TINY[kind])
    return randomize_bn(model, torch.Generator().manual_seed(seed + 1))


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Tone bursts and near-silence of random lengths: enough structure for varied output."""
    rng = np.random.default_rng(seed)
    parts, total = [], int(seconds * 16000)
    while sum(map(len, parts)) < total:
        n = int(rng.uniform(0.05, 0.4) * 16000)
        if rng.random() < 0.3:
            parts.append(0.003 * rng.standard_normal(n))
        else:
            tone = np.sin(2 * np.pi * rng.uniform(100, 3000) * np.arange(n) / 16000)
            parts.append(0.3 * tone * np.hanning(n) + 0.01 * rng.standard_normal(n))
    return np.concatenate(parts)[:total].astype(np.float32)


DECODER_GAIN = 3.0  # the talkative model's logits are this much sharper (and so are fp32 errors)


def talkative_model(kind: str) -> DLEModel:
    """A tiny model that emits varied words: BatchNorm statistics measured on speech-like
    features (so activations are normalised, not constant), decoder sharpened, spaces favoured."""
    from speechrt.audio.features import FeatureConfig
    from speechrt.runtime.featurizer import batch_features

    ref = dle_model(kind)
    waves = [torch.from_numpy(speechlike(s, 100 + i)) for i, s in enumerate((3.0, 2.0, 4.0))]
    feats, lens = batch_features(waves, FeatureConfig())
    for m in ref.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batch
    with torch.no_grad():
        ref.train()(feats, lens)
        ref.eval()
        ref.decoder.layers[0].weight *= DECODER_GAIN
        ref.decoder.layers[0].bias[0] += 2.0 if kind == "jasper" else 3.0
    return ref


def dle_features(x: np.ndarray) -> np.ndarray:
    """DLE's FilterbankFeatures (the dle_config above, no dither) written out by hand: float64,
    a frame loop, numpy's FFT. (N,) -> (64, 1 + N // 160), zero past the ceil(N / 160) valid
    frames; not yet padded to a multiple of pad_align."""
    from speechrt.audio.mel import mel_filterbank

    x = x.astype(np.float64)
    y = np.concatenate([x[:1], x[1:] - 0.97 * x[:-1]])
    y = np.pad(y, 256, mode="reflect")
    window = np.zeros(512)
    window[96 : 96 + 320] = np.hanning(320)  # symmetric Hann, centred in n_fft
    n_frames = 1 + len(x) // 160
    frames = np.stack([y[i * 160 : i * 160 + 512] * window for i in range(n_frames)], axis=1)
    power = np.abs(np.fft.rfft(frames, axis=0)) ** 2
    fb = mel_filterbank(16000, 512, 64, 0.0, 8000.0).astype(np.float64)  # == librosa
    mel = np.log(fb @ power + 1e-20)
    valid = int(np.ceil(len(x) / 160))
    m = mel[:, :valid]
    mel = (mel - m.mean(axis=1, keepdims=True)) / (m.std(axis=1, ddof=1, keepdims=True) + 1e-5)
    mel[:, valid:] = 0
    return mel


PAD_LEADING = {"jasper": 16, "quartznet": 0}  # zero frames DLE's inference.py prepends


def dle_inference(kind: str, model: DLEModel, x: np.ndarray) -> tuple[str, np.ndarray]:
    """DLE's inference.py on one file at batch size 1: features of the whole file, padded to a
    multiple of 16 frames, PAD_LEADING zero frames prepended, the model, then greedy CTC over
    every output frame (the padded tail too: DLE decodes it).
    -> (its transcript, words split by single spaces; log-probs (T', 29))."""
    pad_leading = PAD_LEADING[kind]
    feats = dle_features(x)
    valid = int(np.ceil(len(x) / 160))
    feats = np.pad(feats, ((0, 0), (pad_leading, -feats.shape[1] % 16)))
    with torch.no_grad():
        log_probs, _ = model(
            torch.from_numpy(feats).float()[None], torch.tensor([valid + pad_leading])
        )
    lp = log_probs[0].numpy()
    blank, ids, last = lp.shape[1] - 1, [], -1
    for i in lp.argmax(1).tolist():  # collapse repeats, drop blanks
        if i != last and i != blank:
            ids.append(i)
        last = i
    return " ".join("".join(LABELS[i] for i in ids).split()), lp
