"""HiFi-GAN: DLE checkpoint layout, conversion parity, batch independence, presets."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from speechrt.arch.hifigan import PRESETS, HiFiGANDims
from speechrt.audio.mel import MelConfig
from speechrt.cli import main
from speechrt.convert.hifigan import dle_state_dict, from_dle
from speechrt.errors import SpeechRTError
from speechrt.models.hifigan import HiFiGAN
from speechrt.options import SynthesisOptions
from speechrt.repo import load_component

KEYS = Path(__file__).parent / "data" / "checkpoint_keys" / "hifigan.json"

# hop 4 * 4 = 16; three resblocks per stage as in every published config.
TINY = HiFiGANDims(
    upsample_rates=(4, 4),
    upsample_kernel_sizes=(8, 8),
    upsample_initial_channel=16,
    resblock="1",
    resblock_kernel_sizes=(3, 5, 7),
    resblock_dilation_sizes=((1, 3, 5), (1, 3, 5), (1, 3, 5)),
    n_mels=12,
)
TINY_V3 = HiFiGANDims(
    upsample_rates=(4, 2, 2),
    upsample_kernel_sizes=(8, 4, 4),
    upsample_initial_channel=16,
    resblock="2",
    resblock_kernel_sizes=(3, 5, 7),
    resblock_dilation_sizes=((1, 2), (2, 6), (3, 12)),
    n_mels=12,
)
TRAIN_SETUP = dict(
    segment_size=8192,
    filter_length=64,
    num_mels=12,
    hop_length=16,
    win_length=64,
    sampling_rate=8000,
    mel_fmin=0.0,
    mel_fmax=4000.0,
    mel_fmax_loss=None,
    max_wav_value=32768.0,
    seed=1234,
)


def dle_model(dims: HiFiGANDims) -> HiFiGAN:
    """A weight-normed module as DLE trains it, with g != ||v|| so that folding matters."""
    model = HiFiGAN(dims, weight_norm=True).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("original0"):  # g
                p.mul_(torch.empty_like(p).uniform_(0.5, 1.5))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    return model


def dle_config(dims: HiFiGANDims) -> dict:
    # DLE stores plain lists and the resblock kind as a string; no n_mels.
    d = json.loads(json.dumps(asdict(dims)))
    del d["n_mels"]
    return d


def save_ckpt(path: Path, sd: dict, **extra) -> Path:
    torch.save({"generator": sd, "gen_ema": None, "train_state": {"epoch": 3}, **extra}, path)
    return path


def random_mel(dims: HiFiGANDims, batch: int, frames: int) -> torch.Tensor:
    return torch.randn(batch, dims.n_mels, frames) - 4.0


def test_dle_layout_matches_published_keys():
    published = json.loads(KEYS.read_text())
    dims = HiFiGANDims()
    assert dle_config(dims) == published["hyperparameters"]
    sd = dle_state_dict(HiFiGAN(dims, weight_norm=True))
    assert {k: list(v.shape) for k, v in sd.items()} == published["state_dict"]
    assert sum(p.numel() for p in HiFiGAN(dims).parameters()) == 13_926_017  # 13.9 M


@pytest.mark.parametrize("dims", [TINY, TINY_V3], ids=["resblock1", "resblock2"])
def test_convert_matches_weight_normed_model(tmp_path, dims):
    ref = dle_model(dims)
    sd = {f"module.{k}": v for k, v in dle_state_dict(ref).items()}
    ckpt = save_ckpt(
        tmp_path / "hifigan_gen_checkpoint_3.pt",
        sd,
        config=dle_config(dims),
        train_setup=TRAIN_SETUP,
    )
    out = tmp_path / "hifigan"
    assert main(["convert", str(ckpt), str(out)]) == 0  # kind detected from the keys
    model, info = load_component(out)
    assert info.kind == "hifigan" and model.dims == dims
    assert info.mel == MelConfig(
        sampling_rate=8000, n_fft=64, hop_length=16, win_length=64, n_mels=12, fmax=4000.0
    )
    mel = random_mel(dims, 2, 9)
    with torch.no_grad():
        expected = ref(mel)
        assert (model(mel) - expected).abs().max() <= 1e-5
        audio, lengths = model.mel_to_audio(mel, torch.tensor([9, 9]), SynthesisOptions())
    assert audio.shape == (2, 9 * 16) and lengths.tolist() == [144, 144]
    assert (audio - expected.squeeze(1)).abs().max() <= 1e-5


def test_old_flat_resblock_keys_and_conv2d_shapes_load():
    ref = dle_model(TINY)
    sd = dle_state_dict(ref)
    new = from_dle({"generator": sd, "config": dle_config(TINY), "train_setup": TRAIN_SETUP})
    flat = {}
    for k, v in sd.items():
        parts = k.split(".")
        if parts[0] == "resblocks":  # resblocks.{stage}.{j}.rest -> resblocks.{stage * 3 + j}.rest
            k = ".".join(["resblocks", str(int(parts[1]) * 3 + int(parts[2])), *parts[3:]])
        # Conv2d-style checkpoints carry a trailing singleton dim on every weight.
        flat[k] = v.unsqueeze(-1) if k.endswith(("weight_g", "weight_v")) else v
    assert any(k.startswith("resblocks.5.convs1.0") for k in flat)
    for ckpt in (
        {"generator": flat, "config": dle_config(TINY), "train_setup": TRAIN_SETUP},
        {"generator": flat, "train_setup": TRAIN_SETUP},
    ):
        old = from_dle(ckpt)
        assert old.dims == new.dims == TINY
        assert old.state_dict.keys() == new.state_dict.keys()
        assert all(torch.equal(old.state_dict[k], v) for k, v in new.state_dict.items())


@pytest.mark.parametrize("dims", [TINY, TINY_V3], ids=["resblock1", "resblock2"])
def test_dims_inferred_without_config(dims):
    sd = dle_state_dict(dle_model(dims))
    conv = from_dle({"generator": sd, "train_setup": TRAIN_SETUP})
    assert conv.dims == dims
    with pytest.raises(SpeechRTError, match="no train_setup: default hop_length 256"):
        from_dle({"generator": sd})
    # No train_setup: the DLE TTS mel front end, which needs hop 256.
    conv = from_dle(dle_state_dict(dle_model(HiFiGANDims.from_name("hifigan-v2"))))
    assert conv.mel == MelConfig() and conv.dims == HiFiGANDims.from_name("hifigan-v2")


def test_config_keys_override_inference():
    conv = from_dle(
        {
            "generator": dle_state_dict(dle_model(TINY)),
            "config": {"upsample_rates": [2, 8], "resblock_dilation_sizes": [[1, 2, 3]] * 3},
            "train_setup": {**TRAIN_SETUP},
        }
    )
    assert conv.dims.upsample_rates == (2, 8)
    assert conv.dims.resblock_dilation_sizes == ((1, 2, 3),) * 3


def test_mismatched_checkpoints_fail_clearly(tmp_path, capsys):
    sd = dle_state_dict(dle_model(TINY))
    bad_hop = save_ckpt(
        tmp_path / "a.pt",
        sd,
        config=dle_config(TINY),
        train_setup={**TRAIN_SETUP, "hop_length": 256},
    )
    assert main(["convert", str(bad_hop), str(tmp_path / "a")]) == 2
    assert "hop_length 256" in capsys.readouterr().err
    wrong_kernels = {**dle_config(TINY), "resblock_kernel_sizes": [3, 5, 9]}
    bad_cfg = save_ckpt(tmp_path / "b.pt", sd, config=wrong_kernels, train_setup=TRAIN_SETUP)
    assert main(["convert", str(bad_cfg), str(tmp_path / "b")]) == 2
    assert "does not match the hifigan layout" in capsys.readouterr().err
    with pytest.raises(SpeechRTError, match="not a HiFi-GAN"):
        from_dle({"generator": {"conv_pre.bias": torch.zeros(3)}})


@pytest.mark.parametrize("dims", [TINY, TINY_V3], ids=["resblock1", "resblock2"])
def test_batched_equals_single(dims):
    model = HiFiGAN(dims).eval()
    lengths = torch.tensor([6, 23, 1, 15])
    mel = random_mel(dims, 4, 23)
    mel[0, :, 6:] = 9.0  # padding garbage must not leak into the valid part
    hop = dims.hop_length
    audio, audio_lengths = model.mel_to_audio(mel, lengths, SynthesisOptions())
    assert audio.shape == (4, 23 * hop) and audio_lengths.tolist() == (lengths * hop).tolist()
    for i, n in enumerate(lengths.tolist()):
        single, _ = model.mel_to_audio(mel[i : i + 1, :, :n], torch.tensor([n]))
        assert (audio[i, : n * hop] - single[0]).abs().max() <= 1e-5
        assert not audio[i, n * hop :].any()
    # One full-length item: the masked path is the plain DLE forward, bit for bit.
    single, _ = model.mel_to_audio(mel[1:2], torch.tensor([23]))
    with torch.no_grad():
        assert torch.equal(single, model(mel[1:2]).squeeze(1))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build_and_run(name):
    dims = HiFiGANDims.from_name(name)
    assert dims.hop_length == 256 and dims == HiFiGANDims(**PRESETS[name])
    model = HiFiGAN(dims).eval()
    audio, lengths = model.mel_to_audio(random_mel(dims, 1, 3), torch.tensor([3]))
    assert audio.shape == (1, 768) and lengths.tolist() == [768]
    assert torch.isfinite(audio).all() and audio.abs().max() <= 1.0


def test_bad_dims_and_inputs():
    with pytest.raises(SpeechRTError, match="unknown HiFi-GAN preset"):
        HiFiGANDims.from_name("hifigan-v9")
    with pytest.raises(SpeechRTError, match="resblock"):
        HiFiGANDims(resblock="3")
    with pytest.raises(SpeechRTError, match="does not fit"):
        HiFiGANDims(upsample_kernel_sizes=(16, 16, 4, 3))
    model = HiFiGAN(TINY)
    with pytest.raises(SpeechRTError, match="expected mel"):
        model.mel_to_audio(torch.zeros(1, 80, 5), torch.tensor([5]))
    with pytest.raises(SpeechRTError, match="lengths"):
        model.mel_to_audio(torch.zeros(1, 12, 5), torch.tensor([6]))
    with pytest.raises(SpeechRTError, match="mel_lengths"):
        model.mel_to_audio(torch.zeros(2, 12, 5), torch.tensor([5]))


@pytest.mark.slow
def test_default_dims_convert_and_match(tmp_path):
    dims = HiFiGANDims()
    ref = dle_model(dims)
    train_setup = dict(
        TRAIN_SETUP,
        filter_length=1024,
        num_mels=80,
        hop_length=256,
        win_length=1024,
        sampling_rate=22050,
        mel_fmax=8000.0,
    )
    ckpt = save_ckpt(
        tmp_path / "g.pt",
        {f"module.{k}": v for k, v in dle_state_dict(ref).items()},
        config=dle_config(dims),
        train_setup=train_setup,
    )
    assert main(["convert", str(ckpt), str(tmp_path / "out")]) == 0
    model, info = load_component(tmp_path / "out")
    assert info.mel == MelConfig() and model.dims == dims
    mel = random_mel(dims, 1, 8)
    with torch.no_grad():
        assert (model(mel) - ref(mel)).abs().max() <= 1e-5
