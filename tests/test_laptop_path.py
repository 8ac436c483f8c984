"""The CPU path users get by default: the bundled ONNX graphs on onnxruntime, no torch imported.

- `speechrt --help`, `synthesize` (numbers too), `transcribe` and `serve` import neither torch
  nor inflect (numbers have their own speller); the server serves every route on onnxruntime, and
  says how to get the denoiser, whose graph the bundled voice does not ship;
- the shipped graphs read the bundled safetensors (no weights twice) and are what re-exporting
  the weights writes;
- the onnx and eager defaults agree: mel, audio, transcripts;
- the numpy front ends (ASR features, resampler, output lengths) equal the torch/scipy ones.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, VOICE_VOCODER, default_model
from speechrt.registry import contract, graphs_of
from speechrt.repo import read_info

pytestmark = pytest.mark.skipif(
    None in (default_model(VOICE_ACOUSTIC), default_model(VOICE_VOCODER), default_model(ASR_MODEL)),
    reason="no default models bundled",
)

BUNDLED = [VOICE_ACOUSTIC, VOICE_VOCODER, ASR_MODEL]
HEAVY = ("torch", "inflect", "scipy", "ray")

# Runs the CLI in a fresh interpreter and prints which heavy modules it imported. uvicorn
# raises the SIGTERM that stopped a server again once it has shut down: exit cleanly on it.
DRIVER = """
import signal, sys
from speechrt.cli import main
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("IMPORTED", ",".join(m for m in {heavy} if m in sys.modules), file=sys.stderr)
"""


def imported_by(*argv: str, cwd: Path) -> list[str]:
    """The heavy modules `speechrt ARGV...` imports (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-c", DRIVER.format(heavy=HEAVY), *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("IMPORTED")][-1]
    return [m for m in line.split(" ", 1)[1].split(",") if m]


def test_the_cli_on_a_cpu_imports_no_torch(tmp_path: Path) -> None:
    assert imported_by("--help", cwd=tmp_path) == []
    assert imported_by("synthesize", "Hello world.", "-o", "hello.wav", cwd=tmp_path) == []
    assert (tmp_path / "hello.wav").stat().st_size > 10_000
    speech = ("synthesize", "Speech recognition works on this machine.", "-o", "speech.wav")
    assert imported_by(*speech, cwd=tmp_path) == []
    assert imported_by("transcribe", "speech.wav", cwd=tmp_path) == []
    # numbers are spelled without inflect (whose import took seconds)
    money = ("synthesize", "It costs $3.50 on Jan. 5th, 1984.", "-o", "n.wav")
    assert imported_by(*money, cwd=tmp_path) == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, server: subprocess.Popen, log: Path) -> None:
    """Poll /v2/health/ready until it answers 200 (the server failing or hanging fails)."""
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"not ready after 120 s:\n{log.read_text()}")


def test_serve_on_a_cpu_imports_no_torch(tmp_path: Path) -> None:
    """`speechrt serve` on the defaults, in a fresh interpreter: speech, a transcription and
    /v2 metadata on onnxruntime; what the server process imported is printed when SIGTERM has
    stopped it. The denoiser, whose ONNX graph is not bundled, is not served: asking for it
    gets a 4xx naming the two fixes."""
    import httpx

    port = free_port()
    url, log = f"http://127.0.0.1:{port}", tmp_path / "server.log"
    argv = ["serve", "--port", str(port)]
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-c", DRIVER.format(heavy=HEAVY), *argv],
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(url, server, log)
        text = "Speech recognition works on this machine."
        r = httpx.post(
            f"{url}/v1/audio/speech",
            json={"model": "tts-1", "input": text, "voice": "0"},
            timeout=60,
        )
        assert r.status_code == 200 and len(r.content) > 10_000, r.text
        wav = r.content
        files, data = {"file": ("speech.wav", wav, "audio/wav")}, {"model": "whisper-1"}
        r = httpx.post(f"{url}/v1/audio/transcriptions", data=data, files=files, timeout=60)
        assert r.status_code == 200 and r.json()["text"].strip(), r.text
        asr_kind = read_info(default_model(ASR_MODEL)).kind  # the bundled recogniser's kind
        for model in ("fastpitch", "hifigan", asr_kind):
            meta = httpx.get(f"{url}/v2/models/{model}").json()
            assert meta["platform"] == "onnxruntime_onnx", meta
        for model in ("tts", "asr"):
            assert httpx.get(f"{url}/v2/models/{model}/config").json()["backend"] == "onnx"
        r = httpx.get(f"{url}/v2/models/hifigan.denoiser")
        assert r.status_code == 404 and "--graph denoiser" in r.text, r.text
        index = {m["name"]: m for m in httpx.post(f"{url}/v2/repository/index").json()}
        assert index["hifigan.denoiser"]["state"] == "UNAVAILABLE"
        assert "--graph denoiser" in index["hifigan.denoiser"]["reason"]
        assert index["hifigan"]["state"] == "READY"
        body = {"model": "tts-1", "input": "Hello.", "voice": "0", "denoise": 0.01}
        r = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=60)
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "--graph denoiser" in message and "--backend eager" in message
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    output = log.read_text()
    assert "serving tts [onnx], asr [onnx], fastpitch [onnx], hifigan [onnx]" in output
    imported = [ln for ln in output.splitlines() if ln.startswith("IMPORTED")]
    assert imported == ["IMPORTED "], output


