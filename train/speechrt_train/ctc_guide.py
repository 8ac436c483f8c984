"""Alignment guidance for a FastConformer's first steps, from a character CTC model made here.

A CTC model trained from scratch first learns the pieces' priors and emits blanks; it finds
where in the audio each piece lies only after many steps (CTC's plateau). The bundled QuartzNet
already knows where each character is. For each training batch (the same augmented audio):

    QuartzNet (its own features) -> char log-probs (B, T_q, 29)
    -> the best CTC path spelling the transcript (`viterbi_first_frames`, batched on the device)
    -> each character's first frame -> each piece's first character's frame, scaled to the
       FastConformer's frames (x stride_q / 8) and pushed later where pieces would collide
    -> frame targets (B, T'): the piece on its frame, blank elsewhere, ignored past the length

The trainer adds weight x NLL of those targets to the CTC loss, the weight falling linearly
to zero over `steps`; after that the guide costs nothing. Only data made here is used: the
guide is the bundled recogniser, trained on this corpus.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from speechrt.audio.features import FeatureConfig
from speechrt_train.asr_data import batched_features

IGNORE = -100  # F.nll_loss's ignore_index: frames past an item's length, items that do not fit


def viterbi_first_frames(
    log_probs: Tensor, lengths: Tensor, targets: Tensor, target_lengths: Tensor, blank: int
) -> Tensor:
    """The most likely CTC path of each item that spells its targets -> the first frame of each
    target on it.

    log_probs (B, T, C), lengths (B,) valid frames, targets (B, L) padded (any id past
    target_lengths), target_lengths (B,) -> (B, L) long: frame of target j's first emission,
    -1 past target_lengths and for items with no such path (too few frames)."""
    B, T, _ = log_probs.shape
    L = targets.shape[1]
    S = 2 * L + 1
    dev = log_probs.device
    ext = torch.full((B, S), blank, dtype=torch.long, device=dev)
    ext[:, 1::2] = targets
    skip = torch.zeros(B, S, dtype=torch.bool, device=dev)  # s - 2 -> s allowed
    skip[:, 3::2] = targets[:, 1:] != targets[:, :-1]
    neg = torch.tensor(float("-inf"), device=dev)
    dp = torch.full((B, S), float("-inf"), device=dev)
    first = log_probs[:, 0].float().gather(1, ext)
    dp[:, :2] = first[:, :2]
    back = torch.zeros(T, B, S, dtype=torch.uint8, device=dev)  # 0 stay, 1 from s-1, 2 s-2
    for t in range(1, T):
        one = F.pad(dp[:, :-1], (1, 0), value=float("-inf"))
        two = torch.where(skip, F.pad(dp[:, :-2], (2, 0), value=float("-inf")), neg)
        best, arg = torch.stack([dp, one, two]).max(0)
        active = (t < lengths)[:, None]
        dp = torch.where(active, best + log_probs[:, t].float().gather(1, ext), dp)
        back[t] = torch.where(active, arg, 0).to(torch.uint8)
    # the path ends in the last target or the blank after it
    rows = torch.arange(B, device=dev)
    end = 2 * target_lengths
    last_blank, last_target = dp[rows, end], dp[rows, (end - 1).clamp(min=0)]
    s = torch.where(last_target > last_blank, end - 1, end)
    ok = torch.maximum(last_blank, last_target) > float("-inf")
    path = torch.empty(T, B, dtype=torch.long, device=dev)
    for t in range(T - 1, -1, -1):
        path[t] = s
        s = s - back[t, rows, s].long()
    # first frame of each odd state 2j + 1: the smallest t whose state is it
    frames = torch.arange(T, device=dev)[:, None].expand(T, B)
    valid = (path % 2 == 1) & (frames < lengths[None])
    j = torch.where(valid, (path - 1) // 2, L)  # L: a dump column
    out = torch.full((B, L + 1), T, dtype=torch.long, device=dev)
    out.scatter_reduce_(1, j.T, frames.T.contiguous(), "amin")
    out = out[:, :L]
    keep = ok[:, None] & (torch.arange(L, device=dev)[None] < target_lengths[:, None])
    return torch.where(keep & (out < T), out, -1)


def piece_anchors(pieces: list[str], text: str) -> list[int] | None:
    """For SentencePiece pieces ("▁" marks a word's start) spelling `text` (single spaces),
    the index in `text` of each piece's first character (a lone "▁": the next one's);
    None where the pieces do not spell the text."""
    spelled = "".join(pieces).replace("▁", " ")
    if spelled != " " + text:
        return None
    anchors, at = [], 0  # at: the piece's start in " " + text
    for p in pieces:
        k = at + len(p) - len(p.lstrip("▁"))  # past its word-start mark (a lone one: the next)
        anchors.append(k - 1)
        at += len(p)
    return anchors


def place(anchor_frames: list[int], ids: list[int], n_frames: int, blank: int) -> list[int] | None:
    """Frame targets for one item: piece ids[k] at anchor_frames[k], moved later where it would
    share a frame with the piece before (two frames on when it repeats it: CTC needs a blank
    between), blank elsewhere; None where the pieces run past n_frames."""
    row = [blank] * n_frames
    prev, prev_id = -1, None
    for f, i in zip(anchor_frames, ids, strict=True):
        f = max(f, prev + (2 if i == prev_id else 1))
        if f >= n_frames:
            return None
        row[f] = i
        prev, prev_id = f, i
    return row


@dataclass
class GuideItem:
    chars: list[int]  # the transcript's character labels (the guide's)
    anchors: list[int]  # per piece: index of its first character in chars
    ids: list[int]  # the piece ids


class Guide:
    """The frame targets of a batch from a character CTC recogniser's alignments."""

    def __init__(
        self,
        model_dir: str | Path,
        texts: list[str],
        encode: Callable[[str], tuple[list[str], list[int]]],
        device: torch.device,
        out_stride: int,
        out_blank: int,
    ) -> None:
        """`encode(text) -> (piece strings, piece ids)`; `out_stride`: feature frames per
        output frame of the model guided (8), `out_blank` its blank class."""
        from speechrt.repo import load_component

        self.out_blank = out_blank
        self.net, info = load_component(model_dir, device)
        if info.kind not in ("jasper", "quartznet"):
            raise ValueError(f"{model_dir}: a {info.kind}, not a character CTC model (QuartzNet)")
        labels = info.meta["labels"]
        self.blank = len(labels)
        self.features = FeatureConfig(**info.meta["features"])
        self.ratio = math.prod(self.net.dims.strides) / out_stride  # guide frame -> output frame
        self.g = torch.Generator(device=device).manual_seed(0)  # the guide's dither
        index = {c: i for i, c in enumerate(labels)}
        self.items: list[GuideItem | None] = []
        for text in texts:
            text = " ".join(text.split())
            pieces, ids = encode(text)
            anchors = piece_anchors(pieces, text)
            ok = anchors is not None and all(c in index for c in text)
            self.items.append(GuideItem([index[c] for c in text], anchors, ids) if ok else None)

    @torch.no_grad()
    def targets(
        self, audio: Tensor, sizes: list[int], index: list[int], out_frames: list[int], width: int
    ) -> Tensor:
        """audio (B, N) padded (as the model trained sees it), sizes, the items' dataset
        indices, their valid output frames and the outputs' padded count -> (B, width) long
        targets (IGNORE where none)."""
        feats, lengths = batched_features(audio, sizes, self.features, self.g)
        with torch.autocast(audio.device.type, torch.bfloat16, enabled=audio.is_cuda):
            log_probs, q_lengths = self.net(feats, lengths)
        items = [self.items[i] for i in index]
        L = max([len(it.chars) for it in items if it is not None] + [1])
        chars = torch.zeros(len(items), L, dtype=torch.long)
        n_chars = torch.zeros(len(items), dtype=torch.long)
        for b, it in enumerate(items):
            if it is not None:
                chars[b, : len(it.chars)] = torch.tensor(it.chars)
                n_chars[b] = len(it.chars)
        dev = audio.device
        first = viterbi_first_frames(
            log_probs.float(), q_lengths, chars.to(dev), n_chars.to(dev), self.blank
        ).cpu()
        out = torch.full((len(items), width), IGNORE, dtype=torch.long)
        for b, it in enumerate(items):
            if it is None or n_chars[b] == 0 or bool((first[b, : n_chars[b]] < 0).any()):
                continue
            frames = [int(f * self.ratio) for f in first[b, it.anchors].tolist()]
            row = place(frames, it.ids, out_frames[b], self.out_blank)
            if row is not None:
                out[b, : out_frames[b]] = torch.tensor(row)
        return out.to(dev)


def guide_loss(log_probs: Tensor, targets: Tensor) -> Tensor:
    """Mean NLL of the frame targets: log_probs (B, T', V) float, targets (B, T') with IGNORE;
    0 where nothing is targeted."""
    if bool((targets == IGNORE).all()):
        return log_probs.sum() * 0.0
    return F.nll_loss(log_probs.transpose(1, 2), targets, ignore_index=IGNORE)
