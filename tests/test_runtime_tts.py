"""The TTS pipeline on the onnx backend == eager, for every acoustic model x vocoder; CLIs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from runtime_models import TEXT, fastspeech, save, tacotron2, waveglow
from speechrt.audio.mel import MelConfig
from speechrt.cli import main
from speechrt.options import SynthesisOptions
from speechrt.tts import TTS

MEL = MelConfig()  # 22.05 kHz, hop 256, 80 mels: the real text front end and mel sizes
TEXTS = ["Hello world.", "A second, somewhat longer sentence. And a third one!"]


@pytest.fixture(scope="module")
def voices(tiny_voice: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("runtime_tts")
    dirs = {
        "fastpitch": Path(shutil.copytree(tiny_voice[0], root / "fastpitch")),
        "hifigan": Path(shutil.copytree(tiny_voice[1], root / "hifigan")),
        "tacotron2": save(tacotron2(n_mel_channels=80, n_symbols=148, max_decoder_steps=300),
                          root / "tacotron2", {"text": TEXT}, MEL),
        "fastspeech": save(fastspeech(n_mels=80, n_symbols=149), root / "fastspeech",
                           {"text": TEXT}, MEL),
        "waveglow": save(waveglow(n_mel_channels=80, upsample_kernel=1024, hop_length=256),
                         root / "waveglow", None, MEL),
    }  # fmt: skip
    for d in dirs.values():
        assert main(["export", str(d)]) == 0
    return dirs


@pytest.mark.parametrize("vocoder", ["hifigan", "waveglow"])
@pytest.mark.parametrize("acoustic", ["fastpitch", "tacotron2", "fastspeech"])
def test_onnx_pipeline_equals_eager(voices: dict, acoustic: str, vocoder: str) -> None:
    eager = TTS(voices[acoustic], voices[vocoder], device="cpu")
    onnx = TTS(voices[acoustic], voices[vocoder], device="cpu", backend="auto")
    assert onnx.backend == "onnx"  # auto on a CPU with exported graphs
    opts = SynthesisOptions(pace=1.1, denoise=0.01)
    ref = eager.synthesize(TEXTS, opts, seeds=[3, 4])
    got = onnx.synthesize(TEXTS, opts, seeds=[3, 4])
    for a, b in zip(ref, got, strict=True):
        assert a.shape == b.shape and len(a) > 0
        assert np.abs(a - b).max() <= 1e-4
    alone = onnx.synthesize(TEXTS[1:], opts, seeds=[4])[0]  # batch independence
    assert np.abs(alone - got[1]).max() <= 1e-5


def test_synthesize_and_bench_cli_on_onnx(voices: dict, tmp_path: Path) -> None:
    voice = ["--acoustic", str(voices["fastpitch"]), "--vocoder", str(voices["hifigan"])]
    out = tmp_path / "a.wav"
    args = ["synthesize", "Hello.", "-o", str(out), *voice, "--device", "cpu"]
    assert main([*args, "--backend", "onnx"]) == 0 and out.stat().st_size > 44
    assert main([*args, "--backend", "cuda"]) == 2  # no GPU here: one clear error
    bench = ["bench", "tts", *voice, "--device", "cpu", "--backends", "eager,onnx"]
    bench += ["--batch-sizes", "1", "--warmup", "0", "--iters", "1", "--out-dir", str(tmp_path)]
    assert main(bench) == 0
    assert main([*bench[:-2], "--backends", "tensorrt"]) == 2


@pytest.mark.parametrize("acoustic", ["fastpitch", "fastspeech"])
def test_one_step_text_to_audio_equals_two_stages(voices: dict, acoustic: str) -> None:
    """The cuda backend's text-to-audio step (RegulatedToAudio: decoder and vocoder as one
    graph after the frame count; here uncompiled on the CPU, with bucketed shapes) against its
    two stages: the same lengths and durations, audio within 1e-5 (clipped to [-1, 1] as the
    pipeline clips it); and through the pipeline, the same waves and word frames as eager."""
    import torch

    from speechrt.runtime.buckets import Buckets
    from speechrt.runtime.stages import TTSStages, text_to_audio

    eager = TTS(voices[acoustic], voices["hifigan"], device="cpu", backend="eager")
    tts = TTS(voices[acoustic], voices["hifigan"], device="cpu", backend="eager")
    assert not tts.one_step  # eager: two stages
    buckets = Buckets({"batch": (4,), "symbols": (64,), "frames": (32, 64)})
    a = (tts.acoustic, tts.acoustic_info, voices[acoustic])
    v = (tts.vocoder, tts.vocoder_info, voices["hifigan"])
    tts.stages = TTSStages("cuda", torch.device("cpu"), "fp32", a, v, buckets, None)
    assert not tts.one_step  # on the CPU the vocoder runs long mels in chunks
    tts.stages.vocoder.chunk_frames = None  # as on a GPU
    tts.stages.whole = text_to_audio(tts.stages.acoustic, tts.stages.vocoder)
    assert tts.one_step
    opts = SynthesisOptions(pace=0.9)
    pieces = tts.text_to_pieces(TEXTS, [3, 4])
    assert len(pieces) == 3  # the second text is two sentences
    ids, lengths, seeds = tts.batch_to_tensors(pieces)
    with torch.inference_mode():
        got = tts.ids_to_wave(ids, lengths, opts, seeds)
        out = tts.stages.acoustic.outputs(ids, lengths, opts, seeds)
        audio, audio_lengths = tts.mel_to_audio(out["mel"], out["mel_lengths"], opts, seeds)
    assert int(out["mel_lengths"].max()) > 64  # past the last bucket: a multiple of it
    assert set(got) == set(out) - {"mel"} | {"audio", "audio_lengths"}
    for name in set(out) - {"mel"}:
        assert torch.equal(got[name], out[name]), name
    assert torch.equal(got["audio_lengths"], audio_lengths)
    assert got["audio"].shape == audio.shape and got["audio"].dtype == torch.float32
    assert float((got["audio"] - audio.clamp(-1, 1)).abs().max()) <= 1e-5
    ref = eager.synthesize(TEXTS, opts, seeds=[3, 4])
    waves = tts.synthesize(TEXTS, opts, seeds=[3, 4])
    for w, r in zip(waves, ref, strict=True):
        assert w.shape == r.shape and np.abs(w - r).max() <= 1e-5
    if acoustic == "fastpitch":  # word times from the one step's durations
        timed = tts.ids_to_timed_audio(pieces, opts)
        want = eager.ids_to_timed_audio(pieces, opts)
        for t, r in zip(timed, want, strict=True):
            assert np.array_equal(t.frames, r.frames) and np.abs(t.audio - r.audio).max() <= 1e-5
