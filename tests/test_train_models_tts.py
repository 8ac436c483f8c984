"""speechrt_train's FastPitch and HiFi-GAN trainers on a synthetic corpus (no synthesizer
needed): they learn, resume bit-for-bit, export into components speechrt loads, and HiFi-GAN
trains on a FastPitch's predicted mels."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from speechrt.models.fastpitch import regulate_length
from speechrt.options import SynthesisOptions
from speechrt.repo import load_component, save_component
from speechrt_train.__main__ import _trainer, build_parser, main
from speechrt_train.corpus import TTS_MEL, TTS_VOICE, load_shard
from speechrt_train.distributed import Ranks
from speechrt_train.export import fastpitch_component
from speechrt_train.fastpitch_train import (
    FastPitchTrainer,
    expand,
    load_mel_teacher,
    predicted_mels,
)
from speechrt_train.hifigan_train import HiFiGANTrainer, plain_generator
from speechrt_train.loop import CHECKPOINT
from speechrt_train.tts_data import VoiceData, load_voice
from train_harness import FP, HG, HG_ARGS, _resume_matches, _same_weights


@pytest.fixture(scope="module")
def voice(corpus):
    shard = load_shard(corpus / f"{TTS_VOICE}.pt")
    return load_voice(shard), load_voice(shard, heldout=True)


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
