"""Riva's and Triton's gRPC protocols on a real `speechrt serve --grpc-port` with the bundled
models, driven by the clients people use unmodified: riva.client (offline recognition with word
offsets, streaming with interim and final results, synthesis whole and streamed) and
tritonclient.grpc (metadata and infer on tts and asr); their answers checked against the HTTP
routes of the same server."""

from __future__ import annotations

import io
import re
import struct
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from speechrt.audio.io import to_int16
from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model

pytestmark = pytest.mark.skipif(
    default_model(ASR_MODEL) is None or default_model(VOICE_ACOUSTIC) is None,
    reason="no default models bundled",
)
grpc = pytest.importorskip("grpc")
riva = pytest.importorskip("riva.client")
tc = pytest.importorskip("tritonclient.grpc")

TEXT = "Speech recognition works on this machine. Please call Stella."
SHORT = "Hello there."
SAID = "speech recognition works on this machine"  # what the recogniser hears of it, at least
MAX_CHARS, MAX_SECONDS = 300, 12  # the server's --max-text-chars, --max-audio-seconds
RATE = 16000  # the bundled recogniser's


@pytest.fixture(scope="module")
def server(start_server) -> tuple[str, str]:
    """(HTTP base URL, gRPC host:port) of one server with the bundled voice and recogniser."""
    url, proc = start_server(
        *("--device", "cpu", "--grpc-port", "0", "--max-upload-mb", "1"),
        *("--max-text-chars", str(MAX_CHARS), "--max-audio-seconds", str(MAX_SECONDS)),
    )
    port = re.search(r"gRPC on 127\.0\.0\.1:(\d+)", proc.log.read_text())
    assert port is not None, proc.log.read_text()
    return url, f"127.0.0.1:{port.group(1)}"


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


# -- hostile input -------------------------------------------------------------------------------


def refused(call, *args) -> tuple[grpc.StatusCode, str]:
    """The status code and message a call (or a stream's responses) ends with."""
    with pytest.raises(grpc.RpcError) as e:
        result = call(*args)
        if not hasattr(result, "SerializeToString"):
            list(result)  # a stream: its error comes with the responses
    return e.value.code(), e.value.details()


def stubs(address: str):
    from riva.client.proto import riva_asr_pb2_grpc, riva_tts_pb2_grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(address)
    return (
        riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel),
        riva_asr_pb2_grpc.RivaSpeechRecognitionStub(channel),
        service_pb2_grpc.GRPCInferenceServiceStub(channel),
    )


PCM = riva.AudioEncoding.LINEAR_PCM
SYNTHESIS = [  # SynthesizeSpeechRequest fields -> what the INVALID_ARGUMENT says
    ({"text": ""}, "empty"),
    ({"text": "a" * (MAX_CHARS + 1)}, f"the limit is {MAX_CHARS}"),
    ({"voice_name": "nobody"}, "voice 'nobody' not found"),
    ({"encoding": riva.AudioEncoding.MULAW}, "MULAW is not supported"),
    ({"encoding": 77}, "encoding 77 is not supported"),
    ({"sample_rate_hz": 1000}, "sample_rate_hz must be within"),
    ({"encoding": riva.AudioEncoding.OGGOPUS, "sample_rate_hz": 22050}, "OGGOPUS audio is 48000"),
    ({"language_code": "de-DE"}, "speak en-US"),
    ({"custom_dictionary": "tomato  T AH0 M EY1 T OW2"}, "custom_dictionary"),
    ({"custom_configuration": {"pace": "fast"}}, "is no number"),
    ({"custom_configuration": {"pace": "99"}}, "pace must be within"),
    ({"custom_configuration": {"bogus": "1"}}, "unknown keys bogus"),
    ({"custom_configuration": {"speaker": "1"}}, "chosen by voice_name"),
    ({"zero_shot_data": {"quality": 20}}, "zero_shot_data"),
    ({"text": "<speak><prosody rate='fast'>Hi</speak>"}, "SSML"),
]


