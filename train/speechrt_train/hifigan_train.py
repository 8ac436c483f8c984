"""Training HiFi-GAN (speechrt.models.hifigan) on the TTS voice: the GAN parts live here only.

generator: speechrt's HiFiGAN(weight_norm=True); exported with the weight norm folded
discriminators: multi-period (periods 2, 3, 5, 7, 11; 2-D convs over the folded waveform)
                + multi-scale (raw, x1/2, x1/4; grouped 1-D convs), both narrower than
                the paper's by `width` (4.6 M parameters at the default 1/4)
losses (least squares GAN, as the paper): D: (1 - D(y))^2 + D(G(x))^2
          G: (1 - D(G(x)))^2 + 2 * feature matching (L1) + 45 * L1(full-band log-mel)
data: (mel, real audio) segments; the mels are the ground truth's, or FastPitch's teacher-forced
      ones (config.mels_from, `--mels-from DIR`: fine-tuned to the acoustic model's errors)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm
from torch.profiler import record_function

from speechrt.arch.hifigan import PRESETS as HIFIGAN_PRESETS
from speechrt.arch.hifigan import HiFiGANDims
from speechrt.audio.mel import MelConfig, magnitude_spectrogram, mel_filterbank, mel_spectrogram
from speechrt.convert.checkpoints import fold_weight_norm
from speechrt.convert.hifigan import dle_state_dict
from speechrt.models.hifigan import HiFiGAN
from speechrt_train.loop import Batches, Checkpointed, optimizer_options
from speechrt_train.tts_data import VoiceData, segment_batch

SLOPE = 0.1

PRESETS: dict[str, dict[str, Any]] = {
    "hifigan-small": dict(HIFIGAN_PRESETS["hifigan-v2"]),  # 0.93 M parameters
    "hifigan-tiny": dict(HIFIGAN_PRESETS["tiny"]),  # tests
}


def conv_stack(convs: nn.ModuleList, post: nn.Module, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """A discriminator's convs (leaky ReLU after each) and its output conv -> flattened
    scores and every layer's output (the feature maps of the feature-matching loss)."""
    fmaps = []
    for conv in convs:
        x = F.leaky_relu(conv(x), SLOPE)
        fmaps.append(x)
    x = post(x)
    fmaps.append(x)
    return x.flatten(1), fmaps


class PeriodDiscriminator(nn.Module):
    """The waveform folded into (T / p, p) columns, judged by 2-D convs along time."""

    def __init__(self, period: int, width: float) -> None:
        super().__init__()
        self.period = period
        ch = [1] + [max(8, int(c * width)) for c in (32, 128, 512, 1024, 1024)]
        strides = (3, 3, 3, 3, 1)
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv2d(ch[i], ch[i + 1], (5, 1), (strides[i], 1), (2, 0)))
            for i in range(5)
        )
        self.post = weight_norm(nn.Conv2d(ch[-1], 1, (3, 1), 1, (1, 0)))

    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:  # x (B, 1, N)
        B, C, N = x.shape
        if N % self.period:
            x = F.pad(x, (0, self.period - N % self.period), mode="reflect")
        return conv_stack(self.convs, self.post, x.view(B, C, -1, self.period))


class ScaleDiscriminator(nn.Module):
    """Grouped strided 1-D convs over the waveform (at one of three sampling rates)."""

    def __init__(self, width: float) -> None:
        super().__init__()

        def c(n: int) -> int:  # a multiple of 16, the largest group count
            return 16 * max(1, round(n * width / 16))

        # (in, out, kernel, stride, groups) as the paper's, channels scaled
        spec = [
            (1, c(128), 15, 1, 1),
            (c(128), c(128), 41, 2, 4),
            (c(128), c(256), 41, 2, 16),
            (c(256), c(512), 41, 4, 16),
            (c(512), c(1024), 41, 4, 16),
            (c(1024), c(1024), 41, 1, 16),
            (c(1024), c(1024), 5, 1, 1),
        ]
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv1d(i, o, k, s, k // 2, groups=g)) for i, o, k, s, g in spec
        )
        self.post = weight_norm(nn.Conv1d(c(1024), 1, 3, 1, 1))

    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        return conv_stack(self.convs, self.post, x)


