"""Riva's and Triton's gRPC protocols on a real `speechrt serve --grpc-port` with the bundled
models, driven by the clients people use unmodified: riva.client (offline recognition with word
offsets, streaming with interim and final results, synthesis whole and streamed) and
tritonclient.grpc (metadata and infer on tts and asr); their answers checked against the HTTP
routes of the same server."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from grpc_speech import PCM, RATE, SHORT, stubs
from speechrt.audio.io import to_int16
from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model

pytestmark = pytest.mark.skipif(
    default_model(ASR_MODEL) is None or default_model(VOICE_ACOUSTIC) is None,
    reason="no default models bundled",
)
riva = pytest.importorskip("riva.client")
tc = pytest.importorskip("tritonclient.grpc")

TEXT = "Speech recognition works on this machine. Please call Stella."
SAID = "speech recognition works on this machine"  # what the recogniser hears of it, at least


@pytest.fixture(scope="module")
def server(grpc_server: tuple[str, str]) -> tuple[str, str]:
    """(HTTP base URL, gRPC host:port): the session's server with the bundled voice and
    recogniser (tests/conftest.py's grpc_server; its limits in tests/grpc_speech.py)."""
    return grpc_server


@pytest.fixture(scope="module")
def tts(server) -> riva.SpeechSynthesisService:
    return riva.SpeechSynthesisService(riva.Auth(uri=server[1]))


@pytest.fixture(scope="module")
def asr(server) -> riva.ASRService:
    return riva.ASRService(riva.Auth(uri=server[1]))


@pytest.fixture(scope="module")
def wav_file(tts, tmp_path_factory) -> Path:
    """TEXT spoken by the bundled voice, as a 16 kHz 16-bit WAV file (from Riva's Synthesize)."""
    pcm = tts.synthesize(TEXT, sample_rate_hz=RATE).audio
    path = tmp_path_factory.mktemp("grpc") / "speech.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm)
    return path


def int16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.int32)


def assert_close(a: np.ndarray, b: np.ndarray, lsb: int = 2) -> None:
    """The same samples within `lsb` int16 steps (the HTTP tests' tolerance between a streamed
    response, whose first sentence is vocoded in two spans, and the whole one)."""
    assert a.shape == b.shape
    assert np.abs(a - b).max(initial=0) <= lsb


def config(**kw) -> riva.RecognitionConfig:
    return riva.RecognitionConfig(language_code="en-US", max_alternatives=1, **kw)


# -- Riva speech synthesis -----------------------------------------------------------------------


