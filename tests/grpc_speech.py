"""What the gRPC test modules share: the server they run against (`speechrt serve --grpc-port`
with the bundled voice and recogniser, started once a session by tests/conftest.py's
grpc_server), its limits, and plain stubs of Riva's and Triton's services."""

from __future__ import annotations

import re

import pytest

grpc = pytest.importorskip("grpc")
riva = pytest.importorskip("riva.client")

SHORT = "Hello there."
MAX_CHARS, MAX_SECONDS = 300, 12  # the server's --max-text-chars, --max-audio-seconds
RATE = 16000  # the bundled recogniser's
PCM = riva.AudioEncoding.LINEAR_PCM


def serve(start_server) -> tuple[str, str]:
    """(HTTP base URL, gRPC host:port) of one server with the bundled voice and recogniser."""
    url, proc = start_server(
        *("--device", "cpu", "--grpc-port", "0", "--max-upload-mb", "1"),
        *("--max-text-chars", str(MAX_CHARS), "--max-audio-seconds", str(MAX_SECONDS)),
    )
    port = re.search(r"gRPC on 127\.0\.0\.1:(\d+)", proc.log.read_text())
    assert port is not None, proc.log.read_text()
    return url, f"127.0.0.1:{port.group(1)}"


def stubs(address: str):
    from riva.client.proto import riva_asr_pb2_grpc, riva_tts_pb2_grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(address)
    return (
        riva_tts_pb2_grpc.RivaSpeechSynthesisStub(channel),
        riva_asr_pb2_grpc.RivaSpeechRecognitionStub(channel),
        service_pb2_grpc.GRPCInferenceServiceStub(channel),
    )
