"""speechrt_train's command line on a synthetic corpus: train, warm-start, export, evaluate and
write model cards; average checkpoints; the speed script; and compile=True."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from speechrt_train.__main__ import main
from speechrt_train.asr_data import load_speech
from speechrt_train.corpus import TTS_VOICE, load_shard
from speechrt_train.hifigan_train import HiFiGANTrainer
from speechrt_train.quartznet_train import QuartzNetTrainer
from speechrt_train.tts_data import load_voice
from train_harness import HG, HG_ARGS, QN


@pytest.fixture(scope="module")
def voice(corpus):
    shard = load_shard(corpus / f"{TTS_VOICE}.pt")
    return load_voice(shard), load_voice(shard, heldout=True)


@pytest.fixture(scope="module")
def speech(corpus):
    shards = [load_shard(corpus / f"{v}.pt") for v in (TTS_VOICE, "slt")]
    return load_speech(shards, False), load_speech([load_shard(corpus / "rms.pt")], True)


def test_cli_trains_exports_and_evaluates(corpus, tmp_path, capsys):
    runs = tmp_path / "runs"
    common = ["--corpus", str(corpus), "--max-steps", "2", "--quiet", "--device", "cpu"]
    assert (
        main(["fastpitch", "--run", str(runs / "fastpitch"), "--preset", "fastpitch-tiny", *common])
        == 0
    )
    assert (
        main(
            [
                "hifigan",
                "--run",
                str(runs / "hifigan"),
                *HG_ARGS,
                *common,
            ]
        )
        == 0
    )
    compact = tmp_path / "qn.pt"
    assert (
        main(
            [
                "quartznet",
                "--run",
                str(runs / "quartznet"),
                "--preset",
                "quartznet-tiny",
                "--compact-out",
                str(compact),
                *common,
            ]
        )
        == 0
    )
    # a fresh run warm-starts from the compact file at its step
    assert (
        main(
            [
                "quartznet",
                "--run",
                str(tmp_path / "qn2"),
                "--preset",
                "quartznet-tiny",
                "--warm-start",
                str(compact),
                "--corpus",
                str(corpus),
                "--max-steps",
                "3",
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    capsys.readouterr()
    metrics = tmp_path / "metrics.json"
    out = tmp_path / "defaults"
    assert (
        main(
            [
                "export",
                "--runs",
                str(runs),
                "--out",
                str(out),
                "--evaluate",
                "--precise-bn",
                "--corpus",
                str(corpus),
                "--metrics",
                str(metrics),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    result = json.loads(metrics.read_text())
    assert result["export"]["quartznet"]["steps"] == 2
    assert result["export"]["total_mb"] < 1
    assert {"asr_heldout_voice", "tts_intelligibility", "hello_world"} <= set(result["eval"])
    asr_meta = json.loads((out / "asr" / "model.json").read_text())["meta"]
    assert asr_meta["precise_bn"] and asr_meta["features"]["dither"] == 1e-5
    # trained with telephones (the default augmentation): 8 kHz sources go through their band
    assert asr_meta["features"]["narrowband"] == "telephone"
    for name in ("voice-acoustic", "voice-vocoder", "asr"):
        assert (out / name / "model.json").exists() and (out / name / "model.safetensors").exists()
    log = (tmp_path / "qn2" / "log.jsonl").read_text().splitlines()
    assert json.loads(log[-1])["step"] == 3
    # a fresh run warm-starts from the exported recogniser (unfolded) at its step, 2
    qn3 = ["quartznet", "--preset", "quartznet-tiny", "--corpus", str(corpus), "--quiet"]
    qn3 += ["--device", "cpu", "--max-steps", "4", "--run", str(tmp_path / "qn3")]
    assert main([*qn3, "--warm-start", str(out / "asr")]) == 0
    log = [json.loads(line) for line in (tmp_path / "qn3" / "log.jsonl").read_text().splitlines()]
    assert log[0]["step"] == 3 and log[-1]["step"] == 4
    with pytest.raises(SystemExit, match="voice-acoustic: a fastpitch .*not the 'quartznet-tiny'"):
        main([*qn3[:-1], str(tmp_path / "qn4"), "--warm-start", str(out / "voice-acoustic")])
    fp = ["fastpitch", "--preset", "fastpitch-tiny", "--corpus", str(corpus), "--quiet"]
    with pytest.raises(SystemExit, match="compact files only"):
        main([*fp, "--run", str(tmp_path / "fp2"), "--warm-start", str(out / "voice-acoustic")])
    assert main(["cards", "--metrics", str(metrics), "--out", str(tmp_path / "cards")]) == 0
    card = (tmp_path / "cards" / "quartznet.md").read_text()
    assert "WER, held-out voice rms" in card and "quartznet-tiny" in card
    shipped = ["--models", "fastpitch", "hifigan", "--hardware", "1x H200"]
    assert main(["cards", "--metrics", str(metrics), "--out", str(tmp_path / "c2"), *shipped]) == 0
    assert sorted(p.name for p in (tmp_path / "c2").iterdir()) == ["fastpitch.md", "hifigan.md"]
    card = (tmp_path / "c2" / "hifigan.md").read_text()
    assert "(1x H200)" in card and "teacher's (slt-hts) audio" in card
    scored = {"sentences": 2, "greedy": 0.5, "beam": 0.25}  # speechrt_train.asr_eval's form
    decoding = tmp_path / "asr-eval.json"
    decoding.write_text(
        json.dumps(
            {
                "decoding": {"beam_size": 4},
                "our_voice": scored
                | {"8khz": scored | {"beam": 0.3}, "8khz_resampled_only": scored},
                "heldout_voice_rms": scored,
                "hello_world": "hello world",
            }
        )
    )
    args = ["--models", "quartznet", "--decoding", str(decoding), "--out", str(tmp_path / "c3")]
    assert main(["cards", "--metrics", str(metrics), *args]) == 0
    card = (tmp_path / "c3" / "quartznet.md").read_text()
    assert "| WER, our voice, 2 held-out sentences | **0.250** with the LM (greedy 0.500) |" in card
    assert "| WER, our voice, the same at 8 kHz | **0.300** as heard (telephone band; " in card
    assert "speed, one utterance" not in card  # files from before asr_eval timed the model
    assert "Plan wide" not in card  # the wide plan's extra text is named only when it was read
    timed = scored | {"acoustic_ms_per_audio_second": 31.5, "beam_ms_per_audio_second": 4.0}
    decoding.write_text(json.dumps(json.loads(decoding.read_text()) | {"our_voice": timed}))
    assert main(["cards", "--metrics", str(metrics), *args]) == 0
    card = (tmp_path / "c3" / "quartznet.md").read_text()
    assert "features + acoustic model 31.5 ms, beam search 4.0 ms per second of audio" in card
    result["corpus"] = {"sentences": {"fortunes": 17955, "extra text": 45514}}
    metrics.write_text(json.dumps(result))
    assert main(["cards", "--metrics", str(metrics), *args]) == 0
    card = (tmp_path / "c3" / "quartznet.md").read_text()
    assert "Plan wide adds 45,514 sentences" in card and "fortunes' 17,955." in card


def _compile_with(monkeypatch, backend: str) -> None:
    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: original(m, backend=backend, **kw))


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("SPEECHRT_COMPILE_TESTS") != "1",
    reason="torch.compile tracing takes 1-2 min per model here: SPEECHRT_COMPILE_TESTS=1",
)
@pytest.mark.parametrize("model", ["quartznet", "hifigan"])
def test_compile_option_traces_and_matches_eager(model, speech, voice, monkeypatch):
    """`compile=True` through dynamo + AOT autograd (backend aot_eager: the graphs the GPU's
    inductor compiles, without its minutes of C++ code generation on this CPU)."""
    _compile_with(monkeypatch, "aot_eager")
    torch._dynamo.reset()
    if model == "quartznet":
        config = dataclasses.replace(QN, dropout=0.0)  # dropout: compiled RNG differs

        def make(flag: bool):
            torch.manual_seed(0)
            return QuartzNetTrainer(speech[0], None, dataclasses.replace(config, compile=flag))
    else:

        def make(flag: bool):
            torch.manual_seed(0)
            return HiFiGANTrainer(voice[0], None, dataclasses.replace(HG, compile=flag))

    eager, compiled = make(False), make(True)
    for _ in range(3):
        a, b = eager.step(), compiled.step()
        for k in a:
            assert abs(float(a[k]) - float(b[k])) <= 1e-4 * abs(float(a[k])), (k, a[k], b[k])


def test_train_speed_script_reports_each_variant(corpus, tmp_path):
    from speechrt_train import train_speed as script

    out = tmp_path / "speed.json"
    common = ["--corpus", str(corpus), "--out", str(out), "--tiny", "--device", "cpu"]
    models = "quartznet,hifigan,fastconformer"
    args = [*common, "--models", models, "--steps", "2", "--warmup", "1"]
    assert script.main([*args, "--profile", "--variant", "hifigan:batch_size=2"]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["model"], r["batch_size"]) for r in rows] == [
        ("quartznet", 4),
        ("quartznet", 8),
        ("hifigan", 2),
        ("fastconformer", 4),
    ]
    for r in rows:
        assert r["steps"] == 2 and r["steps_per_s"] > 0 and r["items_per_s"] > 0
        assert r["audio_s_per_s"] > 0 and r["ops"]["regions"]["forward"]["aten"] > 0
    assert script.main([*args, "--seconds", "0"]) == 0  # budget spent: every variant skipped
    assert all(r["stopped"] == "skipped" for r in json.loads(out.read_text())["results"])
    assert script.main(["--corpus", str(tmp_path / "none"), "--out", str(out)]) == 2


def test_average_of_compact_files(tmp_path, capsys):
    from speechrt_train.export import load_run

    def compact(step, value):
        weights = {
            "w": torch.full((3,), value).half(),
            "bn.num_batches_tracked": torch.tensor(step),
        }
        state = {"model": weights, "step": step, "config": {"lr": value}, "elapsed": float(step)}
        torch.save(state, tmp_path / f"{step}.pt")
        return str(tmp_path / f"{step}.pt")

    a, b, out = compact(10, 1.0), compact(20, 3.0), str(tmp_path / "avg.pt")
    assert main(["average", a, b, "--weights", "0.25", "0.75", "--out", out]) == 0
    trainer, info = load_run(out)
    assert trainer["model"]["w"].dtype == torch.float16
    assert trainer["model"]["w"].tolist() == [2.5] * 3  # 0.25 x 1 + 0.75 x 3, exact in fp16
    assert int(trainer["model"]["bn.num_batches_tracked"]) == 20 and info["steps"] == 20
    assert info["averaged"] == [{"step": 10, "weight": 0.25}, {"step": 20, "weight": 0.75}]
    from speechrt_train.cards import _steps  # what the model card says of it

    assert _steps(info) == "the mean of steps 10 (weight 0.25) and 20 (weight 0.75)"
    assert _steps({"steps": 20}) == "20"
    capsys.readouterr()
    assert main(["average", a, b, "--weights", "0.5", "0.6", "--out", out]) == 2
    assert "sum to 1" in capsys.readouterr().err
    torch.save({"model": {"v": torch.zeros(3)}, "step": 30}, tmp_path / "other.pt")
    assert main(["average", a, str(tmp_path / "other.pt"), "--out", out]) == 2
    assert "differ" in capsys.readouterr().err
    torch.save({"model": {"w": torch.zeros(4).half()}, "step": 30}, tmp_path / "wider.pt")
    assert main(["average", a, str(tmp_path / "wider.pt"), "--out", out]) == 2
    assert "differ" in capsys.readouterr().err
    pieces = []  # a FastConformer's: its SentencePiece model rides along, and must be the same
    for step, proto in ((40, b"pieces-a"), (50, b"pieces-b")):
        state = torch.load(a, weights_only=True) | {"step": step}
        state["tokenizer"] = {"proto": torch.frombuffer(bytearray(proto), dtype=torch.uint8)}
        torch.save(state, tmp_path / f"{step}.pt")
        pieces.append(str(tmp_path / f"{step}.pt"))
    assert main(["average", pieces[0], pieces[0], "--out", str(tmp_path / "m" / "avg.pt")]) == 0
    assert bytes(torch.load(tmp_path / "m" / "avg.pt")["tokenizer"]["proto"]) == b"pieces-a"
    capsys.readouterr()
    assert main(["average", *pieces, "--out", out]) == 2
    assert "tokenizers differ" in capsys.readouterr().err


def test_average_of_exported_directories(tiny_asr, tmp_path, capsys):
    """`average DIR DIR` takes the weighted mean of exported (folded) weights, keeps model.json
    apart from its source, which lists what it averaged, and writes the main graph."""
    import shutil

    from safetensors.torch import load_file, save_file

    from speechrt.repo import read_info
    from speechrt_train.cards import _steps

    def exported(name, scale, source):
        d = tmp_path / name
        shutil.copytree(tiny_asr, d)
        weights = {k: v * scale for k, v in load_file(str(d / "model.safetensors")).items()}
        save_file(weights, str(d / "model.safetensors"))
        info = json.loads((d / "model.json").read_text())
        (d / "model.json").write_text(json.dumps(info | {"source": source}))
        return d

    meaned = {"steps": 20, "averaged": [{"step": 10, "weight": 0.5}, {"step": 20, "weight": 0.5}]}
    a, b = exported("a", 1.0, meaned), exported("b", -3.0, {"steps": 30, "train_seconds": 9.0})
    out = tmp_path / "mean"
    assert main(["average", str(a), str(b), "--weights", "0.75", "0.25", "--out", str(out)]) == 0
    got, first = load_file(str(out / "model.safetensors")), load_file(str(a / "model.safetensors"))
    for name, tensor in first.items():  # 0.75 x w + 0.25 x (-3 w) = 0
        torch.testing.assert_close(got[name], torch.zeros_like(tensor), atol=1e-6, rtol=0)
    assert (out / "model.onnx").is_file()
    info = read_info(out)
    assert info.meta == read_info(a).meta and info.dims == read_info(a).dims
    assert info.source["steps"] == 30 and info.source["train_seconds"] == 9.0
    assert info.source["averaged"] == [
        {"step": 20, "weight": 0.75, "averaged": meaned["averaged"]},
        {"step": 30, "weight": 0.25},
    ]
    assert _steps(info.source) == (
        "the mean of [the mean of steps 10 (weight 0.5) and 20 (weight 0.5)] (weight 0.75)"
        " and step 30 (weight 0.25)"
    )
    capsys.readouterr()
    other = exported("c", 1.0, {"steps": 5})
    info = json.loads((other / "model.json").read_text())
    info["meta"]["pad_leading"] = 99
    (other / "model.json").write_text(json.dumps(info))
    assert main(["average", str(a), str(other), "--out", str(tmp_path / "bad")]) == 2
    assert "differs" in capsys.readouterr().err


def test_save_atomic_makes_the_folder(tmp_path):
    """Every CLI that writes a shard or a compact file (people, pack, average) goes through it."""
    from speechrt_train.loop import save_atomic

    out = tmp_path / "new" / "folder" / "people.pt"
    save_atomic({"voice": "people", "audio": torch.arange(3)}, out)
    got = torch.load(out, weights_only=True)
    assert got["voice"] == "people" and torch.equal(got["audio"], torch.arange(3))
    assert [p.name for p in out.parent.iterdir()] == ["people.pt"]  # no temporary file left
