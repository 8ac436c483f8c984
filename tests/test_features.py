"""ASR features vs a straightforward numpy computation of DLE's FilterbankFeatures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dle_jasper import dle_features
from speechrt.audio.features import FeatureConfig, batch_features, log_mel
from speechrt.device import batch_invariance_holds
from speechrt.errors import SpeechRTError


def signal(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    x = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1870 * t * (1 + t))
    return (x + 0.05 * rng.standard_normal(n)).astype(np.float32)


@pytest.mark.parametrize("n", [16000, 12345, 4000, 321])
def test_matches_numpy_reference(n: int) -> None:
    x = signal(n, seed=n)
    got = log_mel(torch.from_numpy(x), FeatureConfig()).numpy()
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
    x = torch.from_numpy(signal(4000))
    cfg = FeatureConfig()
    assert torch.equal(log_mel(x, cfg), log_mel(x, cfg))
    noisy = FeatureConfig(dither=1e-3)
    a = log_mel(x, noisy, torch.Generator().manual_seed(1))
    b = log_mel(x, noisy, torch.Generator().manual_seed(1))
    c = log_mel(x, noisy, torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)


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
        log_mel(torch.zeros(100), FeatureConfig())
    with pytest.raises(SpeechRTError, match="no audio"):
        batch_features([], FeatureConfig())
