"""GET /v1/audio/voices and the names `voice` takes, through a real server and the openai client."""

from __future__ import annotations

import httpx
import openai
import pytest

from speechrt.serving.http_errors import ApiError
from speechrt.serving.openai_api import OPENAI_VOICES, speaker_of, voices_of

TEXT = "Voices have names."


@pytest.fixture(scope="module")
def oai(speech_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{speech_server}/v1", api_key="unused", max_retries=0)


def test_voices_lists_the_loaded_voice_and_every_name_speaks_it(speech_server, oai, tiny_voice):
    r = httpx.get(f"{speech_server}/v1/audio/voices")
    assert r.status_code == 200
    (voice,) = r.json()["voices"]  # the tiny voice has one speaker
    assert voice["id"] == tiny_voice[0].name and voice["speaker"] == 0
    assert {"0", "speaker-0", "alloy"} <= set(voice["aliases"])
    want = oai.audio.speech.create(model="tts", voice="0", input=TEXT, response_format="pcm")
    for name in (voice["id"], voice["id"].upper(), "speaker-0", "alloy", " Nova "):
        got = oai.audio.speech.create(model="tts", voice=name, input=TEXT, response_format="pcm")
        assert got.content == want.content, name


@pytest.mark.parametrize("voice", ["bella", "1", "speaker-2", ""])
def test_unknown_voices_are_400_naming_the_voices(speech_server, tiny_voice, voice):
    body = {"model": "tts", "voice": voice, "input": TEXT}
    r = httpx.post(f"{speech_server}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "voice" and error["code"] == "voice_not_found"
    assert error["message"].startswith(
        f"voice {voice!r} not found; this server's voices: {tiny_voice[0].name}; also 0 or "
        "speaker-0, and OpenAI's voice names (alloy, "
    )


def test_a_multi_speaker_voice_names_each_speaker():
    entries = voices_of("lj", 3)
    assert [v["id"] for v in entries] == ["lj-0", "lj-1", "lj-2"]
    assert speaker_of("lj-2", "lj", 3) == 2 and speaker_of("speaker-1", "lj", 3) == 1
    assert speaker_of("lj", "lj", 3) == 0 and speaker_of("2", "lj", 3) == 2
    assert all(speaker_of(name, "lj", 3) == 0 for name in OPENAI_VOICES)
    with pytest.raises(ApiError, match="lj-0, lj-1, lj-2; also 0 to 2 or speaker-N, and "):
        speaker_of("3", "lj", 3)
    with pytest.raises(ApiError, match=r"lj-7, \.\.\. \(20 voices\); also 0 to 19 or"):
        speaker_of("20", "lj", 20)
