"""speechrt_train's ASR augmentation, batched on the device: speed, noise, features and
SpecAugment against their per-item references, and the channel's silence, telephone band, room,
coloured noise and VTLP."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from speechrt_train.asr_data import label_ids


def _speech(n_items: int = 5, seed: int = 0):
    from speechrt_train.asr_data import SpeechData

    rng = np.random.default_rng(seed)
    audio = []
    for k in range(n_items):  # speech-like: a few harmonics with a slow envelope, 0.4-3 s
        n = int(rng.integers(6400, 48000))
        t = np.arange(n) / 16000
        f0 = 90 + 40 * k
        x = sum(np.sin(2 * np.pi * f0 * h * t) / h for h in range(1, 5))
        audio.append(torch.tensor(0.2 * x * np.sin(np.pi * t / t[-1]), dtype=torch.float32))
    targets = [torch.tensor(label_ids("ab c")) for _ in audio]
    return SpeechData(audio, ["ab c"] * n_items, targets, ["v"] * n_items)


def test_batched_speed_perturbation_equals_per_item_interpolate():
    from speechrt_train.asr_data import Augment, augment_audio_reference, augment_batch

    data = _speech()
    index = [3, 0, 4, 1]
    quiet = Augment(noise_prob=0.0)  # noise draws differ by design (one batched draw)
    ref = augment_audio_reference(
        [data.audio[i] for i in index], quiet, torch.Generator().manual_seed(7), None
    )
    audio, lengths = augment_batch(
        data, index, quiet, torch.Generator().manual_seed(7), torch.Generator()
    )
    assert lengths == [r.shape[0] for r in ref] and audio.shape[1] == max(lengths)
    assert len(set(lengths)) == 4 and lengths != [data.audio[i].shape[0] for i in index]
    for row, r, n in zip(audio, ref, lengths, strict=True):
        assert (row[:n] - r).abs().max() < 1e-5
        assert not row[n:].any()  # padding stays silent


def test_batched_noise_has_the_drawn_snr_on_the_noisy_items():
    from speechrt_train.asr_data import Augment, augment_batch

    data = _speech(8)
    index = list(range(8))
    aug = Augment(speed=(1.0, 1.0), gain_db=(0.0, 0.0), snr_db=(20.0, 20.0))
    clean, _ = augment_batch(data, index, dataclasses.replace(aug, noise_prob=0.0), None, None)
    noisy, lengths = augment_batch(
        data, index, aug, torch.Generator(), torch.Generator().manual_seed(1)
    )
    u = torch.rand(8, 4, generator=torch.Generator(), dtype=torch.float64)
    for k, n in enumerate(lengths):
        diff = noisy[k, :n] - clean[k, :n]
        if u[k, 2] < 0.5:  # drawn noisy: 20 dB below the item's power
            snr = 10 * torch.log10(clean[k, :n].square().mean() / diff.square().mean())
            assert abs(float(snr) - 20.0) < 0.5
        else:
            assert not diff.any()


def test_batched_features_equal_speechrt_batch_features():
    from speechrt.audio.features import FeatureConfig
    from speechrt.runtime.featurizer import batch_features
    from speechrt_train.asr_data import batched_features, padded_audio

    data = _speech()
    cfg = FeatureConfig()
    index = [2, 0, 4]
    audio, sizes = padded_audio(data, index)
    feats, lengths = batched_features(audio, sizes, cfg, None)
    ref, ref_lengths = batch_features([data.audio[i] for i in index], cfg)
    assert feats.shape == ref.shape and torch.equal(lengths, ref_lengths)
    assert (feats - ref).abs().max() < 1e-4


def test_spec_augment_on_the_device_equals_the_per_item_loop():
    from speechrt_train.asr_data import Augment, spec_augment, spec_augment_reference

    feats = torch.randn(6, 64, 200) + 3
    lengths = [200, 37, 150, 5, 120, 64]
    for seed in range(5):
        a = spec_augment(feats, lengths, Augment(), torch.Generator().manual_seed(seed))
        b = spec_augment_reference(feats, lengths, Augment(), torch.Generator().manual_seed(seed))
        assert torch.equal(a, b)
    masked = (a == 0).float().mean()
    assert 0.05 < masked < 0.6  # masks exist but leave most of the features


def test_time_masks_as_a_share_of_the_item_match_the_loop_and_scale_with_length():
    from speechrt_train.asr_data import AUGMENTS, spec_augment, spec_augment_reference

    aug = AUGMENTS["recordings-masked"]  # 10 time masks of up to 5 % of the item each
    feats = torch.randn(4, 64, 2000) + 3
    lengths = [2000, 1000, 100, 19]
    for seed in range(5):
        a = spec_augment(feats, lengths, aug, torch.Generator().manual_seed(seed))
        b = spec_augment_reference(feats, lengths, aug, torch.Generator().manual_seed(seed))
        assert torch.equal(a, b)
    time_only = type(aug)(freq_masks=0, time_masks=10, time_share=0.05, time_width=10**6)
    masked = spec_augment(feats, lengths, time_only, torch.Generator().manual_seed(0))
    for b, n in enumerate(lengths):
        cols = int((masked[b, 0, :n] == 0).sum())  # masked frames of the item
        assert cols <= 10 * int(n * 0.05)  # each mask at most 5 % of the item
    assert (masked[3, 0, :19] != 0).all()  # under 20 frames: widths of 0, nothing masked
    assert (masked[0, 0] == 0).sum() > 0


def _channel(aug, data, seed: int = 0):
    from speechrt_train.asr_data import padded_audio
    from speechrt_train.channels import channel_batch

    audio, sizes = padded_audio(data, list(range(len(data.audio))))
    g, g_noise = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    out, lengths = channel_batch(audio, sizes, aug, g, g_noise)
    return audio, sizes, out, lengths


def test_channel_silence_moves_the_speech_and_keeps_it():
    from speechrt_train.asr_data import Augment

    data = _speech(6)
    audio, sizes, out, lengths = _channel(Augment(pad_prob=1.0, pad_s=0.5), data)
    assert out.shape[1] == max(lengths) and all(n >= s for n, s in zip(lengths, sizes, strict=True))
    assert any(n > s for n, s in zip(lengths, sizes, strict=True))
    for row, x, n, s in zip(out, audio, lengths, sizes, strict=True):
        lead = max(range(n - s + 1), key=lambda k: float(row[k : k + s] @ x[:s]))
        assert (row[lead : lead + s] - x[:s]).abs().max() < 1e-4  # unchanged, moved
        silence = torch.cat([row[:lead], row[lead + s :]])  # before, after, past the length
        assert silence.abs().max() < 1e-4


def test_channel_telephone_band_and_mu_law():
    from speechrt_train.asr_data import Augment, SpeechData

    noise = torch.randn(3, 16000, generator=torch.Generator().manual_seed(0)) * 0.1
    data = SpeechData(list(noise), ["a"] * 3, [torch.tensor(label_ids("a"))] * 3, ["v"] * 3)
    _, _, out, lengths = _channel(Augment(phone_prob=1.0), data)
    assert lengths == [16000] * 3
    power = torch.fft.rfft(out).abs().square()  # bins of 1 Hz
    in_band = power[:, 500:3000].mean()
    assert power[:, 4500:].mean() < 1e-3 * in_band  # > 30 dB down above the band
    assert power[:, 20:120].mean() < 0.1 * in_band  # and below it
    from speechrt_train.asr_data import AUGMENTS, narrowband
    from speechrt_train.channels import _mu_law

    # the recogniser that trains on this band is told to hear 8 kHz sources through it
    assert narrowband(AUGMENTS["recordings"]) == "telephone"
    assert narrowband(AUGMENTS["synthetic"]) is None and narrowband(None) is None
    x = torch.linspace(-1, 1, 10001)
    coded = _mu_law(x)
    assert len(torch.unique(coded)) <= 256  # 8-bit codes
    assert ((coded - x).abs() <= 0.025 * x.abs() + 2e-4).all()  # log-spaced steps


def test_channel_room_spreads_energy_past_the_speech():
    from speechrt_train.asr_data import Augment

    data = _speech(4)
    dry = Augment(pad_prob=1.0, pad_s=0.5)
    wet = dataclasses.replace(dry, reverb_prob=1.0, rt60_s=(0.6, 0.6), drr_db=(0.0, 0.0))
    _, sizes, a, lengths = _channel(dry, data)
    _, _, b, lengths_b = _channel(wet, data)
    assert lengths == lengths_b
    for k, (s, n) in enumerate(zip(sizes, lengths, strict=True)):
        lead = max(range(n - s + 1), key=lambda j: float(a[k, j : j + s] @ data.audio[k]))
        after = slice(lead + s, min(lead + s + 1600, n))  # 0.1 s after the speech
        if after.stop - after.start < 800:
            continue
        assert a[k, after].square().mean() < 1e-8
        assert b[k, after].square().mean() > 1e-5  # the room's tail
        rms = [float(x[k, lead : lead + s].square().mean().sqrt()) for x in (a, b)]
        assert abs(rms[1] / rms[0] - 1) < 0.01  # the speech's RMS is kept


def test_channel_coloured_noise_at_the_drawn_snr():
    from speechrt_train.asr_data import Augment

    data = _speech(6)
    aug = Augment(colour_noise_prob=1.0, colour_snr_db=(15.0, 15.0))
    _, _, clean, _ = _channel(dataclasses.replace(aug, colour_noise_prob=0.0), data)
    _, _, noisy, lengths = _channel(aug, data)
    for k, n in enumerate(lengths):
        diff = noisy[k, :n] - clean[k, :n]
        snr = 10 * torch.log10(clean[k, :n].square().mean() / diff.square().mean())
        assert abs(float(snr) - 15.0) < 1.0


def test_vtlp_warp_moves_a_tone_and_one_is_the_identity():
    from speechrt.audio.features import FeatureConfig
    from speechrt_train.asr_data import batched_features
    from speechrt_train.channels import vtlp_source_bins

    n = 257
    ident = vtlp_source_bins(torch.ones(1), n)
    assert torch.allclose(ident, torch.arange(n, dtype=torch.float32)[None])
    src = vtlp_source_bins(torch.tensor([0.9, 1.1]), n)
    assert src[:, 0].eq(0).all() and src[:, -1].eq(n - 1).all()  # DC and Nyquist stay
    assert (src[:, 1:] >= src[:, :-1]).all()  # monotonic
    cfg = FeatureConfig(dither=0.0)
    t = torch.arange(16000) / 16000
    tone = (0.3 * torch.sin(2 * torch.pi * 1000 * t))[None].repeat(2, 1)
    plain, _ = batched_features(tone, [16000] * 2, cfg, None)
    same, _ = batched_features(tone, [16000] * 2, cfg, None, torch.ones(2))
    assert (plain - same).abs().max() < 1e-4
    warped, _ = batched_features(tone, [16000] * 2, cfg, None, torch.tensor([0.9, 1.1]))
    peak = [int(f[:, 10:-10].mean(1).argmax()) for f in (plain[0], warped[0], warped[1])]
    assert peak[1] < peak[0] < peak[2]  # alpha < 1 moves it down, alpha > 1 up
