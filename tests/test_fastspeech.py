"""FastSpeech: DLE checkpoint layout, conversion, DLE's inference math, batch independence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dle_fastspeech import TINY, dle_shapes, dle_state_dict, dle_table
from speechrt import cli
from speechrt.convert.fastspeech import from_dle
from speechrt.errors import SpeechRTError
from speechrt.models.fastspeech import FastSpeech, FastSpeechDims
from speechrt.options import SynthesisOptions
from speechrt.repo import load_component

KEYS = Path(__file__).parent / "data" / "checkpoint_keys"


@pytest.fixture(autouse=True)
def _fast_cpu(monkeypatch):
    # oneDNN builds a new primitive for every conv shape: slow for many tiny first calls
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


def dle_infer(sd: dict, d: FastSpeechDims, ids: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """DLE's Fastspeech.forward at batch size 1 (eval), on a DLE-layout state dict."""

    def ln(x, name):
        return F.layer_norm(x, x.shape[-1:], sd[name + ".weight"], sd[name + ".bias"])

    def conv(x, name):  # (B, T, C) -> (B, T, C')
        return F.conv1d(x.transpose(1, 2), sd[name + ".weight"], sd[name + ".bias"], padding=1)

    def fft(x, name, n_layer, heads):
        x = x + sd[name + ".position.weight"][1 : x.shape[1] + 1]
        for i in range(n_layer):
            p = f"{name}.layer_stack.{i}."
            qkv = F.linear(x, sd[p + "slf_attn.linear.weight"], sd[p + "slf_attn.linear.bias"])
            qkv = qkv.view(1, x.shape[1], heads, 192).permute(2, 0, 1, 3)[:, 0]
            q, k, v = qkv[..., :64], qkv[..., 64:128], qkv[..., 128:]
            out = torch.softmax(torch.bmm(q, k.transpose(1, 2)) / 8.0, dim=2) @ v
            out = out.permute(1, 0, 2).reshape(1, x.shape[1], heads * 64)
            out = F.linear(out, sd[p + "slf_attn.fc.weight"], sd[p + "slf_attn.fc.bias"])
            x = ln(out + x, p + "slf_attn.layer_norm")
            y = F.conv1d(F.relu(conv(x, p + "pos_ffn.w_1")), sd[p + "pos_ffn.w_2.weight"],
                         sd[p + "pos_ffn.w_2.bias"], padding=1).transpose(1, 2)  # fmt: skip
            x = ln(y + x, p + "pos_ffn.layer_norm")
        return x

    x = fft(F.embedding(ids, sd["word_emb.weight"]), "phoneme_side", 2, 2)
    p = "length_regulator.duration_predictor."
    y = ln(F.relu(conv(x, p + "conv1d_1").transpose(1, 2)), p + "layer_norm_1")
    y = ln(F.relu(conv(y, p + "conv1d_2").transpose(1, 2)), p + "layer_norm_2")
    out = F.linear(y, sd[p + "linear_layer.weight"], sd[p + "linear_layer.bias"]).squeeze(-1)
    repeats = torch.round(torch.clamp_min(torch.exp(out) - 1, 0)[0] * alpha).long()
    y = torch.repeat_interleave(x[0], repeats, dim=0)[None, : d.max_seq_len]
    y = fft(y, "mel_side", 2, 2)
    return F.linear(y, sd["mel_linear.weight"], sd["mel_linear.bias"]).transpose(1, 2)


def tiny() -> tuple[FastSpeech, dict]:
    sd = dle_state_dict()
    conv = from_dle({"step": 1, "model": {"module." + k: v for k, v in sd.items()}})
    model = FastSpeech(conv.dims).eval()
    model.load_state_dict(conv.state_dict)
    return model, sd


def test_layout_and_conversion_at_default_dims() -> None:
    published = json.loads((KEYS / "fastspeech.json").read_text())
    assert dle_shapes(FastSpeechDims()) == published["state_dict"]
    sd = {"module." + k: torch.empty(s, device="meta") for k, s in published["state_dict"].items()}
    conv = from_dle({"step": 10, "model": sd, "optim": {}})
    assert conv.dims == FastSpeechDims()
    with torch.device("meta"):
        FastSpeech(conv.dims).load_state_dict(conv.state_dict, strict=True)
    assert conv.meta["text"]["symbol_set"] == "english_basic"
    assert torch.equal(FastSpeech(TINY).position, dle_table(65, 16))


def test_matches_dle_at_batch_size_one() -> None:
    model, sd = tiny()
    ids = torch.randint(1, 149, (1, 9))
    for pace in (1.0, 2.0, 0.5):
        mel, n = model.generate_mel(ids, torch.tensor([9]), SynthesisOptions(pace=pace))
        ref = dle_infer(sd, TINY, ids, alpha=1.0 / pace)
        assert mel.shape == ref.shape and n.tolist() == [ref.shape[2]] and ref.shape[2] > 9
        assert (mel - ref).abs().max() <= 1e-5
    _, slow = model.generate_mel(ids, torch.tensor([9]), SynthesisOptions(pace=0.25))
    assert slow.item() == 64  # cropped at max_seq_len


def test_convert_cli_roundtrip(tmp_path: Path, monkeypatch) -> None:
    model, sd = tiny()
    ckpt = {"step": 100, "model": {"module." + k: v for k, v in sd.items()}, "optim": {}}
    torch.save(ckpt, tmp_path / "fs.pt")
    monkeypatch.setattr(cli, "COMMANDS", {"convert": cli.COMMANDS["convert"]})
    assert cli.main(["convert", str(tmp_path / "fs.pt"), str(tmp_path / "fs")]) == 0
    loaded, info = load_component(tmp_path / "fs")
    assert info.kind == "fastspeech" and info.dims["max_seq_len"] == 64
    ids, lengths = torch.randint(1, 149, (2, 7)), torch.tensor([7, 4])
    a, na = loaded.generate_mel(ids, lengths, SynthesisOptions())
    b, nb = model.generate_mel(ids, lengths, SynthesisOptions())
    assert torch.equal(na, nb) and (a - b).abs().max() <= 1e-5


def test_batched_equals_single() -> None:
    model, _ = tiny()
    ids = torch.randint(1, 149, (3, 10))
    lengths = torch.tensor([4, 10, 7])
    mel, n = model.generate_mel(ids, lengths, SynthesisOptions())
    for i in range(3):
        k = int(lengths[i])
        m, ni = model.generate_mel(ids[i : i + 1, :k], lengths[i : i + 1], SynthesisOptions())
        assert int(n[i]) == int(ni)
        assert (mel[i, :, : int(ni)] - m[0]).abs().max() <= 1e-5
        assert not mel[i, :, int(ni) :].any()


def test_bad_input_and_checkpoint() -> None:
    model, sd = tiny()
    opts = SynthesisOptions()
    with pytest.raises(SpeechRTError):
        model.generate_mel(torch.tensor([[1, 149]]), torch.tensor([2]), opts)
    with pytest.raises(SpeechRTError):
        model.generate_mel(torch.tensor([[1, 2]]), torch.tensor([3]), opts)
    sd["mel_side.position.weight"] = torch.randn(65, 16)
    with pytest.raises(SpeechRTError, match="sinusoid"):
        from_dle({"model": sd})
    with pytest.raises(SpeechRTError):
        from_dle({"step": 1})
