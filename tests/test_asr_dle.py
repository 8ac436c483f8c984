"""Jasper / QuartzNet checkpoints in the DLE layout -> `speechrt convert` -> same log-probs.

The reference below is a DLE-layout module written for these tests: unfolded BatchNorm with random
running statistics, ReLU/Dropout modules between convs (hence conv.{4j} / mconv.{5j} indices),
masked convolutions that update lengths, dense or plain residuals as DLE wires them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from speechrt.cli import main
from speechrt.errors import SpeechRTError
from speechrt.models.jasper import PRESETS, Jasper, QuartzNet
from speechrt.repo import load_component

KEYS = Path(__file__).parent / "data" / "checkpoint_keys"
LABELS = [" ", *"abcdefghijklmnopqrstuvwxyz", "'"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Small CPU ops are dominated by thread hand-offs on a 2-core machine.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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


def preset_cfg(name: str) -> list[dict]:
    p = PRESETS[name]
    cols = zip(
        *(p[k] for k in ("filters", "kernels", "repeats", "strides", "dilations")), strict=True
    )
    return [
        block_cfg(f, k, r, s, d, sep, res != "none", res == "dense")
        for (f, k, r, s, d), sep, res in zip(cols, p["separable"], p["residual"], strict=True)
    ]


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
    from speechrt.audio.features import FeatureConfig, batch_features

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


def dle_config(kind: str, blocks: list[dict] | None = None) -> dict:
    enc = {"activation": "relu", "frame_splicing": 1, "in_feats": 64, "use_conv_masks": True}
    fb = {"sample_rate": 16000, "window_size": 0.02, "window_stride": 0.01, "n_fft": 512}
    fb.update(n_filt=64, window="hann", normalize="per_feature", pad_align=16, dither=1e-5)
    return {
        "labels": LABELS,
        kind: {"encoder": {**enc, "blocks": copy.deepcopy(blocks or TINY[kind])}},
        "input_val": {"filterbank_features": fb},
    }


def convert(tmp_path: Path, ckpt: dict, name: str = "ckpt") -> Path:
    src, out = tmp_path / f"{name}.pt", tmp_path / name
    torch.save(ckpt, src)
    assert main(["convert", str(src), str(out)]) == 0
    return out


def batch(seed: int = 3, lengths=(96, 61, 80)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths)
    x = torch.randn(len(lengths), 64, max(lengths), generator=g)
    t = torch.arange(x.shape[2])
    return x.masked_fill((t[None] >= lens[:, None])[:, None], 0), lens


def assert_same_outputs(ref: nn.Module, model: nn.Module, tol: float = 1e-5) -> None:
    x, lens = batch()
    with torch.no_grad():
        want, want_lens = ref(x, lens)
        got, got_lens = model(x, lens)
    assert torch.equal(want_lens, got_lens)
    assert got.shape == want.shape
    for i, n in enumerate(got_lens.tolist()):
        assert (got[i, :n] - want[i, :n]).abs().max().item() <= tol


@pytest.mark.parametrize(
    ("kind", "preset"), [("jasper", "jasper-10x5"), ("quartznet", "quartznet-15x5")]
)
def test_default_dims_layout_matches_published_keys(kind: str, preset: str) -> None:
    published = json.loads((KEYS / f"{kind}.json").read_text())["state_dict"]
    with torch.device("meta"):  # shapes only, no 333 M floats
        ref = DLEModel(kind, preset_cfg(preset))
    sd = ref.state_dict()
    assert {k: list(v.shape) for k, v in sd.items()} == published
    conv = (Jasper if kind == "jasper" else QuartzNet).from_dle({"state_dict": sd})
    assert conv.dims == (Jasper if kind == "jasper" else QuartzNet).Dims()  # preset inferred
    with torch.device("meta"):
        model = (Jasper if kind == "jasper" else QuartzNet)(conv.dims)
    model.load_state_dict(conv.state_dict, strict=True, assign=True)


@pytest.mark.parametrize("kind", ["jasper", "quartznet"])
def test_convert_matches_dle_module(tmp_path: Path, kind: str) -> None:
    ref = dle_model(kind)
    out = convert(tmp_path, {"state_dict": ref.state_dict(), "config": dle_config(kind)})
    model, info = load_component(out)
    assert info.kind == kind and model.role == "asr"
    assert info.meta["pad_leading"] == (16 if kind == "jasper" else 0)
    assert info.meta["labels"] == LABELS and info.meta["features"]["dither"] == 0.0
    assert_same_outputs(ref, model)


@pytest.mark.parametrize("kind", ["jasper", "quartznet"])
def test_convert_without_config_infers_strides(tmp_path: Path, kind: str) -> None:
    ref = dle_model(kind, seed=5)
    out = convert(tmp_path, {"state_dict": ref.state_dict(), "epoch": 3})
    model, info = load_component(out)
    assert info.dims["strides"][0] == 2 and 2 in info.dims["dilations"]
    assert_same_outputs(ref, model)


def test_ema_weights_preferred(tmp_path: Path) -> None:
    ref, other = dle_model("quartznet", seed=1), dle_model("quartznet", seed=2)
    ckpt = {"state_dict": other.state_dict(), "ema_state_dict": ref.state_dict(), "step": 10}
    model, info = load_component(convert(tmp_path, ckpt))
    assert info.meta["weights"] == "ema_state_dict"
    assert_same_outputs(ref, model)


def test_jasper_v1_keys(tmp_path: Path) -> None:
    ref = dle_model("jasper", seed=4)
    v1 = {}
    for k, v in ref.state_dict().items():
        k = k.replace("encoder.layers.", "jasper_encoder.encoder.")
        v1["module." + k.replace("decoder.layers.", "jasper_decoder.decoder_layers.")] = v
    v1["audio_preprocessor.featurizer.fb"] = torch.zeros(1, 64, 257)
    model, _ = load_component(convert(tmp_path, {"state_dict": v1}))
    assert_same_outputs(ref, model)


@pytest.mark.parametrize("kind", ["jasper", "quartznet"])
def test_batched_equals_single(tmp_path: Path, kind: str) -> None:
    model, _ = load_component(convert(tmp_path, {"state_dict": dle_model(kind).state_dict()}))
    x, lens = batch(seed=9, lengths=(112, 37, 80, 64))
    with torch.no_grad():
        full, full_lens = model(x, lens)
        for i, n in enumerate(lens.tolist()):
            t = -(-n // 16) * 16  # the item alone, padded as the pipeline pads it
            one, one_lens = model(x[i : i + 1, :, :t], lens[i : i + 1])
            assert one_lens.item() == full_lens[i].item()
            # valid frames and the padded tail that DLE decodes at batch size 1
            assert (one[0] - full[i, : one.shape[1]]).abs().max().item() <= 1e-5


def test_bad_checkpoints(tmp_path: Path) -> None:
    sd = dle_model("jasper").state_dict()
    del sd["encoder.layers.2.conv.5.running_var"]
    torch.save({"state_dict": sd}, tmp_path / "a.pt")
    assert main(["convert", str(tmp_path / "a.pt"), str(tmp_path / "a")]) == 2
    sd = dle_model("quartznet").state_dict()
    sd["encoder.layers.1.extra.weight"] = torch.zeros(3)
    with pytest.raises(SpeechRTError, match="unexpected key"):
        QuartzNet.from_dle({"state_dict": sd})
    cfg = dle_config("jasper")
    cfg["jasper"]["encoder"]["blocks"][2]["filters"] = 99
    with pytest.raises(SpeechRTError, match="block 2"):
        Jasper.from_dle({"state_dict": dle_model("jasper").state_dict(), "config": cfg})


@pytest.mark.slow
def test_quartznet_15x5_default_dims(tmp_path: Path) -> None:
    ref = dle_model("quartznet", blocks=preset_cfg("quartznet-15x5"))
    out = convert(tmp_path, {"ema_state_dict": ref.state_dict()})
    model, info = load_component(out)
    assert info.dims == {
        k: list(v) if isinstance(v, tuple) else v for k, v in PRESETS["quartznet-15x5"].items()
    }
    assert_same_outputs(ref, model)
