"""KServe v2 component models follow the shared contracts (speechrt.contracts): their metadata is
the contract's, a request built from the metadata alone runs, its outputs equal the eager runner's
(float32, within 1e-5 of the output scale), and bad inputs are 400s that leave the server healthy.

In-process (Starlette's TestClient) with the tiny voice and ASR model, plus one tritonclient
request to the shared `speechrt serve` subprocess."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import tritonclient.http as triton
from fastapi.testclient import TestClient

from speechrt.asr import ASR
from speechrt.registry import contract
from speechrt.runtime.stages import make_runner
from speechrt.serving import Server, create_app
from speechrt.serving.v2metadata import component_names, model_metadata
from speechrt.serving.v2models import ComponentAdapter
from speechrt.tts import TTS

TOL = 1e-5  # float32: max |served - eager| / max(1, max |eager|)
BINARY = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def pipes(tiny_voice, tiny_asr) -> tuple[TTS, ASR]:
    return TTS(*tiny_voice, device="cpu"), ASR(tiny_asr, device="cpu")


@pytest.fixture(scope="module")
def client(pipes):
    with TestClient(create_app(Server(*pipes))) as c:
        yield c


def components(pipes) -> dict[str, tuple]:
    """v2 name -> (graph, module, info) for every graph of the tiny voice and ASR model."""
    tts, asr = pipes
    out = {}
    for module, info in ((tts.acoustic, tts.acoustic_info), (tts.vocoder, tts.vocoder_info)):
        out |= {n: (g, module, info) for n, g in component_names(info.kind).items()}
    out |= {n: (g, asr.model, asr.info) for n, g in component_names(asr.info.kind).items()}
    return out


def request_from_metadata(meta: dict, batch: int = 2, length: int = 12) -> dict[str, np.ndarray]:
    """What a client knowing only the metadata sends: every dynamic axis `length` long, ids small,
    per-item scalars 1, lengths full for item 0 and shorter after, float tensors random."""
    rng = np.random.default_rng(0)
    feeds = {}
    for t in meta["inputs"]:
        shape = [batch] + [length if d < 0 else d for d in t["shape"][1:]]
        if t["datatype"] == "INT64" and len(shape) == 1:
            feeds[t["name"]] = np.array([length - 3 * i for i in range(batch)], dtype=np.int64)
        elif t["datatype"] == "INT64":
            feeds[t["name"]] = rng.integers(1, 20, shape).astype(np.int64)
        elif len(shape) == 1:
            feeds[t["name"]] = np.ones(shape, dtype=np.float32)
        else:
            feeds[t["name"]] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    return feeds


def v2_body(feeds: dict[str, np.ndarray], binary: bool) -> tuple[bytes, dict[str, str]]:
    datatypes = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32"}
    inputs, blobs = [], []
    for name, x in feeds.items():
        t = {"name": name, "datatype": datatypes.get(x.dtype, "BOOL"), "shape": list(x.shape)}
        if binary:
            blobs.append(x.astype(x.dtype.newbyteorder("<")).tobytes())
            t["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            t["data"] = x.reshape(-1).tolist()
        inputs.append(t)
    head = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": binary}}).encode()
    if not binary:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(blobs), {BINARY: str(len(head))}


def v2_outputs(r) -> dict[str, np.ndarray]:
    assert r.status_code == 200, r.text
    n = int(r.headers.get(BINARY, len(r.content)))
    head, raw, pos, out = json.loads(r.content[:n]), r.content[n:], 0, {}
    for o in head["outputs"]:
        dtype = {"FP32": "<f4", "INT64": "<i8"}[o["datatype"]]
        if "data" in o:
            out[o["name"]] = np.array(o["data"], dtype=dtype).reshape(o["shape"])
        else:
            size = o["parameters"]["binary_data_size"]
            out[o["name"]] = np.frombuffer(raw[pos : pos + size], dtype).reshape(o["shape"])
            pos += size
    return out


def eager(parts: tuple, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    graph, module, info = parts
    runner = make_runner(graph, module, info, "eager", torch.device("cpu"))
    out = runner.run({k: torch.from_numpy(v.copy()) for k, v in feeds.items()})
    return {k: v.numpy() for k, v in out.items()}


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name, w in want.items():
        assert got[name].shape == w.shape and got[name].dtype == w.dtype, name
        scale = max(1.0, float(np.abs(w).max(initial=0)))
        assert np.abs(got[name] - w).max(initial=0) <= TOL * scale, name


# -- names and metadata --------------------------------------------------------------------------


def test_component_names() -> None:
    assert component_names("fastpitch") == {"fastpitch": "fastpitch"}
    assert component_names("hifigan") == {"hifigan": "hifigan", "hifigan.denoiser": "denoiser"}
    assert component_names("quartznet") == {"quartznet": "jasper"}
    assert list(component_names("tacotron2")) == [
        "tacotron2.encoder",
        "tacotron2.decoder_step",
        "tacotron2.postnet",
    ]


def test_metadata_is_the_shared_contract(client, pipes) -> None:
    parts = components(pipes)
    assert sorted(parts) == ["fastpitch", "hifigan", "hifigan.denoiser", "quartznet"]
    for name, (graph, _, info) in parts.items():
        want = model_metadata(contract(graph, info.dims), name)
        got = client.get(f"/v2/models/{name}").json()
        for t in got["inputs"]:  # the server's size limits (tests/test_serving_surface.py)
            assert len(t.pop("max_shape")) == len(t["shape"])
        assert (got["name"], got["inputs"], got["outputs"]) == (
            name,
            want["inputs"],
            want["outputs"],
        )
        assert client.get(f"/v2/models/{name}/ready").status_code == 200
    for name in ("tts", "asr"):  # the pipelines keep their BYTES contracts
        meta = client.get(f"/v2/models/{name}").json()
        assert "BYTES" in {t["datatype"] for t in meta["inputs"] + meta["outputs"]}


# -- infer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_from_metadata_alone_equals_the_eager_runner(client, pipes, binary) -> None:
    for name, parts in components(pipes).items():
        feeds = request_from_metadata(client.get(f"/v2/models/{name}").json())
        body, headers = v2_body(feeds, binary)
        r = client.post(f"/v2/models/{name}/infer", content=body, headers=headers)
        assert_close(v2_outputs(r), eager(parts, feeds))


def test_optional_inputs_take_their_defaults(client, pipes) -> None:
    meta = client.get("/v2/models/fastpitch").json()
    feeds = request_from_metadata(meta)
    required = {k: feeds[k] for k in ("ids", "lengths")}
    got = v2_outputs(client.post("/v2/models/fastpitch/infer", content=v2_body(required, False)[0]))
    full = required | {
        "pace": np.ones(2, np.float32),
        "pitch_shift": np.zeros(2, np.float32),
        "pitch_scale": np.ones(2, np.float32),
    }
    assert_close(got, eager(components(pipes)["fastpitch"], full))


def test_requests_batched_together_get_what_they_get_alone(pipes) -> None:
    """FastPitch's frame count depends on the values: a batch-mate's longer output is cut off."""
    tts, _ = pipes
    runner = make_runner("fastpitch", tts.acoustic, tts.acoustic_info, "eager", torch.device("cpu"))
    adapter = ComponentAdapter(runner)
    meta = model_metadata(contract("fastpitch", tts.acoustic_info.dims), "fastpitch")
    short = request_from_metadata(meta, batch=1, length=6)
    long = request_from_metadata(meta, batch=1, length=6)
    long["pace"] = np.full(1, 0.25, np.float32)  # 4x the frames
    assert adapter.key(short) == adapter.key(long)
    together = adapter.run_batch([short, long])
    for item, out in zip((short, long), together, strict=True):
        (alone,) = adapter.run_batch([item])
        assert_close(out, alone)
    assert together[0]["mel"].shape[2] < together[1]["mel"].shape[2]


# -- bad input -----------------------------------------------------------------------------------


def _bad_cases(client) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    mel = request_from_metadata(client.get("/v2/models/hifigan").json())
    ids = request_from_metadata(client.get("/v2/models/fastpitch").json())
    feats = request_from_metadata(client.get("/v2/models/quartznet").json())
    return {
        "missing required input": ("hifigan", {"mel": mel["mel"]}),
        "wrong dtype": ("hifigan", mel | {"mel_lengths": mel["mel_lengths"].astype(np.float32)}),
        "wrong rank": ("quartznet", feats | {"features": feats["features"][0]}),
        "wrong fixed size": ("hifigan", mel | {"mel": mel["mel"][:, :3]}),
        "unknown input name": ("fastpitch", ids | {"speed": np.ones(2, np.float32)}),
        "batch sizes differ": ("fastpitch", ids | {"pace": np.ones(3, np.float32)}),
        "pace out of bounds": ("fastpitch", ids | {"pace": np.full(2, 50.0, np.float32)}),
        "length past the axis": ("quartznet", feats | {"feature_lengths": np.array([13, 2])}),
        "NaN": ("hifigan", mel | {"mel": np.full_like(mel["mel"], np.nan)}),
        "empty batch": ("hifigan", {k: v[:0] for k, v in mel.items()}),
    }


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_bad_inputs_are_400_and_the_server_stays_healthy(client, binary) -> None:
    for case, (model, feeds) in _bad_cases(client).items():
        if not binary and case == "NaN":
            continue  # NaN is not JSON
        body, headers = v2_body(feeds, binary)
        r = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
        assert r.status_code == 400, (case, r.text)
        assert isinstance(r.json()["error"], str) and model in r.json()["error"], case
    assert client.get("/v2/health/ready").status_code == 200
    good = request_from_metadata(client.get("/v2/models/hifigan").json())
    body, headers = v2_body(good, binary)
    assert client.post("/v2/models/hifigan/infer", content=body, headers=headers).status_code == 200


# -- tritonclient --------------------------------------------------------------------------------


def test_tritonclient_runs_a_component_from_its_metadata(speech_server, pipes) -> None:
    """The denoiser of the served vocoder, binary tensors; the server runs with oneDNN on."""
    trt = triton.InferenceServerClient(speech_server.removeprefix("http://"))
    meta = trt.get_model_metadata("hifigan.denoiser")
    feeds = request_from_metadata(meta, length=600)
    inputs = []
    for t in meta["inputs"]:
        x = triton.InferInput(t["name"], list(feeds[t["name"]].shape), t["datatype"])
        x.set_data_from_numpy(feeds[t["name"]], binary_data=True)
        inputs.append(x)
    result = trt.infer("hifigan.denoiser", inputs)
    mkldnn = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = True
    try:
        want = eager(components(pipes)["hifigan.denoiser"], feeds)
    finally:
        torch.backends.mkldnn.enabled = mkldnn
    assert_close({n: result.as_numpy(n) for n in want}, want)
