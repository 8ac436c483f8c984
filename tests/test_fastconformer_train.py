"""speechrt_train's FastConformer-CTC on the synthetic corpus: it learns, its folded BatchNorms
compute what training computed, it resumes exactly, and its export is a Parakeet CTC model
directory that speechrt transcribes alike on eager and onnx; guided by the bundled QuartzNet's
alignments, its first steps target every piece (ctc_guide)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from speechrt.models.parakeet import ParakeetCTC
from speechrt.runtime.featurizer import batch_features
from speechrt_train.__main__ import main
from speechrt_train.asr_data import SpeechData, load_speech, transcript
from speechrt_train.corpus import HELDOUT_VOICE, load_shard
from speechrt_train.ctc_guide import IGNORE
from speechrt_train.fastconformer_train import (
    FastConformerConfig,
    FastConformerTrainer,
    Tokenizer,
    TrainableParakeet,
)
from speechrt_train.loop import run

BUNDLED_ASR = Path(__file__).parents[1] / "src/speechrt/defaults/asr"
FC = FastConformerConfig(
    preset="tiny", batch_size=4, lr=3e-3, warmup=5, amp=False, augment="synthetic"
)


@pytest.fixture(scope="module")
def speech(corpus: Path) -> tuple[SpeechData, SpeechData]:
    shards = [load_shard(p) for p in sorted(corpus.glob("*.pt")) if p.stem != HELDOUT_VOICE]
    val = load_speech([load_shard(corpus / f"{HELDOUT_VOICE}.pt")], heldout=True)
    return load_speech(shards, heldout=False), val


def test_tokenizer_pieces_spell_the_transcripts(speech):
    train, val = speech
    trainer = FastConformerTrainer(train, val, FC)
    tok = trainer.tokenizer
    assert trainer.blank == len(tok) == trainer.model.net.dims.vocab_size
    assert tok.pieces[0] == ("<unk>", 2)  # no <s> / </s>: CTC never emits them
    for text, target in zip(trainer.train.texts, trainer.train.targets, strict=True):
        assert tok.decode(target.tolist()) == text == transcript(text)
        # model.json's labels (the pieces' surfaces) joined read as the text, as speechrt shows
        assert "".join(tok.labels()[i] for i in target.tolist()).strip() == text


def test_fastconformer_overfits_a_batch_and_folds_its_batchnorm(speech):
    train, val = speech
    config = FastConformerConfig(**{**FC.__dict__, "dropout": 0.0})
    trainer = FastConformerTrainer(train, val, config, augment=None)
    trainer.batches = itertools.repeat([0, 1, 2, 3])  # one batch, again and again
    losses = [float(trainer.step()["ctc"]) for _ in range(20)]
    assert losses[-1] < 0.6 * losses[0], losses

    model = trainer.model.eval()
    assert isinstance(model, TrainableParakeet)
    norms = [layer.conv.batch_norm for layer in model.net.encoder.layers]
    assert all(int(bn.num_batches_tracked) == 20 for bn in norms)  # trained: not the identity
    folded = ParakeetCTC(model.net.dims).eval()
    folded.load_state_dict(model.folded_state_dict())  # strict: no BatchNorm left
    audio = [train.audio[0], train.audio[5][:12000]]  # two lengths: padding in the batch
    feats, lengths = batch_features(audio, dataclasses.replace(trainer.features, dither=0.0))
    with torch.no_grad():
        want, want_n = model(feats, lengths)
        got, got_n = folded(feats, lengths)
    assert torch.equal(want_n, got_n)
    for b, n in enumerate(got_n.tolist()):  # the valid frames of each item
        torch.testing.assert_close(got[b, :n], want[b, :n], atol=1e-4, rtol=0)


def test_fastconformer_resumes_exactly(speech, tmp_path):
    train, val = speech

    def make() -> FastConformerTrainer:
        # Conformers' AdamW second-moment decay (NeMo's 0.98), from the config
        return FastConformerTrainer(train, val, dataclasses.replace(FC, beta2=0.98))

    whole = make()
    run(whole, tmp_path / "whole", minutes=10, max_steps=4, progress=False)
    run(make(), tmp_path / "split", minutes=10, max_steps=2, progress=False)
    resumed = make()
    run(resumed, tmp_path / "split", minutes=10, max_steps=4, progress=False)
    assert resumed.step_count == 4 and resumed.tokenizer.proto == whole.tokenizer.proto
    assert resumed.optimizer.param_groups[0]["betas"] == (0.9, 0.98)
    want, got = whole.model.state_dict(), resumed.model.state_dict()
    assert want.keys() == got.keys()
    for k in want:  # parameters and BatchNorm statistics, bit for bit (same machine, same steps)
        assert torch.equal(want[k], got[k]), k
    # a compact file (a warm start elsewhere) carries the pieces: a trainer whose tokenizer
    # differs (here: trained on 6 sentences) takes them and re-encodes its targets
    other = FastConformerTrainer(train, val, FC)
    other.tokenizer = Tokenizer.train(train.texts[:6], FC.vocab_size)
    other.train = other._encoded(other.train)
    assert other.tokenizer.proto != whole.tokenizer.proto
    other.load_compact(whole.compact_state())
    assert other.tokenizer.proto == whole.tokenizer.proto and other.step_count == 4
    for a, b in zip(other.train.targets, whole.train.targets, strict=True):
        assert torch.equal(a, b)


def _write_wav(path: Path, audio: np.ndarray, sr: int = 16000) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def test_cli_trains_and_exports_a_parakeet_directory(corpus, speech, tmp_path, capsys, monkeypatch):
    from speechrt.asr import ASR

    runs = tmp_path / "runs"
    common = ["--corpus", str(corpus), "--device", "cpu", "--quiet"]
    train_args = ["fastconformer", "--dims", "tiny", "--batch", "4", "--steps", "6"]
    train_args += ["--run", str(runs / "fastconformer"), "--set", "warmup=5", *common]
    assert main(train_args) == 0
    capsys.readouterr()
    out = tmp_path / "defaults"
    export_args = ["export", "--runs", str(runs), "--models", "fastconformer", "--out", str(out)]
    metrics = tmp_path / "metrics.json"
    export_args += ["--fp32", "--corpus", str(corpus), "--device", "cpu", "--metrics", str(metrics)]
    assert main(export_args) == 0
    summary = json.loads(capsys.readouterr().out)["export"]["fastconformer"]
    assert summary["steps"] == 6 and summary["dtype"] == "fp32"
    assert main(["cards", "--metrics", str(metrics), "--out", str(tmp_path / "cards")]) == 0
    card = (tmp_path / "cards" / "fastconformer.md").read_text()
    assert card.startswith("# FastConformer-CTC recogniser") and "| training steps | 6" in card

    model_dir = out / "asr-fastconformer"
    info = json.loads((model_dir / "model.json").read_text())
    assert info["kind"] == "parakeet_ctc" and info["meta"]["features"]["n_mels"] == 80
    assert len(info["meta"]["labels"]) == len(info["meta"]["pieces"]) == info["dims"]["vocab_size"]
    assert (model_dir / "model.onnx").is_file()

    wav = tmp_path / "speech.wav"
    _write_wav(wav, speech[1].audio[0].numpy())
    texts = {}
    for backend in ("eager", "onnx"):
        asr = ASR(model_dir, backend=backend, dither=0.0)
        assert asr.features.n_mels == 80
        texts[backend] = asr.transcribe([str(wav)])[0].text
    assert texts["eager"] == texts["onnx"]
    _tunes_decoding_over_pieces(model_dir, speech[1], monkeypatch, tmp_path)


def _tunes_decoding_over_pieces(model_dir, val, monkeypatch, tmp_path):
    """`tune_decoding --asr DIR` on a piece model: beam search over its pieces with the bundled
    LM at each grid point (a stand-in reader: CI has no flite)."""
    import shutil
    import sys

    from speechrt_train import tune_decoding
    from speechrt_train.teachers import Utterance

    for lm in BUNDLED_ASR.glob("lm.*"):
        shutil.copy(lm, model_dir)

    class Reader:
        def __init__(self, prefix):
            pass

        def synthesize(self, voice, spoken):
            return [Utterance(a.numpy(), 16000) for a in val.audio[: len(spoken)]]

    texts = val.texts[:3]
    monkeypatch.setattr(tune_decoding, "sentence_sets", lambda root, limit: {"dev": texts})
    monkeypatch.setattr(tune_decoding, "Teachers", Reader)
    out = tmp_path / "tune.json"
    grid = '{"alpha": [0.5, 0.9], "beta": [0.0]}'
    argv = ["--asr", str(model_dir), "--reader", "rms", "--grid", grid, "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["tune_decoding", *argv])
    tune_decoding.main()
    result = json.loads(out.read_text())
    assert result["sentences"] == 3 and len(result["points"]) == 2
    assert all(p["wer"] >= 0.0 for p in result["points"]) and result["best"] in result["points"]


@pytest.mark.skipif(
    json.loads((BUNDLED_ASR / "model.json").read_text())["kind"] != "quartznet",
    reason="the guide is a character CTC model: the QuartzNet bundled before the FastConformer",
)
def test_guided_steps_target_every_piece_in_order(speech):
    train, val = speech
    config = FastConformerConfig(
        preset="tiny", batch_size=4, lr=3e-3, warmup=5, amp=False, augment="synthetic",
        guide=str(BUNDLED_ASR), guide_steps=2,
    )  # fmt: skip
    trainer = FastConformerTrainer(train, val, config)
    trainer.batches = itertools.repeat([0, 1, 2, 3])
    losses = [trainer.step() for _ in range(3)]
    assert 0 < float(losses[0]["extra"]) < 20 and float(losses[1]["extra"]) > 0
    assert "extra" not in losses[2]  # past guide_steps: CTC alone

    assert trainer.guide is not None
    index = [0, 9, 10, 11]  # 0: 31 pieces for 24 frames (cannot be placed); the rest fit
    audio = torch.nn.utils.rnn.pad_sequence([trainer.train.audio[i] for i in index], True)
    sizes = [len(trainer.train.audio[i]) for i in index]
    out_frames = trainer.model.output_frames([trainer.features.valid_frames(n) for n in sizes])
    targets = trainer.guide.targets(audio, sizes, index, out_frames, max(out_frames) + 1)
    assert targets.shape == (4, max(out_frames) + 1)
    pieces = [trainer.train.targets[i].tolist() for i in index]
    assert len(pieces[0]) > out_frames[0] and (targets[0] == IGNORE).all()
    for b in range(1, 4):
        row = targets[b, : out_frames[b]].tolist()
        assert IGNORE not in row and (targets[b, out_frames[b] :] == IGNORE).all()
        assert [i for i in row if i != trainer.blank] == pieces[b]  # each piece once, in order
