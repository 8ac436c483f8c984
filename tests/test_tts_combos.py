"""Every acoustic model x every vocoder through `speechrt convert` and `speechrt synthesize`."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import soundfile as sf
import torch

import dle_fastspeech
import dle_tacotron2
import dle_waveglow
from speechrt.cli import main
from speechrt.errors import MaxDecoderStepsWarning
from speechrt.models.tacotron2 import Tacotron2Dims
from speechrt.registry import preset
from speechrt.tts import TTS

TACOTRON2 = dataclasses.asdict(preset("tacotron2", "tiny", max_decoder_steps=400))
# DLE's layouts fix what the tiny presets shrink: WaveGlow's 1024-tap upsampling, FastSpeech's
# 64-wide heads; so these two are the DLE helpers' tiny sizes at the real mel count
WAVEGLOW = dict(dle_waveglow.TINY, n_mel_channels=80)
FASTSPEECH = dataclasses.replace(dle_fastspeech.TINY, n_mels=80, n_symbols=149, max_seq_len=256)


def convert(ckpt, out) -> str:
    assert main(["convert", str(ckpt), str(out)]) == 0
    return str(out)


@pytest.fixture(scope="module")
def models(tiny_voice, tmp_path_factory):
    """kind -> model dir; Tacotron2 in two flavours: stopping and never stopping."""
    root = tmp_path_factory.mktemp("combos")
    torch.manual_seed(0)
    d = Tacotron2Dims(**TACOTRON2)
    stopping = dle_tacotron2.dle_state_dict(d)
    never = {k: v.clone() for k, v in stopping.items()}
    dle_tacotron2.make_stopping(stopping, d, rate=0.3)
    never["decoder.gate_layer.linear_layer.bias"].fill_(-1e4)
    torch.save({"state_dict": stopping, "config": TACOTRON2}, root / "t2.pt")
    torch.save({"state_dict": never, "config": TACOTRON2}, root / "t2never.pt")
    torch.save({"state_dict": dle_waveglow.dle_state_dict(**WAVEGLOW)}, root / "wg.pt")
    fs = {"module." + k: v for k, v in dle_fastspeech.dle_state_dict(FASTSPEECH).items()}
    torch.save({"step": 1, "model": fs, "optim": {}}, root / "fs.pt")
    return {
        "fastpitch": str(tiny_voice[0]),
        "hifigan": str(tiny_voice[1]),
        "tacotron2": convert(root / "t2.pt", root / "tacotron2"),
        "tacotron2-never": convert(root / "t2never.pt", root / "tacotron2-never"),
        "waveglow": convert(root / "wg.pt", root / "waveglow"),
        "fastspeech": convert(root / "fs.pt", root / "fastspeech"),
    }


@pytest.mark.parametrize("denoise", [0.0, 0.01])
@pytest.mark.parametrize("vocoder", ["hifigan", "waveglow"])
@pytest.mark.parametrize("acoustic", ["fastpitch", "tacotron2", "fastspeech"])
def test_every_combination(models, tmp_path, capsys, acoustic, vocoder, denoise):
    out = tmp_path / "out.wav"
    args = ["synthesize", "Hello world.", "-o", str(out), "--acoustic", models[acoustic]]
    args += ["--vocoder", models[vocoder], "--denoise", str(denoise), "--device", "cpu"]
    assert main(args) == 0, capsys.readouterr().err
    audio, sr = sf.read(out, dtype="float32")
    assert sr == 22050 and len(audio) >= 256 and len(audio) % 256 == 0
    assert np.isfinite(audio).all() and np.abs(audio).max() > 0


def test_seeded_audio_does_not_depend_on_batch_mates(models):
    tts = TTS(models["tacotron2"], models["waveglow"], device="cpu")
    texts = ["Hello world.", "Another, somewhat longer sentence to speak."]
    both = tts.synthesize(texts, seeds=[5, 6], batch_size=2)
    alone = tts.synthesize(texts[1:], seeds=[6])[0]
    assert both[1].shape == alone.shape and np.abs(both[1] - alone).max() <= 1e-4
    again = tts.synthesize(texts[1:], seeds=[6])[0]
    assert np.array_equal(again, alone)  # reproducible run to run
    other = tts.synthesize(texts[1:], seeds=[7])[0]
    assert other.shape != alone.shape or np.abs(other - alone).max() > 1e-3  # dropout + noise


@pytest.mark.parametrize(
    "text", ["hello world with no end punctuation", "a", "Short sentence. " * 125]
)
def test_tacotron2_edge_inputs_finish(models, text):
    tts = TTS(models["tacotron2"], models["hifigan"], device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        audio = tts.synthesize([text], batch_size=16)[0]
    assert not [w for w in caught if issubclass(w.category, MaxDecoderStepsWarning)]
    assert 0 < len(audio) < 400 * 256 * 20 and np.isfinite(audio).all()


def test_max_decoder_steps_is_reported_per_text(models, tmp_path, capsys):
    out = tmp_path / "x.wav"
    args = ["synthesize", "One. Two.", "-o", str(out), "--acoustic", models["tacotron2-never"]]
    args += ["--vocoder", models["hifigan"], "--max-decoder-steps", "12", "--device", "cpu"]
    assert main(args) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("warning" in e and "max decoder steps" in e for e in err)
    assert "text 1, sentence 1" in err[0] + err[1] and "text 1, sentence 2" in err[0] + err[1]
    assert sf.info(str(out)).frames == 12 * 256 * 2 + int(0.2 * 22050)  # two cut pieces + pause
