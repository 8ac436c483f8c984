"""A short `speechrt bench` smoke run: checks the result schema, never timings."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from speechrt.bench.stats import summarize
from speechrt.cli import main

LATENCY_KEYS = {"mean", "std", "min", "p50", "p90", "p95", "p99", "max"}


def test_percentiles_are_empirical():
    s = summarize([float(x) for x in range(1, 101)])  # 1 .. 100
    assert (s["p50"], s["p90"], s["p95"], s["p99"]) == (50.0, 90.0, 95.0, 99.0)
    assert s["mean"] == 50.5 and abs(s["std"] - np.std(np.arange(1, 101))) < 1e-12
    assert summarize([3.0, 1.0, 2.0])["p50"] == 2.0


def check_result(path, task, n_rows):
    result = json.loads(path.read_text())
    stamp = result["stamp"]
    assert {"device", "gpu", "commit", "versions", "command", "time"} <= set(stamp)
    assert stamp["versions"]["torch"] and stamp["command"].startswith("speechrt bench")
    rows = result["rows"]
    assert len(rows) == n_rows
    for r in rows:
        assert r["task"] == task and r["iterations"] == 3
        assert set(r["latency_s"]) == LATENCY_KEYS
        lat = r["latency_s"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"]
        assert r["rtf"] > 0 and r["inferences_s"] > 0 and r["throughput_samples_s"] > 0
        assert abs(sum(r["stages_s"].values()) - lat["mean"]) < 1e-9
    return rows


def test_bench_tts_smoke(tiny_voice, tmp_path, capsys):
    args = ["bench", "tts", "--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1])]
    args += ["--device", "cpu", "--precisions", "fp32,bf16", "--batch-sizes", "1,2"]
    args += ["--warmup", "1", "--iters", "3", "--denoise", "0.01", "--out-dir", str(tmp_path)]
    assert main(args) == 0
    rows = check_result(tmp_path / "tts.json", "tts", 4)
    assert set(rows[0]["stages_s"]) == {"input", "acoustic", "vocoder", "denoiser", "output"}
    assert all(r["avg_mel_frames"] > 0 and r["avg_audio_s"] > 0 for r in rows)
    with (tmp_path / "tts.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4
    assert (tmp_path / "tts.png").stat().st_size > 1000
    assert "RTF" in capsys.readouterr().out


def test_bench_asr_smoke(tiny_asr, tmp_path):
    args = ["bench", "asr", "--model", str(tiny_asr), "--device", "cpu", "--durations", "0.5,1"]
    args += ["--batch-sizes", "1,2", "--warmup", "0", "--iters", "3", "--out-dir", str(tmp_path)]
    assert main(args) == 0
    rows = check_result(tmp_path / "asr.json", "asr", 4)
    assert {r["audio_s"] for r in rows} == {0.5, 1.0}
    assert set(rows[0]["stages_s"]) == {"features", "acoustic", "decode"}


def test_bench_with_no_model_runs_the_bundled_ones(tmp_path):
    """As every other command (README's example gives no model directory)."""
    from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model

    if default_model(VOICE_ACOUSTIC) is None or default_model(ASR_MODEL) is None:
        pytest.skip("needs the bundled voice and recogniser")
    quick = ["--device", "cpu", "--backends", "onnx", "--batch-sizes", "1", "--warmup", "0"]
    quick += ["--iters", "1", "--out-dir", str(tmp_path)]
    assert main(["bench", "tts", *quick]) == 0
    assert main(["bench", "asr", "--durations", "1", *quick]) == 0
    tts = json.loads((tmp_path / "tts.json").read_text())
    assert tts["config"]["acoustic"] == str(default_model(VOICE_ACOUSTIC))
    asr = json.loads((tmp_path / "asr.json").read_text())
    assert asr["config"]["model"] == str(default_model(ASR_MODEL))
    assert tts["rows"][0]["rtf"] > 0 and asr["rows"][0]["rtf"] > 0


def test_bench_asr_on_a_parakeet_transducer(tiny_parakeet, tmp_path):
    """The bench decodes a transducer with its greedy loop (ASR.decode), as transcribe does."""
    from parakeet_models import sound
    from speechrt.asr import ASR

    model = tiny_parakeet["tdt_ctc"]
    args = ["bench", "asr", "--model", str(model), "--device", "cpu", "--durations", "1"]
    args += ["--batch-sizes", "1,2", "--warmup", "0", "--iters", "3", "--out-dir", str(tmp_path)]
    assert main(args) == 0
    rows = check_result(tmp_path / "asr.json", "asr", 2)
    assert set(rows[0]["stages_s"]) == {"features", "acoustic", "decode"}
    asr = ASR(model)
    audio = sound(2.0, seed=1)
    segs = asr.segments(0, audio)
    asr.decode(segs, *asr.log_probs(segs))
    assert [w for s in segs for w in s.words] == asr.transcribe([audio])[0].words


def test_bench_bad_arguments(tiny_voice, capsys):
    assert main(["bench", "tts", "--acoustic", str(tiny_voice[0])]) == 2
    assert "a voice needs both" in capsys.readouterr().err
    voice = ["--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1])]
    assert main(["bench", "tts", *voice, "--backends", "nope", "--device", "cpu"]) == 2
    assert "unknown backend" in capsys.readouterr().err


def test_bench_load_against_a_server(speech_server, tmp_path):
    args = ["bench", "tts", "--url", f"dynamic={speech_server}", "--concurrency", "1,4"]
    args += ["--rates", "4", "--seconds", "1.5", "--out-dir", str(tmp_path)]
    assert main(args) == 0
    result = json.loads((tmp_path / "tts-load.json").read_text())
    rows = result["rows"]
    assert [(r["target"], r["mode"], r["level"]) for r in rows] == [
        ("dynamic", "concurrency", 1),
        ("dynamic", "concurrency", 4),
        ("dynamic", "rate", 4.0),
    ]
    for r in rows:
        assert r["errors"] == 0 and r["requests"] >= 1 and r["throughput_rps"] > 0
        assert r["latency_s"]["p99"] >= r["latency_s"]["p50"] > 0
        assert r["server_compute_ms_per_item"] > 0 and r["mean_batch_size"] >= 1
        assert "gpu_busy_pct" in r  # None without nvidia-smi
    assert (tmp_path / "tts-load.png").stat().st_size > 1000


def test_bench_load_clients_in_processes(speech_server, tmp_path):
    """A closed-loop level's clients split over processes that start together: every process's
    requests are counted, and the row says how many processes ran them."""
    args = ["bench", "tts", "--url", f"split={speech_server}", "--concurrency", "3"]
    args += ["--client-processes", "2", "--seconds", "1.5", "--out-dir", str(tmp_path)]
    assert main(args) == 0
    (row,) = json.loads((tmp_path / "tts-load.json").read_text())["rows"]
    assert row["client_processes"] == 2 and row["errors"] == 0 and row["requests"] >= 3
    assert 1.5 <= row["wall_s"] < 60 and row["throughput_rps"] > 0
    assert row["mean_batch_size"] >= 1


def test_gpu_busy_means_per_gpu() -> None:
    """nvidia-smi's 'index, utilization' lines averaged per GPU; samples it could not read
    ('[N/A]') are left out; no lines, no figure."""
    from speechrt.bench.load import gpu_busy_means

    text = "0, 50\n1, 10\n0, 70\n1, [N/A]\n\n"
    assert gpu_busy_means(text) == {0: 60.0, 1: 10.0}
    assert gpu_busy_means("") is None


def test_gpu_busy_samples_nvidia_smi_while_the_level_runs(tmp_path, monkeypatch) -> None:
    """GpuBusy runs nvidia-smi's sampling loop for the block and stops it after; a machine
    without it gets None. The stand-in ignores the stop signal, prints its samples and exits;
    the block ends only once it has printed them (its 'ready' file), so the test reads the same
    whatever the timing."""
    import time

    from speechrt.bench.load import GpuBusy

    fake, ready = tmp_path / "nvidia-smi", tmp_path / "ready"
    fake.write_text(
        '#!/bin/sh\ntrap \'\' TERM\necho "$@" > "$0.args"\n'
        f"printf '0, 20\\n0, 40\\n'\ntouch {ready}\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with GpuBusy(period_ms=50) as busy:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # waiting for the stand-in to have printed, not for ordering
    assert busy.means == {0: 30.0}
    args = (tmp_path / "nvidia-smi.args").read_text()
    assert "--query-gpu=index,utilization.gpu" in args and "--loop-ms=50" in args
    with GpuBusy(command="no-such-nvidia-smi") as busy:
        pass
    assert busy.means is None


def test_client_processes_per_level() -> None:
    import os

    from speechrt.bench.load import client_processes

    cores = os.cpu_count() or 1
    assert client_processes(1) == 1 and client_processes(8) == 1
    assert client_processes(64) == min(8, cores) and client_processes(9) == min(2, cores)
    assert client_processes(4, 16) == 4 and client_processes(4, 2) == 2


def test_to_host_passes_numpy_and_copies_cpu_tensors() -> None:
    import numpy as np
    import torch

    from speechrt.device import to_host

    a, b = np.arange(3), torch.arange(6, dtype=torch.float32).reshape(2, 3)
    ha, hb = to_host(a, b)
    assert ha is a and isinstance(hb, np.ndarray) and hb.tolist() == b.tolist()
