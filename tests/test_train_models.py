"""speechrt_train's trainers on a synthetic corpus (no synthesizer needed): they learn, resume
bit-for-bit, and export into components speechrt loads."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from speechrt.audio.features import FeatureConfig
from speechrt.models.fastpitch import regulate_length
from speechrt.models.jasper import QuartzNet, QuartzNetDims, mask_frames
from speechrt.options import SynthesisOptions
from speechrt.repo import load_component, save_component
from speechrt_train.__main__ import _trainer, build_parser, main
from speechrt_train.asr_data import Augment, SpeechData, load_speech, speech_batch
from speechrt_train.corpus import HELDOUT_VOICE, TTS_MEL, TTS_VOICE, load_shard
from speechrt_train.distributed import Ranks
from speechrt_train.export import fastpitch_component
from speechrt_train.fastpitch_train import (
    FastPitchConfig,
    FastPitchTrainer,
    expand,
    load_mel_teacher,
    predicted_mels,
)
from speechrt_train.hifigan_train import HiFiGANConfig, HiFiGANTrainer, plain_generator
from speechrt_train.loop import CHECKPOINT, run
from speechrt_train.quartznet_train import PRESETS as QUARTZNET_PRESETS
from speechrt_train.quartznet_train import (
    QuartzNetConfig,
    QuartzNetTrainer,
    TrainableJasper,
    precise_bn,
    unfold,
)
from speechrt_train.tts_data import VoiceData, load_voice

FP = FastPitchConfig(preset="fastpitch-tiny", batch_size=4, lr=3e-3, warmup=5, amp=False)
HG = HiFiGANConfig(preset="hifigan-tiny", disc_width=0.05, batch_size=2, segment_frames=8)
HG_ARGS = ["--preset", "hifigan-tiny", "--set", "disc_width=0.05", "--set", "segment_frames=8"]
QN = QuartzNetConfig(
    preset="quartznet-tiny", batch_size=4, lr=3e-3, warmup=5, amp=False, augment="synthetic"
)


@pytest.fixture(scope="module")
def voice(corpus):
    shard = load_shard(corpus / f"{TTS_VOICE}.pt")
    return load_voice(shard), load_voice(shard, heldout=True)


@pytest.fixture(scope="module")
def speech(corpus):
    shards = [load_shard(corpus / f"{v}.pt") for v in (TTS_VOICE, "slt")]
    return load_speech(shards, False), load_speech([load_shard(corpus / "rms.pt")], True)


def test_a_repeated_voice_is_listed_again_not_copied(corpus):
    shards = [load_shard(corpus / f"{v}.pt") for v in (TTS_VOICE, "slt")]
    once = load_speech(shards, False)
    twice = load_speech(shards, False, repeat={"slt": 2})
    assert twice.voices.count("slt") == 2 * once.voices.count("slt") > 0
    assert twice.voices.count(TTS_VOICE) == once.voices.count(TTS_VOICE)
    first = twice.voices.index("slt")
    assert twice.audio[first] is twice.audio[first + 1]  # the same tensor, listed twice
    assert twice.texts[first] == twice.texts[first + 1]
    with pytest.raises(ValueError, match="lack: joe"):
        load_speech(shards, False, repeat={"joe": 3})


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _resume_matches(make, tmp_path, steps: int) -> tuple:
    """Train `steps` in one go and in two chunks (new trainer, resumed from last.pt)."""
    whole = make()
    run(whole, tmp_path / "whole", minutes=10, max_steps=steps, progress=False)
    run(make(), tmp_path / "split", minutes=10, max_steps=steps // 2, progress=False)
    torch.manual_seed(1234)  # the global RNG must come back from the checkpoint too
    resumed = make()
    summary = run(resumed, tmp_path / "split", minutes=10, max_steps=steps, progress=False)
    assert summary["steps"] == steps and (tmp_path / "split" / CHECKPOINT).exists()
    return whole, resumed


def test_voice_targets(voice):
    train, val = voice
    assert len(train) == 9 and len(val) == 3
    for mel, dur, ids, pitch in zip(
        train.mels, train.durations, train.ids, train.pitch, strict=True
    ):
        assert mel.shape == (80, int(dur.sum())) and dur.shape == ids.shape == pitch.shape
    assert 100 < train.pitch_mean < 300 and train.pitch_std > 1


def test_expand_equals_the_runtime_length_regulator():
    durations = torch.tensor([[2, 0, 3, 1], [1, 4, 0, 0]])
    enc = torch.randn(2, 4, 5)
    frames, lengths = regulate_length(durations, enc)
    assert lengths.tolist() == [6, 5]
    assert torch.equal(expand(durations, enc, 6), frames)


def test_fastpitch_learns_and_resumes_exactly(voice, tmp_path):
    train, val = voice
    trainer = FastPitchTrainer(train, val, dataclasses.replace(FP, lr=1e-2))
    steps = [trainer.step() for _ in range(60)]
    last = {k: sum(s[k] for s in steps[-5:]) / 5 for k in steps[0]}
    assert last["mel"] < 0.6 * steps[0]["mel"] and last["dur"] < 0.1 * steps[0]["dur"]
    assert last["pitch"] < steps[0]["pitch"] and last["energy"] < steps[0]["energy"]
    assert trainer.evaluate()["val_dur"] < steps[0]["dur"]
    whole, resumed = _resume_matches(lambda: FastPitchTrainer(train, val, FP), tmp_path, 6)
    assert _same_weights(whole.model, resumed.model)
    assert resumed.batches.state_dict() == whole.batches.state_dict()


def test_fastpitch_exports_a_component_speechrt_loads(voice, tmp_path):
    train, _ = voice
    trainer = FastPitchTrainer(train, None, FP)
    trainer.step()
    model, info = fastpitch_component(trainer.state_dict())
    assert info.meta["text"]["p_arpabet"] == 1.0
    loaded, _ = load_component(save_component(tmp_path / "fp", info, model.state_dict()))
    ids = train.ids[0][None]
    lengths = torch.tensor([ids.shape[1]])
    a, _ = trainer.model.eval().generate_mel(ids, lengths, SynthesisOptions())
    b, _ = loaded.generate_mel(ids, lengths, SynthesisOptions())
    assert torch.allclose(a, b, atol=1e-5)
    assert float(loaded.pitch_mean[0]) == pytest.approx(train.pitch_mean)


def test_hifigan_folds_and_resumes_exactly(voice, tmp_path):
    train, val = voice
    trainer = HiFiGANTrainer(train, val, HG)
    losses = [trainer.step()["mel_l1"] for _ in range(8)]
    assert min(losses[-3:]) < losses[0]
    plain = plain_generator(trainer.gen).eval()
    mel = val.mels[0][None]
    with torch.no_grad():
        assert torch.allclose(plain(mel), trainer.gen.eval()(mel), atol=1e-5)
    assert "val_mel_l1" in trainer.evaluate(limit=1)
    whole, resumed = _resume_matches(lambda: HiFiGANTrainer(train, val, HG), tmp_path, 4)
    assert _same_weights(whole.gen, resumed.gen) and _same_weights(whole.disc, resumed.disc)


def _fastpitch_dir(voice, path, **info_changes) -> str:
    """A tiny FastPitch (3 steps on the voice) saved as `python -m speechrt_train export` saves
    voice-acoustic; `info_changes` alter its model.json."""
    trainer = FastPitchTrainer(voice[0], None, FP)
    for _ in range(3):
        trainer.step()
    model, info = fastpitch_component(trainer.state_dict())
    return str(save_component(path, dataclasses.replace(info, **info_changes), model.state_dict()))


def _copy(data: VoiceData) -> VoiceData:
    """The same items in new lists (replace_mels / packed() would change the fixture's)."""
    return dataclasses.replace(data, audio=list(data.audio), mels=list(data.mels), _packed=None)


def test_fastpitch_predicted_mels_replace_the_ground_truth(voice, tmp_path):
    teacher = load_mel_teacher(_fastpitch_dir(voice, tmp_path / "fp"), voice[0].mel_config)
    assert float(teacher.pitch_mean[0]) == pytest.approx(voice[0].pitch_mean)
    data = _copy(voice[0])
    mels = predicted_mels(teacher, data, batch_size=4)
    for mel, truth in zip(mels, data.mels, strict=True):
        assert mel.shape == truth.shape and mel.dtype == torch.float32
        assert torch.isfinite(mel).all() and (mel - truth).abs().mean() > 0.01
    # batched (sorted by length, padded) == one by one: no frame sees its batch-mates
    for i, mel in enumerate(predicted_mels(teacher, data, batch_size=1)):
        assert torch.allclose(mel, mels[i], atol=1e-5), i
    data.packed()  # cached from the ground truth ...
    data.replace_mels(mels)  # ... and rebuilt from the predictions
    assert torch.equal(data.packed()[1], torch.cat(mels, dim=1))
    with pytest.raises(ValueError, match="mel"):
        data.replace_mels([m[:, 1:] for m in mels])


def test_hifigan_trains_on_fastpitch_mels_through_the_cli(corpus, voice, tmp_path):
    fp = _fastpitch_dir(voice, tmp_path / "voice-acoustic")
    args = [
        "hifigan",
        "--corpus",
        str(corpus),
        "--run",
        str(tmp_path / "hifigan"),
        *HG_ARGS,
        "--max-steps",
        "2",
        "--quiet",
        "--device",
        "cpu",
        "--mels-from",
        fp,
    ]
    trainer = _trainer(build_parser().parse_args(args), "cpu", Ranks())
    teacher, _ = load_component(fp)
    for data, truth in zip((trainer.train, trainer.val), voice, strict=True):
        assert torch.equal(data.audio[0], truth.audio[0])  # real audio stays the target
        for mel, expected in zip(data.mels, predicted_mels(teacher, truth), strict=True):
            assert torch.allclose(mel, expected, atol=1e-5)
    assert trainer.config.mels_from == fp
    assert main(args) == 0
    state = torch.load(tmp_path / "hifigan" / CHECKPOINT, weights_only=True)
    assert state["trainer"]["step"] == 2 and state["trainer"]["config"]["mels_from"] == fp


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mel": dataclasses.replace(TTS_MEL, fmax=7600.0)}, "mel configs .* differ: fmax"),
        ({"meta": {"text": {"symbol_set": "english_basic"}}}, "text front end"),
    ],
)
def test_mels_from_a_mismatched_component_is_a_one_line_error(
    corpus, voice, tmp_path, change, message
):
    fp = _fastpitch_dir(voice, tmp_path / "fp", **change)
    args = ["hifigan", "--corpus", str(corpus), "--run", str(tmp_path / "r"), "--device", "cpu"]
    with pytest.raises(SystemExit) as e:
        main([*args, "--preset", "hifigan-tiny", "--max-steps", "1", "--mels-from", fp])
    text = str(e.value.code)
    assert text.startswith("--mels-from: ") and "\n" not in text and re.search(message, text)
    assert not (tmp_path / "r").exists()  # failed before any training