@pytest.mark.parametrize(("fields", "message"), SYNTHESIS, ids=[m for _, m in SYNTHESIS])
def test_bad_synthesis_requests_are_invalid_argument(server, fields, message):
    from riva.client.proto import riva_tts_pb2

    tts_stub, _, _ = stubs(server[1])
    request = riva_tts_pb2.SynthesizeSpeechRequest(**{"text": SHORT, "encoding": PCM, **fields})
    code, details = refused(tts_stub.Synthesize, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details, details
    online = {**fields, "enable_word_time_offsets": True} if "text" in fields else fields
    if "sample_rate_hz" not in fields or "encoding" in fields:
        request = riva_tts_pb2.SynthesizeSpeechRequest(**{"text": SHORT, "encoding": PCM, **online})
        code, details = refused(tts_stub.SynthesizeOnline, iter([request]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details


def test_bad_synthesis_streams_are_invalid_argument(server):
    from riva.client.proto import riva_tts_pb2

    tts_stub, _, _ = stubs(server[1])

    def stream(*requests: dict) -> tuple[grpc.StatusCode, str]:
        msgs = [riva_tts_pb2.SynthesizeSpeechRequest(encoding=PCM, **r) for r in requests]
        return refused(tts_stub.SynthesizeOnline, iter(msgs))

    cases = [
        ((), "no request"),
        (({"text": " "}, {"text": "**"}), "nothing to speak"),
        (({"text": "Hello"}, {"text": " there.", "custom_configuration": {"pace": "1.5"}}), "same"),
        (({"text": "<speak>Hi</speak>"},), "SSML goes to Synthesize"),
        (({"text": "Hi. " + "a" * MAX_CHARS},), f"the limit is {MAX_CHARS}"),
    ]
    for requests, message in cases:
        code, details = stream(*requests)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details, details


def riff(fmt_tag: int = 1, channels: int = 1, rate: int = RATE, bits: int = 16) -> bytes:
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", fmt_tag, channels, rate, rate * block, block, bits)
    return (
        b"RIFF"
        + struct.pack("<I", 36)
        + b"WAVEfmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data\0\0\0\0"
    )


def nan_wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.full(RATE, np.nan, dtype=np.float32), RATE, format="WAV", subtype="FLOAT")
    return buf.getvalue()


RECOGNITION = [  # (RecognitionConfig fields, audio) -> what the INVALID_ARGUMENT says
    ({"encoding": riva.AudioEncoding.FLAC}, b"\0" * 3200, "must be a whole file"),
    ({"encoding": PCM}, b"\0" * 3200, "needs sample_rate_hertz"),
    ({"encoding": PCM, "sample_rate_hertz": RATE}, b"\0" * 3201, "ends inside a sample frame"),
    ({"encoding": PCM, "sample_rate_hertz": RATE}, b"", "empty"),
    ({"encoding": PCM, "sample_rate_hertz": 8000}, b"\0" * 2 * 8000 * 13, "limit is 12"),
    ({}, riff()[:12] + b"garbage!" * 8, "not a readable audio file"),
    ({}, nan_wav(), "NaN"),
    ({"sample_rate_hertz": 8000}, riff() + b"\0" * 6400, "differs from the file's 16000"),
    ({"encoding": riva.AudioEncoding.MULAW, "sample_rate_hertz": 4000}, b"\xff" * 800, "within"),
    ({"audio_channel_count": 9}, b"\0" * 3200, "audio_channel_count"),
    ({"language_code": "fr-FR"}, b"\0" * 3200, "speak en-US"),
    ({"model": "whisper-9"}, b"\0" * 3200, "is not served"),
    ({"profanity_filter": True}, b"\0" * 3200, "profanity_filter"),
    ({"speech_contexts": [{"phrases": ["Stella"], "boost": 4}]}, b"\0" * 3200, "word boosting"),
    ({"enable_automatic_punctuation": True}, b"\0" * 3200, "does not punctuate"),
    ({"diarization_config": {"enable_speaker_diarization": True}}, b"\0", "diarization"),
    ({"endpointing_config": {"stop_history": 800}}, b"\0" * 3200, "endpointing_config"),
    ({"custom_configuration": {"x": "y"}}, b"\0" * 3200, "custom_configuration"),
]


@pytest.mark.parametrize(
    ("fields", "audio", "message"), RECOGNITION, ids=[m for *_, m in RECOGNITION]
)
def test_bad_recognition_requests_are_invalid_argument(server, fields, audio, message):
    from riva.client.proto import riva_asr_pb2

    _, asr_stub, _ = stubs(server[1])
    request = riva_asr_pb2.RecognizeRequest(
        config=riva_asr_pb2.RecognitionConfig(**fields), audio=audio
    )
    code, details = refused(asr_stub.Recognize, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details, details


def stream_of(config: dict, *audio: bytes, interim: bool = True) -> list:
    from riva.client.proto import riva_asr_pb2 as r

    streaming = r.StreamingRecognitionConfig(
        config=r.RecognitionConfig(**config), interim_results=interim
    )
    first = r.StreamingRecognizeRequest(streaming_config=streaming)
    return [first, *(r.StreamingRecognizeRequest(audio_content=a) for a in audio)]


def test_bad_streams_are_invalid_argument(server):
    from riva.client.proto import riva_asr_pb2

    _, asr_stub, _ = stubs(server[1])
    raw = {"encoding": PCM, "sample_rate_hertz": 8000}
    second = 2 * 8000 * b"\0"  # one second of raw audio
    cases = [
        ([riva_asr_pb2.StreamingRecognizeRequest(audio_content=b"\0" * 320)], "first request"),
        (stream_of(raw, second) + stream_of(raw), "comes once"),
        (stream_of({"encoding": riva.AudioEncoding.FLAC}, b"fLaC"), "go to Recognize"),
        (stream_of(raw, *[second] * (MAX_SECONDS + 1), interim=False), f"of {MAX_SECONDS} s"),
        (stream_of({}, riff(bits=8) + b"\0" * 800), "must be 16-bit PCM"),
        (stream_of({"sample_rate_hertz": 8000}, riff() + b"\0" * 800), "differs from the WAV"),
        (stream_of({}, riff()[:20]), "no WAV data chunk"),
        (stream_of({"encoding": PCM}, b"\0" * 320), "needs sample_rate_hertz"),
    ]
    for requests, message in cases:
        code, details = refused(asr_stub.StreamingRecognize, iter(requests))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details, (message, details)
    # a stream without audio ends without a result; one with G.711 is heard
    for empty in (raw, {}):  # raw audio, or a WAV file's bytes (no rate given)
        assert list(asr_stub.StreamingRecognize(iter(stream_of(empty)))) == []
    ulaw = stream_of({"encoding": riva.AudioEncoding.MULAW}, b"\xff" * 8000, interim=False)
    (response,) = asr_stub.StreamingRecognize(iter(ulaw))
    assert response.results[0].is_final and response.results[0].audio_processed == 1.0


def infer_request(model: str = "asr", **kw):
    from tritonclient.grpc import service_pb2 as pb

    samples = np.zeros((1, RATE), dtype=np.float32)
    tensor = pb.ModelInferRequest.InferInputTensor(name="AUDIO", datatype="FP32", shape=[1, RATE])
    fields = {"model_name": model, "inputs": [tensor], "raw_input_contents": [samples.tobytes()]}
    return pb.ModelInferRequest(**{**fields, **kw})


def tensor(name: str, datatype: str, shape: list[int], **kw):
    from tritonclient.grpc import service_pb2 as pb

    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape, **kw)


def typed(model: str, name: str, datatype: str, shape: list[int], **contents):
    """An infer request whose one input comes as typed `contents`, not raw."""
    t = tensor(name, datatype, shape, contents=contents)
    return infer_request(model, inputs=[t], raw_input_contents=[])


def test_bad_infer_requests(server):
    from tritonclient.grpc import service_pb2 as pb

    _, _, triton = stubs(server[1])
    invalid, not_found = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    longest = 16000 * MAX_SECONDS + 1  # samples: one past the limit
    text9 = tensor("TEXT", "BYTES", [9])  # a batch of 9: the limit is 8
    nine = (struct.pack("<I", 1) + b"a") * 9  # 9 texts "a": a length, then the bytes, each
    shm = {"shared_memory_region": {"string_param": "r"}}
    nan = np.full(RATE, np.nan, "<f4").tobytes()
    cases = [
        (infer_request("nope"), not_found, "unknown model 'nope'"),
        (infer_request(model_version="2"), not_found, "no version '2'"),
        (infer_request(inputs=[tensor("AUDIO", "FP64", [1, RATE // 2])]), invalid, "must be FP32"),
        (infer_request(inputs=[tensor("AUDIO", "FP32", [1, 10])]), invalid, "do not hold shape"),
        (infer_request(raw_input_contents=[b"", b""]), invalid, "give one per input"),
        (infer_request(inputs=[], raw_input_contents=[]), invalid, "no inputs"),
        (
            infer_request(
                inputs=[tensor("AUDIO", "FP32", [1, longest])],
                raw_input_contents=[bytes(4 * longest)],
            ),
            invalid,
            "the limit is",
        ),
        (infer_request(raw_input_contents=[nan]), invalid, "NaN"),
        (infer_request(inputs=[tensor("AUDIO", "FP32", [2**40, 2**40])]), invalid, "too large"),
        (typed("asr", "AUDIO", "FP32", [1, 4], fp32_contents=[0.0] * 3), invalid, "needs 4 values"),
        (typed("asr", "AUDIO", "FP16", [1, 4]), invalid, "raw_input_contents"),
        (
            infer_request(inputs=[tensor("AUDIO", "FP32", [1, 4], parameters=shm)]),
            invalid,
            "shared memory",
        ),
        (infer_request(outputs=[{"name": "LOGITS"}]), invalid, "has no output 'LOGITS'"),
        (infer_request("tts", inputs=[text9], raw_input_contents=[b""]), invalid, "truncated"),
        (infer_request("tts", inputs=[text9], raw_input_contents=[nine]), invalid, "limit is 8"),
        (typed("tts", "TEXT", "BYTES", [1], bytes_contents=[b"\xff"]), invalid, "not UTF-8"),
    ]
    for request, code, message in cases:
        got, details = refused(triton.ModelInfer, request)
        assert got == code and message in details, (message, details)
    # typed contents are read as raw tensors are
    silence = typed("asr", "AUDIO", "FP32", [1, 4000], fp32_contents=[0.0] * 4000)
    assert triton.ModelInfer(silence).outputs[0].name == "TEXT"
    code, _ = refused(triton.ModelStatistics, pb.ModelStatisticsRequest())
    assert code == grpc.StatusCode.UNIMPLEMENTED


def test_messages_larger_than_an_http_body_are_refused(server):
    """--max-upload-mb 1: a 2 MB message is refused by gRPC itself, before it is decoded."""
    from riva.client.proto import riva_asr_pb2

    _, asr_stub, triton = stubs(server[1])
    cfg = riva_asr_pb2.RecognitionConfig(encoding=PCM, sample_rate_hertz=RATE)
    big = riva_asr_pb2.RecognizeRequest(config=cfg, audio=b"\0" * 2_000_000)
    code, details = refused(asr_stub.Recognize, big)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    code, _ = refused(triton.ModelInfer, infer_request(raw_input_contents=[b"\0" * 2_000_000]))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
