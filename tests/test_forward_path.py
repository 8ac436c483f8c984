"""One forward path: the eager `/v1/audio/speech` pipeline and the eager `/v2` component models
run the same graph functions (speechrt.runtime.graphs), so patching one of them changes both.

In-process (Starlette's TestClient) with the tiny FastPitch + HiFi-GAN voice."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from serving_inputs import ids, infer, mel
from speechrt.runtime.graphs.fastpitch import FastPitchGraph
from speechrt.runtime.graphs.hifigan import HiFiGANGraph
from speechrt.serving import Server, create_app
from speechrt.tts import TTS

SPEECH = {"model": "tts", "voice": "0", "input": "Hello there.", "response_format": "pcm"}


@pytest.fixture(scope="module")
def client(tiny_voice):
    with TestClient(create_app(Server(TTS(*tiny_voice, device="cpu", backend="eager")))) as c:
        yield c


def v2_outputs(r) -> dict[str, np.ndarray]:
    """The outputs of a JSON-bodied v2 infer response, by name."""
    assert r.status_code == 200, r.text
    dtypes = {"FP32": np.float32, "INT64": np.int64}
    return {
        o["name"]: np.array(o["data"], dtype=dtypes[o["datatype"]]).reshape(o["shape"])
        for o in r.json()["outputs"]
    }


def speech(client: TestClient) -> np.ndarray:
    r = client.post("/v1/audio/speech", json=SPEECH)
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, dtype="<i2").astype(np.int32)


def test_patching_hifigan_forward_changes_v1_speech_and_v2_hifigan(client, monkeypatch) -> None:
    feeds = mel(2, 9)
    feeds["mel"] = feeds["mel"] + np.linspace(0, 4, 9, dtype=np.float32)  # not a constant mel
    before_v1, before_v2 = speech(client), v2_outputs(infer(client, "hifigan", feeds))
    assert np.abs(before_v1).max() > 100 and np.abs(before_v2["audio"]).max() > 0

    forward = HiFiGANGraph.forward

    def halved(self: HiFiGANGraph, m: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
        audio, lengths = forward(self, m, n)
        return audio * 0.5, lengths

    monkeypatch.setattr(HiFiGANGraph, "forward", halved)
    after_v1, after_v2 = speech(client), v2_outputs(infer(client, "hifigan", feeds))
    np.testing.assert_array_equal(after_v2["audio"], before_v2["audio"] * 0.5)  # x 0.5 is exact
    np.testing.assert_array_equal(after_v2["audio_lengths"], before_v2["audio_lengths"])
    assert after_v1.shape == before_v1.shape
    # int16 samples of half the audio: within one step of half the unpatched ones
    assert np.abs(after_v1 - before_v1 / 2).max() <= 1.0
    assert not np.array_equal(after_v1, before_v1)


def test_patching_fastpitch_decode_changes_v1_speech_and_v2_fastpitch(client, monkeypatch) -> None:
    feeds = ids(2, 7)
    before_v1, before_v2 = speech(client), v2_outputs(infer(client, "fastpitch", feeds))

    decode = FastPitchGraph.decode

    def louder(
        self: FastPitchGraph, enc: torch.Tensor, reps: torch.Tensor, n_frames: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m, lengths = decode(self, enc, reps, n_frames)
        return m + 1.0, lengths  # log-mel + 1: e times the magnitude

    monkeypatch.setattr(FastPitchGraph, "decode", louder)
    after_v1, after_v2 = speech(client), v2_outputs(infer(client, "fastpitch", feeds))
    np.testing.assert_allclose(after_v2["mel"], before_v2["mel"] + 1.0, rtol=0, atol=1e-5)
    for name in ("mel_lengths", "durations", "pitch"):
        np.testing.assert_array_equal(after_v2[name], before_v2[name])
    assert after_v1.shape == before_v1.shape  # same durations: the same number of samples
    assert np.abs(after_v1 - before_v1).max() > 100


def test_eager_components_run_the_pipelines_runners(tiny_voice, tiny_asr) -> None:
    """One runner per graph: each eager /v2 component model runs the pipeline's own runner."""
    from speechrt.asr import ASR

    tts, asr = TTS(*tiny_voice, device="cpu"), ASR(tiny_asr, device="cpu")
    server = Server(tts, asr)
    assert set(tts.runners()) == {"fastpitch", "hifigan", "denoiser"}
    assert server.engines["fastpitch"].adapter.runner is tts.stages.acoustic.runner
    assert server.engines["hifigan"].adapter.runner is tts.stages.vocoder.runner
    assert server.engines["hifigan.denoiser"].adapter.runner is tts.stages.denoiser.runner
    assert server.engines["quartznet"].adapter.runner is asr.runner
