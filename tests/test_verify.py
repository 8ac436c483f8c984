"""`speechrt verify`: passes on a faithful export, fails (exit 1) on a perturbed weight."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from runtime_models import exported
from speechrt.cli import main


@pytest.fixture(scope="module")
def exported_voice() -> tuple[Path, Path]:
    return exported()["fastpitch"], exported()["hifigan"]


def test_eager_vs_onnx_passes(
    exported_voice: tuple[Path, Path], capsys: pytest.CaptureFixture
) -> None:
    assert (
        main(["verify", str(exported_voice[0]), "--a", "eager", "--b", "onnx", "--device", "cpu"])
        == 0
    )
    out = capsys.readouterr().out
    # intermediate activations (from the probe export) and every output, each with a verdict
    assert "model.encoder.layers.0 " in out and "model.decoder.layers.1 " in out
    for name in ("mel", "mel_lengths", "durations", "pitch", "energy"):
        assert f"out: {name} " in out
    assert out.strip().endswith("PASS")


def test_perturbed_weight_fails(
    exported_voice: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src = exported_voice[1]
    d = tmp_path / "voc"
    d.mkdir()
    for f in src.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    import onnx
    from onnx.external_data_helper import convert_model_from_external_data

    graph = onnx.load(str(d / "model.onnx"))  # with the weights it reads from model.safetensors
    convert_model_from_external_data(graph)
    onnx.save(graph, str(d / "model.onnx"))  # ... now held inside the graph file
    weights = load_file(str(d / "model.safetensors"))
    weights["conv_post.bias"] += 0.05  # the ONNX graphs keep the old weights
    save_file(weights, str(d / "model.safetensors"))
    code = main(["verify", str(d), "--b", "onnx", "--device", "cpu", "--graph", "hifigan"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("out: audio "))
    assert line.split()[-1] == "False"
    # the first layers still agree; the perturbed last conv does not
    conv_pre = next(ln for ln in out.splitlines() if ln.startswith("model.conv_pre "))
    assert conv_pre.split()[-1] == "True" or float(conv_pre.split()[-4]) < 1e-5


def test_eager_vs_cuda_runner_in_half_precision(
    exported_voice: tuple[Path, Path], capsys: pytest.CaptureFixture
) -> None:
    # on the CPU the cuda runner runs uncompiled: buckets, bf16 weights, float32 encoder
    args = [
        "verify",
        str(exported_voice[0]),
        "--b",
        "cuda",
        "--precision",
        "bf16",
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "uncompiled" in out and "model.decoder.layers.0 " in out
    assert main([*args, "--tolerance", "1e-6"]) == 1  # bf16 is not that close


def test_verify_errors(exported_voice: tuple[Path, Path]) -> None:
    assert main(["verify", str(exported_voice[0]), "--graph", "denoiser", "--device", "cpu"]) == 2
    assert main(["verify", str(exported_voice[0]), "--batch", "0"]) == 2


@pytest.mark.parametrize("kind", ["tacotron2", "waveglow", "fastspeech", "quartznet"])
def test_every_kind_verifies(kind: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["verify", str(exported()[kind]), "--device", "cpu", "--length", "9"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == out.count("== ") >= 1