class Discriminators(nn.Module):
    def __init__(self, width: float = 0.25, periods: tuple[int, ...] = (2, 3, 5, 7, 11)) -> None:
        super().__init__()
        self.mpd = nn.ModuleList(PeriodDiscriminator(p, width) for p in periods)
        self.msd = nn.ModuleList(ScaleDiscriminator(width) for _ in range(3))

    def forward(self, x: Tensor) -> tuple[list[Tensor], list[list[Tensor]]]:
        """x (B, 1, N) -> every discriminator's scores and feature maps."""
        outs, fmaps = [], []
        for d in self.mpd:
            o, f = d(x)
            outs.append(o)
            fmaps.append(f)
        for i, d in enumerate(self.msd):
            if i:
                x = F.avg_pool1d(x, 4, 2, padding=2)
            o, f = d(x)
            outs.append(o)
            fmaps.append(f)
        return outs, fmaps


def discriminator_loss(real: list[Tensor], fake: list[Tensor]) -> Tensor:
    return sum(
        ((1 - r.float()) ** 2).mean() + (f.float() ** 2).mean()
        for r, f in zip(real, fake, strict=True)
    )


def generator_adv_loss(fake: list[Tensor]) -> Tensor:
    return sum(((1 - f.float()) ** 2).mean() for f in fake)


def feature_loss(real: list[list[Tensor]], fake: list[list[Tensor]]) -> Tensor:
    return sum(
        (r.float() - f.float()).abs().mean()
        for rs, fs in zip(real, fake, strict=True)
        for r, f in zip(rs, fs, strict=True)
    )


@dataclass
class HiFiGANConfig:
    preset: str = "hifigan-small"
    disc_width: float = 0.25
    batch_size: int = 16
    segment_frames: int = 32  # 8192 samples at hop 256
    lr: float = 2e-4
    lr_decay: float = 0.999  # per 1000 steps
    mel_weight: float = 45.0
    fm_weight: float = 2.0
    seed: int = 0
    amp: bool = True  # bf16 autocast for the discriminators on CUDA
    compile: bool = False  # torch.compile generator and discriminators (fixed segment shape)
    # the FastPitch component whose teacher-forced mels replaced the ground truth (fine-tuning;
    # set by --mels-from), None: ground-truth mels
    mels_from: str | None = None


def plain_generator(gen: HiFiGAN) -> HiFiGAN:
    """The inference form: a weight-norm generator's weights folded into a plain HiFiGAN."""
    plain = HiFiGAN(gen.dims)
    sd = fold_weight_norm({k: v.detach().float().cpu() for k, v in dle_state_dict(gen).items()})
    plain.load_state_dict(sd)
    return plain


