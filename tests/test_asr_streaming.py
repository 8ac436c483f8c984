"""The streaming recogniser (speechrt.asr.streaming): committed log-probs equal offline ones on a
tiny random model and on the bundled one, the streaming front end equals the offline features,
partials come every chunk, the final text equals offline transcription, memory stays bounded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from speechrt.asr import ASR
from speechrt.asr.streaming import (
    StreamingRecognizer,
    committed_log_probs,
    plan_window,
    receptive_field,
    window_log_probs,
)
from speechrt.asr.wer import char_errors
from speechrt.audio.features import FeatureConfig, log_mel_numpy
from speechrt.audio.stream_features import StreamingFrontEnd
from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model
from speechrt.registry import preset

TOL = 1e-3  # log-probs: float32 convolutions over windows of other lengths

bundled = pytest.mark.skipif(
    default_model(ASR_MODEL) is None or default_model(VOICE_ACOUSTIC) is None,
    reason="no default models bundled",
)


def _bundled_kind() -> str | None:
    from speechrt.repo import read_info

    d = default_model(ASR_MODEL)
    return None if d is None else read_info(d).kind


# StreamingRecognizer's exact committed frames are a convolutional CTC model's (QuartzNet's);
# an attention model streams in chunks (speechrt.asr.chunked, tests/test_asr_chunked.py)
bundled_quartznet = pytest.mark.skipif(
    default_model(VOICE_ACOUSTIC) is None or _bundled_kind() != "quartznet",
    reason="the bundled recogniser is not a QuartzNet",
)


def _dims(d: object) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(d).items()}


def test_receptive_field_from_the_dims() -> None:
    # QuartzNet 5x5: the prologue's 16 frames, then 2 x (5 x (16 + 19 + 25 + 31 + 37) + 2 x 43)
    assert receptive_field(_dims(preset("quartznet", "quartznet-5x5"))) == 16 + 2 * 726
    # tiny: prologue k 11 (5 frames), then 2 x (2 sub-blocks x 6)
    assert receptive_field(_dims(preset("quartznet", "tiny"))) == 5 + 2 * 12


def test_plan_commits_only_frames_with_their_whole_span() -> None:
    w = plan_window(committed=0, available=100, rf=29, stride=2)
    assert (w.start, w.stop, w.commit_from, w.commit_to) == (0, 100, 0, 36)
    assert (w.commit_to - 1) * 2 + 29 < 100 <= w.commit_to * 2 + 29  # the last one that can
    w = plan_window(committed=36, available=160, rf=29, stride=2)
    assert w.start == 42 and w.commit_to == 66  # from 29 frames before frame 36's centre
    final = plan_window(committed=66, available=150, rf=29, stride=2, final=160)
    assert (final.start, final.stop, final.length, final.commit_to) == (102, 160, 48, 80)


def _offline(asr: ASR, feats: np.ndarray, valid: int) -> np.ndarray:
    return window_log_probs(asr, feats, valid)  # the whole utterance in one window


def _parity(asr: ASR, n_frames: int, valid: int, step: int, rf: int | None = None) -> float:
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((asr.features.n_mels, n_frames)).astype(np.float32)
    feats[:, valid:] = 0.0
    ref = _offline(asr, feats, valid)
    rf = receptive_field(asr.info.dims) if rf is None else rf
    run = lambda f, n: window_log_probs(asr, f, n)  # noqa: E731
    got = committed_log_probs(run, feats, valid, rf, 2, step)
    assert got.shape == ref.shape
    return float(np.abs(got - ref).max())


def test_committed_log_probs_equal_offline_on_a_tiny_model(tiny_asr: Path) -> None:
    asr = ASR(tiny_asr, dither=0)
    rf = receptive_field(asr.info.dims)
    for step in (1, 7, 50):
        assert _parity(asr, 400, 389, step) < TOL
    # the parity needs the whole field: one frame of right context short, it breaks
    assert _parity(asr, 400, 389, 7, rf=rf - 2) > 10 * TOL


@bundled_quartznet
def test_committed_log_probs_equal_offline_on_the_bundled_model() -> None:
    asr = ASR(device="cpu", dither=0)
    rf = receptive_field(asr.info.dims)
    # long enough for windows that start and end mid-utterance (2 x 1468 frames of context)
    assert _parity(asr, 3 * rf + 32, 3 * rf + 21, 700) < TOL


def test_front_end_equals_offline_features() -> None:
    """Pushed in ragged chunks: once finished, its statistics are the utterance's, and its
    features are log_mel_numpy's."""
    cfg = FeatureConfig()
    rng = np.random.default_rng(1)
    for n in (321, 16000, 16123):
        audio = (0.1 * rng.standard_normal(n)).astype(np.float32)
        fe = StreamingFrontEnd(cfg)
        sizes = rng.integers(1, 900, size=n)
        start = 0
        for size in sizes:
            fe.push(audio[start : start + size])
            start += size
            if start >= n:
                break
        fe.finish()
        ref = log_mel_numpy(audio, cfg)
        got = fe.features(0, fe.n_frames)
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() < 1e-4


