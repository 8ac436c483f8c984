"""The batched log-mel (BatchLogMel) and the featurizer against the per-item numpy log-mel,
log_mel_numpy (float64 inside), given each item's dither noise.

Tolerance: 1e-4 absolute on normalised features (values of order 1; float32 rounding of the
batched STFT and of the masked mean/std sums: ~3e-5 on these signals). Valid frame counts are
identical and frames from an item's valid_frames on are exactly zero.

An item of 2 valid frames (near min_samples) normalises a bin to +-0.707 d / (d + 1.4 std_eps),
d the bin's difference between its two frames: where d is a near-tie (~1e-3 of log-mel values
~6), rounding is amplified past any fixed tolerance, for the reference as much as for the batch.
The test signals rise in amplitude (an onset) so that short items' two frames differ clearly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from speechrt.audio.features import FeatureConfig, log_mel_numpy
from speechrt.errors import SpeechRTError
from speechrt.runtime.buckets import Buckets
from speechrt.runtime.featurizer import BatchLogMel, Featurizer, batch_features, make_featurizer

TOL = 1e-4
# the GPU's compiled fp32 reductions vs eager ones: 1.03e-4 at most on an H200 (dither)
TOL_CUDA = 2e-4
CPU = torch.device("cpu")
# min_samples (320) and just above it, multiples of the hop (480, 4800, 16000), and others
LENGTHS = (320, 321, 480, 639, 4800, 12345, 16000)
CONFIGS = {
    "default": FeatureConfig(),
    "no-preemph": FeatureConfig(preemph=0.0),
    "dither": FeatureConfig(dither=1e-3),
    "dither-no-preemph": FeatureConfig(dither=1e-3, preemph=0.0),
}


def waves(lengths: tuple[int, ...] = LENGTHS) -> list[np.ndarray]:
    out = []
    for i, n in enumerate(lengths):
        rng = np.random.default_rng(i)
        t = np.arange(n) / 16000
        x = 0.3 * np.sin(2 * np.pi * (200 + 150 * i) * t) + 0.05 * rng.standard_normal(n)
        out.append((x * (0.1 + np.arange(n) / n)).astype(np.float32))  # an onset: see top
    return out


def generators(cfg: FeatureConfig, n: int, device: torch.device = CPU) -> list | None:
    """Window i's dither generator, seeded i (None without dither)."""
    if cfg.dither == 0:
        return None
    return [torch.Generator(device=device).manual_seed(i) for i in range(n)]


def reference(audios: list[np.ndarray], cfg: FeatureConfig, device: torch.device = CPU) -> list:
    """Per-item log_mel_numpy, each window's dither noise drawn from its own generator as the
    featurizer draws it: [(n_mels, 1 + N // hop)] on `device`."""
    gens = generators(cfg, len(audios), device) or [None] * len(audios)
    out = []
    for a, g in zip(audios, gens, strict=True):
        x = a.astype(np.float64)
        if g is not None:
            x = (
                x
                + cfg.dither
                * torch.randn(len(a), generator=g, device=device).cpu().double().numpy()
            )
        mel = log_mel_numpy(x, dataclasses.replace(cfg, dither=0.0))
        out.append(torch.from_numpy(mel).to(device))
    return out


def assert_matches_reference(
    feats: torch.Tensor,
    valid: torch.Tensor,
    audios: list[np.ndarray],
    cfg: FeatureConfig,
    ref,
    tol: float = TOL,
) -> None:
    assert feats.shape == (len(audios), cfg.n_mels, cfg.padded_frames(max(map(len, audios))))
    assert valid.tolist() == [cfg.valid_frames(len(a)) for a in audios]
    for i, r in enumerate(ref):
        T = r.shape[1]
        assert (feats[i, :, :T] - r).abs().max().item() <= tol
        assert not feats[i, :, int(valid[i]) :].any()  # zero past valid and past its own frames


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batch_log_mel_matches_per_item(name: str) -> None:
    cfg = CONFIGS[name]
    audios = waves()
    B, N = len(audios), max(map(len, audios))
    # padding past each item's samples is garbage: it must not leak into any item
    audio = torch.randn(B, N) * 100
    noise = torch.randn(B, N) * 100
    gens = generators(cfg, B) or []
    for i, a in enumerate(audios):
        audio[i, : len(a)] = torch.from_numpy(a)
        if gens:
            noise[i, : len(a)] = torch.randn(len(a), generator=gens[i])
    lengths = torch.tensor([len(a) for a in audios])
    feats, valid = BatchLogMel(cfg)(audio, lengths, noise if cfg.dither else None)
    assert_matches_reference(feats, valid, audios, cfg, reference(audios, cfg))


