"""Hostile input to Riva's and Triton's gRPC protocols on a real `speechrt serve --grpc-port`
with the bundled models: bad synthesis and recognition requests and streams, bad infer requests
and messages larger than an HTTP body, each refused with the status and message that say why."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf

from grpc_speech import MAX_CHARS, MAX_SECONDS, PCM, RATE, SHORT, stubs
from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model

pytestmark = pytest.mark.skipif(
    default_model(ASR_MODEL) is None or default_model(VOICE_ACOUSTIC) is None,
    reason="no default models bundled",
)
grpc = pytest.importorskip("grpc")
riva = pytest.importorskip("riva.client")


@pytest.fixture(scope="module")
def server(grpc_server: tuple[str, str]) -> tuple[str, str]:
    """(HTTP base URL, gRPC host:port): the session's server with the bundled voice and
    recogniser (tests/conftest.py's grpc_server; its limits in tests/grpc_speech.py)."""
    return grpc_server


def refused(call, *args) -> tuple[grpc.StatusCode, str]:
    """The status code and message a call (or a stream's responses) ends with."""
    with pytest.raises(grpc.RpcError) as e:
        result = call(*args)
        if not hasattr(result, "SerializeToString"):
            list(result)  # a stream: its error comes with the responses
    return e.value.code(), e.value.details()


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