class HiFiGANTrainer(Checkpointed):
    """Generator + discriminators + optimizers + data order (see loop.Trainer)."""

    def __init__(
        self,
        train: VoiceData,
        val: VoiceData | None,
        config: HiFiGANConfig,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config, self.device = config, torch.device(device)
        self.train, self.val = train, val
        self.mel = train.mel_config
        dims = HiFiGANDims(**PRESETS[config.preset], n_mels=self.mel.n_mels)
        if dims.hop_length != self.mel.hop_length:
            raise ValueError(f"generator hop {dims.hop_length} != mel hop {self.mel.hop_length}")
        self.loss_mel = MelConfig(**{**self.mel.to_dict(), "fmax": None})  # full band
        torch.manual_seed(config.seed)
        self.gen = HiFiGAN(dims, weight_norm=True).to(self.device)
        self.disc = Discriminators(config.disc_width).to(self.device)
        # compiled forms share the parameters; state dicts stay those of gen / disc
        self.gen_fwd = torch.compile(self.gen) if config.compile else self.gen
        self.disc_fwd = torch.compile(self.disc) if config.compile else self.disc
        adam = {"betas": (0.8, 0.99), "weight_decay": 0.01, **optimizer_options(self.device)}
        self.opt_g = torch.optim.AdamW(self.gen.parameters(), config.lr, **adam)
        self.opt_d = torch.optim.AdamW(self.disc.parameters(), config.lr, **adam)
        self.basis = torch.from_numpy(  # the loss mel's filterbank, on the device once
            mel_filterbank(
                self.loss_mel.sampling_rate,
                self.loss_mel.n_fft,
                self.loss_mel.n_mels,
                self.loss_mel.fmin,
                self.loss_mel.fmax,
            )
        ).to(self.device)
        self.batches = Batches(train.frames(), config.batch_size, config.seed)
        self.generator = torch.Generator().manual_seed(config.seed)  # segment starts
        self.step_count = 0

    def _autocast(self) -> Any:
        on = self.config.amp and self.device.type == "cuda"
        return torch.autocast(self.device.type, torch.bfloat16, enabled=on)

    def loss_mels(self, y_hat: Tensor, audio: Tensor) -> tuple[Tensor, Tensor]:
        """Full-band log-mels of y_hat (B, N) and audio (B, N) in one STFT: each equals
        speechrt's mel_spectrogram(x, loss_mel)."""
        both = torch.cat([y_hat.float(), audio.float()])
        mel = torch.matmul(self.basis, magnitude_spectrogram(both, self.loss_mel))
        mel = torch.log(torch.clamp(mel, min=self.loss_mel.log_clamp))
        return mel[: y_hat.shape[0]], mel[y_hat.shape[0] :]

    def _cached_weights(self) -> Any:
        """Eager: every weight-norm weight computed once per use of the discriminators
        (parametrize.cached); compiled graphs compute them inside."""
        return contextlib.nullcontext() if self.config.compile else parametrize.cached()

    def step(self) -> dict[str, Tensor]:
        cfg = self.config
        self.gen.train()
        self.disc.train()
        lr = cfg.lr * cfg.lr_decay ** (self.step_count / 1000) * self.lr_scale
        for opt in (self.opt_g, self.opt_d):
            for group in opt.param_groups:
                group["lr"] = lr
        with record_function("data"):
            mel, audio = segment_batch(
                self.train, next(self.batches), cfg.segment_frames, self.generator
            )
        y = audio[:, None, :]  # (B, 1, N)
        with record_function("forward"):
            # the generator stays float32: bf16's 8-bit mantissa would be a -48 dB noise floor
            # in the waveform; the discriminators run under autocast
            y_hat = self.gen_fwd(mel)
            with self._cached_weights(), self._autocast():  # discriminators
                real, _ = self.disc_fwd(y)
                fake, _ = self.disc_fwd(y_hat.detach())
            loss_d = discriminator_loss(real, fake)
        with record_function("backward"):
            self.opt_d.zero_grad(set_to_none=True)
            loss_d.backward()
        with record_function("optimizer"):
            self.opt_d.step()
        # generator: the discriminators' weights get no gradient (opt_d.zero_grad would drop
        # it unused), the real audio's feature maps are targets (no gradient at all)
        self.disc.requires_grad_(False)
        with record_function("forward"):
            with self._cached_weights(), self._autocast():
                with torch.no_grad():
                    _, fmap_real = self.disc_fwd(y)
                fake, fmap_fake = self.disc_fwd(y_hat)
            mel_fake, mel_real = self.loss_mels(y_hat[:, 0], audio)
            mel_l1 = F.l1_loss(mel_fake, mel_real)
            adv = generator_adv_loss(fake)
            fm = feature_loss(fmap_real, fmap_fake)
            loss_g = adv + cfg.fm_weight * fm + cfg.mel_weight * mel_l1
        with record_function("backward"):
            self.opt_g.zero_grad(set_to_none=True)
            loss_g.backward()
        self.disc.requires_grad_(True)
        with record_function("optimizer"):
            self.opt_g.step()
        self.step_count += 1
        losses = {"g": loss_g, "d": loss_d, "adv": adv, "fm": fm, "mel_l1": mel_l1}
        return {k: v.detach() for k, v in losses.items()}  # floats only when logged: no sync

    @torch.no_grad()
    def evaluate(self, limit: int = 16) -> dict[str, float]:
        """Full-band log-mel L1 of whole held-out utterances re-synthesized from their mels."""
        if self.val is None:
            return {}
        self.gen.eval()
        total = 0.0
        n = min(limit, len(self.val))
        for i in range(n):
            y_hat = self.gen(self.val.mels[i][None])[0, 0]
            a = mel_spectrogram(y_hat.float(), self.loss_mel)
            b = mel_spectrogram(self.val.audio[i], self.loss_mel)
            total += float(F.l1_loss(a, b))
        return {"val_mel_l1": total / n}

    def _state_parts(self) -> dict[str, Any]:
        return {
            "gen": self.gen,
            "disc": self.disc,
            "opt_g": self.opt_g,
            "opt_d": self.opt_d,
            "batches": self.batches,
            "generator": self.generator,
        }

    def _weight_parts(self) -> dict[str, nn.Module]:
        return {"gen": self.gen, "disc": self.disc}