def test_mels_from_needs_a_fastpitch_with_its_pitch_statistics(voice, tmp_path):
    vocoder = Path(__file__).parents[1] / "src" / "speechrt" / "defaults" / "voice-vocoder"
    with pytest.raises(ValueError, match="a hifigan component, not fastpitch"):
        load_mel_teacher(vocoder, voice[0].mel_config)
    fp = _fastpitch_dir(voice, tmp_path / "fp")
    model, info = load_component(fp)
    model.pitch_std.zero_()
    save_component(fp, info, model.state_dict())
    with pytest.raises(ValueError, match="no pitch statistics"):
        load_mel_teacher(fp, voice[0].mel_config)


def test_quartznet_learns_folds_and_resumes_exactly(speech, tmp_path):
    train, val = speech
    assert set(train.voices) == {TTS_VOICE, "slt"} and HELDOUT_VOICE not in train.voices
    trainer = QuartzNetTrainer(train, val, QN)
    first = [trainer.step()["ctc"] for _ in range(3)]
    for _ in range(20):
        last = trainer.step()["ctc"]
    assert last < 0.8 * sum(first) / 3
    folded = QuartzNet(trainer.model.net.dims)
    folded.load_state_dict(trainer.model.folded_state_dict())  # strict: inference layout
    feats, lengths, _, _ = speech_batch(val, [0, 1], trainer.features)
    with torch.no_grad():
        a, la = trainer.model.eval()(feats, lengths)
        b, lb = folded.eval()(feats, lengths)
    assert torch.equal(la, lb) and (a - b).abs().max() < 1e-4
    evaluation = trainer.evaluate()
    assert evaluation["val_n"] == 3 and evaluation["val_wer"] >= 0
    # dropout draws from the global RNG; recordings' augmentation from both generators
    config = dataclasses.replace(QN, dropout=0.2, augment="recordings")
    whole, resumed = _resume_matches(lambda: QuartzNetTrainer(train, val, config), tmp_path, 4)
    assert _same_weights(whole.model, resumed.model)


