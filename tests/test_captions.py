"""Word captions of synthesized speech: the text front end's word spans, the CLI's
--timestamps files and /v1/audio/speech/captioned on a real server."""

from __future__ import annotations

import base64
import json
import re

import httpx
import numpy as np
import pytest

from speechrt.audio.io import read_audio
from speechrt.cli import main
from speechrt.text import TextProcessor

THREE = "The first sentence is here. Then a second, longer one follows it! Is this the third?"
WORDS = [
    "the",
    "first",
    "sentence",
    "is",
    "here",
    "then",
    "a",
    "second",
    "longer",
    "one",
    "follows",
    "it",
    "is",
    "this",
    "the",
    "third",
]


def assert_cover(words: list[dict], seconds: float) -> None:
    """Each word lasts, words follow each other in order, and they span the audio."""
    assert all(w["end"] > w["start"] for w in words)
    assert all(a["end"] <= b["start"] for a, b in zip(words, words[1:], strict=False))
    assert words[0]["start"] == 0.0  # the audio starts with the first symbol
    assert words[-1]["end"] == pytest.approx(seconds, abs=1e-3)  # and ends with the last


def test_word_spans_spell_the_words_the_model_reads():
    arpabet = TextProcessor(p_arpabet=1.0)  # every word becomes {ARPAbet}: spelled as written
    for tp in (TextProcessor(), arpabet):
        spans = tp.word_spans("It costs $3, Dr. Smith.")
        assert [w for w, _, _ in spans] == ["it", "costs", "three", "dollars", "doctor", "smith"]
        ids = tp.text_to_ids("It costs $3, Dr. Smith.")
        space = tp.symbols.index(" ")
        assert all(space not in ids[a:b] for _, a, b in spans)
        assert all(b <= c for (_, _, b), (_, c, _) in zip(spans, spans[1:], strict=False))


def test_cli_writes_word_times_as_json_srt_and_vtt(tiny_voice, tmp_path):
    voice = ["--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1]), "--device", "cpu"]
    out = tmp_path / "a.wav"
    assert (
        main(
            ["synthesize", THREE, "-o", str(out), "--timestamps", str(tmp_path / "w.json"), *voice]
        )
        == 0
    )
    words = json.loads((tmp_path / "w.json").read_text())["words"]
    audio, sr = read_audio(out)
    assert [w["word"] for w in words] == WORDS
    assert_cover(words, len(audio) / sr)
    for fmt in ("srt", "vtt"):
        path = tmp_path / f"w.{fmt}"
        assert main(["synthesize", THREE, "-o", str(out), "--timestamps", str(path), *voice]) == 0
        text = path.read_text()
        assert text.startswith("WEBVTT" if fmt == "vtt" else "1\n")
        assert len(re.findall(r"\d\d:\d\d:\d\d[,.]\d{3} --> ", text)) == len(WORDS)
    bad = ["synthesize", THREE, "-o", str(tmp_path / "b.wav"), "--timestamps", "w.txt", *voice]
    assert main(bad) == 2 and not (tmp_path / "b.wav").exists()  # nothing written
    assert main(["synthesize", "--file", str(tmp_path / "w.json"), "--timestamps", "x.srt"]) == 2


def test_captioned_speech_returns_the_audio_and_its_word_times(speech_server):
    body = {"model": "tts", "voice": "0", "input": THREE, "response_format": "wav"}
    url = f"{speech_server}/v1/audio/speech"
    r = httpx.post(f"{url}/captioned", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["format"] == "wav" and [w["word"] for w in out["words"]] == WORDS
    audio, sr = read_audio(base64.b64decode(out["audio"]))
    assert sr == out["sample_rate"]
    plain, _ = read_audio(httpx.post(url, json=body, timeout=60).content)
    assert audio.shape == plain.shape and np.abs(audio - plain).max() <= 2 / 32768  # 2 int16 steps
    assert_cover(out["words"], len(audio) / sr)
    mp3 = httpx.post(f"{url}/captioned", json={**body, "response_format": "mp3"}, timeout=60)
    assert mp3.json()["words"] == out["words"] and mp3.json()["format"] == "mp3"
    streamed = httpx.post(f"{url}/captioned", json={**body, "stream_format": "audio"}, timeout=60)
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream_format"


@pytest.mark.parametrize("kind", ["tacotron2", "fastspeech"])
def test_voices_without_durations_refuse_word_times(tmp_path, kind):
    """Only FastPitch's graph outputs its durations; the others say so (a 400 when served)."""
    import runtime_models as rm
    from speechrt.errors import SpeechRTError
    from speechrt.tts import TTS

    acoustic = rm.save(getattr(rm, kind)(), tmp_path / kind, {"text": rm.TEXT})
    tts = TTS(acoustic, rm.save(rm.hifigan(), tmp_path / "hifigan"), device="cpu")
    assert not tts.has_durations
    with pytest.raises(SpeechRTError, match=f"durations.*{kind} does not"):
        tts.synthesize_with_words("Hello.")


def test_words_follow_a_sentence_cut_into_pieces():
    from speechrt.tts import piece_words

    tp = TextProcessor()
    text = " ".join(f"word{i % 10}" for i in range(120))  # ~1,000 symbols: cut into pieces
    ids, spans = tp.text_to_ids(text), tp.word_spans(text)
    pieces = tp.encode_pieces(text, 400)
    assert len(pieces) == 3
    shares = piece_words(ids, pieces, spans)
    assert [w for share in shares for w, _, _ in share] == [w for w, _, _ in spans]
    for piece, share in zip(pieces, shares, strict=True):
        assert [piece[a:b] for _, a, b in share] == [tp.text_to_ids(w) for w, _, _ in share]