def test_batch_log_mel_needs_noise_when_dithering() -> None:
    with pytest.raises(SpeechRTError, match="noise"):
        BatchLogMel(FeatureConfig(dither=1e-3))(torch.zeros(1, 400), torch.tensor([400]))


@pytest.mark.parametrize("name", ["default", "dither"])
def test_featurizer_matches_per_item(name: str) -> None:
    cfg = CONFIGS[name]
    audios = waves()
    ref = reference(audios, cfg)
    feats, valid = Featurizer(cfg, CPU)(audios, generators(cfg, len(audios)))
    assert_matches_reference(feats, valid, audios, cfg, ref)
    # an item's features do not depend on its batch-mates or their order
    for i in (0, 5):
        gens = generators(cfg, i + 1)
        one, one_valid = Featurizer(cfg, CPU)([audios[i]], gens and gens[i:])
        assert one_valid.item() == valid[i].item()
        assert (one[0] - feats[i, :, : one.shape[2]]).abs().max().item() <= TOL


@pytest.mark.parametrize("name", ["default", "dither"])
def test_bucketed_featurizer_crops_to_true_shape(name: str) -> None:
    """The cuda featurizer's padding (batch and sample buckets), run uncompiled on the CPU."""
    cfg = CONFIGS[name]
    buckets = Buckets({"batch": (4, 8), "feature_frames": (200, 400)})
    f = Featurizer(cfg, CPU, buckets)
    assert f.padded_shape(3, 16000) == (4, 200 * 160)
    assert f.padded_shape(7, 32001) == (8, 400 * 160)
    assert Featurizer(cfg, CPU).padded_shape(3, 16000) == (3, 16000)
    for lengths in (LENGTHS, LENGTHS[:3], (16000,)):
        audios = waves(lengths)
        feats, valid = f(audios, generators(cfg, len(audios)))
        assert feats.is_contiguous()
        assert_matches_reference(feats, valid, audios, cfg, reference(audios, cfg))


def test_featurizer_errors() -> None:
    f = Featurizer(FeatureConfig(), CPU)
    with pytest.raises(SpeechRTError, match="no audio"):
        f([])
    with pytest.raises(SpeechRTError, match="too short"):
        f([np.zeros(319, np.float32)])
    with pytest.raises(SpeechRTError, match="generator"):
        Featurizer(FeatureConfig(dither=1e-3), CPU)(waves((400, 500)))


def test_make_featurizer_per_backend() -> None:
    cfg = FeatureConfig()
    for backend in ("eager", "onnx"):
        f = make_featurizer(cfg, backend, CPU)
        assert f.buckets is None and f.fn is f.module  # the module as it is


@pytest.mark.parametrize("dither", [None, 1e-4])
def test_asr_featurize_equals_reference_and_buckets_change_no_text(
    tmp_path: Path, one_thread: None, dither: float | None
) -> None:
    """ASR.featurize (one host batch, one BatchLogMel) vs batch_features of the same windows
    plus the model's leading padding; the cuda featurizer's bucketing, uncompiled on the CPU,
    gives the same words."""
    from dle_jasper import speechlike, talkative_model
    from speechrt.asr import ASR
    from speechrt.cli import main

    torch.save({"state_dict": talkative_model("jasper").state_dict()}, tmp_path / "j.pt")
    assert main(["convert", str(tmp_path / "j.pt"), str(tmp_path / "j")]) == 0
    asr = ASR(tmp_path / "j", dither=dither)
    waves_ = [speechlike(s, i) for i, s in enumerate((2.5, 0.02, 1.0, 1.7))]
    segs = [asr.segments(i, w, seed=i)[0] for i, w in enumerate(waves_)]
    feats, lengths, samples = asr.featurize(segs)
    cfg = asr.features
    gens = None
    if cfg.dither:
        gens = [torch.Generator().manual_seed(seg.seed) for seg in segs]
    ref, ref_lengths = batch_features([torch.from_numpy(seg.audio) for seg in segs], cfg, gens)
    P = asr.pad_leading
    assert samples == [len(w) for w in waves_]
    assert feats.shape == (4, cfg.n_mels, P + ref.shape[2])
    assert lengths.tolist() == (ref_lengths + P).tolist()
    assert not feats[:, :, :P].any()
    assert (feats[:, :, P:] - ref).abs().max().item() <= TOL
    want = asr.transcribe(waves_, batch_size=4)
    assert sum(len(t.words) for t in want) >= 5  # the test model does say things
    asr.featurizer = Featurizer(cfg, CPU, Buckets({"batch": (8,), "feature_frames": (512,)}))
    got = asr.transcribe(waves_, batch_size=4)
    assert [t.words for t in got] == [t.words for t in want]