def test_auto_picks_onnx_on_a_cpu_for_the_bundled_models() -> None:
    from speechrt.runtime import has_onnx, resolve_backend

    dirs = [default_model(name) for name in BUNDLED]
    assert all(has_onnx(d, main_only=True) for d in dirs)
    assert resolve_backend("auto", "cpu", dirs, main_only=True) == "onnx"
    # the vocoder's denoiser graph is not shipped: denoising needs the eager backend
    assert not has_onnx(default_model(VOICE_VOCODER))


@pytest.mark.parametrize("name", BUNDLED)
def test_shipped_graphs_read_the_bundled_weights(name: str) -> None:
    """The graph's weights are external references into model.safetensors (float16, widened
    by a Cast); what stays inside is a few constants the exporter folded (< 1 kB; an attention
    model's folded relative-position table too: < 1 % of the weights)."""
    import onnx
    from onnx import numpy_helper

    d = default_model(name)
    path = d / next(iter(graphs_of(_kind(d)).values()))
    model = onnx.load(str(path), load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    locations = {e.value for t in external for e in t.external_data if e.key == "location"}
    assert locations == {"model.safetensors"} and len(external) > 50
    inline = [t for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    attention = "d_model" in read_info(d).dims
    limit = 0.01 * (d / "model.safetensors").stat().st_size if attention else 1000
    assert sum(numpy_helper.to_array(t).nbytes for t in inline) < limit
    assert path.stat().st_size < 1_000_000


def _kind(model_dir: Path) -> str:
    return read_info(model_dir).kind


@pytest.mark.parametrize("name", BUNDLED)
def test_reexporting_the_bundled_weights_gives_the_shipped_graph(name: str, tmp_path: Path) -> None:
    """`speechrt export DIR --graph MAIN` on a copy of the bundled weights writes a graph whose
    outputs equal the shipped one's to 1e-5 (so the shipped files can be regenerated)."""
    from speechrt.runtime.export import export_dir
    from speechrt.runtime.graphs import build_graph, example_feeds
    from speechrt.runtime.onnx import OnnxRunner

    d = default_model(name)
    for f in ("model.json", "model.safetensors"):
        shutil.copy(d / f, tmp_path / f)
    kind = _kind(d)
    main_graph, file = next(iter(graphs_of(kind).items()))
    export_dir(tmp_path, check=False, graphs=[main_graph])
    from speechrt.repo import load_component

    model, info = load_component(d)
    feeds = example_feeds(main_graph, build_graph(main_graph, model, info), 2, 23, seed=1)
    arrays = {k: v.numpy() for k, v in feeds.items()}
    c = contract(main_graph, info.dims)
    shipped = OnnxRunner(d / file, c, device="cpu").run(arrays)
    fresh = OnnxRunner(tmp_path / file, c, device="cpu").run(arrays)
    for out in c.output_names:
        np.testing.assert_allclose(fresh[out], shipped[out], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def voices():
    from speechrt.tts import TTS

    return TTS(device="cpu"), TTS(device="cpu", backend="eager")


def test_onnx_and_eager_voices_agree(voices) -> None:
    """Same ids: mel within 1e-3 (float32 graphs, other kernels), audio SNR >= 40 dB."""
    from speechrt.options import SynthesisOptions

    onnx_tts, eager_tts = voices
    assert onnx_tts.backend == "onnx" and onnx_tts.numpy and eager_tts.backend == "eager"
    options = SynthesisOptions()
    pieces = onnx_tts.text_to_pieces(["The quick brown fox jumps over the lazy dog."], [0])
    ids, lengths, seeds = onnx_tts.batch_to_tensors(pieces)
    mel, mel_lengths = onnx_tts.ids_to_mel(ids, lengths, options, seeds)
    with torch.inference_mode():
        ref, ref_lengths = eager_tts.ids_to_mel(
            torch.from_numpy(ids), torch.from_numpy(lengths), options, torch.from_numpy(seeds)
        )
    assert mel_lengths.tolist() == ref_lengths.tolist()
    assert np.abs(mel - ref.numpy()).max() <= 1e-3
    audio = onnx_tts.synthesize(["The quick brown fox jumps over the lazy dog."])[0]
    ref_audio = eager_tts.synthesize(["The quick brown fox jumps over the lazy dog."])[0]
    assert audio.shape == ref_audio.shape
    snr = 10 * np.log10(np.sum(ref_audio**2) / np.sum((audio - ref_audio) ** 2))
    assert snr >= 40, snr


def test_denoising_on_onnx_without_the_graph_says_how(voices) -> None:
    """The bundled voice on onnx cannot denoise (no denoiser.onnx): a clear error, not a
    fallback; eager denoises."""
    from speechrt.errors import SpeechRTError
    from speechrt.options import SynthesisOptions

    onnx_tts, eager_tts = voices
    assert "--graph denoiser" in (onnx_tts.denoiser_missing or "")
    assert "denoiser" not in onnx_tts.runners()
    with pytest.raises(SpeechRTError, match="--backend eager"):
        onnx_tts.synthesize(["Hello."], SynthesisOptions(denoise=0.01))
    assert eager_tts.denoiser_missing is None
    assert len(eager_tts.synthesize(["Hello."], SynthesisOptions(denoise=0.01))[0]) > 0


def test_onnx_and_eager_recognisers_agree(voices) -> None:
    """Same probabilities within 1e-3 and the same transcripts, on the bundled voice's speech."""
    from speechrt.asr import ASR
    from speechrt.audio.io import resample

    texts = ["Speech recognition works on this machine.", "Please call Stella."]
    tts = voices[0]
    audios = [resample(a, tts.sampling_rate, 16000) for a in tts.synthesize(texts)]
    # without dither (each backend draws its own noise): probabilities within 1e-3
    onnx_asr, eager_asr = ASR(device="cpu", dither=0), ASR(device="cpu", backend="eager", dither=0)
    assert onnx_asr.backend == "onnx" and onnx_asr.numpy and eager_asr.backend == "eager"
    segs = [s for i, a in enumerate(audios) for s in onnx_asr.segments(i, a)]
    lp, n = onnx_asr.log_probs(segs)
    ref_lp, ref_n = eager_asr.log_probs(segs)
    assert n.tolist() == ref_n.tolist()
    assert np.abs(np.exp(lp) - np.exp(ref_lp.numpy())).max() <= 1e-3
    # as users get them (the model's dither on)
    onnx_asr, eager_asr = ASR(device="cpu"), ASR(device="cpu", backend="eager")
    got = [t.text for t in onnx_asr.transcribe(audios)]
    assert got == [t.text for t in eager_asr.transcribe(audios)]


def test_numpy_features_equal_torch_features() -> None:
    """log_mel_numpy against the torch computation (BatchLogMel): within 2e-4 on unit-scale
    features (torch's float32 STFT), over lengths on and off the hop grid."""
    from speechrt.audio.features import FeatureConfig, batch_features_numpy
    from speechrt.runtime.featurizer import batch_features

    cfg = FeatureConfig()
    rng = np.random.default_rng(0)
    audios = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (321, 16000, 48123)]
    feats, lengths = batch_features_numpy(audios, cfg)
    ref, ref_lengths = batch_features([torch.from_numpy(a) for a in audios], cfg)
    assert lengths.tolist() == ref_lengths.tolist() and feats.shape == tuple(ref.shape)
    assert np.abs(feats - ref.numpy()).max() <= 2e-4


@pytest.mark.parametrize(("orig", "target"), [(22050, 16000), (8000, 16000), (48000, 16000)])
def test_numpy_resampler_equals_scipy(orig: int, target: int) -> None:
    from math import gcd

    from scipy.signal import resample_poly as scipy_resample_poly

    from speechrt.audio.io import resample

    x = np.random.default_rng(orig).standard_normal(orig // 3 + 7).astype(np.float32)
    g = gcd(orig, target)
    ref = scipy_resample_poly(x.astype(np.float64), target // g, orig // g).astype(np.float32)
    got = resample(x, orig, target)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-6


def test_output_frames_equal_the_modules() -> None:
    """Jasper/QuartzNet's output frames from model.json's dims (what decode_padding decodes)
    are its module's, without building it."""
    import dataclasses

    from speechrt.asr.head import output_frames
    from speechrt.models import build_model
    from speechrt.registry import preset

    dims = preset("quartznet", "quartznet-5x5")
    with torch.device("meta"):
        model = build_model("quartznet", dims)
    n = torch.arange(1, 400)
    ref = model.output_lengths(n).tolist()
    assert [output_frames(dataclasses.asdict(dims), int(k)) for k in n] == ref


def test_own_stages_are_known_without_importing_the_graph_modules() -> None:
    """A graph's entry says `own_stage` exactly where its code has a stage (only main graphs:
    Tacotron 2's encoder, WaveGlow), and its code cannot say otherwise."""
    import dataclasses

    from speechrt.arch import GraphCode
    from speechrt.errors import SpeechRTError
    from speechrt.registry import ARCHITECTURES, GRAPHS, graph_code, load
    from speechrt.runtime.graphs import stage_builder

    with_stage = {name for name, g in GRAPHS.items() if load(g.code, GraphCode).stage is not None}
    assert with_stage == {name for name, g in GRAPHS.items() if g.own_stage}
    assert with_stage == {"tacotron2.encoder", "waveglow"}
    assert with_stage <= {a.graphs[0][0].name for a in ARCHITECTURES.values()}
    assert stage_builder("waveglow") is not None and stage_builder("hifigan") is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(GRAPHS, "hifigan", dataclasses.replace(GRAPHS["hifigan"], own_stage=True))
        with pytest.raises(SpeechRTError, match="hifigan: its code has no stage"):
            graph_code("hifigan")
