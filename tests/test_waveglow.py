"""WaveGlow: DLE checkpoint layout, conversion, DLE's inference math and batch independence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dle_waveglow import TINY, dle_shapes, dle_state_dict
from speechrt import cli
from speechrt.convert.waveglow import from_dle
from speechrt.models.waveglow import WaveGlow, WaveGlowDims
from speechrt.options import SynthesisOptions
from speechrt.repo import load_component

KEYS = Path(__file__).parent / "data" / "checkpoint_keys"


@pytest.fixture(autouse=True)
def _fast_cpu(monkeypatch):
    # oneDNN builds a new primitive for every conv shape: seconds for a tiny model's first call
    # (mkldnn is on again after the test)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


def convert(monkeypatch, ckpt: Path, out: Path) -> int:
    """`speechrt convert CKPT OUT` through the CLI (other subcommands need not exist here)."""
    monkeypatch.setattr(cli, "COMMANDS", {"convert": cli.COMMANDS["convert"]})
    return cli.main(["convert", str(ckpt), str(out)])


def dle_infer(sd: dict, hp: dict, mel: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    """DLE's WaveGlow.infer, on a DLE-layout state dict, noise from the global RNG."""
    n_group, every, size, n_layers = 8, 4, 2, hp["n_layers"]
    c = hp["n_channels"]

    def conv(name, x, **kw):  # a weight-normed conv as torch computes it
        w = torch._weight_norm(sd[name + ".weight_v"], sd[name + ".weight_g"], 0)
        return F.conv1d(x, w, sd[name + ".bias"], **kw)

    def wn(f, audio, spect):
        audio, output = conv(f"WN.{f}.start", audio), 0
        for i in range(n_layers):
            a = conv(f"WN.{f}.in_layers.{i}", audio, dilation=2**i, padding=2**i)
            a = a + conv(f"WN.{f}.cond_layers.{i}", spect)
            acts = torch.tanh(a[:, :c]) * torch.sigmoid(a[:, c:])
            rs = conv(f"WN.{f}.res_skip_layers.{i}", acts)
            if i < n_layers - 1:
                audio, rs = rs[:, :c] + audio, rs[:, c:]
            output = output + rs
        return F.conv1d(output, sd[f"WN.{f}.end.weight"], sd[f"WN.{f}.end.bias"])

    spect = F.conv_transpose1d(mel, sd["upsample.weight"], sd["upsample.bias"], stride=256)
    spect = spect[:, :, : -(1024 - 256)]
    spect = spect.unfold(2, n_group, n_group).permute(0, 2, 1, 3)
    spect = spect.contiguous().view(spect.size(0), spect.size(1), -1).permute(0, 2, 1)
    torch.manual_seed(seed)
    audio = sigma * torch.randn(mel.shape[0], 4, spect.size(2))
    for k in reversed(range(12)):
        n_half = audio.size(1) // 2
        out = wn(k, audio[:, :n_half], spect)
        a1 = (audio[:, n_half:] - out[:, :n_half]) / torch.exp(out[:, n_half:])
        w_inv = sd[f"convinv.{k}.conv.weight"].squeeze().float().inverse().unsqueeze(-1)
        audio = F.conv1d(torch.cat([audio[:, :n_half], a1], 1), w_inv)
        if k % every == 0 and k > 0:
            audio = torch.cat((sigma * torch.randn(mel.shape[0], size, spect.size(2)), audio), 1)
    return audio.permute(0, 2, 1).contiguous().view(audio.size(0), -1)


def config(**hp) -> dict:
    return {"n_mel_channels": hp["n_mel_channels"], "n_flows": 12, "n_group": 8,
            "n_early_every": 4, "n_early_size": 2,
            "WN_config": {"n_layers": hp["n_layers"], "kernel_size": 3,
                          "n_channels": hp["n_channels"]}}  # fmt: skip


def tiny_model(n_channels: int = 8) -> WaveGlow:
    conv = from_dle({"state_dict": dle_state_dict(**{**TINY, "n_channels": n_channels})})
    model = WaveGlow(conv.dims).eval()
    model.load_state_dict(conv.state_dict)
    return model


@pytest.mark.parametrize("name,channels", [("waveglow", 512), ("waveglow256", 256)])
def test_layout_and_conversion_at_default_dims(name: str, channels: int) -> None:
    published = json.loads((KEYS / f"{name}.json").read_text())["state_dict"]
    shapes = dle_shapes(n_channels=channels)
    assert shapes == published
    # convert on the meta device (the 512-channel model has 268 M parameters)
    sd = {k: torch.empty(s, device="meta") for k, s in shapes.items()}
    conv = from_dle({"state_dict": {"module." + k: v for k, v in sd.items()}})
    assert conv.dims == WaveGlowDims(n_channels=channels)
    with torch.device("meta"):
        model = WaveGlow(conv.dims)
    model.load_state_dict(conv.state_dict, strict=True)
    assert conv.mel is not None and conv.mel.n_mels == 80 and conv.mel.fmax == 8000.0


