"""FastSpeech (NVIDIA DeepLearningExamples CUDA-Optimized/FastSpeech): text ids -> mel, parallel.

    ids -> word_emb + sinusoid positions (1-based, 0 = padding) -> phoneme-side FFT blocks
        -> duration predictor: d = clamp(exp(x) - 1, min 0); repeats = round(d * alpha),
           alpha = 1 / pace (torch.round: half to even)
        -> length regulator (repeat each symbol's encoding) -> + positions -> mel-side FFT blocks
        -> mel_linear -> mel (B, n_mels, T), cropped to max_seq_len frames

FFT block (post-LN): x = LN(x + fc(attention(x))) * mask; x = LN(x + conv2(relu(conv1(x)))) * mask.
Attention: one linear gives q, k, v per head (d_head 64), scores / sqrt(d_head), padded keys
filled with -65504. Where DLE lets padding leak into valid positions (the second conv of the FFT
feed-forward and of the duration predictor) we zero padding first, so a batched item equals the
item run alone, which equals DLE.

Checkpoint: trainer.py's {'step', 'model': nn.DataParallel state dict ('module.' keys), 'optim'};
no config in it (dims from the weight shapes, else hparams/base.yaml's). Parameter names here
equal DLE's; the frozen sinusoid tables (`*.position.weight`) are recomputed, not stored.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.arch.fastspeech import FastSpeechDims
from speechrt.errors import SpeechRTError
from speechrt.models.inputs import check_ids
from speechrt.options import SynthesisOptions

MASK_VALUE = -65504.0  # DLE's attention fill for padded keys (fp16 min)


def sinusoid_table(n_position: int, d: int) -> Tensor:
    """(n_position, d): [sin, cos] interleaved over even / odd dims; row 0 (padding) is zero."""
    pos = torch.arange(n_position, dtype=torch.float64).unsqueeze(1)
    rate = torch.pow(10000.0, 2 * (torch.arange(d) // 2).double() / d)
    angle = pos / rate
    table = torch.where(torch.arange(d) % 2 == 0, torch.sin(angle), torch.cos(angle))
    table[0] = 0.0
    return table.float()


class MultiHeadAttention(nn.Module):
    """x (B, T, D), key_pad (B, T) bool (True = padding) -> LN(x + fc(attention)) (B, T, D)."""

    def __init__(self, d_model: int, n_head: int, d_head: int) -> None:
        super().__init__()
        self.n_head, self.d_head = n_head, d_head
        self.linear = nn.Linear(d_model, n_head * 3 * d_head)
        self.layer_norm = nn.LayerNorm(d_model)
        self.fc = nn.Linear(n_head * d_head, d_model)

    def forward(self, x: Tensor, key_pad: Tensor) -> Tensor:
        b, t, _ = x.shape
        h, dk = self.n_head, self.d_head
        qkv = self.linear(x).view(b, t, h, 3 * dk).permute(2, 0, 1, 3).reshape(h * b, t, 3 * dk)
        q, k, v = qkv[..., :dk], qkv[..., dk : 2 * dk], qkv[..., 2 * dk :]
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(dk)  # (H * B, T, T), head-major
        scores = scores.masked_fill(key_pad.repeat(h, 1).unsqueeze(1), MASK_VALUE)
        out = torch.bmm(torch.softmax(scores, dim=2), v)
        out = out.view(h, b, t, dk).permute(1, 2, 0, 3).reshape(b, t, h * dk)
        return self.layer_norm(self.fc(out) + x)


class PositionwiseFeedForward(nn.Module):
    """x (B, T, D), keep (B, T, 1) -> LN(x + w_2(relu(w_1(x)))); padding zeroed before w_2."""

    def __init__(self, d_model: int, d_inner: int, kernel: int, padding: int) -> None:
        super().__init__()
        self.w_1 = nn.Conv1d(d_model, d_inner, kernel, padding=padding)
        self.w_2 = nn.Conv1d(d_inner, d_model, kernel, padding=padding)
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        y = F.relu(self.w_1(x.transpose(1, 2))) * keep.transpose(1, 2)
        return self.layer_norm(self.w_2(y).transpose(1, 2) + x)


class FFTBlock(nn.Module):
    def __init__(self, d: FastSpeechDims, n_head: int, d_inner: int) -> None:
        super().__init__()
        self.slf_attn = MultiHeadAttention(d.d_model, n_head, d.d_head)
        self.pos_ffn = PositionwiseFeedForward(
            d.d_model, d_inner, d.fft_conv1d_kernel, d.fft_conv1d_padding
        )

    def forward(self, x: Tensor, keep: Tensor, key_pad: Tensor) -> Tensor:
        x = self.slf_attn(x, key_pad) * keep
        return self.pos_ffn(x, keep) * keep


class FFTBlocks(nn.Module):
    """x (B, T, D) with positions already added, keep (B, T, 1) float -> (B, T, D)."""

    def __init__(self, d: FastSpeechDims, n_layers: int, n_head: int, d_inner: int) -> None:
        super().__init__()
        self.layer_stack = nn.ModuleList(FFTBlock(d, n_head, d_inner) for _ in range(n_layers))

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        key_pad = keep.squeeze(2) == 0
        for layer in self.layer_stack:
            x = layer(x, keep, key_pad)
        return x


class DurationPredictor(nn.Module):
    """x (B, L, D), keep (B, L, 1) -> log-domain durations (B, L), 0 at padding."""

    def __init__(self, d: FastSpeechDims) -> None:
        super().__init__()
        f, k = d.duration_predictor_filter_size, d.duration_predictor_kernel_size
        self.conv1d_1 = nn.Conv1d(d.d_model, f, k, padding=(k - 1) // 2)
        self.layer_norm_1 = nn.LayerNorm(f)
        self.conv1d_2 = nn.Conv1d(f, f, k, padding=(k - 1) // 2)
        self.layer_norm_2 = nn.LayerNorm(f)
        self.linear_layer = nn.Linear(f, 1)

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        y = self.conv1d_1((x * keep).transpose(1, 2)).transpose(1, 2)
        y = self.layer_norm_1(F.relu(y)) * keep  # zeroed: conv1d_2 must not see padding
        y = self.layer_norm_2(F.relu(self.conv1d_2(y.transpose(1, 2)).transpose(1, 2)))
        return (self.linear_layer(y) * keep).squeeze(2)


class LengthRegulator(nn.Module):
    def __init__(self, d: FastSpeechDims) -> None:
        super().__init__()
        self.duration_predictor = DurationPredictor(d)


class FastSpeech(nn.Module):
    """DLE FastSpeech; `generate_mel` is the acoustic-model interface."""

    kind = "fastspeech"
    role = "acoustic"
    Dims = FastSpeechDims
    position: Tensor  # buffer (sinusoid table), registered in __init__

    def __init__(self, dims: FastSpeechDims) -> None:
        super().__init__()
        d = dims
        self.dims = d
        self.word_emb = nn.Embedding(d.n_symbols, d.d_model, padding_idx=0)
        self.phoneme_side = FFTBlocks(
            d, d.phoneme_side_n_layer, d.phoneme_side_head, d.phoneme_side_conv1d_filter_size
        )
        self.length_regulator = LengthRegulator(d)
        self.mel_side = FFTBlocks(
            d, d.mel_side_n_layer, d.mel_side_head, d.mel_side_conv1d_filter_size
        )
        self.mel_linear = nn.Linear(d.d_model, d.n_mels)
        self.register_buffer("position", sinusoid_table(d.max_seq_len + 1, d.d_model), False)

    def _positions(self, lengths: Tensor, t: int) -> tuple[Tensor, Tensor]:
        """-> positions (B, t) 1-based with 0 at padding, keep (B, t, 1) in the model dtype."""
        valid = torch.arange(t, device=lengths.device) < lengths.unsqueeze(1)
        pos = (torch.arange(1, t + 1, device=lengths.device) * valid).long()
        return pos, valid.unsqueeze(2).to(self.position.dtype)

    def durations(self, ids: Tensor, lengths: Tensor, pace: float = 1.0) -> tuple[Tensor, Tensor]:
        """ids (B, L), lengths (B,) -> encoder output (B, L, D), repeats (B, L) int64."""
        pos, keep = self._positions(lengths, ids.shape[1])
        x = self.word_emb(ids) + F.embedding(pos, self.position)
        x = self.phoneme_side(x, keep)
        log_dur = self.length_regulator.duration_predictor(x, keep)
        dur = torch.clamp_min(torch.exp(log_dur) - 1, 0)
        return x, torch.round(dur.float() * (1.0 / pace)).long()  # DLE: alpha = 1 / pace

    @torch.no_grad()
    def generate_mel(
        self,
        ids: Tensor,
        lengths: Tensor,
        options: SynthesisOptions,
        seeds: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """ids (B, L), lengths (B,) -> mel (B, n_mels, T) zero-padded, mel_lengths (B,) int64.

        FastSpeech draws no random numbers: `seeds` is accepted and unused.
        """
        d = self.dims
        w = self.mel_linear.weight
        ids, lengths = check_ids(ids, lengths, d.n_symbols)
        if lengths.max() > d.max_seq_len:
            raise SpeechRTError(f"fastspeech: at most {d.max_seq_len} symbols per item")
        ids, lengths = ids.to(w.device), lengths.to(w.device)
        x, repeats = self.durations(ids, lengths, options.pace)
        mel_lengths = repeats.sum(1).clamp(max=d.max_seq_len)  # DLE crops at max_seq_len
        t = int(mel_lengths.max())
        if t == 0:
            return w.new_zeros(ids.shape[0], d.n_mels, 0), mel_lengths
        # length regulator: output frame j of item b shows the symbol whose repeats span j
        ends = repeats.cumsum(1)  # (B, L)
        frames = torch.arange(t, device=w.device).expand(ids.shape[0], t).contiguous()
        src = torch.searchsorted(ends, frames, right=True).clamp(max=ids.shape[1] - 1)
        y = torch.gather(x, 1, src.unsqueeze(2).expand(-1, -1, x.shape[2]))
        pos, keep = self._positions(mel_lengths, t)
        y = y * keep + F.embedding(pos, self.position)
        y = self.mel_side(y, keep)
        mel = (self.mel_linear(y) * keep).transpose(1, 2)
        return mel, mel_lengths
