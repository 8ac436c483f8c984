"""The ASR pipeline with tiny converted models: batching, inputs, long audio, errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from dle_jasper import DECODER_GAIN, speechlike, talkative_model
from speechrt.asr import ASR
from speechrt.audio.io import resample
from speechrt.cli import main
from speechrt.errors import SpeechRTError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("asr_models")
    dirs = {}
    for kind in ("jasper", "quartznet"):
        torch.save({"state_dict": talkative_model(kind).state_dict()}, root / f"{kind}.pt")
        assert main(["convert", str(root / f"{kind}.pt"), str(root / kind)]) == 0
        dirs[kind] = root / kind
    return dirs


def wav_bytes(audio: np.ndarray, sr: int = 16000, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, sr, format="WAV", subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["jasper", "quartznet"])
@pytest.mark.parametrize("dither", [None, 1e-4])
def test_batched_equals_single(model_dirs: dict[str, Path], kind: str, dither) -> None:
    asr = ASR(model_dirs[kind], dither=dither)
    waves = [speechlike(s, i) for i, s in enumerate((2.5, 1.0, 0.4, 1.7, 3.0))]
    batched = asr.transcribe(waves, batch_size=5)
    singles = [asr.transcribe([w], batch_size=1, seeds=[i])[0] for i, w in enumerate(waves)]
    assert [t.text for t in batched] == [t.text for t in singles]
    assert [t.words for t in batched] == [t.words for t in singles]
    assert sum(len(t.words) for t in batched) >= 10  # the test model does say things
    segs = [asr.segments(i, w, seed=i)[0] for i, w in enumerate(waves)]
    lp, frames = asr.log_probs(segs)
    for i, seg in enumerate(segs):
        one, n = asr.log_probs([seg])
        assert n.item() == frames[i].item() == one.shape[1]  # the padded tail is decoded too
        # 1e-5 at the logit scale of a plain model (this one's logits are DECODER_GAIN x larger)
        assert (one[0] - lp[i, : one.shape[1]]).abs().max().item() <= 1e-5 * DECODER_GAIN


def test_valid_frames_only(model_dirs: dict[str, Path]) -> None:
    asr = ASR(model_dirs["jasper"], decode_padding=False)
    w = speechlike(1.234, 3)
    _, frames = asr.log_probs(asr.segments(0, w))
    # ceil(N / 160) feature frames + 16 leading, halved by the stride-2 prologue
    assert frames.item() == -(-(-(-w.size // 160) + 16) // 2)
    t = asr.transcribe([w])[0]
    assert t.words and all(0 <= x.start <= x.end <= t.duration for x in t.words)


def test_inputs_paths_bytes_arrays(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    asr = ASR(model_dirs["quartznet"])
    pcm = (speechlike(1.5, 7) * 32767).astype(np.int16)
    data = wav_bytes(pcm)
    (tmp_path / "a.wav").write_bytes(data)
    flac = tmp_path / "a.flac"
    sf.write(flac, pcm, 16000)
    out = asr.transcribe([str(tmp_path / "a.wav"), data, pcm, pcm / 32768.0, flac], batch_size=2)
    assert len({t.text for t in out}) == 1 and out[0].text
    assert out[0].duration == pytest.approx(1.5) and all(t.rtf > 0 for t in out)
    d = out[0].to_dict()
    assert set(d) == {"text", "words", "duration", "rtf"} and set(d["words"][0]) == {
        "word",
        "start",
        "end",
    }


def test_8khz_is_resampled(model_dirs: dict[str, Path]) -> None:
    asr = ASR(model_dirs["jasper"])
    low = (resample(speechlike(2.0, 8), 16000, 8000) * 32767).astype(np.int16)
    got = asr.transcribe([wav_bytes(low, 8000)])[0]
    want = asr.transcribe([resample(low / 32768.0, 8000, 16000)])[0]
    assert got.duration == pytest.approx(2.0) and got.text == want.text


def test_six_channels_are_mixed(model_dirs: dict[str, Path]) -> None:
    asr = ASR(model_dirs["jasper"])
    chans = np.stack([speechlike(1.2, 20 + c) * (c + 1) / 8 for c in range(6)], axis=1)
    data = wav_bytes(chans, subtype="FLOAT")
    got = asr.transcribe([data])[0]
    assert got.text == asr.transcribe([chans.astype(np.float32).mean(axis=1)])[0].text


def test_bad_audio(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    asr = ASR(model_dirs["quartznet"])
    data = wav_bytes((speechlike(1.0, 1) * 32767).astype(np.int16))
    cases = {
        "header": data[:30],
        "noise": b"this is not audio at all" * 40,
        "empty bytes": b"",
        "zero frames": wav_bytes(np.zeros(0, np.int16)),
        "zero array": np.zeros(0, np.float32),
        "too short": np.zeros(100, np.float32),
        "2-D": np.zeros((2, 16000), np.float32),
        "nan": np.full(16000, np.nan, np.float32),
        "missing": str(tmp_path / "nope.wav"),
    }
    for name, src in cases.items():
        with pytest.raises(SpeechRTError) as e:
            asr.transcribe([src])
        assert "\n" not in str(e.value), name
    # Cut inside the data chunk: libsndfile reads what is there (a correct, shorter result).
    t = asr.transcribe([data[: len(data) // 2 + 1]])[0]
    assert t.duration == pytest.approx(0.5, abs=0.01)
    with pytest.raises(SpeechRTError, match="batch size"):
        asr.transcribe([data], batch_size=0)


def test_segments_partition_long_audio(model_dirs: dict[str, Path]) -> None:
    asr = ASR(model_dirs["quartznet"], window=2.0, overlap=0.5)
    for n in (32000, 32001, 40000, 100_123):
        segs = asr.segments(0, np.zeros(n, np.float32))
        assert segs[0].offset == 0 and segs[-1].offset * 16000 + segs[-1].audio.size == n
        assert all(s.audio.size == 32000 for s in segs)
        for a, b in zip(segs, segs[1:], strict=False):
            assert a.offset + 2.0 - b.offset >= 0.5 - 1e-9  # overlap kept
            assert a.keep[1] == b.keep[0] and a.offset < a.keep[1] < a.offset + 2.0
        assert segs[0].keep[0] == -np.inf and segs[-1].keep[1] == np.inf


def test_long_audio_stitching(model_dirs: dict[str, Path]) -> None:
    asr = ASR(model_dirs["jasper"], window=3.0, overlap=1.0, vad=False)  # fixed windows
    w = speechlike(10.0, 11)
    words = asr.transcribe([w], batch_size=3)[0].words
    expect = []
    for seg in asr.segments(0, w):  # each window alone, shifted, keeping its own centres
        for x in asr.transcribe([seg.audio])[0].words:
            s, e = x.start + seg.offset, x.end + seg.offset
            if seg.keep[0] <= (s + e) / 2 < seg.keep[1]:
                expect.append((x.word, round(s, 3), round(e, 3)))
    assert [(x.word, round(x.start, 3), round(x.end, 3)) for x in words] == expect
    assert len(words) > 5 and all(
        a.start <= b.start for a, b in zip(words, words[1:], strict=False)
    )


def test_ten_minutes_in_linear_work(
    model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work counted, not timed: ten minutes go to the model as 38 windows of 20 s starting every
    16 s (2,001 feature frames padded to 2,016), in batches of 8: no second is seen more than
    twice and nothing but the number of windows grows with the audio's length."""
    asr = ASR(model_dirs["quartznet"])
    w = np.tile(speechlike(30.0, 5), 20)  # 10 minutes
    path = tmp_path / "long.flac"
    sf.write(path, w, 16000)
    calls: list[tuple[int, int]] = []  # (windows, feature frames) of each model call
    acoustic = asr.acoustic

    def counted(feats: torch.Tensor, lengths: torch.Tensor, samples: list[int]):
        calls.append((feats.shape[0], feats.shape[2]))  # feats (B, F, T)
        return acoustic(feats, lengths, samples)

    monkeypatch.setattr(asr, "acoustic", counted)
    (t,) = asr.transcribe([path], batch_size=8)
    assert calls == [(8, 2016)] * 4 + [(6, 2016)]
    assert t.duration == pytest.approx(600.0) and len(t.words) > 100
    assert all(0 <= x.start <= x.end <= 600.0 for x in t.words)
    assert all(a.start <= b.start for a, b in zip(t.words, t.words[1:], strict=False))


