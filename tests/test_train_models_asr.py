"""speechrt_train's QuartzNet trainer on a synthetic corpus (no synthesizer needed): it learns,
folds into the inference layout, resumes bit-for-bit, unfolds again, and its masked BatchNorm
forward matches the plain composition."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from speechrt.audio.features import FeatureConfig
from speechrt.models.jasper import QuartzNet, QuartzNetDims, mask_frames
from speechrt_train.asr_data import Augment, SpeechData, load_speech, speech_batch
from speechrt_train.corpus import HELDOUT_VOICE, TTS_VOICE, load_shard
from speechrt_train.quartznet_train import PRESETS as QUARTZNET_PRESETS
from speechrt_train.quartznet_train import QuartzNetTrainer, TrainableJasper, precise_bn, unfold
from train_harness import QN, _resume_matches, _same_weights


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


def test_quartznet_augment_presets_by_name(speech):
    train, val = speech
    trainer = QuartzNetTrainer(train, val, dataclasses.replace(QN, augment="recordings"))
    assert trainer.augment is not None and trainer.augment.channel
    assert QuartzNetTrainer(train, val, QN).augment == Augment()
    with pytest.raises(ValueError, match="augment 'studio'"):
        QuartzNetTrainer(train, val, dataclasses.replace(QN, augment="studio"))
