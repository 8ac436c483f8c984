"""HTTP serving: the OpenAI audio API and KServe v2 (Triton) over dynamic batching.

    engine.py       the batcher (knows no models) and the device thread; batch_queue.py its
                    fair queue (which items form the next batch)
    pipelines.py    TTS / ASR adapters and services       v2models.py  KServe v2 models
    v2metadata.py   named-tensor I/O of every v2 model     v2codec.py   JSON + binary tensors
    openai_api.py   /v1 routes     kserve.py  /v2 routes   metrics.py   Prometheus /metrics
    server.py       what a running server holds            app.py       the FastAPI app
    auth.py         API keys, rate limits                  grpc_app.py  gRPC beside HTTP:
    grpc_riva.py, grpc_riva_tts.py, grpc_triton.py (Riva, Triton), grpc_calls.py (status codes)

Needs the `serve` extra (fastapi, uvicorn, python-multipart); gRPC the `grpc` extra.
"""

from speechrt.limits import Limits
from speechrt.serving.app import create_app
from speechrt.serving.engine import BatchConfig
from speechrt.serving.server import ServeConfig, Server

__all__ = ["BatchConfig", "Limits", "ServeConfig", "Server", "create_app"]