def test_unfold_gives_back_a_trainable_model_that_computes_the_folded_one(speech):
    """An exported (folded) recogniser unfolded for training: eval mode computes what the
    folded model computes; training mode (no dropout) on the calibration items nearly so; and
    folding it again gives the same weights."""
    train, val = speech
    trainer = QuartzNetTrainer(train, val, QN)
    for _ in range(5):
        trainer.step()
    trainer.model.eval()
    folded = QuartzNet(trainer.model.net.dims).eval()
    folded.load_state_dict(trainer.model.folded_state_dict())
    calib = [speech_batch(train, [i], trainer.features)[0][0] for i in range(6)]
    model = unfold(folded.state_dict(), folded.dims, calib)
    feats, lengths, _, _ = speech_batch(val, [0, 1, 2], trainer.features)
    with torch.no_grad():
        want, _ = folded(feats, lengths)
        got, _ = model.eval()(feats, lengths)
    assert (got - want).abs().max() < 1e-4
    again = model.folded_state_dict()
    for k, v in folded.state_dict().items():
        assert torch.allclose(again[k], v, atol=1e-6, rtol=1e-5), k
    model.dropout = 0.0
    items = torch.cat(calib, dim=1)[None]  # the six items as one: the statistics recorded
    with torch.no_grad():
        want, _ = folded(items, torch.tensor([items.shape[2]]))
        got, _ = model.train()(items, torch.tensor([items.shape[2]]))
    assert (got - want).abs().max() < 0.05 * want.abs().max()