def test_synthesize_is_the_http_speech_with_word_times(server, tts):
    url = server[0]
    body = {"model": "tts", "voice": "alloy", "input": TEXT, "response_format": "pcm"}
    http = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=60)
    sr = int(http.headers["x-sample-rate"])
    got = tts.synthesize(TEXT, sample_rate_hz=sr, enable_word_time_offsets=True)
    assert_close(int16(got.audio), int16(http.content))
    captioned = httpx.post(f"{url}/v1/audio/speech/captioned", json=body, timeout=60).json()
    want = [
        (w["word"], round(w["start"] * 1000), round(w["end"] * 1000)) for w in captioned["words"]
    ]
    assert [(w.word, w.start_time, w.end_time) for w in got.meta.words] == want
    assert len(want) == len(TEXT.split()) and got.meta.text == TEXT

    pcm = tts.synthesize(SHORT, sample_rate_hz=sr).audio
    flac = tts.synthesize(SHORT, encoding=riva.AudioEncoding.FLAC, sample_rate_hz=sr).audio
    assert_close(sf.read(io.BytesIO(flac), dtype="int16")[0].astype(np.int32), int16(pcm), 0)
    low = tts.synthesize(SHORT, sample_rate_hz=8000).audio  # resampled to the rate asked
    assert abs(len(low) // 2 - len(pcm) // 2 * 8000 / sr) <= 2
    opus = tts.synthesize(SHORT, encoding=riva.AudioEncoding.OGGOPUS, sample_rate_hz=48000).audio
    audio, opus_rate = sf.read(io.BytesIO(opus))
    assert opus_rate == 48000 and abs(len(audio) / 48000 - len(pcm) / 2 / sr) < 0.05


def test_synthesize_online_streams_each_sentence(tts):
    whole = int16(tts.synthesize(TEXT).audio)
    chunks = [r.audio for r in tts.synthesize_online(TEXT)]
    assert len(chunks) >= 2  # the first sentence's head, then sentence by sentence
    assert_close(int16(b"".join(chunks)), whole)
    # requests carry pieces of one text (an LLM's tokens), joined as they are
    pieces = ["Speech recog", "nition works on this mach", "ine.", " Please call", " Stella."]
    joined = b"".join(r.audio for r in tts.synthesize_online(pieces))
    assert_close(int16(joined), whole)


def test_synthesize_online_speaks_each_sentence_once_complete(server, tts):
    """The first sentence's audio comes back while the requests that end the text are still
    held back by the client: speech starts when a sentence completes, not when the stream
    ends."""
    import queue

    from riva.client.proto import riva_tts_pb2

    tts_stub, _, _ = stubs(server[1])
    go_on: queue.Queue[None] = queue.Queue()
    sent: list[str] = []

    def requests():
        for piece in ("Speech recognition works", " on this machine.", " Please"):
            sent.append(piece)
            yield riva_tts_pb2.SynthesizeSpeechRequest(text=piece, encoding=PCM)
        try:
            go_on.get(timeout=120)  # until the first sentence's audio came back
        except queue.Empty:
            sent.append("(no audio before the end)")
        sent.append(" call Stella.")
        yield riva_tts_pb2.SynthesizeSpeechRequest(text=" call Stella.", encoding=PCM)

    responses = tts_stub.SynthesizeOnline(requests(), timeout=300)
    first = next(responses)
    assert sent == ["Speech recognition works", " on this machine.", " Please"]
    go_on.put(None)
    audio = first.audio + b"".join(r.audio for r in responses)
    assert_close(int16(audio), int16(tts.synthesize(TEXT).audio))


def test_synthesis_config_lists_the_voice_by_riva_names(tts):
    from riva.client.proto import riva_tts_pb2

    response = tts.stub.GetRivaSynthesisConfig(riva_tts_pb2.RivaSynthesisConfigRequest())
    (model,) = response.model_config
    params = dict(model.parameters)
    assert params["language_code"] == "en-US"
    subvoice = params["subvoices"].split(",")[0].split(":")[0]
    named = tts.synthesize("Hello.", voice_name=f"{params['voice_name']}.{subvoice}").audio
    assert named == tts.synthesize("Hello.").audio  # the first speaker either way


# -- Riva speech recognition ---------------------------------------------------------------------


def offline(asr, wav_file: Path, **kw):
    cfg = config(enable_word_time_offsets=True, **kw)
    riva.add_audio_file_specs_to_config(cfg, wav_file)  # what Riva's scripts do
    (result,) = asr.offline_recognize(wav_file.read_bytes(), cfg).results
    return result.alternatives[0]


def test_recognize_with_word_offsets_as_http_transcribes(server, asr, wav_file):
    alt = offline(asr, wav_file)
    assert SAID in alt.transcript
    words = [(w.word, w.start_time, w.end_time) for w in alt.words]
    assert [w for w, _, _ in words] == alt.transcript.split()
    assert all(0 <= a < b for _, a, b in words)
    assert all(b1 <= a2 for (_, _, b1), (_, a2, _) in zip(words, words[1:], strict=False))
    with sf.SoundFile(wav_file) as f:
        assert words[-1][2] <= 1000 * f.frames / f.samplerate
    form = {"model": "whisper-1", "response_format": "verbose_json"}
    form["timestamp_granularities[]"] = "word"
    files = {"file": ("a.wav", wav_file.read_bytes(), "audio/wav")}
    http = httpx.post(f"{server[0]}/v1/audio/transcriptions", data=form, files=files, timeout=60)
    want = [
        (w["word"], round(w["start"] * 1000), round(w["end"] * 1000)) for w in http.json()["words"]
    ]
    assert alt.transcript == http.json()["text"] and words == want

    raw = wav_file.read_bytes()[44:]  # the same samples without the header
    cfg = config(encoding=riva.AudioEncoding.LINEAR_PCM, sample_rate_hertz=RATE)
    (result,) = asr.offline_recognize(raw, cfg).results
    assert result.alternatives[0].transcript == alt.transcript


def test_streaming_gives_interim_results_then_the_offline_result(asr, wav_file):
    cfg = riva.StreamingRecognitionConfig(
        config=config(enable_word_time_offsets=True), interim_results=True
    )
    # the file as Riva's transcribe_file.py streams it: its bytes, header first, 1600 frames a chunk
    with riva.AudioChunkFileIterator(str(wav_file), 1600) as chunks:
        results = [
            r for resp in asr.streaming_response_generator(chunks, cfg) for r in resp.results
        ]
    interim = [r.alternatives[0].transcript for r in results if not r.is_final]
    finals = [r for r in results if r.is_final]
    assert len(interim) >= 2 and len(finals) == 1 and results[-1].is_final
    assert any(SAID.split()[0] in t for t in interim)
    final, want = finals[0].alternatives[0], offline(asr, wav_file)
    assert final.transcript == want.transcript
    assert [(w.word, w.start_time, w.end_time) for w in final.words] == [
        (w.word, w.start_time, w.end_time) for w in want.words
    ]
    quiet = riva.StreamingRecognitionConfig(config=config(), interim_results=False)
    with riva.AudioChunkFileIterator(str(wav_file), 1600) as chunks:
        (only,) = [
            r for resp in asr.streaming_response_generator(chunks, quiet) for r in resp.results
        ]
    assert only.is_final and only.alternatives[0].transcript == want.transcript


def test_recognition_config_lists_offline_and_online(asr):
    from riva.client.proto import riva_asr_pb2

    request = riva_asr_pb2.RivaSpeechRecognitionConfigRequest()
    models = asr.stub.GetRivaSpeechRecognitionConfig(request).model_config
    assert sorted(m.parameters["type"] for m in models) == ["offline", "online"]
    assert {m.parameters["sample_rate_hz"] for m in models} == {str(RATE)}


# -- Triton's gRPC protocol ----------------------------------------------------------------------


def test_tritonclient_grpc_metadata_and_infer(server, tts, wav_file):
    url, address = server
    client = tc.InferenceServerClient(address)
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata().name == "speechrt"
    for name in ("tts", "asr"):
        assert client.is_model_ready(name)
        meta, http = client.get_model_metadata(name), httpx.get(f"{url}/v2/models/{name}").json()
        for got, want in zip(meta.inputs, http["inputs"], strict=True):
            assert (got.name, got.datatype, list(got.shape)) == (
                want["name"], want["datatype"], want["shape"]
            )  # fmt: skip
        config = client.get_model_config(name).config
        want_config = httpx.get(f"{url}/v2/models/{name}/config").json()
        assert config.max_batch_size == want_config["max_batch_size"] == 8
        assert [t.name for t in config.input] == [t["name"] for t in want_config["input"]]
    index = client.get_model_repository_index().models
    http_index = httpx.post(f"{url}/v2/repository/index").json()
    assert [(m.name, m.state) for m in index] == [(m["name"], m["state"]) for m in http_index]

    text = tc.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[SHORT.encode()]], dtype=object))
    out = client.infer("tts", [text])
    (n,) = out.as_numpy("AUDIO_LENGTHS")
    audio = out.as_numpy("AUDIO")[0, :n]
    want = int16(tts.synthesize(SHORT, sample_rate_hz=0).audio)  # 0: the voice's own rate
    assert_close(to_int16(audio).astype(np.int32), want)

    samples = sf.read(wav_file, dtype="float32")[0][None, :]  # (1, S) at the recogniser's rate
    heard = tc.InferInput("AUDIO", list(samples.shape), "FP32")
    heard.set_data_from_numpy(samples)
    (said,) = client.infer("asr", [heard]).as_numpy("TEXT")
    assert SAID in said.decode()
