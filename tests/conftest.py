from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


# -- tiny random-weight models in model-repository form (serving and client tests) ---------------


def _randomize(module: torch.nn.Module, seed: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


@pytest.fixture(scope="session")
def tiny_voice(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"acoustic": dir, "vocoder": dir}: a FastPitch + HiFi-GAN pair with random weights, small
    enough for CPU tests (hop 16 at 22.05 kHz, 10 mel bins), english_basic symbols."""
    from speechrt.audio.mel import MelConfig
    from speechrt.models.fastpitch import FastPitch, FastPitchDims
    from speechrt.models.hifigan import HiFiGAN, HiFiGANDims
    from speechrt.repo import ComponentInfo, save_component

    root = tmp_path_factory.mktemp("tiny_voice")
    mel = MelConfig(n_fft=64, hop_length=16, win_length=64, n_mels=10)
    fp_dims = FastPitchDims(
        n_mel_channels=10,
        n_symbols=148,
        symbols_embedding_dim=16,
        in_fft_n_layers=1,
        in_fft_n_heads=2,
        in_fft_d_head=4,
        in_fft_conv1d_filter_size=16,
        in_fft_output_size=16,
        out_fft_n_layers=1,
        out_fft_n_heads=2,
        out_fft_d_head=4,
        out_fft_conv1d_filter_size=16,
        out_fft_output_size=16,
        dur_predictor_filter_size=8,
        pitch_predictor_filter_size=8,
        energy_predictor_filter_size=8,
    )
    fastpitch = FastPitch(fp_dims).eval()
    _randomize(fastpitch, 0, 0.3)
    with torch.no_grad():
        fastpitch.duration_predictor.fc.bias.fill_(1.5)  # ~3.5 frames per symbol
        fastpitch.pitch_mean.fill_(200.0)
        fastpitch.pitch_std.fill_(50.0)
    text = {"symbol_set": "english_basic", "cleaners": ["english_cleaners_v2"], "p_arpabet": 0.0}
    info = ComponentInfo("fastpitch", fp_dims, mel, {"text": text})
    save_component(root / "fastpitch", info, fastpitch.state_dict())
    hg_dims = HiFiGANDims(
        upsample_rates=(4, 4),
        upsample_kernel_sizes=(8, 8),
        upsample_initial_channel=16,
        resblock="1",
        resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1, 3, 5),),
        n_mels=10,
    )
    hifigan = HiFiGAN(hg_dims).eval()
    _randomize(hifigan, 1, 0.2)
    save_component(root / "hifigan", ComponentInfo("hifigan", hg_dims, mel), hifigan.state_dict())
    return {"acoustic": root / "fastpitch", "vocoder": root / "hifigan"}


@pytest.fixture(scope="session")
def tiny_asr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A QuartzNet-shaped model (3 blocks, 16-32 channels) with random weights, English labels."""
    from speechrt.audio.features import FeatureConfig
    from speechrt.models.jasper import LABELS, QuartzNet, QuartzNetDims
    from speechrt.repo import ComponentInfo, save_component

    dims = QuartzNetDims(
        filters=(16, 16, 32),
        kernels=(11, 13, 1),
        repeats=(1, 2, 1),
        strides=(2, 1, 1),
        dilations=(1, 1, 1),
        separable=(True, True, False),
        residual=("none", "plain", "none"),
    )
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
def speech_server(start_server, tiny_voice: dict[str, Path], tiny_asr: Path) -> str:
    """Base URL of one server with the tiny voice and ASR model, shared by the serving tests."""
    url, _ = start_server(
        *("--acoustic", str(tiny_voice["acoustic"]), "--vocoder", str(tiny_voice["vocoder"])),
        *("--asr", str(tiny_asr), "--device", "cpu"),
        *("--max-batch-size", "8", "--max-queue-delay-ms", "20", "--max-queue-size", "512"),
        *("--max-text-chars", "2000", "--max-upload-mb", "1", "--max-audio-seconds", "30"),
    )
    return url
