"""Training a small FastConformer-CTC (speechrt.models.parakeet) on the recogniser corpus.

    corpus transcripts (a-z, ' and spaces) -> SentencePiece unigram model (trained here)
    audio -> augmentation (asr_data: speed, gain, noise, rooms, microphones, telephone, VTLP)
    -> speechrt's features at 80 mels (DLE-style, as the bundled QuartzNet: the exported
    model.json declares the same FeatureConfig, so speechrt transcribes what training saw)
    -> SpecAugment -> FastConformer (x8) -> CTC over the pieces (blank last)

"fastconformer-small" (d_model 256, 16 layers, 4 heads, conv kernel 9, ff x4, 256-channel
subsampling) has 26.2 M parameters with 256 pieces (fastconformer_parameters).

`TrainableParakeet` is ParakeetCTC with what inference folds away: a BatchNorm between each conv
module's depthwise conv and its SiLU (as NeMo trains it), over each item's valid frames only
(quartznet_train.MaskedBatchNorm1d), and dropout on every residual branch (forward hooks: the
forward is ParakeetCTC's own). `folded_state_dict()` folds each BatchNorm into its depthwise
conv (masked_bn.fold_bn), giving weights that load strictly into ParakeetCTC(dims) and
compute what the trainable model computes in eval mode (tested).

The trainer is QuartzNetTrainer (batches, augmentation, data parallelism, checkpoints) with
this model, these features and the SentencePiece targets; the tokenizer's serialized model
travels in the checkpoint, so a resumed or exported run uses the pieces it trained with.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.arch.parakeet import CTC_PRESETS, ParakeetCTCDims, encoder_frames
from speechrt.audio.features import FeatureConfig
from speechrt.convert.nemo import sentencepiece_pieces, surface
from speechrt.models.parakeet import ConvModule, ParakeetCTC
from speechrt_train.asr_data import AUGMENTS, SpeechData, narrowband
from speechrt_train.ctc_guide import Guide, guide_loss
from speechrt_train.masked_bn import (
    Frames,
    MaskedBatchNorm1d,
    Pending,
    fold_bn,
    update_running_stats,
)
from speechrt_train.quartznet_train import QuartzNetConfig, QuartzNetTrainer

N_MELS = 80
PRESETS: dict[str, dict[str, Any]] = {
    # 26.2 M parameters with 256 pieces (26.4 M with 1024)
    "fastconformer-small": dict(
        n_mels=N_MELS, d_model=256, n_layers=16, n_heads=4, ff_expansion=4, conv_kernel=9,
        subsampling_channels=256,
    ),
    # tests and smoke runs: speechrt's tiny Parakeet with this corpus's features
    "tiny": dict(CTC_PRESETS["tiny"], n_mels=N_MELS, conv_kernel=9),
}  # fmt: skip
BN_EPS = 1e-5  # NeMo's ConformerConvolution BatchNorm1d (nemo.convert folds with the same)


class Tokenizer:
    """A SentencePiece model held as its serialized ModelProto (what the checkpoint stores)."""

    def __init__(self, proto: bytes) -> None:
        import sentencepiece as spm

        self.proto = proto
        self.sp = spm.SentencePieceProcessor(model_proto=proto)
        self.pieces = sentencepiece_pieces(proto)  # (piece, type) in id order, as nemo.convert

    @classmethod
    def train(cls, texts: list[str], vocab_size: int, model_type: str = "unigram") -> Tokenizer:
        """A model of at most `vocab_size` pieces (fewer where the text has too few: a soft
        limit) over `texts`; <unk> is id 0, no <s> or </s> (CTC never emits them). One thread:
        the same texts give the same model on every run and every data-parallel rank."""
        import sentencepiece as spm

        out = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=out,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=1.0,
            unk_id=0,
            bos_id=-1,
            eos_id=-1,
            hard_vocab_limit=False,
            num_threads=1,
            minloglevel=2,
        )
        return cls(out.getvalue())

    @classmethod
    def from_state(cls, state: dict[str, Tensor]) -> Tokenizer:
        return cls(state["proto"].cpu().numpy().tobytes())

    def __len__(self) -> int:
        return len(self.pieces)

    def encode(self, text: str) -> list[int]:
        return list(self.sp.encode(text, out_type=int))

    def decode(self, ids: list[int]) -> str:
        return str(self.sp.decode(ids))

    def labels(self) -> list[str]:
        """How each piece reads (model.json labels, as a converted .nemo's)."""
        return [surface(p, t) for p, t in self.pieces]

    def state_dict(self) -> dict[str, Tensor]:
        return {"proto": torch.frombuffer(bytearray(self.proto), dtype=torch.uint8)}


class TrainableConvModule(ConvModule):
    """ConvModule with its BatchNorm: pointwise -> GLU -> zero padded frames -> depthwise ->
    BatchNorm (valid frames) -> SiLU -> pointwise."""

    def __init__(self, d: ParakeetCTCDims) -> None:
        super().__init__(d)
        self.batch_norm = MaskedBatchNorm1d(d.d_model, eps=BN_EPS)

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        """x: (B, T, D), pad: (B, 1, T) True on padded frames -> (B, T, D)"""
        x = F.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1).masked_fill(pad, 0.0)
        x = self.depthwise_conv(x)  # (B, D, T)
        if self.training:
            keep = pad.logical_not().to(torch.float32)  # (B, 1, T)
            n = keep.sum().clamp(min=2)
            pending: Pending = []
            x = self.batch_norm.normalize(x, Frames(keep.sum((1, 2)), pad, keep / n, n), pending)
            update_running_stats(pending)
        else:
            x = self.batch_norm(x)
        return self.pointwise_conv2(F.silu(x)).transpose(1, 2)


