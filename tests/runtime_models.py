"""Tiny random-weight components in model directories, shared by the runtime tests."""

from __future__ import annotations

import atexit
import dataclasses
import functools
import shutil
import tempfile
from pathlib import Path

import torch

from speechrt.audio.mel import MelConfig
from speechrt.models.fastpitch import FastPitch
from speechrt.models.fastspeech import FastSpeech
from speechrt.models.hifigan import HiFiGAN
from speechrt.models.jasper import QuartzNet
from speechrt.models.tacotron2 import Tacotron2
from speechrt.models.waveglow import WaveGlow
from speechrt.registry import preset
from speechrt.repo import ComponentInfo, save_component

# hop 16 = 4 x 4 upsampling; a 64-point STFT for the denoiser
MEL = MelConfig(sampling_rate=8000, n_fft=64, hop_length=16, win_length=64, n_mels=10)
# The "tiny" presets at this mel config: 10 mels, and for the vocoders hop 16 instead of 256, so
# audio, the denoiser's STFT and the exported graphs stay small.
HOP16 = dict(upsample_rates=(4, 4), upsample_kernel_sizes=(8, 8))  # HiFi-GAN: 4 x 4 upsampling
TEXT = {"symbol_set": "english_basic", "cleaners": "english_cleaners_v2", "p_arpabet": 0.0}


def randomize(model: torch.nn.Module, seed: int, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def fastpitch(seed: int = 0, **over: object) -> FastPitch:
    """~3 frames per symbol, pitch statistics set."""
    # two FFT layers a side: test_verify reads the per-layer report of the second
    layers = dict(n_mel_channels=MEL.n_mels, in_fft_n_layers=2, out_fft_n_layers=2)
    model = FastPitch(preset("fastpitch", "tiny", **{**layers, **over})).eval()
    randomize(model, seed)
    with torch.no_grad():
        model.duration_predictor.fc.bias.fill_(1.5)
        model.pitch_mean.fill_(200.0)
        model.pitch_std.fill_(50.0)
    return model


def hifigan(seed: int = 1) -> HiFiGAN:
    model = HiFiGAN(preset("hifigan", "tiny", n_mels=MEL.n_mels, **HOP16)).eval()
    randomize(model, seed, 0.1)
    return model


def save(model: torch.nn.Module, out: Path, meta: dict | None = None, mel: MelConfig = MEL) -> Path:
    mel = None if model.role == "asr" else mel
    info = ComponentInfo(model.kind, dataclasses.asdict(model.dims), mel, meta or {})
    return save_component(out, info, model.state_dict())


def voice(root: Path, **over: object) -> tuple[Path, Path]:
    """(acoustic dir, vocoder dir) of a tiny FastPitch + HiFi-GAN voice."""
    return (
        save(fastpitch(**over), root / "fastpitch", {"text": TEXT}),
        save(hifigan(), root / "hifigan"),
    )


def tacotron2(seed: int = 2, rate: float = 0.03, **over: object) -> Tacotron2:
    """Decoder unit 0 integrates a context-dependent rate and the gate reads it: items stop after
    tens of steps, each at its own step (the trick of tests/test_tacotron2.py)."""
    model = Tacotron2(preset("tacotron2", "tiny", **{"n_mel_channels": MEL.n_mels, **over})).eval()
    randomize(model, seed, 0.3)
    d, rnn = model.dims, model.decoder.decoder_rnn
    h, a = d.decoder_rnn_dim, d.attention_rnn_dim
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for gate in range(4):  # input, forget, cell, output rows of unit 0
            rnn.weight_ih[gate * h].zero_()
            rnn.weight_hh[gate * h].zero_()
            rnn.bias_ih[gate * h] = 10.0 if gate != 2 else rate
            rnn.bias_hh[gate * h] = 0.0
        rnn.weight_ih[2 * h, a:] = torch.randn(d.encoder_embedding_dim, generator=g) * 0.03
        model.decoder.gate_layer.weight.zero_()
        model.decoder.gate_layer.weight[0, 0] = 20.0
        model.decoder.gate_layer.bias.fill_(-10.0)
    return model


def waveglow(seed: int = 3, **over: object) -> WaveGlow:
    # hop 16 (MEL), n_group 8: two latent positions per mel frame
    hop16 = dict(n_mel_channels=MEL.n_mels, upsample_kernel=64, hop_length=MEL.hop_length)
    model = WaveGlow(preset("waveglow", "tiny", **{**hop16, **over})).eval()
    randomize(model, seed, 0.05)
    return model


def fastspeech(seed: int = 4, **over: object) -> FastSpeech:
    model = FastSpeech(preset("fastspeech", "tiny", **{"n_mels": MEL.n_mels, **over})).eval()
    randomize(model, seed, 0.3)
    with torch.no_grad():
        model.length_regulator.duration_predictor.linear_layer.bias.fill_(1.2)
    return model


def quartznet(seed: int = 5) -> QuartzNet:
    model = QuartzNet(preset("quartznet", "tiny", n_feats=12)).eval()  # the suites feed 12
    randomize(model, seed, 0.3)
    return model


BUILDERS = {
    "fastpitch": fastpitch,
    "hifigan": hifigan,
    "tacotron2": tacotron2,
    "waveglow": waveglow,
    "fastspeech": fastspeech,
    "quartznet": quartznet,
}


@functools.cache
def exported() -> dict[str, Path]:
    """Every tiny component saved and exported (`speechrt export`) once per test process."""
    from speechrt.cli import main

    root = Path(tempfile.mkdtemp(prefix="speechrt-runtime-"))
    atexit.register(shutil.rmtree, root, True)
    dirs = {}
    for kind, build in BUILDERS.items():
        meta = {"text": TEXT} if kind in ("fastpitch", "tacotron2", "fastspeech") else {}
        dirs[kind] = save(build(), root / kind, meta)
        assert main(["export", str(dirs[kind])]) == 0
    return dirs
