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
