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
from speechrt.models.fastpitch import FastPitch, FastPitchDims
from speechrt.models.fastspeech import FastSpeech, FastSpeechDims
from speechrt.models.hifigan import HiFiGAN, HiFiGANDims
from speechrt.models.jasper import QuartzNet, QuartzNetDims
from speechrt.models.tacotron2 import Tacotron2, Tacotron2Dims
from speechrt.models.waveglow import WaveGlow, WaveGlowDims
from speechrt.repo import ComponentInfo, save_component

# hop 16 = 4 x 4 upsampling; a 64-point STFT for the denoiser
MEL = MelConfig(sampling_rate=8000, n_fft=64, hop_length=16, win_length=64, n_mels=10)
FASTPITCH = dict(  # also tests/test_fastpitch.py's tiny dims
    n_mel_channels=10,
    n_symbols=20,
    symbols_embedding_dim=16,
    in_fft_n_layers=2,
    in_fft_n_heads=2,
    in_fft_d_head=4,
    in_fft_conv1d_filter_size=32,
    in_fft_output_size=16,
    out_fft_n_layers=2,
    out_fft_n_heads=2,
    out_fft_d_head=4,
    out_fft_conv1d_filter_size=32,
    out_fft_output_size=16,
    dur_predictor_filter_size=8,
    pitch_predictor_filter_size=8,
    energy_predictor_filter_size=8,
)
HIFIGAN = dict(
    upsample_rates=(4, 4),
    upsample_kernel_sizes=(8, 8),
    upsample_initial_channel=32,
    resblock_kernel_sizes=(3, 5),
    resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)),
    n_mels=10,
)
TEXT = {"symbol_set": "english_basic", "cleaners": "english_cleaners_v2", "p_arpabet": 0.0}


def randomize(model: torch.nn.Module, seed: int, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def fastpitch(seed: int = 0, **over: object) -> FastPitch:
    """~3 frames per symbol, pitch statistics set."""
    model = FastPitch(FastPitchDims(**{**FASTPITCH, **over})).eval()
    randomize(model, seed)
    with torch.no_grad():
        model.duration_predictor.fc.bias.fill_(1.5)
        model.pitch_mean.fill_(200.0)
        model.pitch_std.fill_(50.0)
    return model


def hifigan(seed: int = 1) -> HiFiGAN:
    model = HiFiGAN(HiFiGANDims(**HIFIGAN)).eval()
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


TACOTRON2 = dict(n_mel_channels=10, n_symbols=30, symbols_embedding_dim=16,
                 encoder_embedding_dim=16, attention_rnn_dim=24, attention_dim=8,
                 attention_location_n_filters=4, attention_location_kernel_size=7,
                 decoder_rnn_dim=24, prenet_dim=12, postnet_embedding_dim=16,
                 max_decoder_steps=80)  # fmt: skip


def tacotron2(seed: int = 2, rate: float = 0.03, **over: object) -> Tacotron2:
    """Decoder unit 0 integrates a context-dependent rate and the gate reads it: items stop after
    tens of steps, each at its own step (the trick of tests/test_tacotron2.py)."""
    model = Tacotron2(Tacotron2Dims(**{**TACOTRON2, **over})).eval()
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
    over = (
        dict(n_mel_channels=10, n_layers=2, n_channels=8, upsample_kernel=64, hop_length=16) | over
    )
    dims = WaveGlowDims(**over)
    model = WaveGlow(dims).eval()
    randomize(model, seed, 0.05)
    return model


def fastspeech(seed: int = 4, **over: object) -> FastSpeech:
    dims = FastSpeechDims(n_symbols=30, d_model=16, max_seq_len=256, d_head=4,
                          phoneme_side_n_layer=2, phoneme_side_head=2,
                          phoneme_side_conv1d_filter_size=32, mel_side_n_layer=2, mel_side_head=2,
                          mel_side_conv1d_filter_size=32, duration_predictor_filter_size=8,
                          n_mels=10)  # fmt: skip
    model = FastSpeech(dataclasses.replace(dims, **over)).eval()
    randomize(model, seed, 0.3)
    with torch.no_grad():
        model.length_regulator.duration_predictor.linear_layer.bias.fill_(1.2)
    return model


def quartznet(seed: int = 5) -> QuartzNet:
    dims = QuartzNetDims(filters=(8, 8, 8, 16, 29), kernels=(5, 5, 7, 9, 1),
                         repeats=(1, 2, 2, 1, 1), strides=(2, 1, 1, 1, 1),
                         dilations=(1, 1, 1, 2, 1),
                         separable=(True, True, True, True, False),
                         residual=("none", "plain", "plain", "none", "none"), n_feats=12,
                         n_classes=29)  # fmt: skip
    model = QuartzNet(dims).eval()
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
