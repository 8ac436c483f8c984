"""What SSML may cost: a document is read within the request's symbol limit, counted as it
expands, so no expansion (a 2,000-digit telephone number, a 9,000-character alias, 9,000
phones, thousands of entities) costs more than the limit to refuse, and none reaches a model.

The real server (`speechrt serve` on the bundled voice) runs with a low --max-text-symbols and
a high --max-text-chars, so each attack from the issue is inside the character limit and must
be stopped by the symbol limit; the TTS model's run-item count shows that no model ran.
"""

from __future__ import annotations

import httpx
import pytest

from serving_inputs import tts_metrics
from speechrt.defaults import VOICE_ACOUSTIC, default_model
from speechrt.errors import SpeechRTError
from speechrt.text import TextProcessor, ssml
from speechrt.tts import MAX_PIECE_SYMBOLS, text_to_pieces

pytestmark = pytest.mark.skipif(
    default_model(VOICE_ACOUSTIC) is None, reason="needs the bundled voice"
)

LIMIT = 2000  # --max-text-symbols of the server below
SAY = '<speak>Call <say-as interpret-as="{}">{}</say-as> now.</speak>'
# the attack run's documents (issue 46, section 4), each within 40,000 characters
ATTACKS = {
    "telephone": SAY.format("telephone", "5" * 2000),
    "sub": '<speak><sub alias="{}">x</sub></speak>'.format("hello world " * 750),
    "phoneme": '<speak><phoneme alphabet="x-arpabet" ph="{}">x</phoneme></speak>'.format(
        " ".join(["AH0", "B", "K"] * 3000)
    ),
    "entities": "<speak>" + "&amp;&lt;&gt;" * 2500 + "</speak>",
    "characters": SAY.format("characters", "w" * 3000),
    "digit references": "<speak>" + "&#49;" * 1900 + "</speak>",  # 1,900 digits, read one by one
}


@pytest.fixture(scope="module")
def url(start_server) -> str:
    args = ("--max-text-symbols", str(LIMIT), "--max-text-chars", "40000", "--device", "cpu")
    url, _ = start_server(*args)
    return url


def speak(url: str, text: str) -> httpx.Response:
    body = {"model": "tts-1", "voice": "0", "input": text, "response_format": "pcm"}
    return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)


@pytest.mark.parametrize("case", ATTACKS)
def test_expansions_past_the_limit_are_refused_before_any_model_runs(url: str, case: str):
    text = ATTACKS[case]
    assert len(text) <= 40_000
    ran = tts_metrics(url)["nv_inference_count"]
    r = speak(url, text)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert f"more than {LIMIT} symbols" in message and f"the limit is {LIMIT}" in message
    assert tts_metrics(url)["nv_inference_count"] == ran  # no piece reached the model


def test_ssml_within_the_limit_is_spoken(url: str):
    r = speak(url, SAY.format("telephone", "+1 555-0100"))
    assert r.status_code == 200, r.text
    assert len(r.content) > 0


# -- the front end stops at the limit (the work, not the time, is what is bounded) --------------


@pytest.fixture(scope="module")
def front_end() -> TextProcessor:
    from speechrt.repo import read_info

    path = default_model(VOICE_ACOUSTIC)
    assert path is not None
    return TextProcessor.from_meta(read_info(path).meta)


class Counting(TextProcessor):
    """The voice's front end, counting the symbols it encodes."""

    encoded = 0

    def encode_pieces(self, text: str, max_symbols: int) -> list[list[int]]:
        pieces = super().encode_pieces(text, max_symbols)
        self.encoded += sum(map(len, pieces))
        return pieces


def test_encoding_stops_at_the_symbol_limit(front_end: TextProcessor):
    counting = Counting.from_meta({"text": front_end.to_meta()})
    digits = "1234567890" * 1000  # 10,000 characters: about 42,000 symbols read digit by digit
    with pytest.raises(SpeechRTError, match=f"more than {LIMIT} symbols"):
        text_to_pieces(counting, [digits], [0], max_symbols=LIMIT)
    # the limit, and at most one sentence piece's worth beyond it (300 characters of digits)
    assert LIMIT < counting.encoded <= LIMIT + 4 * MAX_PIECE_SYMBOLS
    whole = sum(map(len, (p.ids for p in text_to_pieces(counting, [digits], [0]))))
    assert whole > 20 * LIMIT  # what it would have cost


def test_ssml_stops_expanding_at_the_symbol_limit(monkeypatch: pytest.MonkeyPatch):
    calls = []
    spell = ssml.telephone
    monkeypatch.setattr(ssml, "telephone", lambda text: calls.append(text) or spell(text))
    number = '<say-as interpret-as="telephone">' + "7" * 100 + "</say-as> "
    document = "<speak>" + number * 1000 + "</speak>"  # 100,000 digits: ~600,000 characters
    with pytest.raises(SpeechRTError, match=f"SSML expands to more than {LIMIT} symbols"):
        ssml.parse(document, LIMIT)
    assert len(calls) <= LIMIT // 500 + 1  # each number reads as ~600 characters
    assert len(ssml.parse(document).segments[0].text) > 500_000  # what it would have cost
