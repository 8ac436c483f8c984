"""The gRPC services in-process with the stand-in voice of app_harness: a call the client
cancels drops its queued work, a full queue is UNAVAILABLE, a slow call DEADLINE_EXCEEDED. No
models, no subprocess."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from app_harness import SlowTTS, until
from speechrt.serving import BatchConfig, Limits, ServeConfig, Server

grpc = pytest.importorskip("grpc")
rtts = pytest.importorskip("riva.client.proto.riva_tts_pb2")
rtts_grpc = pytest.importorskip("riva.client.proto.riva_tts_pb2_grpc")
pb = pytest.importorskip("tritonclient.grpc.service_pb2")
pb_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")


def run_grpc(tts, config, body):
    """body(channel, server) against `tts` served over gRPC on a free port."""
    from speechrt.serving.grpc_app import start_grpc

    async def main():
        server = Server(tts, None, config)
        await server.start()
        rpc, port = await start_grpc(server, "127.0.0.1:0", None)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                return await asyncio.wait_for(body(channel, server), 60)  # a hang guard
        finally:
            await rpc.stop(None)
            await server.stop()

    return asyncio.run(main())


def call(channel, method: str, text: str):
    """Start one call speaking `text` ('|' splits it into pieces: batch items)."""
    request = rtts.SynthesizeSpeechRequest(text=text)
    if method == "Synthesize":
        return rtts_grpc.RivaSpeechSynthesisStub(channel).Synthesize(request)
    if method == "SynthesizeOnline":
        return rtts_grpc.RivaSpeechSynthesisStub(channel).SynthesizeOnline(iter([request]))
    tensor = pb.ModelInferRequest.InferInputTensor(name="TEXT", datatype="BYTES", shape=[1])
    infer = pb.ModelInferRequest(
        model_name="tts",
        inputs=[tensor],
        raw_input_contents=[len(text).to_bytes(4, "little") + text.encode()],
    )
    return pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(infer)


async def outcome(c) -> grpc.StatusCode:
    """How a call ended (OK once its responses are read)."""
    try:
        if hasattr(c, "__aiter__"):
            async for _ in c:
                pass
        else:
            await c
    except grpc.aio.AioRpcError as e:
        return e.code()
    except asyncio.CancelledError:
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.OK


@pytest.mark.parametrize("method", ["Synthesize", "SynthesizeOnline", "ModelInfer"])
def test_a_call_the_client_cancels_has_its_queued_pieces_dropped(method):
    gate = threading.Event()
    tts = SlowTTS(gate=gate)
    config = ServeConfig(BatchConfig(max_batch_size=1, max_queue_delay_ms=0))

    async def body(channel, server):
        c = call(channel, method, "a|b|c|d")
        await tts.wait_entered()  # "a" holds the device; b, c, d are queued
        c.cancel()
        ended = await outcome(c)
        engine = server.engines["tts"]
        # the server learns of the cancel after the client does: open the device only once
        # the handler has cancelled b, c and d (else the worker may start b first)
        await until(
            lambda: (
                len(engine.queue.items) == 3 and all(p.future.done() for p in engine.queue.items)
            )
        )
        gate.set()
        await until(lambda: engine.pending == 0 and engine.dropped == 3)
        return ended, server.metrics.render()

    ended, metrics = run_grpc(tts, config, body)
    assert ended == grpc.StatusCode.CANCELLED
    assert tts.batches == [1]  # b, c and d never ran
    assert 'speechrt_dropped_items_total{model="tts",version="1"} 3' in metrics


@pytest.mark.parametrize("method", ["Synthesize", "SynthesizeOnline", "ModelInfer"])
def test_a_full_queue_is_unavailable(method):
    gate = threading.Event()
    tts = SlowTTS(gate=gate)
    config = ServeConfig(BatchConfig(max_batch_size=1, max_queue_delay_ms=0, max_queue_size=2))

    async def body(channel, server):
        first = call(channel, "Synthesize", "a")
        await tts.wait_entered()  # "a" holds the device
        queued = call(channel, "Synthesize", "b|c")
        await until(lambda: server.engines["tts"].pending == 3)  # b and c queued
        refused = await outcome(call(channel, method, "d"))
        gate.set()
        return refused, await first, await queued

    refused, first, queued = run_grpc(tts, config, body)
    assert refused == grpc.StatusCode.UNAVAILABLE
    a, bc = np.frombuffer(first.audio, "<i2"), np.frombuffer(queued.audio, "<i2")
    assert a[0] == round(ord("a") / 1000 * 32767)  # the stand-in's audio: its ids as samples
    assert (bc[0], bc[-1]) == (round(ord("b") / 1000 * 32767), round(ord("c") / 1000 * 32767))


def test_a_call_past_the_request_timeout_is_deadline_exceeded():
    gate = threading.Event()
    tts = SlowTTS(gate=gate)
    config = ServeConfig(
        BatchConfig(max_batch_size=1, max_queue_delay_ms=0), Limits(request_timeout_s=0.1)
    )

    async def body(channel, server):
        ended = await outcome(call(channel, "Synthesize", "a|b"))  # "a" waits past the deadline
        gate.set()
        return ended

    assert run_grpc(tts, config, body) == grpc.StatusCode.DEADLINE_EXCEEDED