class TrainableParakeet(nn.Module):
    """ParakeetCTC with BatchNorm in every conv module and dropout on every residual branch."""

    def __init__(self, dims: ParakeetCTCDims, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = ParakeetCTC(dims)
        self.dropout = dropout
        for layer in self.net.encoder.layers:
            layer.conv = TrainableConvModule(dims)
            for branch in (layer.feed_forward1, layer.self_attn, layer.conv, layer.feed_forward2):
                branch.register_forward_hook(self._drop)

    def _drop(self, module: nn.Module, inputs: Any, out: Tensor) -> Tensor:
        # a residual branch's output (B, T, D), dropped out while training
        return F.dropout(out, self.dropout, self.training)

    def forward(self, feats: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """feats (B, n_mels, T), lengths (B,) -> log-probs (B, T', vocab + 1) float32, (B,)"""
        return self.net(feats, lengths)

    def output_frames(self, frames: list[int]) -> list[int]:
        """Encoder frames for `frames` feature frames (host ints: the CTC loss's lengths)."""
        return [encoder_frames(self.net.dims, n) for n in frames]

    @torch.no_grad()
    def folded_state_dict(self) -> dict[str, Tensor]:
        """Weights for ParakeetCTC(dims): each BatchNorm folded into its depthwise conv."""
        sd = {
            k: v.detach().clone()
            for k, v in self.net.state_dict().items()
            if ".batch_norm." not in k
        }
        for i, layer in enumerate(self.net.encoder.layers):
            conv = layer.conv.depthwise_conv
            w, b = fold_bn(conv.weight, conv.bias, layer.conv.batch_norm)
            sd[f"encoder.layers.{i}.conv.depthwise_conv.weight"] = w
            sd[f"encoder.layers.{i}.conv.depthwise_conv.bias"] = b
        return {k: v.float().cpu() for k, v in sd.items()}


def features_of(config: dict[str, Any]) -> FeatureConfig:
    """The features a run (its config as a dict) trains on, and its export declares: the
    bundled QuartzNet's (speechrt's batch_features: reflect-padded STFT of 20 ms windows,
    DLE's dither; the telephone band for 8 kHz sources where it trained on telephones) at the
    preset's mel count."""
    defaults = FastConformerConfig()
    augment = AUGMENTS[config.get("augment", defaults.augment)]
    return FeatureConfig(
        n_mels=PRESETS[config.get("preset", defaults.preset)]["n_mels"],
        dither=float(config.get("dither", defaults.dither)),
        narrowband=narrowband(augment),
    )


def fastconformer_parameters(preset: str, vocab_size: int) -> int:
    """Parameters of the exported (folded) model of `preset` with `vocab_size` pieces."""
    dims = ParakeetCTCDims(**{**PRESETS[preset], "vocab_size": vocab_size})
    return sum(p.numel() for p in ParakeetCTC(dims).parameters())


@dataclass
class FastConformerConfig(QuartzNetConfig):
    preset: str = "fastconformer-small"
    # the guided H200 run's (docs/models/fastconformer.md): a batch of 512, peak lr 1e-3 with
    # beta2 0.98 (NeMo's), the recordings' augmentation, no dropout
    batch_size: int = 512
    lr: float = 1e-3  # peak of warmup_rsqrt (AdamW)
    warmup: int = 500
    beta2: float = 0.98
    augment: str = "recordings"
    dropout: float = 0.0
    vocab_size: int = 256  # SentencePiece pieces at most (the blank is one more class)
    tokenizer: str = "unigram"  # SentencePiece model_type: unigram or bpe
    # a character CTC recogniser's model directory (e.g. the bundled src/speechrt/defaults/asr)
    # whose alignments guide the first guide_steps steps (ctc_guide): "" none
    guide: str = ""
    guide_steps: int = 1500  # its weight falls linearly from guide_weight to 0 over these
    guide_weight: float = 1.0


class FastConformerTrainer(QuartzNetTrainer):
    """QuartzNetTrainer with a TrainableParakeet, 80-mel features and SentencePiece targets
    (the tokenizer trained on the training transcripts; `val` keeps its texts for WER)."""

    def __init__(
        self,
        train: SpeechData,
        val: SpeechData | None,
        config: FastConformerConfig,
        device: str | torch.device = "cpu",
        augment: Any = "config",
        rank: int = 0,
        world: int = 1,
    ) -> None:
        if config.preset not in PRESETS:
            raise ValueError(f"preset {config.preset!r}: one of {', '.join(PRESETS)}")
        self.tokenizer = Tokenizer.train(train.texts, config.vocab_size, config.tokenizer)
        self.blank = len(self.tokenizer)
        self.guide: Guide | None = None  # built at its first use (ctc_guide)
        super().__init__(self._encoded(train), val, config, device, augment, rank, world)
        if self.augment is not None:  # SpecAugment's mel masks: as wide a share of 80 as of 64
            width = round(self.augment.freq_width * N_MELS / FeatureConfig().n_mels)
            self.augment = replace(self.augment, freq_width=width)

    def _encoded(self, data: SpeechData) -> SpeechData:
        """`data` with piece ids as its targets (the audio shared, not copied)."""
        targets = [torch.tensor(self.tokenizer.encode(t), dtype=torch.long) for t in data.texts]
        return SpeechData(data.audio, data.texts, targets, data.voices)

    def make_features(self) -> FeatureConfig:
        return features_of(dataclasses.asdict(self.config))

    def make_model(self) -> nn.Module:
        dims = ParakeetCTCDims(**{**PRESETS[self.config.preset], "vocab_size": len(self.tokenizer)})
        return TrainableParakeet(dims, self.config.dropout)

    def text_of(self, ids: list[int]) -> str:
        """Greedy CTC: merge repeats, drop blanks, decode the pieces."""
        kept = [i for k, i in enumerate(ids) if i != self.blank and (k == 0 or i != ids[k - 1])]
        return " ".join(self.tokenizer.decode(kept).split())

    def _take_tokenizer(self, state: dict[str, Tensor]) -> None:
        """A checkpoint's pieces replace this run's (same count: the model's classes), and
        the training targets are encoded with them."""
        tokenizer = Tokenizer.from_state(state)
        if len(tokenizer) != self.blank:
            raise ValueError(f"the checkpoint has {len(tokenizer)} pieces, this run {self.blank}")
        self.tokenizer = tokenizer
        self.train = self._encoded(self.train)
        self.guide = None  # its targets follow the pieces

    def extra_loss(
        self,
        log_probs: Tensor,
        out_frames: list[int],
        index: list[int],
        audio: Tensor,
        sizes: list[int],
    ) -> Tensor | None:
        """The guide's frame NLL (ctc_guide), weighted, while step < guide_steps."""
        c = self.config
        assert isinstance(c, FastConformerConfig)
        if not c.guide or self.step_count >= c.guide_steps:
            return None
        if self.guide is None:
            sp = self.tokenizer.sp
            self.guide = Guide(
                c.guide,
                self.train.texts,
                lambda t: (sp.encode(t, out_type=str), sp.encode(t, out_type=int)),
                self.device,
                2**self.model.net.dims.subsampling_layers,
                self.blank,
            )
        targets = self.guide.targets(audio, sizes, index, out_frames, log_probs.shape[1])
        weight = c.guide_weight * (1.0 - self.step_count / c.guide_steps)
        return weight * guide_loss(log_probs.float(), targets)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._take_tokenizer(state["tokenizer"])  # first: the targets follow it
        super().load_state_dict(state)

    def compact_state(self) -> dict[str, Any]:
        # the pieces ride along: a warm start on another corpus round keeps its targets' ids
        return {**super().compact_state(), "tokenizer": self.tokenizer.state_dict()}

    def load_compact(self, state: dict[str, Any]) -> None:
        self._take_tokenizer(state["tokenizer"])
        super().load_compact(state)

    def load_exported(self, model_dir: Any, items: int = 96) -> float:
        raise ValueError(f"{model_dir}: fastconformer warm-starts from compact files only")

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "tokenizer": self.tokenizer.state_dict()}
