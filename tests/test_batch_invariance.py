"""Batch-invariant mode (speechrt.device.set_batch_invariant): on CPU an item's output is
bitwise the same alone and batched, at any position, beside any batch-mates, at any padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speechrt.asr import ASR
from speechrt.device import batch_invariance_holds, batch_invariant, set_batch_invariant
from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions
from speechrt.tts import TTS, Piece

# MKL on some CPUs (an AMD EPYC here) rounds by shape whatever MKL_CBWR says: the mode refuses
# to turn on there (test_mode_refuses_a_cpu_that_rounds_by_shape), so what it promises is moot
NOT_HERE = pytest.mark.skipif(
    not batch_invariance_holds(), reason="this CPU's kernels round by shape: the mode refuses"
)


@pytest.fixture
def invariant():
    set_batch_invariant(True)
    yield
    set_batch_invariant(False)


def _batchings(n: int) -> list[list[int]]:
    """Orders of items 0..n-1 that put every item at the front, the back, and beside others."""
    every = list(range(n))
    return [every, every[::-1], every[1:] + every[:1], [n - 1, 0]]


@NOT_HERE
@pytest.mark.parametrize(
    "options",
    [SynthesisOptions(), SynthesisOptions(pace=1.3, pitch_shift=30.0)],
    ids=["default", "pace-pitch"],
)
def test_tts_batched_is_bitwise_alone(tiny_voice, invariant, options):
    tts = TTS(*tiny_voice, device="cpu")
    rng = np.random.default_rng(0)
    lengths = (4, 19, 46, 11)  # 46 pads the others by up to 42 symbols (~130 frames)
    pieces = [Piece(i, 0, rng.integers(1, 148, n).tolist(), i) for i, n in enumerate(lengths)]
    alone = [tts.ids_to_audio([p], options)[0] for p in pieces]
    for order in _batchings(len(pieces)):
        batched = tts.ids_to_audio([pieces[k] for k in order], options)
        for k, audio in zip(order, batched, strict=True):
            assert np.array_equal(audio, alone[k]), (order, k)


@NOT_HERE
def test_asr_batched_is_bitwise_alone(tiny_asr, invariant):
    asr = ASR(tiny_asr, device="cpu")
    rng = np.random.default_rng(1)
    t = np.arange(16000 * 3) / 16000
    waves = [
        (0.3 * np.sin(2 * np.pi * f * t[:n]) + 0.01 * rng.standard_normal(n)).astype(np.float32)
        for f, n in ((220, 5000), (700, 16000 * 3), (1500, 12000), (3000, 30000))
    ]
    segs = [asr.segments(i, w)[0] for i, w in enumerate(waves)]
    alone = [asr.log_probs([s]) for s in segs]
    for order in _batchings(len(segs)):
        log_probs, lengths = asr.log_probs([segs[k] for k in order])
        for row, k in enumerate(order):
            n = int(alone[k][1][0])
            assert int(lengths[row]) == n
            assert torch.equal(log_probs[row, :n], alone[k][0][0, :n]), (order, k)
    together = asr.transcribe(waves, batch_size=4)
    for w, got in zip(waves, together, strict=True):
        want = asr.transcribe([w], batch_size=1)[0]
        assert (got.text, got.words) == (want.text, want.words)


@NOT_HERE
def test_mode_switches_onednn_and_refuses_lax_mkl(monkeypatch):
    before = torch.backends.mkldnn.enabled
    set_batch_invariant(True)
    assert batch_invariant() and not torch.backends.mkldnn.enabled
    set_batch_invariant(False)
    assert not batch_invariant() and torch.backends.mkldnn.enabled == before
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    with pytest.raises(SpeechRTError, match="MKL_CBWR"):
        set_batch_invariant(True)
    assert not batch_invariant()


@pytest.mark.skipif(batch_invariance_holds(), reason="this CPU's kernels are batch-invariant")
def test_mode_refuses_a_cpu_that_rounds_by_shape():
    before = torch.backends.mkldnn.enabled
    with pytest.raises(SpeechRTError, match="not available on this CPU"):
        set_batch_invariant(True)
    assert not batch_invariant() and torch.backends.mkldnn.enabled == before
