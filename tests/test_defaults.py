"""The bundled default models (src/speechrt/defaults/): the CLI, the Python API and the server
use them when given no model, and they say something of the right length."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from speechrt.cli import main
from speechrt.defaults import (
    ASR_MODEL,
    BUNDLED_VOICE,
    VOICE_ACOUSTIC,
    VOICE_VOCODER,
    default_model,
)
from speechrt.errors import SpeechRTError
from speechrt.tts import TTS

pytestmark = pytest.mark.skipif(
    default_model(VOICE_ACOUSTIC) is None or default_model(VOICE_VOCODER) is None,
    reason="no default voice bundled",
)

SENTENCES = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
]


@pytest.fixture(scope="module")
def voice():
    from speechrt.tts import TTS

    return TTS(device="cpu")  # no model given: the bundled voice


def test_bundled_voice_is_the_trained_small_one(voice):
    assert voice.acoustic_info.kind == "fastpitch" and voice.vocoder_info.kind == "hifigan"
    assert voice.acoustic_info.source["trained_by"] == "speechrt_train"
    assert voice.sampling_rate == 22050


def test_bundled_voice_speaks_at_a_speaking_rate(voice):
    """Duration tracks the text (about 2-4 words a second) and the audio is voiced speech, not
    silence or noise: most of its energy lies below 4 kHz, as in the teacher's speech."""
    audios = voice.synthesize(SENTENCES)
    for text, audio in zip(SENTENCES, audios, strict=True):
        seconds = len(audio) / voice.sampling_rate
        words = len(text.split())
        assert words / 5.0 <= seconds <= words / 1.5 + 0.5, (text, seconds)
        assert np.abs(audio).max() <= 1.0 and np.sqrt(np.mean(audio**2)) > 0.02
        spectrum = np.abs(np.fft.rfft(audio)) ** 2
        freqs = np.fft.rfftfreq(len(audio), 1 / voice.sampling_rate)
        assert spectrum[freqs < 4000].sum() > 0.8 * spectrum.sum()


def test_cli_synthesize_with_no_model_uses_the_bundled_voice(voice, tmp_path):
    out = tmp_path / "hello.wav"
    assert main(["synthesize", "Hello world.", "-o", str(out), "--device", "cpu"]) == 0
    audio, sr = sf.read(out, dtype="float32")
    ref = voice.synthesize(["Hello world."])[0]
    assert sr == 22050 and audio.shape == ref.shape
    assert np.abs(audio - ref).max() <= 1 / 32768 + 1e-7  # int16 WAV of the same audio


def test_half_a_voice_is_an_error(tmp_path, capsys):
    from speechrt.tts import TTS

    with pytest.raises(SpeechRTError, match="both"):
        TTS(default_model(VOICE_ACOUSTIC), None)
    args = ["synthesize", "Hi.", "-o", str(tmp_path / "x.wav"), "--vocoder", "x"]
    assert main(args) == 2
    assert "both" in capsys.readouterr().err