@pytest.mark.requires_cuda
@pytest.mark.parametrize("name", ["default", "dither"])
def test_cuda_featurizer_matches_per_item_reference(name: str) -> None:
    """Compiled and CUDA-graph-replayed at bucketed shapes vs per-item float32 log_mel on the
    same GPU (each window's noise from its own CUDA generator). Tolerance TOL_CUDA."""
    from speechrt.runtime.cuda import CapturedGraphs

    cfg = CONFIGS[name]
    device = torch.device("cuda")
    f = make_featurizer(cfg, "cuda", device)
    assert isinstance(f.fn, CapturedGraphs) and f.buckets is not None
    # 7 s (112000 samples) at batch 1 and 8, as measured; (110000,) falls in (112000,)'s buckets
    calls = [LENGTHS, LENGTHS[:3], (112000,), (112000,) * 8, (100000, 90000), (110000,)]
    kept = []
    for lengths in calls:
        audios = waves(lengths)
        ref = reference(audios, cfg, device)
        for _ in range(2):  # the first call compiles and captures, the second replays
            feats, valid = f(audios, generators(cfg, len(audios), device))
            assert feats.device.type == "cuda" and feats.dtype == torch.float32
            assert_matches_reference(feats, valid, audios, cfg, ref, TOL_CUDA)
        kept.append((feats, audios, ref))
    # one graph per distinct (batch, samples) bucket shape: the last call replayed the third's
    shapes = {f.padded_shape(len(c), max(c)) for c in calls}
    assert len(shapes) == len(calls) - 1 and len(f.fn.graphs) == len(shapes)
    for feats, audios, ref in kept:  # outputs are copies: later replays did not overwrite them
        valid = torch.tensor([cfg.valid_frames(len(a)) for a in audios])
        assert_matches_reference(feats, valid, audios, cfg, ref, TOL_CUDA)


@pytest.mark.parametrize("dither", [None, 1e-4])
def test_features_to_log_probs_equals_featurize_then_acoustic(
    tmp_path: Path, one_thread: None, dither: float | None
) -> None:
    """FeaturesToLogProbs (the cuda backend's one graph from audio to log-probs; here
    uncompiled on the CPU, with bucketed shapes) vs ASR.featurize then ASR.acoustic: the same
    frames to decode, log-probs within 1e-5 x DECODER_GAIN (the test model's logit scale), the
    same words. The two batches take both ways to the runner's frame bucket: padding the
    featurizer's frames (2.5 s) and cropping them (1.5 s)."""
    from dle_jasper import DECODER_GAIN, speechlike, talkative_model
    from speechrt.asr import ASR
    from speechrt.cli import main
    from speechrt.runtime.cuda import cuda_runner
    from speechrt.runtime.featurizer import FeaturesToLogProbs
    from speechrt.runtime.graphs import build_graph

    torch.save({"state_dict": talkative_model("jasper").state_dict()}, tmp_path / "j.pt")
    assert main(["convert", str(tmp_path / "j.pt"), str(tmp_path / "j")]) == 0
    asr = ASR(tmp_path / "j", dither=dither, backend="eager")
    assert asr.front is None and asr.pad_leading > 0
    buckets = Buckets({"batch": (2, 8), "feature_frames": (256, 512)})
    asr.featurizer = Featurizer(asr.features, CPU, buckets)
    graph = build_graph("jasper", asr.model, asr.info)
    asr.runner = cuda_runner(
        "jasper", graph, asr.runner.contract, device="cpu", dtype=torch.float32, mode=None,
        buckets=buckets,
    )  # fmt: skip
    batches = [(2.5, 0.02, 1.0, 1.7), (1.5,)]
    waves_ = [[speechlike(s, i) for i, s in enumerate(b)] for b in batches]
    segs = [[asr.segments(i, w, seed=i)[0] for i, w in enumerate(ws)] for ws in waves_]
    want = [asr.log_probs(s) for s in segs]
    words = [[t.words for t in asr.transcribe(ws, batch_size=4)] for ws in waves_]
    assert sum(len(w) for ws in words for w in ws) >= 5  # the test model does say things
    asr.front = FeaturesToLogProbs(asr.featurizer, asr.runner, asr.pad_leading)
    for s, (ref, ref_n) in zip(segs, want, strict=True):
        got, n = asr.log_probs(s)
        assert got.shape == ref.shape and n.tolist() == ref_n.tolist()
        assert (got - ref).abs().max().item() <= 1e-5 * DECODER_GAIN
    assert [[t.words for t in asr.transcribe(ws, batch_size=4)] for ws in waves_] == words
