"""Training QuartzNet (speechrt.models.jasper) with CTC; BatchNorm exists only while training.

`TrainableJasper` wraps the inference module and adds what inference folds away: a BatchNorm
(eps 1e-3, as DLE) after every sub-block conv and residual projection, and dropout after each
ReLU. The BatchNorms take their statistics over each item's valid frames only, so padding never
shifts them, and `precise_bn` recomputes their running statistics for the final weights before
export. The forward is Jasper.forward with these inserted; `folded_state_dict()` folds every
BatchNorm into the conv before it, giving weights that load strictly into QuartzNet(dims) and
compute the same thing as the trainable model in eval mode (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import record_function

from speechrt.arch.jasper import PRESETS as JASPER_PRESETS
from speechrt.arch.jasper import QuartzNetDims, _preset
from speechrt.asr.wer import wer
from speechrt.audio.features import FeatureConfig
from speechrt.models.jasper import BN_EPS, LABELS, QuartzNet
from speechrt.runtime.featurizer import batch_features
from speechrt_train.asr_data import (
    AUGMENTS,
    Augment,
    SpeechData,
    narrowband,
    speech_batch,
    speech_batch_host,
)
from speechrt_train.distributed import all_reduce_
from speechrt_train.loop import Batches, Checkpointed, optimizer_options, warmup_rsqrt
from speechrt_train.masked_bn import (
    Frames,
    MaskedBatchNorm1d,
    Pending,
    fold_bn,
    update_running_stats,
)

PRESETS: dict[str, dict[str, Any]] = {
    "quartznet-5x5": JASPER_PRESETS["quartznet-5x5"],  # 6.7 M parameters
    "quartznet-tiny": _preset(  # tests: (filters, kernel, repeat, stride, dilation, sep, res)
        [
            (16, 11, 1, 2, 1, True, "none"),
            (16, 13, 2, 1, 1, True, "plain"),
            (24, 15, 2, 1, 1, True, "plain"),
            (32, 17, 1, 1, 2, True, "none"),
            (32, 1, 1, 1, 1, False, "none"),
        ]
    ),
}


class TrainableJasper(nn.Module):
    """QuartzNet / Jasper with BatchNorm and dropout, for training."""

    def __init__(self, dims: QuartzNetDims, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = QuartzNet(dims)
        self.dropout = dropout

        def bn(c: int) -> MaskedBatchNorm1d:
            return MaskedBatchNorm1d(c, eps=BN_EPS)

        f = dims.filters
        self.sub_bn = nn.ModuleList(
            nn.ModuleList(bn(f[b]) for _ in blk.subs) for b, blk in enumerate(self.net.blocks)
        )
        self.res_bn = nn.ModuleList(
            nn.ModuleList(bn(f[b]) for _ in blk.res) for b, blk in enumerate(self.net.blocks)
        )

    def forward(self, feats: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """feats (B, n_feats, T), lengths (B,) -> log-probs (B, T', n_classes) float32, (B,).

        Jasper.forward with the BatchNorms and dropout inserted; the frame masks are made once
        per distinct lengths (twice: before and after the prologue's stride) and the running
        statistics updated once at the end."""
        xs = [feats]
        drop = self.dropout if self.training else 0.0
        pending: Pending = []

        def norm(bn: MaskedBatchNorm1d, x: Tensor, frames: Frames) -> Tensor:
            return bn.normalize(x, frames, pending) if self.training else bn(x)

        frames = Frames.of(lengths, feats.shape[2])
        for b, (block, keep) in enumerate(zip(self.net.blocks, self.net._keeps, strict=True)):
            x, out = xs[-1], frames
            for j, sub in enumerate(block.subs):
                first = sub.depthwise if sub.separable else sub.conv
                x = first(x.masked_fill(out.pad, 0.0))
                out = out.after(first, x.shape[2])
                if sub.separable:
                    x = sub.pointwise(x.masked_fill(out.pad, 0.0))
                x = norm(self.sub_bn[b][j], x, out)
                if j < len(block.subs) - 1:
                    x = F.dropout(F.relu(x), drop, self.training)
            for conv, bn, src in zip(block.res, self.res_bn[b], xs, strict=False):
                x = x + norm(bn, conv(src.masked_fill(frames.pad, 0.0)), out)
            x = F.dropout(F.relu(x), drop, self.training)
            frames = out
            xs = [*xs, x] if keep else [x]
        update_running_stats(pending)
        logits = self.net.decoder(xs[-1]).transpose(1, 2)
        return F.log_softmax(logits.float(), dim=-1), frames.lengths

    def output_frames(self, frames: list[int]) -> list[int]:
        """Output frames for `frames` input frames, on the host (net.output_lengths' ints)."""
        for block in self.net.blocks:
            for sub in block.subs:
                conv = sub.depthwise if sub.separable else sub.conv
                (p,), (k,), (d,), (s,) = conv.padding, conv.kernel_size, conv.dilation, conv.stride
                frames = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n in frames]
        return frames

    @torch.no_grad()
    def folded_state_dict(self) -> dict[str, Tensor]:
        """Inference weights for QuartzNet(dims): every BatchNorm folded into its conv."""
        sd = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
        for b, block in enumerate(self.net.blocks):
            for j, sub in enumerate(block.subs):
                name = "pointwise" if sub.separable else "conv"
                conv = getattr(sub, name)
                w, bias = fold_bn(conv.weight, conv.bias, self.sub_bn[b][j])
                sd[f"blocks.{b}.subs.{j}.{name}.weight"] = w
                sd[f"blocks.{b}.subs.{j}.{name}.bias"] = bias
            for r, conv in enumerate(block.res):
                w, bias = fold_bn(conv.weight, conv.bias, self.res_bn[b][r])
                sd[f"blocks.{b}.res.{r}.weight"] = w
                sd[f"blocks.{b}.res.{r}.bias"] = bias
        return {k: v.float().cpu() for k, v in sd.items()}


@torch.no_grad()
def unfold(folded: dict[str, Tensor], dims: QuartzNetDims, feats: list[Tensor]) -> TrainableJasper:
    """The inverse of `folded_state_dict`, to train an exported recogniser again: the folded
    weights go into the convs as they are, and every BatchNorm becomes the identity in eval
    mode (gamma = sqrt(var + eps), beta = running mean = mean), with mean and var the
    per-channel statistics of its input over `feats` (each (n_feats, T), one item: no padding).
    Eval mode then computes exactly what the folded model does; training mode does so on a
    batch with those statistics, and approximately on others. Run it on the CPU: deterministic,
    so every data-parallel rank unfolds to the same parameters."""
    model = TrainableJasper(dims).eval()
    model.net.load_state_dict(folded)
    norms = [bn for group in (*model.sub_bn, *model.res_bn) for bn in group]
    sums = {
        bn: [torch.zeros(bn.num_features, dtype=torch.float64) for _ in range(2)] for bn in norms
    }
    frames = dict.fromkeys(norms, 0)

    def record(bn: nn.Module, inputs: tuple[Tensor, ...], _: Tensor) -> None:
        x = inputs[0][0].double()  # (C, T): one item, every frame valid
        sums[bn][0] += x.sum(dim=1)
        sums[bn][1] += x.square().sum(dim=1)
        frames[bn] += x.shape[1]

    for bn in norms:  # the identity while recording: every layer sees the folded model's input
        bn.running_mean.zero_()
        bn.running_var.fill_(1.0 - bn.eps)
        bn.weight.fill_(1.0)
        bn.bias.zero_()
    hooks = [bn.register_forward_hook(record) for bn in norms]
    try:
        for f in feats:
            model(f[None].float(), torch.tensor([f.shape[-1]]))
    finally:
        for h in hooks:
            h.remove()
    for bn in norms:
        mean = sums[bn][0] / frames[bn]
        var = (sums[bn][1] / frames[bn] - mean.square()).clamp(min=0.0)
        bn.running_mean.copy_(mean)
        bn.running_var.copy_(var)
        bn.weight.copy_(torch.sqrt(var + bn.eps))
        bn.bias.copy_(mean)
    return model


@torch.no_grad()
def precise_bn(
    model: TrainableJasper,
    data: SpeechData,
    features: FeatureConfig,
    batches: int = 100,
    batch_size: int = 32,
) -> None:
    """Replace every BatchNorm's running statistics by their average over `batches` batches
    of `data` (training-mode statistics of the final weights; no dropout, no gradient): the
    running averages lag behind weights that were still moving."""
    norms = [m for m in model.modules() if isinstance(m, MaskedBatchNorm1d)]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    dropout, model.dropout = model.dropout, 0.0
    model.train()
    order = np.random.default_rng(0).permutation(len(data)).tolist()
    order.sort(key=lambda i: data.audio[i].shape[0])  # similar lengths together: little padding
    chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    pick = np.random.default_rng(1).permutation(len(chunks))[:batches]
    for k in pick.tolist():
        feats, lengths, _, _ = speech_batch(data, chunks[k], features)
        model(feats, lengths)
    for m, momentum in zip(norms, momenta, strict=True):
        m.momentum = momentum
    model.dropout = dropout
    model.eval()


def ctc_text(ids: list[int], blank: int) -> str:
    """Greedy CTC: merge repeats, drop blanks, join labels."""
    out, prev = [], blank
    for i in ids:
        if i != prev and i != blank:
            out.append(LABELS[i])
        prev = i
    return " ".join("".join(out).split())


@dataclass
class QuartzNetConfig:
    preset: str = "quartznet-5x5"
    # items per step, over all data-parallel ranks together (each takes ~batch_size / N of
    # them): a config, its LR schedule and a step mean the same thing at any N
    batch_size: int = 64
    max_samples: int | None = None  # padded audio samples per batch; None: batch_size x 5 s
    lr: float = 1e-3
    warmup: int = 1000
    weight_decay: float = 1e-3
    beta2: float = 0.999  # AdamW's second-moment decay (Conformers train with 0.98)
    dropout: float = 0.1
    dither: float = 1e-5  # DLE's; kept in the exported features (speechrt seeds it per window)
    seed: int = 0
    amp: bool = True
    compile: bool = False  # torch.compile the model (dynamic shapes: lengths vary per batch)
    augment: str = "recordings"  # asr_data.AUGMENTS: "synthetic" (speed, gain, white noise,
    # SpecAugment) or "recordings" (+ silence, room, coloured noise, EQ, telephone, VTLP)


class QuartzNetTrainer(Checkpointed):
    """A trainable QuartzNet, its optimizer, data order and augmentation RNGs.

    Data-parallel (`world` > 1, the processes of speechrt_train.distributed): every rank draws
    the same global batch from the shared `Batches` order and trains on its share, items
    rank, rank + world, ... of it (lengths sorted: the shares are balanced); its loss is
    weighted by share / batch, so that one all_reduce summing the gradients (and the loss)
    gives every rank the global batch's, and the same clipping and AdamW step keeps the
    replicas bitwise identical. BatchNorm statistics are each rank's own (no SyncBN). The
    augmentation and dropout RNGs differ per rank: seeded seed + 1000 x rank (rank 0: as a
    single process)."""

    def __init__(
        self,
        train: SpeechData,
        val: SpeechData | None,
        config: QuartzNetConfig,
        device: str | torch.device = "cpu",
        augment: Augment | None | str = "config",
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.config, self.device = config, torch.device(device)
        self.rank, self.world = rank, world
        self.train, self.val = train, val
        if config.augment not in AUGMENTS:
            raise ValueError(f"augment {config.augment!r}: one of {', '.join(AUGMENTS)}")
        # "config": the config's preset; an Augment (or None: no augmentation) overrides it
        self.augment = AUGMENTS[config.augment] if isinstance(augment, str) else augment
        self.features = self.make_features()
        torch.manual_seed(config.seed)
        self.model = self.make_model().to(self.device)
        # the compiled module shares the parameters; state dicts stay those of self.model
        self.forward = torch.compile(self.model, dynamic=True) if config.compile else self.model
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            config.lr,
            betas=(0.9, config.beta2),
            weight_decay=config.weight_decay,
            **optimizer_options(self.device),
        )
        lengths = [a.shape[0] for a in train.audio]
        max_samples = config.max_samples or config.batch_size * self.features.sample_rate * 5
        self.batches = Batches(lengths, config.batch_size, config.seed, max_samples)
        seed = config.seed + 1000 * rank
        self.g = torch.Generator().manual_seed(seed)
        self.g_noise = torch.Generator(device=self.device).manual_seed(seed + 1)
        if rank:  # dropout (the global RNG): rank 0 goes on from the model's initialisation
            torch.manual_seed(seed + 2)
        self.step_count = 0

    blank = len(LABELS)  # CTC's blank: the last class

    def make_features(self) -> FeatureConfig:
        # DLE's features (16 kHz, 64 mels, 10 ms hop) with DLE's dither, in training and in the
        # exported model alike: teachers write exact digital silence, log(0 + 1e-20) features
        # otherwise, and the dither is what keeps such frames in the range the model has seen
        return FeatureConfig(dither=self.config.dither, narrowband=narrowband(self.augment))

    def make_model(self) -> nn.Module:
        """The trainable model: forward(feats, lengths) -> (log-probs, lengths) and
        output_frames(host ints) -> host ints."""
        dims = QuartzNetDims(**PRESETS[self.config.preset])
        if dims.n_classes != len(LABELS) + 1 or dims.n_feats != self.features.n_mels:
            raise ValueError("preset does not match the labels / features")
        return TrainableJasper(dims, self.config.dropout)

    def text_of(self, ids: list[int]) -> str:
        """Greedy CTC's text of one item's best classes per frame."""
        return ctc_text(ids, self.blank)

    def _autocast(self) -> Any:
        on = self.config.amp and self.device.type == "cuda"
        return torch.autocast(self.device.type, torch.bfloat16, enabled=on)

    def step(self) -> dict[str, Tensor]:
        self.model.train()
        with record_function("data"):
            batch = next(self.batches)
            index = batch[self.rank :: self.world]  # this rank's share (all of it: one process)
            if index:
                gens = (self.g, self.g_noise)
                seen: list[tuple[Tensor, list[int]]] = []  # the augmented audio (extra_loss)
                feats, lengths, targets, _, frames, n_targets = speech_batch_host(
                    self.train,
                    index,
                    self.features,
                    self.augment,
                    gens,
                    lambda audio, sizes: seen.append((audio, sizes)),
                )
                # CTC's lengths from the host: passed from the device, it would copy them back
                out_frames = self.model.output_frames(frames)
                out_lengths = torch.tensor(out_frames)
        for group in self.optimizer.param_groups:
            group["lr"] = (
                self.config.lr * warmup_rsqrt(self.step_count + 1, self.config.warmup)
            ) * self.lr_scale
        self.optimizer.zero_grad(set_to_none=True)
        extra: Tensor | None = None
        if index:
            with record_function("forward"):
                with self._autocast():
                    log_probs, _ = self.forward(feats, lengths)
                loss = F.ctc_loss(
                    log_probs.float().transpose(0, 1),
                    targets,
                    out_lengths,
                    torch.tensor(n_targets),
                    blank=self.blank,
                    reduction="mean",
                    zero_infinity=True,
                )
                extra = self.extra_loss(log_probs, out_frames, index, *seen[0])
                total = loss if extra is None else loss + extra
                if len(index) < len(batch):  # the share's part of the global batch's mean
                    total = total * (len(index) / len(batch))
                    loss = loss * (len(index) / len(batch))
            with record_function("backward"):
                total.backward()
            loss = loss.detach()
        else:  # a global batch of fewer items than ranks: this one adds nothing
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)
            loss = torch.zeros((), device=self.device)
        with record_function("optimizer"):
            if self.world > 1:
                all_reduce_([*(p.grad for p in self.model.parameters()), loss[None]])
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 100.0, foreach=True)
            self.optimizer.step()
        self.step_count += 1
        losses = {"ctc": loss}  # floats only when logged: no device sync per step
        if extra is not None:
            losses["extra"] = extra.detach()
        return losses

    def extra_loss(
        self,
        log_probs: Tensor,
        out_frames: list[int],
        index: list[int],
        audio: Tensor,
        sizes: list[int],
    ) -> Tensor | None:
        """A loss added to CTC's (none here): log_probs (B, T', C) of the items `index`,
        their valid output frames, and the augmented audio (B, N) they came from."""
        return None

    @torch.no_grad()
    def transcribe(self, data: SpeechData, batch_size: int = 32) -> list[str]:
        """Greedy CTC with the exported features (dither from a fixed seed: deterministic)."""
        self.model.eval()
        texts = []
        g = torch.Generator(device=self.device).manual_seed(0)
        for start in range(0, len(data), batch_size):
            index = list(range(start, min(start + batch_size, len(data))))
            feats, lengths = batch_features(
                [data.audio[i] for i in index], self.features, [g] * len(index)
            )
            with self._autocast():
                log_probs, out_lengths = self.model(feats, lengths)
            best = log_probs.argmax(dim=-1).cpu()
            for i, n in enumerate(out_lengths.cpu().tolist()):
                texts.append(self.text_of(best[i, :n].tolist()))
        return texts

    def evaluate(self) -> dict[str, float]:
        """Word error rate on the held-out voice's held-out sentences (greedy CTC)."""
        if self.val is None:
            return {}
        return {"val_wer": wer(self.val.texts, self.transcribe(self.val)), "val_n": len(self.val)}

    def load_exported(self, model_dir: str | Path, items: int = 96) -> float:
        """Warm-start from an exported recogniser (a model directory, e.g. the bundled
        src/speechrt/defaults/asr): its folded weights unfolded (`unfold`) with BatchNorm
        statistics from `items` training utterances spread over the data, augmented as in
        training (the statistics its BatchNorms ran on; own seeded generators), its step count
        from model.json. Returns its training seconds."""
        from speechrt.repo import load_component

        net, info = load_component(model_dir)
        if info.kind != "quartznet" or info.meta.get("preset") != self.config.preset:
            raise ValueError(
                f"{model_dir}: a {info.kind} {info.meta.get('preset')!r}, "
                f"not the {self.config.preset!r} this run trains"
            )
        picks = np.linspace(0, len(self.train) - 1, min(items, len(self.train))).astype(int)
        gens = (
            torch.Generator().manual_seed(self.config.seed + 7),
            torch.Generator(device=self.device).manual_seed(self.config.seed + 8),
        )
        feats = [
            speech_batch_host(self.train, [i], self.features, self.augment, gens)[0][0].cpu()
            for i in picks.tolist()
        ]
        model = unfold(net.state_dict(), self.model.net.dims, feats)
        self.model.load_state_dict(model.to(self.device).state_dict())
        self.step_count = int(info.source.get("steps", 0))
        return float(info.source.get("train_seconds", 0.0))

    def _state_parts(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "batches": self.batches,
            "g": self.g,
            "g_noise": self.g_noise,
        }

    def _weight_parts(self) -> dict[str, nn.Module]:
        return {"model": self.model}