def test_bad_model_dirs(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    good = model_dirs["jasper"]
    info = json.loads((good / "model.json").read_text())
    weights = (good / "model.safetensors").read_bytes()

    def make(name: str, info_text: str | None, weights_data: bytes | None) -> Path:
        d = tmp_path / name
        d.mkdir()
        if info_text is not None:
            (d / "model.json").write_text(info_text)
        if weights_data is not None:
            (d / "model.safetensors").write_bytes(weights_data)
        return d

    wrong_dims = dict(info, dims=dict(info["dims"], filters=[8] * len(info["dims"]["filters"])))
    bad_types = dict(info, dims=dict(info["dims"], repeats="five"))
    no_labels = dict(info, meta={"features": info["meta"]["features"]})
    dirs = [
        tmp_path / "missing",
        make("empty", None, None),
        make("garbage_json", "{not json", weights),
        make("garbage_weights", json.dumps(info), b"\x00" * 100),
        make("no_weights", json.dumps(info), None),
        make("wrong_dims", json.dumps(wrong_dims), weights),
        make("bad_types", json.dumps(bad_types), weights),
        make("no_labels", json.dumps(no_labels), weights),
    ]
    for d in dirs:
        with pytest.raises(SpeechRTError) as e:
            ASR(d)
        assert "\n" not in str(e.value), d.name
