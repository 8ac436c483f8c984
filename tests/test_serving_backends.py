"""`speechrt serve --backend`: a real server on the onnx backend (the tiny voice and ASR model
exported to ONNX) answers as the in-process onnx pipelines do; backends that cannot serve are
refused at startup with one line.

Bytes equal, not merely close: the server and the in-process pipeline run the same ONNX files in
onnxruntime's CPU provider with the same session options on the same inputs (one request is a
batch of one, as the in-process call is), and onnxruntime's CPU kernels split work across threads
by output element, never inside one sum, so the float32 audio is bitwise the same and so are its
int16 samples. Against eager the float audio is within 1e-4 (what test_runtime_tts allows).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from serving_inputs import ONE, speechlike, wav
from speechrt.asr import ASR
from speechrt.audio.io import to_int16
from speechrt.cli import main
from speechrt.device import batch_invariant
from speechrt.options import SynthesisOptions
from speechrt.runtime.onnx import OnnxRunner
from speechrt.serving import ServeConfig, Server
from speechrt.tts import TTS

EAGER_TOL = 1e-4  # onnx vs eager, float32 audio / log-mel outputs


@pytest.fixture(scope="module")
def exported(tiny_voice, tiny_asr, tmp_path_factory) -> tuple[Path, Path, Path]:
    """Copies of the tiny voice and ASR model with their ONNX graphs (the originals stay
    unexported: other tests' `auto` servers must keep resolving to eager)."""
    root = tmp_path_factory.mktemp("exported")
    dirs = []
    for i, d in enumerate((*tiny_voice, tiny_asr)):
        out = root / f"{i}-{d.name}"
        shutil.copytree(d, out)
        assert main(["export", str(out), "--no-check"]) == 0
        dirs.append(out)
    return dirs[0], dirs[1], dirs[2]


@pytest.fixture(scope="module")
def onnx_server(start_server, exported) -> str:
    a, v, asr = exported
    url, proc = start_server(
        *("--acoustic", str(a), "--vocoder", str(v), "--asr", str(asr)),
        *("--device", "cpu", "--backend", "onnx"),
    )
    assert "tts [onnx], asr [onnx], fastpitch [onnx]" in proc.log.read_text()  # startup log
    return url


def v2_infer(url: str, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A JSON KServe v2 request -> its outputs as numpy arrays."""
    types = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(object): "BYTES"}
    body = {
        "inputs": [
            {
                "name": n,
                "datatype": types[x.dtype],
                "shape": list(x.shape),
                "data": [e.decode() if isinstance(e, bytes) else e for e in x.reshape(-1).tolist()],
            }
            for n, x in inputs.items()
        ]
    }
    r = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    dt = {"FP32": np.float32, "INT64": np.int64}
    return {
        o["name"]: np.array(o["data"], dtype=dt.get(o["datatype"], object)).reshape(o["shape"])
        for o in r.json()["outputs"]
    }


def test_speech_equals_the_in_process_onnx_pipeline(onnx_server, exported, tiny_voice):
    a, v, _ = exported
    local = TTS(a, v, device="cpu", backend="onnx")
    (want,) = local.synthesize([ONE], SynthesisOptions(), seeds=[0])
    (eager,) = TTS(*tiny_voice, device="cpu").synthesize([ONE], SynthesisOptions(), seeds=[0])
    assert want.shape == eager.shape and np.abs(want - eager).max() <= EAGER_TOL
    body = {"model": "tts", "voice": "0", "input": ONE, "response_format": "pcm"}
    r = httpx.post(f"{onnx_server}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200 and r.content == to_int16(want).tobytes()
    out = v2_infer(onnx_server, "tts", {"TEXT": np.array([ONE.encode()], dtype=object)})
    (n,) = out["AUDIO_LENGTHS"]
    assert n == len(want) and np.array_equal(out["AUDIO"][0, :n], want)


def test_transcription_equals_the_in_process_onnx_pipeline(onnx_server, exported):
    local = ASR(exported[2], device="cpu", backend="onnx")
    data = wav(speechlike(2.0, 5))
    want = local.transcribe([local.load_audio(data)])[0].text
    r = httpx.post(
        f"{onnx_server}/v1/audio/transcriptions",
        data={"model": "asr"},
        files={"file": ("a.wav", data, "audio/wav")},
        timeout=60,
    )
    assert r.status_code == 200 and want and r.json()["text"] == want


def test_components_run_on_onnx(onnx_server, exported, tiny_voice):
    for model, platform in (("hifigan", "onnxruntime_onnx"), ("quartznet", "onnxruntime_onnx"),
                            ("tts", "speechrt_pipeline")):  # fmt: skip
        assert httpx.get(f"{onnx_server}/v2/models/{model}").json()["platform"] == platform
        assert httpx.get(f"{onnx_server}/v2/models/{model}/config").json()["backend"] == "onnx"
    g = torch.Generator().manual_seed(0)
    mel = (torch.randn(2, 80, 12, generator=g) - 5.0).numpy()
    lengths = np.array([12, 7], dtype=np.int64)
    got = v2_infer(onnx_server, "hifigan", {"mel": mel, "mel_lengths": lengths})
    want = OnnxRunner.from_dir(exported[1], device="cpu").run({"mel": mel, "mel_lengths": lengths})
    assert got["audio"].shape == (2, 12 * 256)  # samples follow frames: nothing cropped
    assert np.array_equal(got["audio"], want["audio"])
    assert got["audio_lengths"].tolist() == [12 * 256, 7 * 256]
    eager = TTS(*tiny_voice, device="cpu").vocoder
    with torch.inference_mode():
        ref, _ = eager.mel_to_audio(torch.from_numpy(mel), torch.from_numpy(lengths), None)
    for row, n, r in zip(got["audio"], got["audio_lengths"], ref.numpy(), strict=True):
        assert np.abs(row[:n] - r[:n]).max() <= EAGER_TOL


def test_auto_resolves_per_pipeline_and_components_share_runners(exported, tiny_asr):
    """auto on a CPU: onnx for the exported voice, eager for the unexported ASR model; on onnx
    the component models run the pipeline's own runners (one onnxruntime session per graph)."""
    a, v, asr = exported
    server = Server.load(a, v, tiny_asr, device="cpu", config=ServeConfig(components=False))
    assert (server.v2["tts"].backend, server.v2["asr"].backend) == ("onnx", "eager")
    server = Server.load(a, v, asr, device="cpu")
    assert {m.backend for m in server.v2.values()} == {"onnx"}
    assert server.tts is not None and server.asr is not None
    stages = server.tts.tts.stages

    def session(name: str) -> object:
        # the pipelines run onnx on numpy arrays; so do the component models, on the same runner
        return server.engines[name].adapter.runner

    assert session("quartznet") is server.asr.asr.runner
    assert session("fastpitch") is stages.acoustic.runner
    assert session("hifigan") is stages.vocoder.runner
    assert session("hifigan.denoiser") is stages.denoiser.runner


def refused(capsys, *args: str) -> str:
    """`speechrt serve ARGS` fails at startup with exit code 2 and one line; that line."""
    assert main(["serve", "--port", "0", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_backends_that_cannot_serve_are_refused(capsys, exported, tiny_voice, tiny_asr):
    voice = ("--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1]))
    err = refused(capsys, *voice, "--device", "cpu", "--backend", "onnx")
    assert "lacks its main ONNX graph" in err and "speechrt export" in err
    err = refused(capsys, "--asr", str(tiny_asr), "--device", "cpu", "--backend", "onnx")
    assert str(tiny_asr) in err
    if not torch.cuda.is_available():
        err = refused(capsys, *voice, "--backend", "cuda")
        assert "the cuda backend needs a CUDA device" in err
    onnx_voice = ("--acoustic", str(exported[0]), "--vocoder", str(exported[1]))
    for backend in ("onnx", "auto"):  # auto resolves to onnx here: refused as well
        err = refused(
            capsys, *onnx_voice, "--device", "cpu", "--batch-invariant", "--backend", backend
        )
        assert "--batch-invariant needs the eager backend" in err and "got onnx" in err
    assert not batch_invariant()  # refused before it was turned on
    err = refused(capsys, *onnx_voice, "--device", "cpu", "--threads", "1")
    assert "--threads" in err and "fastpitch" in err and "--backend eager" in err
