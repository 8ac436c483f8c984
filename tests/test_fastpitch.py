"""FastPitch: DLE checkpoint layout, conversion round trip, batch independence, options, math."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from speechrt.audio.mel import MelConfig
from speechrt.cli import main
from speechrt.convert.fastpitch import from_dle
from speechrt.errors import SpeechRTError
from speechrt.models.fastpitch import (
    LJ_PITCH_STD,
    FastPitch,
    FastPitchDims,
    PositionalEmbedding,
    positional_embedding,
    regulate_length,
)
from speechrt.options import SynthesisOptions
from speechrt.repo import load_component

# Hand-written rather than the "tiny" preset: the conversion tests assert these sizes (10 mels)
# come back off the weights, and two layers per side let layer-indexed keys be checked.
TINY = dict(
    n_mel_channels=10,
    n_symbols=20,
    symbols_embedding_dim=16,
    in_fft_n_layers=2,
    in_fft_n_heads=2,
    in_fft_d_head=4,
    in_fft_conv1d_filter_size=32,
    in_fft_output_size=16,
    out_fft_n_layers=2,
    out_fft_n_heads=2,
    out_fft_d_head=4,
    out_fft_conv1d_filter_size=32,
    out_fft_output_size=16,
    dur_predictor_filter_size=8,
    pitch_predictor_filter_size=8,
    energy_predictor_filter_size=8,
)
KEYS = Path(__file__).parent / "data" / "checkpoint_keys"
DROPOUTS = ("in_fft_dropout", "in_fft_dropatt", "out_fft_dropout", "dur_predictor_dropout")
TRAIN_SETUP = {
    "sampling_rate": 22050,
    "filter_length": 1024,
    "hop_length": 256,
    "win_length": 1024,
    "mel_fmin": 0.0,
    "mel_fmax": 8000.0,
    "symbol_set": "english_basic",
    "text_cleaners": ["english_cleaners_v2"],
    "p_arpabet": 1.0,
    "epochs": 1000,  # training-only keys are ignored
}


def tiny_model(seed: int = 0, **over: object) -> FastPitch:
    """Random weights large enough that every block matters; ~3.5 frames per symbol."""
    model = FastPitch(FastPitchDims(**{**TINY, **over})).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        model.duration_predictor.fc.bias.fill_(1.5)
        model.pitch_mean.fill_(200.0)
        model.pitch_std.fill_(50.0)
    return model


def dle_checkpoint(model: FastPitch, with_config: bool = True) -> dict:
    """The dict DLE's train.py saves: 'module.'-prefixed weights incl. the training aligner."""
    sd = {"module." + k: v.clone() for k, v in model.state_dict().items()}
    sd["module.attention.key_proj.0.conv.weight"] = torch.randn(32, 16, 3)
    sd["module.attention.attn_proj.bias"] = torch.randn(1)
    ckpt: dict = {"epoch": 7, "iteration": 70, "state_dict": sd, "train_setup": TRAIN_SETUP}
    if with_config:
        config = dataclasses.asdict(model.dims)
        del config["pitch_conditioning_formants"]  # DLE's config does not record it
        ckpt["config"] = config | {f"p_{k}": 0.1 for k in DROPOUTS}
    return ckpt


