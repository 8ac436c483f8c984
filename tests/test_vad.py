"""Voice activity detection: silence and steady noise give no words, padding changes nothing,
long audio is cut at its pauses (speechrt.asr.vad and the ASR pipeline on the bundled models);
and telephone-rate audio gives the words of the wideband."""

from __future__ import annotations

import numpy as np
import pytest

from speechrt.asr.vad import VadOptions, cut, frame_energies_db, speech_regions, speech_windows

SR = 16000


def burst(seconds: float, seed: int) -> np.ndarray:
    """Speech-like: syllable-rate modulated tones and noise, ~-15 dBFS at its loudest."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2  # 4 syllables per second
    voice = np.sin(2 * np.pi * 180 * t) + 0.5 * np.sin(2 * np.pi * 900 * t)
    return (0.15 * envelope * (voice + 0.3 * rng.standard_normal(t.size))).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), np.float32)


def noise(seconds: float, level: float, seed: int = 0) -> np.ndarray:
    return (level * np.random.default_rng(seed).standard_normal(int(seconds * SR))).astype(
        np.float32
    )


def test_frame_energies() -> None:
    tone = (0.5 * np.sin(2 * np.pi * 1000 * np.arange(SR) / SR)).astype(np.float32)
    db = frame_energies_db(tone, SR)
    assert db.shape == (100,)  # one frame per 10 ms
    # mean square of a 0.5 sine = 0.125: -9.03 dBFS (the last frame half zeros: -3 dB)
    assert np.allclose(db[:-1], 10 * np.log10(0.125), atol=0.05)
    assert db[-1] == pytest.approx(10 * np.log10(0.0625), abs=0.05)
    assert frame_energies_db(np.zeros(5, np.float32), SR).shape == (1,)


@pytest.mark.parametrize(
    "audio",
    [silence(10), noise(10, 0.003), noise(10, 0.05), silence(0.005)],
    ids=["silence", "low-noise", "loud-noise", "5-ms"],
)
def test_no_speech(audio: np.ndarray) -> None:
    assert speech_regions(audio, SR) == []
    assert speech_windows(audio, SR) == []


def test_hum_is_not_speech() -> None:
    hum = 0.2 * np.sin(2 * np.pi * 50 * np.arange(5 * SR) / SR)
    assert speech_regions(hum.astype(np.float32), SR) == []


def test_regions_and_windows() -> None:
    """1 s silence, 1.5 s speech, 0.5 s pause, 1 s speech, 3 s silence, 1 s speech, 0.5 s."""
    parts = [silence(1), burst(1.5, 0), silence(0.5), burst(1, 1), silence(3), burst(1, 2)]
    audio = np.concatenate([*parts, silence(0.5)]) + noise(8.5, 1e-4)
    regions = speech_regions(audio, SR)
    edges = [(1.0, 2.5), (3.0, 4.0), (7.0, 8.0)]
    assert len(regions) == 3
    for (a, b), (x, y) in zip(regions, edges, strict=True):
        assert abs(a / SR - x) <= 0.03 and abs(b / SR - y) <= 0.03, (a / SR, b / SR)
    # the 0.5 s pause stays inside one window, the 3 s one separates two; 0.25 s of context
    windows = speech_windows(audio, SR)
    assert len(windows) == 2
    assert windows[0][0] == regions[0][0] - SR // 4 and windows[0][1] == regions[1][1] + SR // 4
    assert windows[1] == (regions[2][0] - SR // 4, regions[2][1] + SR // 4)
    # in a noise floor 40 dB down, the same regions
    noisy = audio + noise(8.5, 0.0015, seed=3)
    assert len(speech_regions(noisy, SR)) == 3


def test_clicks_and_bridges() -> None:
    click = np.concatenate([silence(1), np.full(320, 0.5, np.float32), silence(1)])  # 20 ms
    assert speech_regions(click + noise(2.02, 1e-4), SR) == []
    # a 0.2 s pause inside speech is bridged: one region
    audio = np.concatenate([silence(0.5), burst(1, 0), silence(0.2), burst(1, 1), silence(0.5)])
    audio += noise(3.2, 1e-4)
    assert len(speech_regions(audio, SR)) == 1
    assert len(speech_regions(audio, SR, VadOptions(bridge=0.1))) == 2


def test_cut_pads_with_zeros() -> None:
    x = np.arange(1, 11, dtype=np.float32)
    assert np.array_equal(cut(x, 2, 5), x[2:5])
    assert np.array_equal(cut(x, -2, 3), [0, 0, 1, 2, 3])
    assert np.array_equal(cut(x, 8, 12), [9, 10, 0, 0])
    with pytest.raises(ValueError):
        VadOptions(min_range_db=-1)


def test_hours_of_silence_cost_no_model_work() -> None:
    """An hour of silence: no window reaches the model (memory stays bounded while framing)."""
    assert speech_windows(np.zeros(3600 * SR, np.float32), SR) == []


def test_the_model_json_decides_and_the_caller_overrides() -> None:
    """model_vad: off unless model.json's meta turns it on (true, or options); an explicit
    True / False / VadOptions from the caller wins; a malformed setting is one error."""
    from speechrt.asr.vad import model_vad
    from speechrt.errors import SpeechRTError

    tuned = VadOptions(context=0.5)
    assert model_vad({}) is None and model_vad({"vad": False}) is None
    assert model_vad({"vad": True}) == VadOptions()
    assert model_vad({"vad": {"context": 0.5}}) == tuned
    assert model_vad({"vad": {"context": 0.5}}, False) is None
    assert model_vad({}, True) == VadOptions() and model_vad({"vad": False}, True) == VadOptions()
    assert model_vad({"vad": {"context": 0.5}}, True) == tuned  # on, with the model's options
    assert model_vad({"vad": True}, tuned) == tuned
    for bad in ("yes", 1, None, {"context": -1.0}, {"contexts": 0.5}, {"context": "wide"}):
        with pytest.raises(SpeechRTError, match="dir: model.json vad"):
            model_vad({"vad": bad}, where="dir")


@pytest.fixture(scope="module")
def recorded() -> tuple[object, np.ndarray, np.ndarray]:
    """The bundled recogniser (onnx, the CPU default) and two sentences of the bundled voice."""
    from speechrt.asr import ASR
    from speechrt.tts import TTS

    tts, asr = TTS(), ASR()
    waves = []
    for text in ("Speech recognition works on this machine.", "The cat sat on the mat."):
        (audio,) = tts.synthesize([text])
        waves.append(asr.load_audio(audio_bytes(audio, tts.sampling_rate)))
    return asr, waves[0], waves[1]


def audio_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, audio, sample_rate, format="WAV")
    return buf.getvalue()


def test_bundled_recogniser_hears_nothing_in_silence_and_noise(recorded) -> None:
    asr, _, _ = recorded
    for audio in (silence(10), noise(10, 0.003)):
        t = asr.transcribe([audio])[0]
        assert t.text == "" and t.words == [] and t.duration == pytest.approx(10.0)


def test_padding_with_silence_changes_nothing(recorded) -> None:
    asr, speech, _ = recorded
    plain = asr.transcribe([speech])[0]
    assert len(plain.text.split()) >= 4
    for pad in (1.0, 3.0):
        padded = asr.transcribe([np.concatenate([silence(pad), speech, silence(pad)])])[0]
        assert padded.text == plain.text
        # same words, shifted; the plain one's times are clipped to its ends (a first word's
        # frames may start before its sound), the padded one's only to the silence's
        lo, hi = pad, pad + plain.duration
        for a, b in zip(padded.words, plain.words, strict=True):
            assert min(max(a.start, lo), hi) == pytest.approx(b.start + pad, abs=0.011)
            assert min(max(a.end, lo), hi) == pytest.approx(b.end + pad, abs=0.011)


def test_the_bundled_recogniser_turns_the_detector_on_in_its_model_json(recorded, tmp_path) -> None:
    """The bundled model.json says `"vad": true`; the same weights with a model.json that says
    nothing transcribe without the detector (as a converted checkpoint does), unless asked."""
    import json
    from pathlib import Path

    from speechrt.asr import ASR
    from speechrt.defaults import asr_dir

    asr, _, _ = recorded
    bundled = Path(asr_dir(None))
    info = json.loads((bundled / "model.json").read_text())
    assert info["meta"]["vad"] is True and asr.vad == VadOptions()
    del info["meta"]["vad"]
    for f in bundled.iterdir():
        if f.name != "model.json":
            (tmp_path / f.name).symlink_to(f)
    (tmp_path / "model.json").write_text(json.dumps(info))
    assert ASR(tmp_path).vad is None
    assert ASR(tmp_path, vad=True).vad == VadOptions()
    assert len(ASR(tmp_path).speech_segments(0, silence(10))) >= 1


def test_without_the_detector_silence_reaches_the_recogniser(recorded) -> None:
    """vad=False hands every window to the recogniser; the detector hands it none of silence.
    (Earlier recognisers made words of silence alone, the reason the detector exists; the
    bundled one, trained with silence, noise and hum around its speech, now hears nothing in
    10 s of them either way, so the difference shows in the windows, not the words.)"""
    from speechrt.asr import ASR

    asr, _, _ = recorded
    assert asr.speech_segments(0, silence(10)) == []
    assert len(ASR(vad=False).speech_segments(0, silence(10))) >= 1


def test_telephone_rate_gives_the_same_words(recorded) -> None:
    """The sentence as an 8 kHz file, mono and stereo, is heard through the telephone band the
    recogniser learnt (speechrt.audio.telephone) and gives the same words."""
    from speechrt.audio.io import resample

    asr, speech, _ = recorded
    plain = asr.transcribe([speech])[0].text
    narrow = resample(speech, SR, 8000)
    assert asr.features.narrowband == "telephone"
    for channels in (1, 2):
        data = audio_bytes(np.stack([narrow] * channels, axis=1), 8000)
        assert asr.transcribe([data])[0].text == plain


def test_long_audio_is_cut_at_pauses(recorded) -> None:
    """Two sentences 4 s apart: two windows, each transcribed as if alone (up to one word: each
    window draws its own dither noise, so a word on the edge may come out otherwise)."""
    from speechrt.asr.wer import word_errors

    asr, first, second = recorded
    joined = np.concatenate([first, silence(4), second])
    windows = asr.speech_segments(0, joined)
    assert len(windows) == 2
    got = asr.transcribe([joined])[0]
    alone = [t.text for t in asr.transcribe([first, second])]
    assert len(got.words) == len(" ".join(alone).split())
    assert word_errors(" ".join(alone), got.text).errors <= 1, (got.text, alone)
    duration = joined.size / SR
    assert all(0 <= w.start <= w.end <= duration for w in got.words)
    # CTC places a window's first word early, into its context: the words of each sentence
    # lie on its side of the pause's middle
    n_first, middle = len(alone[0].split()), first.size / SR + 2.0
    assert got.words[n_first - 1].end < middle < got.words[n_first].start


def test_cli_vad_flags(tmp_path, capsys, monkeypatch) -> None:
    """`speechrt transcribe` on 5 s of digital silence: no words; --no-vad: the recogniser
    without its detector; neither flag: the model's own setting (ASR's vad=None)."""
    import soundfile as sf

    import speechrt.asr as asr_module
    from speechrt.cli import main

    path = tmp_path / "silence.wav"
    sf.write(path, silence(5), SR)
    assert main(["transcribe", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}\t\n"
    made = []  # --no-vad reaches the recogniser as vad=False, --vad as True
    real = asr_module.ASR.__init__

    def init(self, *args, **kwargs):
        made.append(kwargs.get("vad", "default"))
        real(self, *args, **kwargs)

    monkeypatch.setattr(asr_module.ASR, "__init__", init)
    assert main(["transcribe", str(path), "--no-vad"]) == 0
    assert made == [False] and capsys.readouterr().out.startswith(f"{path}\t")
    assert main(["transcribe", str(path), "--vad"]) == 0
    assert main(["transcribe", str(path)]) == 0
    assert made == [False, True, "default"]
    assert capsys.readouterr().out == f"{path}\t\n" * 2
    assert main(["transcribe", str(path), "--no-vad", "--url", "http://127.0.0.1:9"]) != 0
    assert "--url" in capsys.readouterr().err


def test_turn_detector_follows_the_offline_regions() -> None:
    """Pushed in uneven pieces: a start where speech begins and a stop where the 3 s pause
    begins (the 0.3 s pause is no turn); the same events as one push."""
    from speechrt.asr.vad import TurnDetector

    parts = [silence(1), burst(1.5, 0), silence(0.3), burst(1, 1), silence(3), burst(1, 2)]
    audio = np.concatenate([*parts, silence(1)]) + noise(8.8, 1e-4)
    whole = TurnDetector(SR, silence=0.5).push(audio)
    td, events, at = TurnDetector(SR, silence=0.5), [], 0
    rng = np.random.default_rng(0)
    while at < audio.size:
        step = int(rng.integers(1, 4000))
        events += td.push(audio[at : at + step])
        at += step
    assert events == whole
    assert [k for k, _, _ in events] == ["start", "stop", "start", "stop"]
    for (kind, got, decided), want in zip(events, (1.0, 3.8, 6.8, 7.8), strict=True):
        assert abs(got / SR - want) <= 0.05, (got / SR, want)
        assert decided - got == (0.05 if kind == "start" else 0.5) * SR


def test_turn_detector_hears_no_turn_in_steady_noise() -> None:
    from speechrt.asr.vad import TurnDetector

    assert TurnDetector(SR).push(noise(10, 0.003)) == []
    assert TurnDetector(SR).push(silence(3)) == []


def test_streaming_partials_stay_empty_in_silence_and_noise(recorded) -> None:
    """The streaming recogniser shows no words before the detector hears speech; with speech,
    the final text is the offline one."""
    from speechrt.asr.chunked import recognizer

    asr, speech, _ = recorded
    for audio in (silence(4), noise(4, 0.003)):
        sr = recognizer(asr)
        partials = [sr.push(audio[i : i + 1600]) for i in range(0, audio.size, 1600)]
        assert [p.text for p in partials if p is not None] == [""] * 8
        assert sr.finish().text == ""
    sr = recognizer(asr)
    audio = np.concatenate([silence(1), speech])
    partials = [sr.push(audio[i : i + 1600]) for i in range(0, audio.size, 1600)]
    assert any(p is not None and p.text for p in partials)
    assert sr.finish().text == asr.transcribe([audio])[0].text


def test_hear_then_finish_is_transcribe(recorded) -> None:
    """The server's split: the device half (the ASR adapter, on the device thread: windows as
    batch items) decodes nothing; finish gives transcribe's words."""
    from speechrt.asr.decoding import Heard
    from speechrt.serving.pipelines import ASRAdapter

    asr, first, second = recorded
    joined = np.concatenate([first, silence(2), second])
    windows = [asr.speech_segments(i, a, asr.seed + i) for i, a in enumerate([first, joined])]
    assert [len(w) for w in windows] == [1, 2]
    batch = windows[1] + windows[0]  # one batch item per window, of any recordings
    assert all(a is b for a, b in zip(ASRAdapter(asr).run_batch(batch), batch, strict=True))
    waves = [first, joined]
    heard = [Heard(a.size / asr.sample_rate, w) for a, w in zip(waves, windows, strict=True)]
    assert all(s.words == [] and s.log_probs is not None for h in heard for s in h.segments)
    got = [asr.finish(h) for h in heard]
    want = asr.transcribe([first, joined])
    assert [(t.text, t.words, t.duration) for t in got] == [
        (t.text, t.words, t.duration) for t in want
    ]
    assert all(s.log_probs is None for h in heard for s in h.segments)  # frames dropped