def test_batchnorm_ignores_padding_and_precise_bn_matches_batch_statistics(speech):
    train, _ = speech
    model = TrainableJasper(QuartzNetDims(**QUARTZNET_PRESETS["quartznet-tiny"]), dropout=0.0)
    features = FeatureConfig(dither=0.0)
    norm = model.sub_bn[0][0]
    x = torch.randn(1, norm.num_features, 40)
    x_padded = torch.cat([x, torch.full((1, x.shape[1], 7), 50.0)], dim=2)  # junk past the end
    lengths = torch.tensor([x.shape[2]])
    assert torch.allclose(norm(x, lengths), norm(x_padded, lengths)[:, :, : x.shape[2]], atol=1e-5)
    feats, lengths, _, _ = speech_batch(train, list(range(4)), features)

    def eval_vs_train() -> float:
        with torch.no_grad():
            a, _ = model.eval()(feats, lengths)
            b, _ = model.train()(feats, lengths)
        return float((a - b).abs().max())

    before = eval_vs_train()  # fresh running statistics (0, 1): far from the batch's (~2.6)
    first4 = SpeechData(*(getattr(train, f)[:4] for f in ("audio", "texts", "targets", "voices")))
    precise_bn(model, first4, features, batches=1, batch_size=4)
    # running statistics = this batch's (up to the unbiased variance's n / (n - 1)): ~0.04
    after = eval_vs_train()
    assert after < min(0.05, before / 20), (before, after)