def test_serve_with_no_model_serves_the_bundled_models(start_server):
    url, _ = start_server("--device", "cpu")
    models = httpx.get(f"{url}/v1/models").json()["data"]
    assert "tts" in {m["id"] for m in models}
    r = httpx.post(
        f"{url}/v1/audio/speech",
        json={"model": "tts", "input": "Hello world.", "voice": "0", "response_format": "wav"},
        timeout=60,
    )
    assert r.status_code == 200 and r.content[:4] == b"RIFF"
    # one name for the bundled voice, as TTS() gives it however its directories are named
    (voice,) = httpx.get(f"{url}/v1/audio/voices").json()["voices"]
    assert voice["id"] == BUNDLED_VOICE == "default" and voice["speaker"] == 0
    assert TTS(device="cpu").name == BUNDLED_VOICE
    assert TTS(default_model(VOICE_ACOUSTIC), default_model(VOICE_VOCODER)).name == BUNDLED_VOICE
    body = {"model": "tts", "input": "Hi.", "voice": "default", "response_format": "wav"}
    assert httpx.post(f"{url}/v1/audio/speech", json=body, timeout=60).status_code == 200
    r = httpx.post(f"{url}/v1/audio/speech", json={**body, "voice": "fastpitch"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        "voice 'fastpitch' not found; this server's voices: default; also 0 or speaker-0, and "
        "OpenAI's voice names (alloy, ash, ballad, coral, echo, fable, nova, onyx, sage, "
        "shimmer, verse, marin, cedar) for default"
    )
    if default_model(ASR_MODEL) is None:
        return
    assert "asr" in {m["id"] for m in models}
    # the round trip over HTTP: the server's recogniser decodes with the bundled LM, as ASR()
    from speechrt.asr import ASR

    speech = httpx.post(
        f"{url}/v1/audio/speech",
        json={"model": "tts", "input": SENTENCES[1], "voice": "0", "response_format": "wav"},
        timeout=60,
    ).content
    r = httpx.post(
        f"{url}/v1/audio/transcriptions",
        files={"file": ("fox.wav", speech)},
        data={
            "model": "asr",
            "response_format": "verbose_json",
            "timestamp_granularities[]": "word",
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    asr = ASR(device="cpu")
    want = asr.transcribe([asr.load_audio(speech)])[0]
    got = r.json()
    assert asr.decoder == "beam" and got["text"] == want.text
    assert [w["word"] for w in got["words"]] == want.text.split()
    starts = [w["start"] for w in got["words"]]
    assert starts == sorted(starts) and got["words"][-1]["end"] <= got["duration"] + 1e-6


HELDOUT = Path(__file__).parent / "data" / "heldout_sentences.txt"


def heldout_sentences() -> list[str]:
    return HELDOUT.read_text().splitlines()


def test_round_trip_sentences_are_held_out():
    """The round-trip sentences: >= 30, and no default model trained on them (the split is a
    hash of the text, train/speechrt_train/texts.py)."""
    from speechrt_train.texts import is_heldout

    sentences = heldout_sentences()
    assert len(sentences) >= 30 and all(is_heldout(s) for s in sentences)


# Issue #8 asks for <= 10 %. Measured with the bundled recogniser (step 36,119) + LM (alpha 0.7):
# 0.076 on these 40 sentences (0.081 on 200 held-out ones); 0.103 with step 29,808 (e43f02a),
# 0.115 with step 26,491 (79f5170). With voice activity detection (the default since), each
# utterance is cut with 0.25 s of context, zeros past the file's ends: 0.092 on these 40
# (0.091 against 0.087 without it on 200 others), and 39 of the 40 transcripts stay the same
# when the audio is padded with 3 s of silence. Step 38,189 (trained for real recordings):
# 0.0945 with voice activity detection; step 39,606: 0.0883 (0.0862 without); step 40,461:
# 0.1006; the mean of steps 39,606 and 40,461: 0.0924, with or without; 0.7 x that mean +
# 0.3 x step 42,774: 0.0945 (0.0903 without); step 46,854: 0.0903 (0.0862 without); the
# equal mean of steps 46,854, 49,751 and 51,902: 0.0924 (0.0801 without); with 54,880 and
# 57,170 too: 0.0924 (0.0883 without); with 60,560 as well (shipped): 0.0883, with or without.
# The FastConformer that replaced QuartzNet (the soup of G, H and the soup of C, D and A+B,
# docs/models/fastconformer.md): 0.0719 on these 40, 0.078 on 223 other held-out ones.
ROUND_TRIP_WER = 0.10


@pytest.mark.skipif(default_model(ASR_MODEL) is None, reason="no default recogniser bundled yet")
def test_round_trip_default_voice_through_default_asr(voice):
    """Held-out sentences spoken by the default voice, heard by the default recogniser (beam
    search with its LM): WER against the words the voice was asked to say (numbers etc.
    normalized) stays at what was measured."""
    from speechrt.asr import ASR
    from speechrt.asr.wer import wer
    from speechrt.audio.io import resample
    from speechrt_train.align import tp_plain
    from speechrt_train.asr_data import transcript

    sentences = heldout_sentences()
    asr = ASR(device="cpu")
    assert asr.decoder == "beam"  # the bundled LM is used by default
    assert voice.backend == asr.backend == "onnx"  # what a CPU user gets by default
    audios = [
        resample(a, voice.sampling_rate, asr.sample_rate) for a in voice.synthesize(sentences)
    ]
    refs = [transcript(tp_plain(voice.text).normalize(s)) for s in sentences]
    hyps = [t.text for t in asr.transcribe(audios, batch_size=8)]
    assert wer(refs, hyps) <= ROUND_TRIP_WER


def test_bundled_models_fit_the_package_budget():
    """Every bundled file (weights, LM, configs) together: <= 90 MB. #8 allowed 40 MB beside a
    QuartzNet 5x5; #51 bundles a FastConformer of 10-30 M parameters in fp16 (up to 60 MB),
    beside the voice (18 MB) and the word LM (8 MB)."""
    root = Path(default_model(VOICE_ACOUSTIC)).parent
    total = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert total <= 90e6, total


@pytest.mark.skipif(default_model(ASR_MODEL) is None, reason="no default recogniser bundled yet")
def test_cli_transcribe_with_no_model_uses_the_bundled_recogniser(tmp_path, capsys):
    from speechrt.asr.wer import word_errors

    wav = tmp_path / "fox.wav"
    assert main(["synthesize", SENTENCES[1], "-o", str(wav), "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["transcribe", str(wav), "--device", "cpu"]) == 0
    path, text = capsys.readouterr().out.strip().split("\t")
    assert path == str(wav) and word_errors(SENTENCES[1], text).rate <= 0.25, text
