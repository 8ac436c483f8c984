"""gRPC beside HTTP: Riva's speech services and Triton's inference service on one port.

`speechrt serve --grpc-port PORT` starts one grpc.aio server in uvicorn's event loop (the app's
lifespan: after the engines start, stopped before they drain), serving
    nvidia.riva.asr.RivaSpeechRecognition    speechrt.serving.grpc_riva (the recogniser's)
    nvidia.riva.tts.RivaSpeechSynthesis      speechrt.serving.grpc_riva_tts (the voice's)
    inference.GRPCInferenceService           speechrt.serving.grpc_triton (KServe v2)
through the same services, batchers and limits as the HTTP routes; errors and API keys as
speechrt.serving.grpc_calls says. A message may be as large as an HTTP body (--max-upload-mb,
plus framing), checked by gRPC itself after decompression (RESOURCE_EXHAUSTED past it). A call
the client cancels, or whose deadline passes, cancels its queued work.

The protobuf modules are those the clients ship (`nvidia-riva-client`, `tritonclient[grpc]`):
the `grpc` extra.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc

from speechrt.errors import SpeechRTError
from speechrt.serving.auth import Access
from speechrt.serving.grpc_calls import RequireKey

if TYPE_CHECKING:
    from speechrt.serving.server import Server

log = logging.getLogger("speechrt.serving")

FRAMING = 64 * 1024  # besides the payload a message may carry (the HTTP body limit's margin)


async def start_grpc(
    server: Server, address: str, access: Access | None
) -> tuple[grpc.aio.Server, int]:
    """Serve `server`'s models over gRPC at `address` ("host:port"; port 0: any free one) ->
    the started gRPC server, for the caller to stop (grpc.aio.Server.stop), and its port."""
    from speechrt.serving import grpc_riva, grpc_riva_tts, grpc_triton

    limit = server.config.limits.max_upload_bytes + FRAMING
    options = [
        ("grpc.max_receive_message_length", limit),
        ("grpc.so_reuseport", 0),  # a port in use is an error, not a second listener
    ]
    interceptors = [RequireKey(access)] if access is not None else []
    grpc_server = grpc.aio.server(interceptors=interceptors, options=options)
    served = []
    if server.asr is not None:
        served.append(grpc_riva.add_service(grpc_server, server))
    if server.tts is not None:
        served.append(grpc_riva_tts.add_service(grpc_server, server))
    served.append(grpc_triton.add_service(grpc_server, server))
    try:
        port = grpc_server.add_insecure_port(address)
    except RuntimeError as e:
        raise SpeechRTError(f"cannot listen for gRPC on {address} ({e})") from None
    await grpc_server.start()
    host = address.rpartition(":")[0]
    log.info("gRPC on %s:%d: %s", host, port, ", ".join(served))
    return grpc_server, port