@pytest.mark.parametrize("channels,with_config", [(8, True), (16, False)])
def test_convert_cli_roundtrip_matches_dle(
    tmp_path: Path, monkeypatch, channels: int, with_config: bool
) -> None:
    hp = {**TINY, "n_channels": channels}
    sd = dle_state_dict(**hp)
    ckpt = {"state_dict": {"module." + k: v for k, v in sd.items()}, "epoch": 3}
    if with_config:
        ckpt["config"] = config(**hp)
    torch.save(ckpt, tmp_path / "wg.pt")
    assert convert(monkeypatch, tmp_path / "wg.pt", tmp_path / "wg") == 0
    loaded, info = load_component(tmp_path / "wg")
    assert info.kind == "waveglow" and info.dims["n_channels"] == channels
    conv = from_dle(torch.load(tmp_path / "wg.pt", weights_only=True))
    memory = WaveGlow(conv.dims).eval()
    memory.load_state_dict(conv.state_dict)

    mel = torch.randn(1, 8, 5)
    opts = SynthesisOptions(sigma=0.6)
    a, n = loaded.mel_to_audio(mel, torch.tensor([5]), opts, torch.tensor([7]))
    b, _ = memory.mel_to_audio(mel, torch.tensor([5]), opts, torch.tensor([7]))
    assert a.shape == (1, 5 * 256) and n.tolist() == [5 * 256]
    assert a.abs().max() > 1e-3
    assert (a - b).abs().max() <= 1e-5
    # equals DLE's infer at batch size 1 after torch.manual_seed(seed)
    ref = dle_infer(sd, hp, mel, 0.6, 7)
    assert (a - ref).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item())


def test_infer_with_noise_matches_infer_onnx_convention() -> None:
    model = tiny_model()
    mel, sigma, seed = torch.randn(1, 8, 3), 0.7, 11
    audio, _ = model.mel_to_audio(
        mel, torch.tensor([3]), SynthesisOptions(sigma=sigma), torch.tensor([seed])
    )
    g = torch.Generator().manual_seed(seed)
    z0, z1, z2 = (torch.randn(c, 96, generator=g) for c in (4, 2, 2))
    z = torch.cat((z0, sigma * z1, sigma * z2)).unsqueeze(0)  # DLE infer_onnx layout
    assert torch.equal(model.infer_with_noise(mel, z, sigma), audio)


def test_batched_equals_single() -> None:
    model = tiny_model(16)
    lengths = torch.tensor([6, 2, 4])
    mel = torch.randn(3, 8, 6)
    mel[1, :, 2:] = 50.0  # padding garbage must not leak
    seeds = torch.tensor([3, 4, 5])
    audio, n = model.mel_to_audio(mel, lengths, SynthesisOptions(), seeds)
    assert n.tolist() == [1536, 512, 1024]
    for i in range(3):
        t = int(lengths[i])
        alone, _ = model.mel_to_audio(mel[i : i + 1, :, :t], lengths[i : i + 1],
                                      SynthesisOptions(), seeds[i : i + 1])  # fmt: skip
        assert (audio[i, : t * 256] - alone[0]).abs().max() <= 1e-5
        assert not audio[i, t * 256 :].any()


def test_seeds_and_sigma() -> None:
    model = tiny_model()
    mel, lengths = torch.randn(1, 8, 3).expand(2, -1, -1), torch.tensor([3, 3])
    a, _ = model.mel_to_audio(mel, lengths, SynthesisOptions(seed=5))
    b, _ = model.mel_to_audio(mel, lengths, SynthesisOptions(), torch.tensor([5, 6]))
    c, _ = model.mel_to_audio(mel, lengths, SynthesisOptions(seed=6))
    assert torch.equal(a, b) and not torch.equal(a[0], c[0])
    assert torch.equal(a[1], c[0])  # item i draws from seed + i
    silent, _ = model.mel_to_audio(mel, lengths, SynthesisOptions(sigma=0.0))
    again, _ = model.mel_to_audio(mel, lengths, SynthesisOptions(sigma=0.0, seed=9))
    assert torch.equal(silent, again)  # sigma 0: no noise at all


def test_bad_input() -> None:
    from speechrt.errors import SpeechRTError

    model = tiny_model()
    with pytest.raises(SpeechRTError):
        model.mel_to_audio(torch.randn(1, 80, 3), torch.tensor([3]), SynthesisOptions())
    with pytest.raises(SpeechRTError):
        model.mel_to_audio(torch.randn(1, 8, 3), torch.tensor([4]), SynthesisOptions())
    with pytest.raises(SpeechRTError):
        from_dle({"generator": {}})
