"""BatchNorm over each item's valid frames only, for the recognisers' trainers (QuartzNet,
FastConformer): padding never shifts the statistics. Inference folds it into the conv before it
(fold_bn)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from speechrt.models.jasper import conv_lengths


class Frames(NamedTuple):
    """One lengths tensor's frame masks: made once per forward and shared by every masked conv
    and BatchNorm that sees those lengths (each made its own: ~10 ops apiece, ~60 per step)."""

    lengths: Tensor  # (B,) valid frames
    pad: Tensor  # (B, 1, T) bool: frames at or past the length (masked_fill's mask)
    weight: Tensor  # (B, 1, T) float32: 1 / n on valid frames, 0 past them (a masked mean)
    n: Tensor  # () valid frames in the batch, at least 2

    @classmethod
    def of(cls, lengths: Tensor, frames: int) -> Frames:
        t = torch.arange(frames, device=lengths.device)
        pad = (t >= lengths[:, None])[:, None, :]
        keep = pad.logical_not().to(torch.float32)
        n = keep.sum().clamp(min=2)
        return cls(lengths, pad, keep / n, n)

    def after(self, conv: nn.Conv1d, frames: int) -> Frames:
        """The frames of `conv`'s output (`frames` long): these same ones when the conv keeps
        lengths (stride 1, 'same' padding: every conv but the prologue's), else new masks."""
        (p,), (k,), (d,), (s,) = conv.padding, conv.kernel_size, conv.dilation, conv.stride
        if s == 1 and 2 * p == d * (k - 1):
            return self
        return Frames.of(conv_lengths(self.lengths, conv), frames)


# a forward's running-statistics updates: (norm, batch mean (C,), variance (C,), n ())
Pending = list[tuple["MaskedBatchNorm1d", Tensor, Tensor, Tensor]]


class MaskedBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm over the frames t < lengths[b] (training); running statistics in eval."""

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:  # (B, C, T)
        if not self.training or lengths is None:
            return super().forward(x)
        pending: Pending = []
        out = self.normalize(x, Frames.of(lengths, x.shape[2]), pending)
        update_running_stats(pending)
        return out

    def normalize(self, x: Tensor, frames: Frames, pending: Pending) -> Tensor:
        """Training mode over `frames`' valid frames: x (B, C, T) -> (B, C, T); the running
        statistics' update goes to `pending` (`update_running_stats` applies a forward's at
        once: four foreach ops in all instead of seven ops per BatchNorm)."""
        xf = x.float()
        mean = (xf * frames.weight).sum(dim=(0, 2))
        centred = xf - mean.view(1, -1, 1)
        var = (centred.square() * frames.weight).sum(dim=(0, 2))
        pending.append((self, mean, var, frames.n))
        scale = self.weight / torch.sqrt(var + self.eps)
        out = torch.addcmul(self.bias.view(1, -1, 1), centred, scale.view(1, -1, 1))
        return out.to(x.dtype)


@torch.no_grad()
def update_running_stats(pending: Pending) -> None:
    """Each BatchNorm's running mean and (unbiased) variance move towards its batch's by its
    momentum (None: the plain average of every batch so far, as precise_bn uses it): four
    foreach ops per group of BatchNorms that saw the same frames with the same momentum."""
    if not pending:
        return
    torch._foreach_add_([m.num_batches_tracked for m, *_ in pending], 1)
    groups: list[tuple[Tensor, float, Pending]] = []  # by (frames, momentum)
    for m, mean, var, n in pending:
        momentum = m.momentum if m.momentum is not None else 1 / int(m.num_batches_tracked)
        group = next((g for n_, mom, g in groups if n_ is n and mom == momentum), None)
        if group is None:
            group = []
            groups.append((n, momentum, group))
        group.append((m, mean, var, n))
    for n, momentum, group in groups:
        unbiased = torch._foreach_div(torch._foreach_mul([v for *_, v, _ in group], n), n - 1)
        running = [t for m, *_ in group for t in (m.running_mean, m.running_var)]
        stats = [t for (_, mean, *_), var in zip(group, unbiased, strict=True) for t in (mean, var)]
        torch._foreach_lerp_(running, stats, momentum)


def fold_bn(weight: Tensor, bias: Tensor | None, bn: nn.BatchNorm1d) -> tuple[Tensor, Tensor]:
    # BN(W x + b) = s (W x + b - mean) + beta, s = gamma / sqrt(var + eps)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    b = bias if bias is not None else torch.zeros_like(bn.running_mean)
    return weight * scale[:, None, None], (b - bn.running_mean) * scale + bn.bias
