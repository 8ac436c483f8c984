"""Tacotron2: DLE checkpoint layout, BatchNorm folding, the decoder step, per-item stopping."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dle_tacotron2 import TINY, dle_shapes, dle_state_dict, make_stopping
from speechrt import cli
from speechrt.convert.tacotron2 import from_dle
from speechrt.errors import SpeechRTError
from speechrt.models.tacotron2 import DECODER_INPUTS, DECODER_OUTPUTS, Tacotron2, Tacotron2Dims
from speechrt.options import SynthesisOptions
from speechrt.repo import load_component

KEYS = Path(__file__).parent / "data" / "checkpoint_keys"


@pytest.fixture(autouse=True)
def _fast_cpu(monkeypatch):
    # oneDNN builds a new primitive for every conv shape: slow for many tiny first calls
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


def tiny(stopping: bool = True) -> tuple[Tacotron2, dict]:
    d = Tacotron2Dims(**TINY)
    sd = dle_state_dict(d)
    if stopping:
        make_stopping(sd, d)
    conv = from_dle({"state_dict": sd, "config": TINY})
    model = Tacotron2(conv.dims).eval()
    model.load_state_dict(conv.state_dict)
    return model, sd


def alone(model, ids, lengths, i, seed, **opts):
    n = int(lengths[i])
    return model.generate_mel(ids[i : i + 1, :n], lengths[i : i + 1], SynthesisOptions(**opts),
                              torch.tensor([seed]))  # fmt: skip


def test_layout_and_conversion_at_default_dims() -> None:
    published = json.loads((KEYS / "tacotron2.json").read_text())
    shapes = dle_shapes(Tacotron2Dims())
    assert shapes == published["state_dict"]
    sd = {"module." + k: torch.empty(s, device="meta") for k, s in shapes.items()}
    conv = from_dle({"state_dict": sd})  # no config: DLE defaults + shapes
    assert conv.dims == Tacotron2Dims()
    with torch.device("meta"):
        Tacotron2(conv.dims).load_state_dict(conv.state_dict, strict=True)
    with_config = from_dle({"state_dict": sd, "config": published["hyperparameters"]})
    assert with_config.dims == Tacotron2Dims()
    assert conv.meta["text"] == {"symbol_set": "english_basic", "cleaners": "english_cleaners",
                                 "p_arpabet": 0.0}  # fmt: skip
    assert conv.mel is not None and conv.mel.fmax == 8000.0 and conv.mel.hop_length == 256


def test_batchnorm_folding_encoder_and_postnet() -> None:
    model, sd = tiny()
    ids, n = torch.randint(1, 30, (1, 7)), torch.tensor([7])
    x = F.embedding(ids, sd["embedding.weight"]).transpose(1, 2)
    for i in range(3):  # DLE: conv -> BatchNorm (eval) -> ReLU
        c = f"encoder.convolutions.{i}."
        x = F.conv1d(x, sd[c + "0.conv.weight"], sd[c + "0.conv.bias"], padding=2)
        x = F.batch_norm(x, sd[c + "1.running_mean"], sd[c + "1.running_var"],
                         sd[c + "1.weight"], sd[c + "1.bias"])  # fmt: skip
        x = F.relu(x)
    lstm = torch.nn.LSTM(16, 8, batch_first=True, bidirectional=True)
    lstm.load_state_dict({k[13:]: v for k, v in sd.items() if k.startswith("encoder.lstm.")})
    ref, _ = lstm(x.transpose(1, 2))
    memory, processed = model.encoder(ids, n)
    assert (memory - ref).abs().max() <= 1e-5
    w = sd["decoder.attention_layer.memory_layer.linear_layer.weight"]
    assert (processed - ref @ w.T).abs().max() <= 1e-5

    mel = torch.randn(1, 8, 11)
    y = mel
    for i in range(5):
        c = f"postnet.convolutions.{i}."
        y = F.conv1d(y, sd[c + "0.conv.weight"], sd[c + "0.conv.bias"], padding=2)
        y = F.batch_norm(y, sd[c + "1.running_mean"], sd[c + "1.running_var"],
                         sd[c + "1.weight"], sd[c + "1.bias"])  # fmt: skip
        y = torch.tanh(y) if i < 4 else y
    # folded vs unfolded: float32 rounding over five layers, relative to the outputs' size (~20
    # here; 1.2e-6 of it measured on an AMD EPYC, under 1e-5 / 20 on Intel); a wrong fold is O(1)
    assert (model.postnet(mel) - (mel + y)).abs().max() <= 1e-5 * max(1.0, (mel + y).abs().max())


def test_decoder_step_matches_dle_math() -> None:
    model, sd = tiny(stopping=False)
    b, t = 2, 6
    g = torch.Generator().manual_seed(1)
    memory = torch.randn(b, t, 16, generator=g)
    mask = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    memory[1, 4:] = 0
    processed = model.encoder.memory_layer(memory)
    state = [torch.randn(b, 24, generator=g) * 0.5 for _ in range(4)]
    w = torch.softmax(torch.randn(b, t, generator=g).masked_fill(mask, -1e9), 1)
    state += [w, w * 3, torch.randn(b, 16, generator=g)]
    frame = torch.randn(b, 8, generator=g)
    masks = (torch.rand(b, 2, 12, generator=g) >= 0.5).float() * 2
    out = model.decoder(frame, *state, memory, processed, mask, masks)
    assert len(out) == len(DECODER_OUTPUTS) and len(DECODER_INPUTS) == 12

    def lin(x, name, bias=False):
        k = f"decoder.{name}.linear_layer."
        return F.linear(x, sd[k + "weight"], sd[k + "bias"] if bias else None)

    def cell(x, hc, name):
        k = f"decoder.{name}."
        gates = x @ sd[k + "weight_ih"].T + sd[k + "bias_ih"] + hc[0] @ sd[k + "weight_hh"].T
        i, f, gg, o = (gates + sd[k + "bias_hh"]).chunk(4, 1)
        c = torch.sigmoid(f) * hc[1] + torch.sigmoid(i) * torch.tanh(gg)
        return torch.sigmoid(o) * torch.tanh(c), c

    x = F.relu(lin(frame, "prenet.layers.0")) * masks[:, 0]
    x = F.relu(lin(x, "prenet.layers.1")) * masks[:, 1]
    h, c = cell(torch.cat((x, state[6]), 1), state[0:2], "attention_rnn")
    att = "attention_layer."
    loc = F.conv1d(
        torch.stack(state[4:6], 1),
        sd[f"decoder.{att}location_layer.location_conv.conv.weight"],
        padding=3,
    )
    loc = lin(loc.transpose(1, 2), att + "location_layer.location_dense")  # fmt: skip
    e = lin(torch.tanh(lin(h, att + "query_layer")[:, None] + loc + processed), att + "v")
    weights = torch.softmax(e.squeeze(2).masked_fill(mask, float("-inf")), 1)
    ctx = (weights[:, :, None] * memory).sum(1)
    dh, dc = cell(torch.cat((h, ctx), 1), state[2:4], "decoder_rnn")
    hc = torch.cat((dh, ctx), 1)
    ref = (lin(hc, "linear_projection", True), lin(hc, "gate_layer", True), h, c, dh, dc,
           weights, state[5] + weights, ctx)  # fmt: skip
    for name, a, r in zip(DECODER_OUTPUTS, out, ref, strict=True):
        assert (a - r).abs().max() <= 1e-5, name


def test_convert_cli_roundtrip(tmp_path: Path, monkeypatch) -> None:
    d = Tacotron2Dims(**TINY)
    sd = dle_state_dict(d)
    make_stopping(sd, d)
    config = {"mask_padding": False, "n_frames_per_step": 1, "p_attention_dropout": 0.1,
              "decoder_no_early_stopping": False,
              **{k: v for k, v in TINY.items()}}  # fmt: skip
    ckpt = {"state_dict": {"module." + k: v for k, v in sd.items()}, "config": config}
    torch.save(ckpt, tmp_path / "t2.pt")
    monkeypatch.setattr(cli, "COMMANDS", {"convert": cli.COMMANDS["convert"]})
    assert cli.main(["convert", str(tmp_path / "t2.pt"), str(tmp_path / "t2")]) == 0
    loaded, info = load_component(tmp_path / "t2")
    assert info.kind == "tacotron2" and info.meta["text"]["cleaners"] == "english_cleaners"
    model, _ = tiny()
    model.load_state_dict(from_dle(ckpt).state_dict)
    ids, lengths = torch.randint(1, 30, (2, 9)), torch.tensor([9, 6])
    opts, seeds = SynthesisOptions(), torch.tensor([4, 5])
    a, na = loaded.generate_mel(ids, lengths, opts, seeds)
    b, nb = model.generate_mel(ids, lengths, opts, seeds)
    assert torch.equal(na, nb) and na.min() > 5 and a.shape == (2, 8, int(na.max()))
    assert (a - b).abs().max() <= 1e-5


def test_items_stop_at_their_own_step_in_callers_order() -> None:
    model, _ = tiny()
    ids = torch.randint(1, 30, (5, 9))
    lengths = torch.tensor([5, 9, 7, 3, 8])  # unsorted on purpose
    seeds = torch.tensor([11, 12, 13, 14, 15])
    mel, mel_lengths = model.generate_mel(ids, lengths, SynthesisOptions(), seeds)
    singles = [alone(model, ids, lengths, i, 11 + i) for i in range(5)]
    assert len({int(n) for _, n in singles}) >= 3  # the items really stop at different steps
    assert max(int(n) for _, n in singles) < 100
    for i, (m, n) in enumerate(singles):
        assert int(mel_lengths[i]) == int(n)  # exactly; values up to fp32 rounding (relative)
        assert (mel[i, :, : int(n)] - m[0]).abs().max() <= 1e-5 * max(1.0, m.abs().max().item())
        assert not mel[i, :, int(n) :].any()


def test_max_decoder_steps_warns_naming_the_item() -> None:
    model, _ = tiny()
    ids, lengths = torch.randint(1, 30, (3, 9)), torch.tensor([9, 4, 6])
    seeds = torch.tensor([1, 2, 3])
    natural = [int(alone(model, ids, lengths, i, 1 + i)[1]) for i in range(3)]
    cap = sorted(natural)[1]  # the shortest item stops by itself, the others hit the cap
    assert min(natural) < cap
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, n = model.generate_mel(ids, lengths, SynthesisOptions(max_decoder_steps=cap), seeds)
    messages = " ".join(str(w.message) for w in caught)
    for i in range(3):
        assert (f"item {i} reached max_decoder_steps" in messages) == (natural[i] >= cap)
        assert int(n[i]) == min(natural[i], cap)


def test_dropout_is_seeded_per_item() -> None:
    model, _ = tiny()
    ids, lengths = torch.randint(1, 30, (1, 6)), torch.tensor([6])
    a = model.generate_mel(ids, lengths, SynthesisOptions(seed=3))
    b = model.generate_mel(ids, lengths, SynthesisOptions(), torch.tensor([3]))
    c = model.generate_mel(ids, lengths, SynthesisOptions(seed=4))
    assert torch.equal(a[0], b[0])
    assert a[0].shape != c[0].shape or not torch.equal(a[0], c[0])


def test_bad_input() -> None:
    model, _ = tiny()
    opts = SynthesisOptions()
    with pytest.raises(SpeechRTError):
        model.generate_mel(torch.tensor([[1, 2, 30]]), torch.tensor([3]), opts)  # id >= n_symbols
    with pytest.raises(SpeechRTError):
        model.generate_mel(torch.tensor([[1, 2, 3]]), torch.tensor([4]), opts)
    with pytest.raises(SpeechRTError):
        model.generate_mel(torch.tensor([[1, 2, 3]]), torch.tensor([0]), opts)
    with pytest.raises(SpeechRTError):
        from_dle({"state_dict": {}, "config": {"n_frames_per_step": 2}})
