"""The TTS pipeline and `speechrt synthesize` on a tiny FastPitch + HiFi-GAN voice."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch

from speechrt.cli import main
from speechrt.options import SynthesisOptions
from speechrt.text import TextProcessor
from speechrt.tts import TTS
from tiny import save_dle_fastpitch, save_dle_hifigan, tiny_fastpitch, tiny_hifigan


@pytest.fixture(scope="module")
def tts(tiny_voice):
    return TTS(*tiny_voice, device="cpu")


def reference_audio(text: str) -> np.ndarray:
    """The in-memory DLE-layout models the tiny voice was converted from, run directly."""
    ids = TextProcessor("english_basic", "english_cleaners_v2", 0.0).encode(text)
    fp, hg = tiny_fastpitch(), tiny_hifigan()
    with torch.no_grad():
        x = torch.tensor([ids])
        mel, mel_lens = fp.generate_mel(x, torch.tensor([len(ids)]), SynthesisOptions())
        audio = hg(mel[:, :, : int(mel_lens[0])])  # weight-normed, DLE forward: (1, 1, T*256)
    return audio[0, 0].clamp(-1, 1).numpy()


def test_cli_convert_then_synthesize_matches_in_memory_model(tmp_path, capsys):
    fp = save_dle_fastpitch(tiny_fastpitch(), tmp_path / "fp.pt")
    hg = save_dle_hifigan(tiny_hifigan(), tmp_path / "hg.pt")
    assert main(["convert", str(fp), str(tmp_path / "a")]) == 0
    assert main(["convert", str(hg), str(tmp_path / "v")]) == 0
    info = json.loads((tmp_path / "a" / "model.json").read_text())
    assert info["kind"] == "fastpitch" and len(info["source"]["sha256"]) == 64
    out = tmp_path / "hello.wav"
    args = ["synthesize", "Hello world.", "-o", str(out), "--acoustic", str(tmp_path / "a")]
    args += ["--vocoder", str(tmp_path / "v"), "--sample-format", "float32", "--device", "cpu"]
    assert main(args) == 0
    audio, sr = sf.read(out, dtype="float32")
    assert sr == 22050
    ref = reference_audio("Hello world.")
    assert audio.shape == ref.shape
    assert np.abs(audio - ref).max() <= 1e-5
    # The default int16 WAV is the same audio within one quantisation step.
    assert main(args[:-4] + ["--device", "cpu"]) == 0
    pcm16, _ = sf.read(out, dtype="float32")
    assert sf.info(str(out)).subtype == "PCM_16"
    assert np.abs(pcm16 - ref).max() <= 1.01 / 32767


def test_audio_later_is_the_same_audio(tts):
    """ids_to_audio_later (the server's pipelined batches) gives what ids_to_audio gives."""
    pieces = tts.text_to_pieces(["Hello world.", "A longer sentence, with a comma."], [0, 1])
    now = tts.ids_to_audio(pieces, SynthesisOptions())
    later = tts.ids_to_audio_later(pieces, SynthesisOptions())()
    assert len(later) == len(now) == 2
    for a, b in zip(now, later, strict=True):
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= 1e-6  # the same computation, run twice


def test_batched_equals_single(tts):
    texts = ["Hello world.", "A much longer sentence, with a comma and more words in it.", "Hi!"]
    batched = tts.synthesize(texts, batch_size=3, seeds=[0, 1, 2])
    for i, text in enumerate(texts):
        single = tts.synthesize([text], batch_size=1, seeds=[i])[0]
        assert single.shape == batched[i].shape
        assert np.abs(single - batched[i]).max() <= 1e-4


def test_long_text_is_split_and_joined(tts):
    sentence = "This is sentence number {}, and it keeps going for a while. "
    text = "".join(sentence.format(i) for i in range(90))  # ~5 000 characters
    assert len(text) > 5000
    audio = tts.synthesize([text], batch_size=16)[0]
    pieces = tts.text_to_pieces([text], [0])
    assert len(pieces) >= 15
    # Joined audio = pieces + a pause between each pair.
    one = [tts.synthesize([sentence.format(0)])[0]]
    assert len(audio) > len(one[0]) * 60
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 1.0


def test_pieces_are_bounded_after_normalisation(tts):
    from speechrt.tts import MAX_PIECE_SYMBOLS

    digits = "1234567890" * 500  # 5,000 characters reading as ~21,000 symbols
    pieces = tts.text_to_pieces([digits, "Hi."], [0, 1])
    mine = [p for p in pieces if p.item == 0]
    assert sum(len(p.ids) for p in mine) > 20_000
    assert max(len(p.ids) for p in mine) <= MAX_PIECE_SYMBOLS
    assert [p.index for p in mine] == list(range(len(mine)))
    assert [p.ids for p in pieces if p.item == 1] == [tts.text.encode("Hi.")]
    run_on = " ".join(["hello"] * 3000)  # no punctuation at all
    assert max(len(p.ids) for p in tts.text_to_pieces([run_on], [0])) <= MAX_PIECE_SYMBOLS


def test_options_change_the_audio(tts):
    base = tts.synthesize(["Hello world."])[0]
    fast = tts.synthesize(["Hello world."], SynthesisOptions(pace=2.0))[0]
    assert len(fast) < len(base) * 0.75
    shifted = tts.synthesize(["Hello world."], SynthesisOptions(pitch_shift=50.0))[0]
    assert shifted.shape == base.shape and np.abs(shifted - base).max() > 1e-3
    denoised = tts.synthesize(["Hello world."], SynthesisOptions(denoise=0.05))[0]
    assert denoised.shape == base.shape and np.abs(denoised - base).max() > 1e-6


@pytest.mark.parametrize(
    "args, message",
    [
        (["synthesize", ""], "is empty"),
        (["synthesize", "?!... ,;"], "nothing to speak"),
        (["synthesize", "Hi.", "--pace", "-1"], "pace must be"),
        (["synthesize", "Hi.", "--batch-size", "0"], "batch size"),
    ],
)
def test_cli_bad_input_one_line(tiny_voice, tmp_path, capsys, args, message):
    voice = ["--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1]), "--device", "cpu"]
    assert main(args + ["-o", str(tmp_path / "x.wav")] + voice) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "x.wav").exists()


def test_cli_model_errors(tiny_voice, tmp_path, capsys, monkeypatch):
    import speechrt.defaults

    def run(*extra):
        code = main(["synthesize", "Hi.", "-o", str(tmp_path / "x.wav"), *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code != 0 and len(err) == 1
        return err[0]

    assert "needs both" in run("--acoustic", str(tiny_voice[0]))
    monkeypatch.setattr(speechrt.defaults, "DEFAULTS", tmp_path / "none")  # an install without
    assert "no voice given" in run()
    assert "not a model directory" in run("--acoustic", str(tmp_path / "nope"), "--vocoder", "x")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "model.json").write_text((tiny_voice[1] / "model.json").read_text())
    (corrupt / "model.safetensors").write_bytes(b"\x00" * 64)
    assert "corrupt weights" in run("--acoustic", str(tiny_voice[0]), "--vocoder", str(corrupt))
    # A vocoder whose mel config differs from the acoustic model's.
    other = tmp_path / "other"
    other.mkdir()
    info = json.loads((tiny_voice[1] / "model.json").read_text())
    info["mel"]["fmax"] = 11025.0
    (other / "model.json").write_text(json.dumps(info))
    (other / "model.safetensors").write_bytes((tiny_voice[1] / "model.safetensors").read_bytes())
    assert "mel configs" in run("--acoustic", str(tiny_voice[0]), "--vocoder", str(other))
    swapped = run("--acoustic", str(tiny_voice[1]), "--vocoder", str(tiny_voice[0]))
    assert "not an acoustic model" in swapped


def test_cli_phrases_file(tiny_voice, tmp_path, capsys):
    voice = ["--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1]), "--device", "cpu"]
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("First phrase.\n\nSecond one here.\nThird!\n")
    out = tmp_path / "audio"
    assert main(["synthesize", "--file", str(phrases), "--out-dir", str(out), *voice]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["1.wav", "2.wav", "3.wav"]
    assert (
        main(
            ["synthesize", "--file", str(phrases), "--out-dir", str(out), "--format", "flac"]
            + voice
        )
        == 0
    )
    assert sf.info(str(out / "1.flac")).samplerate == 22050
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    capsys.readouterr()
    assert main(["synthesize", "--file", str(bad), "--out-dir", str(out), *voice]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not UTF-8" in err[0]


def test_cli_100k_characters(tiny_voice, tmp_path):
    voice = ["--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1]), "--device", "cpu"]
    text = ("Speech synthesis at scale. " * 4000)[:100_000]
    out = tmp_path / "long.wav"
    # --pace 4 keeps the (tiny, CPU) vocoder's work small: this checks splitting and joining.
    args = ["synthesize", text, "-o", str(out), "--batch-size", "64", "--pace", "4", *voice]
    assert main(args) == 0
    info = sf.info(str(out))
    assert info.samplerate == 22050 and info.frames > 22050 * 60


@pytest.mark.slow
def test_default_dims_checkpoints_through_convert_and_synthesize(tmp_path):
    """Published sizes (FastPitch 1.1 with energy, HiFi-GAN V1): DLE checkpoint -> convert ->
    synthesize gives the in-memory models' audio within 1e-5."""
    import dataclasses

    from speechrt.convert.hifigan import dle_state_dict
    from speechrt.models.fastpitch import FastPitch, FastPitchDims
    from speechrt.models.hifigan import HiFiGAN, HiFiGANDims

    torch.manual_seed(0)
    fp = FastPitch(FastPitchDims()).eval()
    with torch.no_grad():
        fp.duration_predictor.fc.weight.mul_(1e-3)  # ~3 frames per symbol
        fp.duration_predictor.fc.bias.fill_(1.4)
        fp.pitch_mean.fill_(214.7)
        fp.pitch_std.fill_(65.7)
    hg = HiFiGAN(HiFiGANDims(), weight_norm=True).eval()
    fp_ckpt, hg_ckpt = save_dle_fastpitch(fp, tmp_path / "fp.pt"), tmp_path / "hg.pt"
    config = {
        k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(hg.dims).items()
    }
    config.pop("n_mels")
    torch.save({"generator": dle_state_dict(hg), "config": config}, hg_ckpt)
    assert main(["convert", str(fp_ckpt), str(tmp_path / "a")]) == 0
    assert main(["convert", str(hg_ckpt), str(tmp_path / "v")]) == 0
    out = tmp_path / "hello.wav"
    args = ["synthesize", "Hello world.", "-o", str(out), "--acoustic", str(tmp_path / "a")]
    args += ["--vocoder", str(tmp_path / "v"), "--sample-format", "float32", "--device", "cpu"]
    assert main(args) == 0
    audio, sr = sf.read(out, dtype="float32")
    ids = TextProcessor("english_basic", "english_cleaners_v2", 0.0).encode("Hello world.")
    with torch.no_grad():
        mel, n = fp.generate_mel(torch.tensor([ids]), torch.tensor([len(ids)]), SynthesisOptions())
        ref = hg(mel[:, :, : int(n[0])])[0, 0].clamp(-1, 1).numpy()
    assert sr == 22050 and audio.shape == ref.shape and len(ref) > 22050 // 4
    assert np.abs(audio - ref).max() <= 1e-5


def test_cli_falls_back_to_bundled_defaults(tiny_voice, tiny_asr, tmp_path, monkeypatch, capsys):
    """With no model given, synthesize and transcribe use speechrt/defaults/<name> when shipped."""
    import shutil

    import speechrt.defaults

    bundle = tmp_path / "defaults"
    shutil.copytree(tiny_voice[0], bundle / "voice-acoustic")
    shutil.copytree(tiny_voice[1], bundle / "voice-vocoder")
    monkeypatch.setattr(speechrt.defaults, "DEFAULTS", tmp_path / "none")
    assert main(["synthesize", "Hi.", "-o", str(tmp_path / "x.wav")]) == 2
    assert "none bundled" in capsys.readouterr().err
    monkeypatch.setattr(speechrt.defaults, "DEFAULTS", bundle)
    out = tmp_path / "hello.wav"
    assert main(["synthesize", "Hello world.", "-o", str(out), "--device", "cpu"]) == 0
    assert sf.info(str(out)).samplerate == 22050
    assert main(["transcribe", str(out), "--device", "cpu"]) == 2  # no ASR bundled yet
    assert "none bundled" in capsys.readouterr().err
    shutil.copytree(tiny_asr, bundle / "asr")
    assert main(["transcribe", str(out), "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith(str(out))
