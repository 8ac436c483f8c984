import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# MKL reads this once, at its first operation: set before any test runs a model, so tests can
# turn batch-invariant mode on in-process (speechrt.device.set_batch_invariant).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# onnxruntime's optimised graphs (speechrt.runtime.onnx_cache) in a folder of this run's own
_ONNX_CACHE = tempfile.mkdtemp(prefix="speechrt-onnx-cache-")
atexit.register(shutil.rmtree, _ONNX_CACHE, True)
os.environ.setdefault("SPEECHRT_ONNX_CACHE", _ONNX_CACHE)

import torch  # noqa: E402

# the Triton repository tests' fixtures (dirs, repo), shared by their modules
pytest_plugins = ["triton_harness"]

# Tiny models: one intra-op thread is many times faster than two on a 2-core machine, and oneDNN
# spends seconds building a primitive for every new conv shape.
torch.set_num_threads(1)
torch.backends.mkldnn.enabled = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked requires_cuda are skipped where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "requires_cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module, whatever an earlier test left set (the ASR modules use
    it: small CPU ops are dominated by thread hand-offs on a 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_voice(tmp_path_factory):
    """(acoustic dir, vocoder dir) of a tiny FastPitch + HiFi-GAN converted from DLE checkpoints."""
    from tiny import make_voice

    return make_voice(tmp_path_factory.mktemp("voice"))


# -- a tiny random-weight ASR model in model-repository form (serving and client tests) ----------


def _randomize(module: torch.nn.Module, seed: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


@pytest.fixture(scope="session")
def tiny_asr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A QuartzNet-shaped model (3 blocks, 16-32 channels) with random weights, English labels."""
    from speechrt.audio.features import FeatureConfig
    from speechrt.models.jasper import LABELS, QuartzNet
    from speechrt.registry import preset
    from speechrt.repo import ComponentInfo, save_component

    dims = preset("quartznet", "tiny")
    model = QuartzNet(dims).eval()
    _randomize(model, 2, 0.3)
    with torch.no_grad():
        model.decoder.bias[-1] += 1.0  # blanks between letters, so words come out
    meta = {"labels": list(LABELS), "features": FeatureConfig().to_dict()}
    out = tmp_path_factory.mktemp("tiny_asr") / "quartznet"
    save_component(out, ComponentInfo("quartznet", dims, None, meta), model.state_dict())
    return out


# -- `speechrt serve` subprocesses ---------------------------------------------------------------

SRC = Path(__file__).resolve().parents[1] / "src"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def start_server(tmp_path_factory: pytest.TempPathFactory):
    """start(*serve_args) -> (base URL, Popen): `python -m speechrt.cli serve` on a free port,
    returned once /v2/health/ready answers 200; every server is stopped at the session's end."""
    import os
    import subprocess
    import sys
    import time

    import httpx

    procs: list[subprocess.Popen] = []

    def start(*args: str) -> tuple[str, subprocess.Popen]:
        port = _free_port()
        log = tmp_path_factory.mktemp("serve") / "server.log"
        path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "speechrt.cli", "serve", "--port", str(port), *args]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, env={**os.environ, "PYTHONPATH": path}, stdout=out, stderr=subprocess.STDOUT
            )
        proc.log = log  # type: ignore[attr-defined]
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited ({proc.returncode}):\n{log.read_text()}")
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                    return url, proc
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after 120 s:\n{log.read_text()}")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="session")
def speech_server(start_server, tiny_voice: tuple[Path, Path], tiny_asr: Path) -> str:
    """Base URL of one server with the tiny voice and ASR model, shared by the serving tests
    (batch-invariant where this CPU allows it: speechrt.device.batch_invariance_holds)."""
    from speechrt.device import batch_invariance_holds

    invariant = ["--batch-invariant"] if batch_invariance_holds() else []
    url, _ = start_server(
        *("--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1])),
        *("--asr", str(tiny_asr), "--device", "cpu", "--threads", "1", *invariant),
        *("--max-batch-size", "8", "--max-queue-delay-ms", "20", "--max-queue-size", "512"),
        *("--max-text-chars", "2000", "--max-upload-mb", "1", "--max-audio-seconds", "30"),
    )
    return url


@pytest.fixture(scope="session")
def grpc_server(start_server) -> tuple[str, str]:
    """(HTTP base URL, gRPC host:port) of one server with the bundled voice and recogniser and
    its gRPC port open, shared by the gRPC test modules (its limits: tests/grpc_speech.py)."""
    from grpc_speech import serve

    return serve(start_server)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic training corpus (speechrt_train.synthetic: no synthesizer), read-only."""
    from speechrt_train.synthetic import write_corpus

    path = tmp_path_factory.mktemp("corpus")
    write_corpus(path)
    return path


@pytest.fixture(scope="session")
def tiny_parakeet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{head: model dir} of tiny random Parakeets whose heads emit tokens: "tdt_ctc" (a hybrid
    TDT + CTC transducer) and "ctc" (tests/parakeet_models.py)."""
    from parakeet_models import build

    root = tmp_path_factory.mktemp("parakeet")
    return {head: build(root / head, head) for head in ("tdt_ctc", "ctc")}


@pytest.fixture(scope="session")
def onnx_parakeet(tiny_parakeet: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny hybrid with its three graphs exported (speechrt export)."""
    import shutil

    from speechrt.runtime.export import export_dir

    out = tmp_path_factory.mktemp("onnx") / "tdt_ctc"
    shutil.copytree(tiny_parakeet["tdt_ctc"], out)
    export_dir(out)
    return out
