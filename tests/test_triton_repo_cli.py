"""`speechrt export --triton-repo` on the command line: options, the bundled models, one-line
errors checked before anything is written, and a repository written without torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speechrt.cli import main
from triton_harness import config


def test_cli_writes_a_repository(dirs: dict[str, Path], tmp_path: Path, capsys) -> None:
    args = ["export", str(dirs["fastpitch"]), str(dirs["hifigan"])]
    args += ["--triton-repo", str(tmp_path / "r"), "--max-batch-size", "16"]
    assert main([*args, "--max-queue-delay-ms", "0.5", "--buckets", "symbols=16,48"]) == 0
    assert "tritonserver --model-repository" in capsys.readouterr().out
    cfg = config(tmp_path / "r" / "fastpitch")
    assert cfg.max_batch_size == 16 and cfg.dynamic_batching.max_queue_delay_microseconds == 500
    text = config(tmp_path / "r" / "fastpitch.text")
    assert text.parameters["buckets"].string_value == "symbols=16,48"


def test_cli_with_no_model_writes_the_bundled_models(tmp_path: Path, capsys) -> None:
    """As every other command, export --triton-repo with no DIR takes the bundled models."""
    from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, VOICE_VOCODER, default_model

    bundled = [default_model(n) for n in (VOICE_ACOUSTIC, VOICE_VOCODER, ASR_MODEL)]
    if None in bundled:
        pytest.skip("needs the bundled voice and recogniser")
    assert main(["export", "--triton-repo", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "note: " in out and "denoiser" in out  # the bundled vocoder ships no denoiser graph
    from speechrt.repo import read_info

    asr_kind = read_info(bundled[2]).kind  # its folder's name (quartznet, parakeet_ctc, ...)
    for name in ("fastpitch", "hifigan", asr_kind, "tts", "asr"):
        assert (tmp_path / "r" / name / "config.pbtxt").is_file(), name
    assert main(["export"]) == 2  # plain export still needs its directories
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give the model directories to export" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "no model.onnx (run `speechrt export"),
        (["--max-batch-size", "0"], "max batch size must be >= 1"),
        (["--buckets", "symbols=x"], "bad bucket list"),
    ],
)
def test_cli_errors_are_one_line(
    dirs: dict[str, Path], tmp_path: Path, capsys, extra: list[str], message: str
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("model.json", "model.safetensors"):
        shutil.copy(dirs["hifigan"] / f, bare / f)
    source = bare if not extra else dirs["hifigan"]
    assert main(["export", str(source), "--triton-repo", str(tmp_path / "r"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "r").exists()


def test_repository_and_python_models_import_no_torch(
    dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Writing a repository needs onnx, not torch; Triton's python models need neither."""
    sources = [str(dirs[k]) for k in ("fastpitch", "hifigan", "quartznet")]
    code = (
        "import sys\n"
        "from speechrt.triton.writer import write_repository\n"
        "import speechrt.triton.backend\n"
        f"write_repository({str(tmp_path / 'r')!r}, {sources!r})\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'torch'], 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (tmp_path / "r" / "tts" / "config.pbtxt").is_file()


def test_a_voice_needs_one_mel_config(dirs: dict[str, Path], tmp_path: Path, capsys) -> None:
    vocoder = tmp_path / "hifigan"
    shutil.copytree(dirs["hifigan"], vocoder)
    info = json.loads((vocoder / "model.json").read_text())
    info["mel"]["sampling_rate"] = 16000
    (vocoder / "model.json").write_text(json.dumps(info))
    args = ["export", str(dirs["fastpitch"]), str(vocoder), "--triton-repo", str(tmp_path / "r")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mel configs" in err and "sampling_rate" in err, err
    assert not (tmp_path / "r").exists()  # checked before anything is written