def test_too_short_a_stream_is_an_error(tiny_asr: Path) -> None:
    from speechrt.errors import SpeechRTError

    rec = StreamingRecognizer(ASR(tiny_asr))
    rec.push(np.zeros(100, dtype=np.float32))
    with pytest.raises(SpeechRTError, match="too short"):
        rec.finish()


def test_long_audio_keeps_memory_bounded(tiny_asr: Path) -> None:
    asr = ASR(tiny_asr, dither=0)
    rf = receptive_field(asr.info.dims)
    rec = StreamingRecognizer(asr, chunk=0.5, keep_seconds=5.0)
    rng = np.random.default_rng(2)
    held = []
    for _ in range(60):  # 30 s
        rec.push((0.1 * rng.standard_normal(8000)).astype(np.float32))
        held.append(rec.front.frames.shape[1])
    chunk_frames = 50
    assert max(held) <= 2 * rf + chunk_frames + 4
    final = rec.finish()
    assert not final.offline and rec.kept is None  # 30 s > keep_seconds: the streaming text
    assert final.seconds == pytest.approx(30.0)


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    from speechrt.audio.io import resample
    from speechrt.tts import TTS

    tts = TTS(device="cpu")
    text = "Speech recognition works on this machine. Please call Stella and ask her to bring "
    (audio,) = tts.synthesize([text + "these things with her from the store."])  # 6.8 s
    return resample(audio, tts.sampling_rate, 16000)


@bundled_quartznet
def test_partials_every_chunk_and_final_equals_offline(speech: np.ndarray) -> None:
    asr = ASR(device="cpu")
    offline = asr.transcribe([speech])[0].text
    rec = StreamingRecognizer(asr, chunk=0.5)
    partials = []
    for start in range(0, speech.shape[0], 1600):  # 0.1 s pieces
        p = rec.push(speech[start : start + 1600])
        if p is not None:
            partials.append(p)
    n = speech.shape[0] // 8000
    assert len(partials) == n  # one per 0.5 s of audio
    assert [p.seconds for p in partials] == pytest.approx([0.5 * (i + 1) for i in range(n)])
    # partials decode greedily on running statistics: close to, not equal to, the final text
    assert {"speech", "works", "machine"} <= set(partials[-1].text.split())
    final = rec.finish()
    assert final.offline and final.text == offline
    assert [w.word for w in final.words] == offline.split()
    # past 4 s, partials come from 4 s windows between the full ones: within a few letters of those
    full = StreamingRecognizer(asr, chunk=0.5, partial_window=None)
    texts = [full.push(speech[i : i + 8000]) for i in range(0, speech.shape[0], 8000)]
    for cheap, ref in zip(partials, [p for p in texts if p is not None], strict=True):
        assert char_errors(ref.text, cheap.text).errors <= 3


@bundled
def test_cli_stream_prints_partials_then_the_offline_text(
    speech: np.ndarray, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import soundfile as sf

    from speechrt.cli import main

    path = tmp_path / "a.wav"
    sf.write(path, speech, 16000, subtype="FLOAT")
    assert main(["transcribe", str(path)]) == 0
    offline = capsys.readouterr().out
    assert main(["transcribe", "--stream", "--chunk-ms", "50", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == offline  # FILE<TAB>text
    lines = err.splitlines()  # not a terminal: one line per partial, every 0.5 s of audio
    assert len(lines) == speech.shape[0] // 8000 and lines[0].startswith("partial\t0.50\t")
    assert main(["transcribe", "--realtime", str(path)]) == 2
    assert "--stream" in capsys.readouterr().err


@bundled
def test_streaming_on_onnx_imports_no_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from speechrt.asr import ASR\n"
        "from speechrt.asr.chunked import recognizer\n"
        "rec = recognizer(ASR(device='cpu'))\n"
        "x = (0.1 * np.random.default_rng(0).standard_normal(24000)).astype(np.float32)\n"
        "assert rec.push(x) is not None and rec.finish().offline\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
