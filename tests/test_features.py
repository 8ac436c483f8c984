"""ASR features, both implementations (log_mel_numpy and the torch BatchLogMel), vs a
straightforward numpy computation of DLE's FilterbankFeatures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dle_jasper import dle_features
from speechrt.audio.features import FeatureConfig, log_mel_numpy
from speechrt.device import batch_invariance_holds
from speechrt.errors import SpeechRTError
from speechrt.runtime.featurizer import batch_features


def torch_log_mel(
    x: np.ndarray, cfg: FeatureConfig, g: torch.Generator | None = None
) -> np.ndarray:
    """One item through the torch implementation: (n_mels, 1 + N // hop), as log_mel_numpy."""
    feats, _ = batch_features([torch.from_numpy(x)], cfg, None if g is None else [g])
    return feats[0, :, : 1 + x.shape[0] // cfg.hop_length].numpy()


IMPLEMENTATIONS = {"numpy": log_mel_numpy, "torch": torch_log_mel}


def signal(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    x = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1870 * t * (1 + t))
    return (x + 0.05 * rng.standard_normal(n)).astype(np.float32)


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("n", [16000, 12345, 4000, 321])
def test_matches_numpy_reference(n: int, impl: str) -> None:
    x = signal(n, seed=n)
    got = IMPLEMENTATIONS[impl](x, FeatureConfig())
    want = dle_features(x)
    assert got.shape == want.shape == (64, 1 + n // 160)
    assert np.abs(got - want).max() <= 1e-4
    if n % 160 == 0:  # ceil(N / 160) valid frames: the STFT's extra last frame is zeroed
        assert not got[:, -1].any() and got[:, -2].any()


def test_batch_padding_and_independence() -> None:
    cfg = FeatureConfig()
    waves = [torch.from_numpy(signal(n, n)) for n in (8000, 16000, 3210)]
    feats, lengths = batch_features(waves, cfg)
    assert feats.shape == (3, 64, 112)  # 1 + 16000 // 160 = 101 frames -> multiple of 16
    assert lengths.tolist() == [50, 100, 21]
    for i, w in enumerate(waves):
        one, one_len = batch_features([w], cfg)
        assert one.shape[2] == cfg.padded_frames(w.shape[0]) and one_len.item() == lengths[i]
        batched = feats[i, :, : one.shape[2]]
        if batch_invariance_holds():  # this CPU's MKL sums alike at any batch shape
            assert torch.equal(one[0], batched)
        else:  # float32 rounding of normalised features (values of order 1)
            assert (one[0] - batched).abs().max() <= 1e-5
        assert not feats[i, :, lengths[i] :].any()


def test_dither_is_off_by_default_and_seeded_when_on() -> None:
    x = signal(4000)
    cfg = FeatureConfig()
    assert np.array_equal(torch_log_mel(x, cfg), torch_log_mel(x, cfg))
    assert np.array_equal(log_mel_numpy(x, cfg), log_mel_numpy(x, cfg))
    noisy = FeatureConfig(dither=1e-3)
    a = torch_log_mel(x, noisy, torch.Generator().manual_seed(1))
    b = torch_log_mel(x, noisy, torch.Generator().manual_seed(1))
    c = torch_log_mel(x, noisy, torch.Generator().manual_seed(2))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    a = log_mel_numpy(x, noisy, np.random.default_rng(1))
    b = log_mel_numpy(x, noisy, np.random.default_rng(1))
    c = log_mel_numpy(x, noisy, np.random.default_rng(2))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_config_from_dle_and_round_trip() -> None:
    fb = {"sample_rate": 16000, "window_size": 0.02, "window_stride": 0.01, "n_filt": 64}
    fb.update(window="hann", normalize="per_feature", pad_align=16, dither=1e-5)
    cfg = FeatureConfig.from_dle(fb)
    assert cfg == FeatureConfig()  # n_fft 512 derived from the 320 window; dither not carried
    assert FeatureConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(SpeechRTError, match="unknown feature config"):
        FeatureConfig.from_dict({"hop": 3})
    with pytest.raises(SpeechRTError, match="window"):
        FeatureConfig.from_dle({**fb, "window": "hamming"})


def test_too_short() -> None:
    with pytest.raises(SpeechRTError, match="too short"):
        torch_log_mel(np.zeros(100, np.float32), FeatureConfig())
    with pytest.raises(SpeechRTError, match="too short"):
        log_mel_numpy(np.zeros(100, np.float32), FeatureConfig())
    with pytest.raises(SpeechRTError, match="no audio"):
        batch_features([], FeatureConfig())
