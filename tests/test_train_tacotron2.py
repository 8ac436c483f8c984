"""speechrt_train's Tacotron 2 trainer on the synthetic corpus: it learns the mels, the gate and
to attend, resumes bit-for-bit, and runs through the CLI (but is no exported default)."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from speechrt.errors import MaxDecoderStepsWarning
from speechrt.options import SynthesisOptions
from speechrt_train.__main__ import main
from speechrt_train.corpus import TTS_VOICE, load_shard
from speechrt_train.loop import CHECKPOINT
from speechrt_train.tacotron2_train import (
    Tacotron2Config,
    Tacotron2Trainer,
    decode,
    guide_weights,
    pad_batch,
)
from speechrt_train.tts_data import TextTrainer, load_voice
from train_harness import _resume_matches, _same_weights

TC = Tacotron2Config(preset="tiny", batch_size=4, lr=3e-3, warmup=5, amp=False)


@pytest.fixture(scope="module")
def voice(corpus):
    shard = load_shard(corpus / f"{TTS_VOICE}.pt")
    return load_voice(shard), load_voice(shard, heldout=True)


def test_guide_weights_are_zero_on_the_diagonal_and_outside_the_items():
    lengths, mel_lengths = torch.tensor([4, 2]), torch.tensor([8, 4])
    w = guide_weights(lengths, mel_lengths, 4, 8, 0.2)  # (B, T, L)
    assert w.shape == (2, 8, 4)
    assert w[0, 0, 0] == 0 and w[0, 4, 2] == 0 and w[1, 2, 1] == 0  # t / T == l / L
    assert w[0, 7, 0] > 0.9 and w[0, 0, 3] > 0.9  # the far corners
    assert w[1, 4:].abs().max() == 0 and w[1, :, 2:].abs().max() == 0  # past item 1's lengths


def test_tacotron2_learns_and_resumes_exactly(voice, tmp_path):
    """60 steps on the tiny preset: held-out gate and guide losses fall, the mel's too (slowly:
    a Tacotron 2 predicts little before it attends), and attention gathers."""
    train, val = voice
    trainer = Tacotron2Trainer(train, val, dataclasses.replace(TC, lr=1e-2))
    before = trainer.evaluate()
    for _ in range(60):
        trainer.step()
    after = trainer.evaluate()
    assert after["val_mel_post"] < 0.98 * before["val_mel_post"]
    assert after["val_gate"] < 0.5 * before["val_gate"]
    assert after["val_guide"] < 0.85 * before["val_guide"]
    assert after["val_focus"] > 2 * before["val_focus"]
    # free-running inference on the trained weights: the runtime's generate_mel
    ids = train.ids[0][None]
    with warnings.catch_warnings():  # a tiny model may run to max_decoder_steps
        warnings.simplefilter("ignore", MaxDecoderStepsWarning)
        mel, n = trainer.model.eval().generate_mel(
            ids, torch.tensor([ids.shape[1]]), SynthesisOptions()
        )
    assert mel.shape[:2] == (1, 80) and 0 <= int(n) <= trainer.model.dims.max_decoder_steps
    whole, resumed = _resume_matches(lambda: Tacotron2Trainer(train, val, TC), tmp_path, 4)
    assert _same_weights(whole.model, resumed.model)


def test_tacotron2_trains_through_the_cli_and_is_not_exported(corpus, tmp_path):
    """The CLI trains it and writes its compact file, which scripts/tacotron2_stop_steps.py
    reads: reference, fused float32 and bf16 decoder steps over the corpus's sentences."""
    run, compact = tmp_path / "tacotron2", tmp_path / "tacotron2.pt"
    args = ["tacotron2", "--corpus", str(corpus), "--run", str(run), "--preset", "tiny"]
    args += ["--set", "amp=false", "--max-steps", "2", "--quiet", "--device", "cpu"]
    assert main([*args, "--compact-out", str(compact)]) == 0
    state = torch.load(run / CHECKPOINT, weights_only=True)
    assert state["trainer"]["step"] == 2 and state["trainer"]["config"]["preset"] == "tiny"
    assert dataclasses.asdict(TC).keys() == state["trainer"]["config"].keys()
    with pytest.raises(SystemExit):
        main(["export", "--runs", str(tmp_path), "--models", "tacotron2"])
    out = tmp_path / "stops.json"
    script = Path(__file__).resolve().parents[1] / "scripts" / "tacotron2_stop_steps.py"
    cmd = [sys.executable, str(script), "--weights", str(compact), "--corpus", str(corpus)]
    cmd += ["--sentences", "5", "--batch", "2", "--device", "cpu", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    assert len(result["rows"]) == 5 and result["summary"]["sentences"] == 5
    for row in result["rows"]:
        for key in ("stop_fp32", "stop_bf16", "stop_fused"):
            assert 0 <= row[key] <= 80  # tiny: at most 80
    for prefix in ("", "fused_"):  # the bf16 step, the float32 control
        summary = result["summary"]
        assert 0 <= summary[f"{prefix}stop_identical"] <= summary[f"{prefix}stop_within_1"] <= 5
    steps = sorted(row["stop_fp32"] for row in result["rows"])
    assert result["summary"]["stop_fp32_min"] == steps[0]
    assert result["summary"]["stop_fp32_median"] == steps[2]
    again = subprocess.run(
        [sys.executable, str(script), "--summarize", str(out)], check=True, capture_output=True
    )
    assert json.loads(again.stdout) == result["summary"]
    r = result["summary"]["stop_symbols_correlation"]  # (None: every stop step the same)
    assert r is None or -1 <= r <= 1


def _losses_and_grads(trainer, b, dropout):
    """One forward and backward of b: its losses and every parameter's gradient."""
    trainer.model.zero_grad(set_to_none=True)
    memory, processed = trainer.model.encoder(b.ids, b.lengths)
    out = decode(trainer.model, memory, processed, b, dropout=dropout)
    parts = trainer._losses(out, b)
    parts["loss"].backward()
    grads = [p.grad.clone() for p in trainer.model.parameters()]
    return {k: v.item() for k, v in parts.items()}, grads


def test_padding_changes_no_loss_or_gradient(voice):
    """GraphedStep's padding (more rows of no frames, more symbols, frames to a multiple of 64)
    leaves every loss and gradient as the batch's own (prenet dropout off: its masks' shape
    changes with the padding)."""
    train, _ = voice
    trainer = Tacotron2Trainer(train, None, TC)
    b = trainer._batch(train, [0, 1, 2])
    padded = pad_batch(b, rows=5, symbols=b.ids.shape[1] + 7)
    assert padded.mel.shape[2] % 64 == 0 and padded.mel.shape[2] > b.mel.shape[2]
    assert padded.mel_lengths[3:].tolist() == [0, 0] and padded.lengths[3:].tolist() == [1, 1]
    own, own_grads = _losses_and_grads(trainer, b, dropout=0.0)
    got, got_grads = _losses_and_grads(trainer, padded, dropout=0.0)
    assert own.keys() == got.keys()
    for k in own:
        assert got[k] == pytest.approx(own[k], rel=1e-5, abs=1e-7), k
    for want, have in zip(own_grads, got_grads, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="does not fit"):
        pad_batch(b, rows=2, symbols=b.ids.shape[1])
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Tacotron2Trainer(train, None, dataclasses.replace(TC, graphs=True))


@pytest.mark.requires_cuda
@pytest.mark.parametrize("amp", [False, True])
def test_graphed_step_matches_the_eager_step(corpus, amp):
    """The captured step gives the eager step's losses and gradients on the same padded batch
    from the same CUDA generator state, and its dropout masks change from replay to replay.
    The eager step runs with autocast's cache off, as the capture does: with it on, each
    decoder weight is cast to bf16 once and its gradient summed over the frames in bf16 (the
    H200 showed 2.4 % of a gradient's norm between the two), not in float32 frame by frame."""
    shard = load_shard(corpus / f"{TTS_VOICE}.pt")
    train = load_voice(shard, device="cuda")
    config = dataclasses.replace(TC, amp=amp, graphs=True)
    graphed = Tacotron2Trainer(train, None, config, "cuda")
    eager = Tacotron2Trainer(train, None, dataclasses.replace(config, graphs=False), "cuda")
    assert graphed.graphed is not None and eager.graphed is None
    eager._autocast = functools.partial(TextTrainer._autocast, eager, cache=False)
    b = graphed._batch(train, [0, 1, 2])
    graphed._gradients(b)  # captures its graph
    graphed.optimizer.zero_grad(set_to_none=True)  # (the encoder's gradients accumulate)
    torch.cuda.manual_seed(3)
    got = graphed._gradients(b)
    got_grads = [p.grad.clone() for p in graphed.model.parameters()]
    torch.cuda.manual_seed(3)
    want = TextTrainer._gradients(eager, pad_batch(b, TC.batch_size, graphed.graphed.symbols))
    tol = dict(rtol=2e-2, atol=1e-4) if amp else dict(rtol=1e-4, atol=1e-6)
    for k in want:
        torch.testing.assert_close(got[k], want[k], **tol)
    for p, have in zip(eager.model.parameters(), got_grads, strict=True):
        if amp:  # bf16 GEMMs may still round differently captured: each gradient as a whole
            # within 5 % of its norm (a wrong graph: ~100 %)
            assert (have - p.grad).norm() <= 5e-2 * p.grad.norm() + 1e-6
        else:
            torch.testing.assert_close(have, p.grad, **tol)
    again = graphed._gradients(b)  # the generator moved on: other dropout masks
    assert again["loss"] != got["loss"]
    for _ in range(3):  # whole steps, batches of several lengths (a graph each)
        graphed.step()
    assert len(graphed.graphed.graphs) >= 2