def _reference_forward(model: TrainableJasper, feats, lengths):
    """TrainableJasper's training forward written plainly: the inference sub-blocks (each
    masks its own input) and a masked BatchNorm that builds its own mask -> log-probs and
    each norm's (batch mean, unbiased variance)."""
    stats = {}

    def bn(norm, x, lengths):
        t = torch.arange(x.shape[2])
        mask = (t[None, :] < lengths[:, None]).float()[:, None, :]
        n = mask.sum().clamp(min=2)
        mean = (x * mask).sum(dim=(0, 2)) / n
        var = ((x - mean[None, :, None]).square() * mask).sum(dim=(0, 2)) / n
        stats[norm] = (mean, var * n / (n - 1))
        scale = norm.weight / torch.sqrt(var + norm.eps)
        return (x - mean[None, :, None]) * scale[None, :, None] + norm.bias[None, :, None]

    xs = [feats]
    for b, (block, keep) in enumerate(zip(model.net.blocks, model.net._keeps, strict=True)):
        x, out_lengths = xs[-1], lengths
        for j, sub in enumerate(block.subs):
            x, out_lengths = sub(x, out_lengths)
            x = bn(model.sub_bn[b][j], x, out_lengths)
            x = F.relu(x) if j < len(block.subs) - 1 else x
        for conv, norm, src in zip(block.res, model.res_bn[b], xs, strict=False):
            x = x + bn(norm, conv(mask_frames(src, lengths)), out_lengths)
        xs, lengths = ([*xs, F.relu(x)] if keep else [F.relu(x)]), out_lengths
    logits = model.net.decoder(xs[-1]).transpose(1, 2)
    return F.log_softmax(logits, dim=-1), lengths, stats


def test_trainable_forward_with_shared_masks_matches_the_plain_composition(speech):
    """The fast forward (frame masks made once, running statistics by foreach ops) against
    `_reference_forward`: outputs, gradients and running statistics, to float rounding."""
    torch.manual_seed(3)
    model = TrainableJasper(QuartzNetDims(**QUARTZNET_PRESETS["quartznet-tiny"]), dropout=0.0)
    reference = TrainableJasper(model.net.dims, dropout=0.0)
    reference.load_state_dict(model.state_dict())
    feats, lengths, _, _ = speech_batch(speech[0], [0, 3, 5, 7], FeatureConfig(dither=0.0))
    a, la = model.train()(feats, lengths)
    b, lb, stats = _reference_forward(reference, feats, lengths)
    assert torch.equal(la, lb) and (a - b).abs().max() < 1e-5
    (a.exp()[..., :4].sum() + a.mean()).backward()
    (b.exp()[..., :4].sum() + b.mean()).backward()
    grads = dict(model.named_parameters())
    largest = max(float(p.grad.abs().max()) for p in grads.values())
    for name, p in reference.named_parameters():
        assert (grads[name].grad - p.grad).abs().max() <= 1e-5 * largest, name
    norms = dict(model.named_modules())
    for name, norm in reference.named_modules():
        if norm in stats:
            mean, var = stats[norm]
            fast = norms[name]
            assert int(fast.num_batches_tracked) == 1
            assert torch.allclose(fast.running_mean, 0.1 * mean, atol=1e-6)
            assert torch.allclose(fast.running_var, 0.9 + 0.1 * var, atol=1e-6)


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
    assert "Plan wide" not in card  # the wide plan's extra text is named only when it was read
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
    args = [*common, "--models", "quartznet,hifigan", "--steps", "2", "--warmup", "1"]
    assert script.main([*args, "--profile", "--variant", "hifigan:batch_size=2"]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["model"], r["batch_size"]) for r in rows] == [
        ("quartznet", 4),
        ("quartznet", 8),
        ("hifigan", 2),
    ]
    for r in rows:
        assert r["steps"] == 2 and r["steps_per_s"] > 0 and r["items_per_s"] > 0
        assert r["audio_s_per_s"] > 0 and r["ops"]["regions"]["forward"]["aten"] > 0
    assert script.main([*args, "--seconds", "0"]) == 0  # budget spent: every variant skipped
    assert all(r["stopped"] == "skipped" for r in json.loads(out.read_text())["results"])
    assert script.main(["--corpus", str(tmp_path / "none"), "--out", str(out)]) == 2


def test_quartznet_augment_presets_by_name(speech):
    train, val = speech
    trainer = QuartzNetTrainer(train, val, dataclasses.replace(QN, augment="recordings"))
    assert trainer.augment is not None and trainer.augment.channel
    assert QuartzNetTrainer(train, val, QN).augment == Augment()
    with pytest.raises(ValueError, match="augment 'studio'"):
        QuartzNetTrainer(train, val, dataclasses.replace(QN, augment="studio"))


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
