"""Checks shared by the models that take padded symbol-id batches."""

from __future__ import annotations

import torch
from torch import Tensor

from speechrt.errors import SpeechRTError


def check_ids(ids: Tensor, lengths: Tensor, n_symbols: int) -> tuple[Tensor, Tensor]:
    """Validate ids (B, L) + lengths (B,); returns ids int64 trimmed to the longest item and
    lengths int64 on the CPU. Ids past an item's length are not checked (any padding value)."""
    if ids.dim() != 2 or ids.shape[0] == 0:
        raise SpeechRTError(f"expected ids of shape (B, L) with B >= 1, got {tuple(ids.shape)}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise SpeechRTError(f"ids must be an integer tensor, got {ids.dtype}")
    lengths = lengths.detach().to("cpu", torch.long)
    if lengths.shape != (ids.shape[0],):
        raise SpeechRTError(
            f"lengths must have shape ({ids.shape[0]},), got {tuple(lengths.shape)}"
        )
    if lengths.min() < 1 or lengths.max() > ids.shape[1]:
        raise SpeechRTError(f"lengths must lie within [1, {ids.shape[1]}], got {lengths.tolist()}")
    ids = ids[:, : int(lengths.max())].long()
    inside = torch.arange(ids.shape[1], device=ids.device) < lengths.to(ids.device)[:, None]
    valid = ids[inside]
    if valid.numel() and (valid.min() < 0 or valid.max() >= n_symbols):
        raise SpeechRTError(f"symbol ids must lie within [0, {n_symbols})")
    return ids, lengths