def batch(seqs: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(map(len, seqs))
    ids = torch.tensor([s + [pad] * (L - len(s)) for s in seqs])
    return ids, torch.tensor([len(s) for s in seqs])


IDS, LENS = batch([[3, 7, 1, 12, 5, 9, 2, 14, 6], [4, 8, 11, 2], [19, 1, 5, 5, 7, 13, 3]])


@pytest.mark.parametrize("name", ["fastpitch", "fastpitch_energy"])
def test_state_dict_layout_matches_published(name: str) -> None:
    published = json.loads((KEYS / f"{name}.json").read_text())
    hp = published["hyperparameters"]
    fields = {f.name for f in dataclasses.fields(FastPitchDims)}
    dims = FastPitchDims(**{k: v for k, v in hp.items() if k in fields})
    assert dims == dataclasses.replace(
        FastPitchDims(), energy_conditioning=hp["energy_conditioning"]
    )
    with torch.device("meta"):  # shapes only, nothing allocated
        model = FastPitch(dims)
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    aligner = {k: s for k, s in published["state_dict"].items() if k.startswith("attention.")}
    assert aligner and list(ours) + list(aligner) == list(published["state_dict"])
    assert ours | aligner == published["state_dict"]

    # the published layout (aligner included), without a config: dims read off the shapes
    sd = {"module." + k: torch.empty(s, device="meta") for k, s in published["state_dict"].items()}
    conv = from_dle({"state_dict": sd})
    assert conv.dims == dims
    assert {k: list(v.shape) for k, v in conv.state_dict.items()} == ours


def test_convert_round_trip_matches_in_memory(tmp_path: Path) -> None:
    model = tiny_model(energy_conditioning=True)
    torch.save(dle_checkpoint(model), tmp_path / "fp.pt")
    assert main(["convert", str(tmp_path / "fp.pt"), str(tmp_path / "fp")]) == 0
    loaded, info = load_component(tmp_path / "fp")
    assert info.kind == "fastpitch" and info.dims == dataclasses.asdict(model.dims)
    assert info.mel == MelConfig(n_mels=10)
    assert info.meta["text"] == {
        "symbol_set": "english_basic",
        "cleaners": "english_cleaners_v2",
        "p_arpabet": 1.0,
    }
    opts = SynthesisOptions(pace=1.2, pitch_shift=20.0)
    mel, mel_lengths = model.generate_mel(IDS, LENS, opts)
    mel2, mel_lengths2 = loaded.generate_mel(IDS, LENS, opts)
    assert torch.equal(mel_lengths, mel_lengths2)
    assert mel.shape == (3, 10, int(mel_lengths.max())) and (mel - mel2).abs().max() <= 1e-5


def test_convert_without_config_reads_dims_off_weights() -> None:
    over = dict(in_fft_n_heads=1, in_fft_d_head=8, out_fft_n_heads=1, out_fft_d_head=6)
    # without energy conditioning its sizes leave no trace: they keep DLE's defaults (256)
    over |= dict(energy_conditioning=False, energy_predictor_filter_size=256)
    over |= dict(n_speakers=3, in_fft_n_layers=3)
    over |= dict(dur_predictor_n_layers=3, pitch_predictor_kernel_size=5)
    model = tiny_model(**over)
    ckpt = dle_checkpoint(model, with_config=False)
    del ckpt["train_setup"]
    conv = from_dle(ckpt)
    assert conv.dims == model.dims
    assert conv.mel == MelConfig(n_mels=10)
    text = {"symbol_set": "english_basic", "cleaners": "english_cleaners_v2", "p_arpabet": 0.0}
    assert conv.meta == {"text": text}
    FastPitch(conv.dims).load_state_dict(conv.state_dict, strict=True)


def test_unknown_config_key_is_refused() -> None:
    ckpt = dle_checkpoint(tiny_model())
    ckpt["config"]["n_flows"] = 12
    with pytest.raises(SpeechRTError, match="n_flows"):
        from_dle(ckpt)


@pytest.mark.parametrize("pad", [0, 17])  # whatever the padding holds, lengths decide
def test_batched_equals_single(pad: int) -> None:
    model = tiny_model(energy_conditioning=True)
    opts = SynthesisOptions(pace=1.3, pitch_shift=25.0, pitch_scale=1.5)
    ids = torch.where(torch.arange(IDS.size(1)) < LENS[:, None], IDS, pad)
    with torch.no_grad():
        out = model.infer(ids, LENS, opts)
        for i, n in enumerate(LENS.tolist()):
            one = model.infer(ids[i : i + 1, :n], LENS[i : i + 1], opts)
            T = int(one.mel_lengths[0])
            assert int(out.mel_lengths[i]) == T > 0
            assert (out.mel[i, :, :T] - one.mel[0]).abs().max() <= 1e-5
            assert (out.durations[i, :n] - one.durations[0]).abs().max() <= 1e-5
            assert (out.pitch[i, :, :n] - one.pitch[0]).abs().max() <= 1e-6
            assert (out.energy[i, :n] - one.energy[0]).abs().max() <= 1e-5


def test_pace_divides_durations_before_rounding() -> None:
    model = tiny_model()
    with torch.no_grad():
        slow = model.infer(IDS, LENS, SynthesisOptions(pace=1.0))
        fast = model.infer(IDS, LENS, SynthesisOptions(pace=2.0))
    for i, n in enumerate(LENS.tolist()):
        durs = slow.durations[i, :n].tolist()
        assert int(slow.mel_lengths[i]) == sum(math.floor(d + 0.5) for d in durs)
        assert int(fast.mel_lengths[i]) == sum(math.floor(d / 2 + 0.5) for d in durs)
        assert abs(int(fast.mel_lengths[i]) - int(slow.mel_lengths[i]) / 2) <= 0.75 * n
    assert int(slow.mel_lengths.min()) >= 2 * len(LENS)  # the test is not vacuous


def test_pitch_transforms_compose_in_dle_order() -> None:
    model = tiny_model()
    run = lambda **kw: model.infer(IDS, LENS, SynthesisOptions(**kw))  # noqa: E731
    inside = (torch.arange(IDS.size(1)) < LENS[:, None])[:, None, :]
    with torch.no_grad():
        base = run()
        flat, amp, up = run(pitch_flatten=True), run(pitch_scale=2.0), run(pitch_shift=30.0)
        both = run(pitch_flatten=True, pitch_scale=2.0, pitch_shift=30.0)
        model.pitch_std.zero_()  # no statistics in the checkpoint: DLE uses LJSpeech's
        up_lj = run(pitch_shift=30.0)
    assert base.pitch.abs()[inside].min() > 0
    assert flat.pitch.abs().max() == 0
    assert torch.allclose(amp.pitch, 2 * base.pitch, atol=1e-6)
    assert torch.allclose(up.pitch, (base.pitch + 30.0 / 50.0) * inside, atol=1e-6)
    assert torch.allclose(up_lj.pitch, (base.pitch + 30.0 / LJ_PITCH_STD) * inside, atol=1e-6)
    assert torch.allclose(both.pitch, inside * 30.0 / 50.0, atol=1e-6)  # x0, x2, then +shift
    for other in (flat, up):
        assert torch.equal(other.mel_lengths, base.mel_lengths)  # pitch does not move durations
        assert (other.mel - base.mel).abs().max() > 1e-2


def test_speakers() -> None:
    model = tiny_model(n_speakers=3, speaker_emb_weight=2.0)
    with torch.no_grad():
        a = model.infer(IDS, LENS, SynthesisOptions(speaker=0))
        b = model.infer(IDS, LENS, SynthesisOptions(speaker=2))
        with pytest.raises(SpeechRTError, match="speaker id 3"):
            model.infer(IDS, LENS, SynthesisOptions(speaker=3))
        with pytest.raises(SpeechRTError, match="speaker id 1"):
            tiny_model().infer(IDS, LENS, SynthesisOptions(speaker=1))
    T = min(int(a.mel_lengths.min()), int(b.mel_lengths.min()))
    assert (a.mel[..., :T] - b.mel[..., :T]).abs().max() > 1e-2


def test_positional_embedding_by_hand() -> None:
    freqs = [1.0, 10000 ** (-2 / 6), 10000 ** (-4 / 6)]
    assert torch.allclose(PositionalEmbedding(6).inv_freq, torch.tensor(freqs), rtol=1e-6)
    emb = positional_embedding(torch.tensor([0.0, 5.0]), torch.tensor(freqs))
    expected = [math.sin(5 * f) for f in freqs] + [math.cos(5 * f) for f in freqs]
    assert emb[0].tolist() == [0.0] * 3 + [1.0] * 3  # sines first, then cosines
    assert torch.allclose(emb[1], torch.tensor(expected), atol=1e-6)


def test_length_regulator_rounds_half_up() -> None:
    durations = torch.tensor([[0.5, 1.5, 2.49, 2.5, 0.0, 0.4], [1.0, 0.0, 2.0, 0.0, 0.0, 0.0]])
    enc = torch.arange(1.0, 7.0).repeat(2, 1)[:, :, None]  # symbol j carries the value j + 1
    frames, lengths = regulate_length(durations, enc)
    # floor(x + 0.5): 1, 2, 2, 3, 0, 0 (Python's round() would give 0, 2, 2, 2, 0, 0)
    assert lengths.tolist() == [8, 3]
    assert frames[0, :, 0].tolist() == [1, 2, 2, 3, 3, 4, 4, 4]
    assert frames[1, :, 0].tolist() == [1, 3, 3, 0, 0, 0, 0, 0]
    frames, lengths = regulate_length(torch.tensor([[3.0, 1.0]]), enc[:1, :2], pace=2.0)
    assert lengths.tolist() == [3] and frames[0, :, 0].tolist() == [1, 1, 2]  # 2.0 -> 2, 1.0 -> 1


def test_bad_inputs_raise_clear_errors() -> None:
    model = tiny_model()
    opts = SynthesisOptions()
    with pytest.raises(SpeechRTError, match="symbol ids"):
        model.generate_mel(torch.tensor([[1, 20]]), torch.tensor([2]), opts)
    with pytest.raises(SpeechRTError, match="lengths"):
        model.generate_mel(IDS, torch.tensor([9, 0, 7]), opts)
    with pytest.raises(SpeechRTError, match="lengths"):
        model.generate_mel(IDS, torch.tensor([10, 4, 7]), opts)
    with pytest.raises(SpeechRTError, match="mel frames"), torch.no_grad():
        model.infer(IDS, LENS, opts, max_frames=5)


@pytest.mark.slow
def test_default_dims_convert_and_match(tmp_path: Path) -> None:
    hp = json.loads((KEYS / "fastpitch_energy.json").read_text())["hyperparameters"]
    model = FastPitch(FastPitchDims()).eval()
    with torch.no_grad():
        model.duration_predictor.fc.bias.fill_(1.0)
        model.pitch_mean.fill_(214.72203)
        model.pitch_std.fill_(65.72038)
    sd = {"module." + k: v for k, v in model.state_dict().items()}
    sd["module.attention.key_proj.0.conv.weight"] = torch.randn(768, 384, 3)
    ckpt = {"state_dict": sd, "config": hp, "train_setup": TRAIN_SETUP}
    torch.save(ckpt, tmp_path / "fp.pt")
    assert main(["convert", str(tmp_path / "fp.pt"), str(tmp_path / "fp")]) == 0
    loaded, info = load_component(tmp_path / "fp")
    assert info.dims == dataclasses.asdict(FastPitchDims())
    ids = torch.randint(1, 148, (2, 24))
    lengths = torch.tensor([24, 15])
    opts = SynthesisOptions(pitch_shift=-10.0)
    mel, mel_lengths = model.generate_mel(ids, lengths, opts)
    mel2, mel_lengths2 = loaded.generate_mel(ids, lengths, opts)
    assert torch.equal(mel_lengths, mel_lengths2) and int(mel_lengths.min()) > 0
    assert (mel - mel2).abs().max() <= 1e-5
