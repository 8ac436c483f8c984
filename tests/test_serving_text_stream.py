"""Speech for text as it is written: the sentence buffer, and the `/v1/audio/speech/stream`
WebSocket of a real `speechrt serve` on the bundled voice (onnx): pieces in, a segment of audio
per sentence out, flush, cancel (barge-in) and bad input answered with error messages."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import numpy as np
import pytest

from speechrt.defaults import VOICE_ACOUSTIC, default_model
from speechrt.serving.text_stream import SentenceBuffer
from speechrt.text import split_sentences
from speechrt.tts import MAX_PIECE_CHARS

websockets_sync = pytest.importorskip("websockets.sync.client")

TEXT = (
    "Dr. Smith paid 3.14 dollars! Did she? It starts once complete; the rest follows\n"
    "A new line ends one. This ends at the flush"
)
MAX_CHARS = 2000  # the server's --max-text-chars
IDLE = 4  # its --realtime-idle-seconds
LSB = 2  # int16 steps: a sentence's first frames are vocoded apart (see test_streaming_speech)


def tokens(text: str) -> list[str]:
    """LLM-like pieces: words with their leading space, punctuation on its own."""
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        lead = " " if i else ""
        if word[-1:] in ".,!?;":
            out += [lead + word[:-1], word[-1]]
        else:
            out.append(lead + word)
    return out


# -- the sentence buffer -------------------------------------------------------------------------


def test_pieces_give_the_splitters_sentences_each_once_complete():
    buf = SentenceBuffer()
    got: list[tuple[int, str]] = []  # (the piece that brought it out, sentence)
    pieces = tokens(TEXT)
    for k, piece in enumerate(pieces):
        got += [(k, s) for s in buf.push(piece)]
    got += [(len(pieces), s) for s in buf.flush()]
    assert [s for _, s in got] == split_sentences(TEXT, MAX_PIECE_CHARS)
    # each sentence comes out with the piece after its end, not before: "Dr." and "3." are
    # not ends, "!" is once a space follows it, and so is a newline
    assert got[0] == (pieces.index(" Did"), "Dr. Smith paid 3.14 dollars!")
    assert got[1] == (pieces.index(" It"), "Did she?")
    newline = next(k for k, p in enumerate(pieces) if "\n" in p)
    assert got[3] == (newline, "the rest follows")
    assert got[-1][0] == len(pieces)  # the last one: at the flush


def test_a_long_sentence_comes_out_by_clauses():
    buf = SentenceBuffer()
    clause = "a clause of several words that goes on, "
    out: list[str] = []
    for _ in range(30):
        out += buf.push(clause)
    assert out and all(len(s) <= MAX_PIECE_CHARS for s in out)
    assert len(buf.text) <= MAX_PIECE_CHARS
    rest = buf.flush()
    assert " ".join(out + rest) == " ".join((clause * 30).split())
    assert buf.flush() == [] and buf.push("  ") == []


# -- the WebSocket -------------------------------------------------------------------------------

needs_voice = pytest.mark.skipif(
    default_model(VOICE_ACOUSTIC) is None, reason="no default voice bundled"
)


@pytest.fixture(scope="module")
def server(start_server) -> str:
    from speechrt.defaults import voice_dirs

    acoustic, vocoder = voice_dirs(None, None)
    url, _ = start_server(
        *("--acoustic", str(acoustic), "--vocoder", str(vocoder), "--backend", "onnx"),
        *("--no-components", "--max-text-chars", str(MAX_CHARS)),
        *("--realtime-idle-seconds", str(IDLE)),
    )
    return url


class Session:
    """A bare WebSocket text stream: JSON messages out, JSON or binary messages in."""

    def __init__(self, server: str, query: str = "") -> None:
        url = server.replace("http://", "ws://") + "/v1/audio/speech/stream" + query
        self.ws = websockets_sync.connect(url, max_size=None).__enter__()

    def send(self, message: dict[str, Any] | str | bytes) -> None:
        self.ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))

    def recv(self) -> dict[str, Any] | bytes:
        m = self.ws.recv(timeout=60)
        return m if isinstance(m, bytes) else json.loads(m)

    def until(self, kind: str) -> list[dict[str, Any] | bytes]:
        """Messages up to and including the first of type `kind`."""
        out = []
        while True:
            m = self.recv()
            out.append(m)
            if isinstance(m, dict) and m["type"] == kind:
                return out

    def error_of(self, message: dict[str, Any] | str | bytes) -> dict[str, Any]:
        self.send(message)
        reply = self.recv()
        assert isinstance(reply, dict) and reply["type"] == "error", reply
        return reply["error"]


def segments(
    messages: list[dict[str, Any] | bytes], cut: bool = False
) -> list[tuple[int, str, bytes]]:
    """(index, text, audio) of each whole segment, checking the framing: start, binary...,
    done; `cut`: the last one may end without its done (a cancel stopped it)."""
    out, current = [], None
    for m in messages:
        if isinstance(m, bytes):
            assert current is not None, "audio outside a segment"
            current[2].append(m)
        elif m["type"] == "segment.start":
            assert current is None
            current = (m["segment"], m["text"], [])
        elif m["type"] == "segment.done":
            assert current is not None and m["segment"] == current[0]
            audio = b"".join(current[2])
            assert m["samples"] * 2 == len(audio)
            out.append((current[0], current[1], audio))
            current = None
    assert cut or current is None
    return out


def speech_pcm(server: str, text: str) -> np.ndarray:
    body = {"model": "tts", "voice": "alloy", "input": text, "response_format": "pcm"}
    r = httpx.post(f"{server}/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, "<i2")


@needs_voice
def test_pieces_in_a_segment_per_sentence_out_equal_to_the_whole_request(server: str):
    s = Session(server, "?voice=alloy")
    created = s.recv()
    assert isinstance(created, dict) and created["type"] == "session.created"
    assert created["format"] == "pcm_s16le" and created["sample_rate"] > 0
    for piece in tokens(TEXT):
        s.send({"text": piece})
    s.send({"flush": True})
    s.send({"close": True})
    got = segments(s.until("done"))
    assert [text for _, text, _ in got] == split_sentences(TEXT, MAX_PIECE_CHARS)
    assert [k for k, _, _ in got] == list(range(len(got)))
    # the segments, as played one after the other, are the whole text's speech (a pause
    # begins every segment after the first, as between a request's sentences)
    streamed = np.frombuffer(b"".join(a for _, _, a in got), "<i2")
    whole = speech_pcm(server, TEXT)
    assert streamed.shape == whole.shape
    assert np.abs(streamed.astype(int) - whole).max() <= LSB


@needs_voice
def test_flush_ends_the_sentence_and_close_sends_what_is_queued(server: str):
    s = Session(server)
    s.recv()
    s.send({"text": "No terminator here"})
    s.send({"text": " and more of it", "flush": True})
    first = segments(s.until("segment.done"))
    assert first[0][1] == "No terminator here and more of it"
    s.send({"text": "Held text. And the tail", "close": True})
    rest = segments(s.until("done"))
    assert [(k, t) for k, t, _ in rest] == [(1, "Held text."), (2, "And the tail")]


@needs_voice
def test_cancel_drops_all_queued_speech_at_once(server: str):
    s = Session(server)
    s.recv()
    many = " ".join(
        f"Sentence number {n} is long enough to take a while to speak." for n in range(8)
    )
    s.send({"text": many + " An unfinished sentence that is never spoken"})
    s.send({"cancel": True})
    before = s.until("cancelled")
    dropped = before[-1]["segments"]  # type: ignore[index]
    done = [k for k, _, _ in segments(before[:-1], cut=True)]
    # each sentence was sent whole before the cancel or is dropped (the one being sent
    # included); speaking a sentence takes far longer than reading two messages, so the
    # cancel finds sentences still queued
    assert dropped and sorted(done + dropped) == list(range(8))
    s.send({"text": "After the barge-in.", "close": True})
    after = s.until("done")
    # no audio of a dropped sentence after the cancel; the unfinished one is never spoken
    assert [(k, t) for k, t, _ in segments(after)] == [(8, "After the barge-in.")]


@needs_voice
def test_bad_messages_get_error_messages_and_the_session_goes_on(server: str):
    s = Session(server)
    s.recv()
    assert "JSON text" in s.error_of(b"\x00\x01")["message"]
    assert s.error_of("{not json")["code"] == "invalid_input"
    assert "JSON object" in s.error_of("[1, 2]")["message"]
    assert "unknown key" in s.error_of({"txt": "typo"})["message"]
    assert "string" in s.error_of({"text": 12})["message"]
    assert "true or false" in s.error_of({"flush": "yes"})["message"]
    assert "limit" in s.error_of({"text": "word " * (MAX_CHARS // 5 + 1)})["message"]
    s.send({"text": "Still here.", "close": True})
    assert [t for _, t, _ in segments(s.until("done"))] == ["Still here."]


@needs_voice
@pytest.mark.parametrize(
    "query, words",
    [
        ("?voice=nobody", "voice 'nobody' not found"),
        ("?speed=9", "speed must be within"),
        ("?speed=fast", "speed"),
        ("?model=whisper-1", "not found"),
        ("?format=mp3", "unknown parameter 'format'"),
    ],
)
def test_bad_options_are_refused_before_the_session(server: str, query: str, words: str):
    s = Session(server, query)
    reply = s.recv()
    assert isinstance(reply, dict) and reply["type"] == "error"
    assert words in reply["error"]["message"]
    with pytest.raises(Exception, match="1008"):
        s.recv()


def tts_cancelled(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics").text
    m = re.search(r'request_failure\{model="tts"[^}]*reason="CANCELED"[^}]*\} (\S+)', metrics)
    return float(m.group(1)) if m else 0.0


@needs_voice
def test_a_client_that_goes_away_cancels_its_queued_sentences(server: str):
    before = tts_cancelled(server)
    s = Session(server)
    s.recv()
    s.send({"text": "A sentence to speak at some length. " * 20})
    s.ws.close()
    deadline = time.monotonic() + 60
    while tts_cancelled(server) == before:  # the server counts them once it has noticed
        assert time.monotonic() < deadline, "no sentence was cancelled"
        time.sleep(0.1)


@needs_voice
def test_an_idle_session_is_closed(server: str):
    s = Session(server)
    s.recv()
    reply = s.recv()  # nothing sent, nothing queued: after IDLE seconds
    assert isinstance(reply, dict) and reply["error"]["code"] == "idle_timeout"
    with pytest.raises(Exception, match="1000"):
        s.recv()
