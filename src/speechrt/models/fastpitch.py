"""FastPitch 1.1 (NVIDIA DeepLearningExamples): text ids -> mel spectrogram, non-autoregressive.

Parameter names equal the DLE state dict, so a DLE checkpoint loads after dropping the
training-only `attention.*` aligner. Inference follows DLE's eager `FastPitch.infer`:

    ids -> word emb + [sin|cos] positions -> post-LN FFT encoder
        -> durations clamp(exp(x) - 1, 0, 75) -> pitch (+ transforms) -> + pitch_emb
        -> [energy on the pitch-augmented encoding -> + energy_emb]
        -> repeat each symbol floor(dur / pace + 0.5) times -> FFT decoder -> proj -> mel

DLE lets a shorter batch item's padding leak into its last valid positions: the second conv of
every FFT block and of every temporal predictor sees ReLU(bias + edge) past the item's end, and
a pitch shift moves padding too. We zero those positions (by item length), so a batched item
equals the item run alone, and the item run alone equals DLE exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.arch.fastpitch import MAX_DURATION, MAX_FRAMES, FastPitchDims
from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions

LJ_PITCH_STD = 67.24  # Hz; DLE's fallback when the pitch_std buffer is 0 (mean 218.14 unused here)


def _group(d: FastPitchDims, prefix: str) -> dict[str, Any]:
    """The fields named prefix + x, keyed by x: _group(d, "in_fft_")["n_heads"]."""
    n = len(prefix)
    return {f.name[n:]: getattr(d, f.name) for f in dataclasses.fields(d) if f.name[:n] == prefix}


class FastPitchOutput(NamedTuple):
    mel: Tensor  # (B, n_mels, T) float; frames beyond mel_lengths hold proj.bias, as in DLE
    mel_lengths: Tensor  # (B,) long
    durations: Tensor  # (B, L) predicted frames per symbol before pace and rounding
    pitch: Tensor  # (B, formants, L) normalised pitch (after the transforms)
    energy: Tensor | None  # (B, L), None without energy conditioning


def positional_embedding(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """(T,) float positions -> (T, 2 * len(inv_freq)): sines then cosines, not interleaved."""
    angles = torch.outer(positions, inv_freq)
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def lengths_mask(lengths: Tensor, max_len: int) -> Tensor:
    """(B,) -> (B, max_len) bool, True inside each item."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def regulate_length(
    durations: Tensor, enc: Tensor, pace: float = 1.0, max_frames: int = MAX_FRAMES
) -> tuple[Tensor, Tensor]:
    """Repeat symbol j of item b floor(durations[b, j] / pace + 0.5) times.

    durations (B, L) >= 0, enc (B, L, D) -> frames (B, T, D) (zero past each length), lengths (B,)
    """
    reps = (durations.float() / pace + 0.5).long()  # floor(x + 0.5): .5 rounds up, as DLE eager
    lengths = reps.sum(dim=1)
    longest = int(lengths.max()) if lengths.numel() else 0
    if longest > max_frames:
        raise SpeechRTError(
            f"fastpitch: an item would produce {longest} mel frames (limit {max_frames}); "
            "split the text or raise the pace"
        )
    ends = reps.cumsum(dim=1)  # (B, L): one past the last frame of each symbol
    frames = torch.arange(longest, device=enc.device)
    # frame t copies the symbol whose span contains it = how many spans end at or before t
    index = (ends[:, None, :] <= frames[None, :, None]).sum(dim=2)  # (B, T)
    index = index.clamp(max=enc.size(1) - 1)
    out = enc.gather(1, index[:, :, None].expand(-1, -1, enc.size(2)))
    return out.masked_fill(~lengths_mask(lengths, longest)[:, :, None], 0.0), lengths


class PositionalEmbedding(nn.Module):
    inv_freq: Tensor  # buffer, registered in __init__

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1 / (10000 ** (torch.arange(0.0, dim, 2.0) / dim)))

    def forward(self, length: int, dtype: torch.dtype) -> Tensor:  # -> (T, dim)
        positions = torch.arange(length, device=self.inv_freq.device).to(dtype)
        return positional_embedding(positions, self.inv_freq)


class MultiHeadAttn(nn.Module):
    """Self-attention over valid keys, then residual + LayerNorm (post-LN)."""

    def __init__(self, n_heads: int, d_model: int, d_head: int) -> None:
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head
        self.qkv_net = nn.Linear(d_model, 3 * n_heads * d_head)
        self.o_net = nn.Linear(n_heads * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, mask: Tensor, lengths: list[int] | None = None) -> Tensor:
        """x (B, T, D), mask (B, T) bool: valid keys. With `lengths` (batch-invariant mode, see
        speechrt.device), each item attends over its own first lengths[b] positions only, so the
        padded length T never enters the softmax or the attention-weighted sum."""
        B, T, _ = x.shape
        q, k, v = (
            t.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
            for t in self.qkv_net(x).chunk(3, dim=2)
        )
        if lengths is None:
            context = self._attend(q, k, v, mask)
        else:
            context = torch.zeros_like(q)  # padded query rows are zeroed by the caller anyway
            for b, n in enumerate(lengths):
                one = slice(b, b + 1)
                context[one, :, :n] = self._attend(q[one, :, :n], k[one, :, :n], v[one, :, :n],
                                                   mask[one, :n])  # fmt: skip
        context = context.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)
        return self.layer_norm(x + self.o_net(context))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """q, k, v (B, H, T, d_head), mask (B, T) -> context (B, H, T, d_head)."""
        scores = torch.matmul(q, k.transpose(2, 3)) * (1 / self.d_head**0.5)
        # finfo.min instead of -inf: identical where a key is valid, finite for an empty item
        scores = scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min)
        return torch.matmul(F.softmax(scores, dim=3), v)


class PositionwiseConvFF(nn.Module):
    def __init__(self, d_model: int, d_inner: int, kernel_size: int) -> None:
        super().__init__()
        pad = kernel_size // 2
        self.CoreNet = nn.Sequential(  # DLE's name; index 2 = second conv
            nn.Conv1d(d_model, d_inner, kernel_size, padding=pad),
            nn.ReLU(),
            nn.Conv1d(d_inner, d_model, kernel_size, padding=pad),
        )
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, inside: Tensor) -> Tensor:
        """x (B, T, D); inside (B, 1, T) float, 1 within the item.

        DLE masks only after the block, so its second conv sees ReLU(bias + edge) past the end
        of a shorter batch item; zeroing there changes nothing for a lone item.
        """
        conv1, relu, conv2 = self.CoreNet
        return self.layer_norm(x + conv2(relu(conv1(x.transpose(1, 2))) * inside).transpose(1, 2))


class TransformerLayer(nn.Module):
    def __init__(self, n_heads: int, d_model: int, d_head: int, d_inner: int, kernel: int) -> None:
        super().__init__()
        self.dec_attn = MultiHeadAttn(n_heads, d_model, d_head)
        self.pos_ff = PositionwiseConvFF(d_model, d_inner, kernel)

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        keep: Tensor,
        inside: Tensor,
        lengths: list[int] | None = None,
    ) -> Tensor:
        """x (B, T, D); mask (B, T) bool and keep (B, T, 1) float: valid keys / outputs;
        inside (B, 1, T) float: within the item; lengths: per-item attention (or None)."""
        x = self.dec_attn(x, mask, lengths) * keep
        return self.pos_ff(x, inside) * keep


class FFTransformer(nn.Module):
    """Encoder (with word embedding) or decoder stack of FFT blocks."""

    def __init__(self, d: FastPitchDims, prefix: str, embed: bool) -> None:
        super().__init__()
        dim = d.symbols_embedding_dim
        p = _group(d, prefix)
        self.word_emb = nn.Embedding(d.n_symbols, dim, padding_idx=d.padding_idx) if embed else None
        self.pos_emb = PositionalEmbedding(dim)
        self.layers = nn.ModuleList(
            TransformerLayer(
                p["n_heads"], dim, p["d_head"], p["conv1d_filter_size"], p["conv1d_kernel_size"]
            )
            for _ in range(p["n_layers"])
        )

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        inside: Tensor,
        conditioning: Tensor | int = 0,
        batch_invariant: bool = False,
    ) -> Tensor:
        """x (B, T) ids (encoder) or (B, T, D) frames (decoder) -> (B, T, D).

        mask (B, T) bool: DLE's mask (the encoder's excludes pad ids); inside (B, T): within item.
        batch_invariant: each item attends over its own length (see speechrt.device).
        """
        if self.word_emb is not None:
            x = self.word_emb(x)
        keep = mask[:, :, None].to(x.dtype)
        x = x + self.pos_emb(x.size(1), x.dtype)[None] * keep + conditioning
        inside_ = inside[:, None, :].to(x.dtype)
        lengths = inside.sum(1).tolist() if batch_invariant and x.size(0) > 1 else None
        for layer in self.layers:
            x = layer(x, mask, keep, inside_, lengths)
        return x


class ConvReLUNorm(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel_size, padding=kernel_size // 2)
        self.norm = nn.LayerNorm(c_out)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, T) -> (B, C_out, T)
        return self.norm(F.relu(self.conv(x)).transpose(1, 2)).transpose(1, 2)


class TemporalPredictor(nn.Module):
    """One (or `n_out`) float per symbol: [conv -> ReLU -> LayerNorm] x n -> Linear."""

    def __init__(self, d: FastPitchDims, prefix: str, n_out: int = 1) -> None:
        super().__init__()
        p = _group(d, prefix)
        c = [d.symbols_embedding_dim] + [p["filter_size"]] * p["n_layers"]  # channels
        pairs = zip(c[:-1], c[1:], strict=True)
        self.layers = nn.Sequential(*(ConvReLUNorm(*io, p["kernel_size"]) for io in pairs))
        self.fc = nn.Linear(c[-1], n_out)

    def forward(self, enc: Tensor, mask: Tensor, inside: Tensor) -> Tensor:
        """enc (B, L, D); mask (B, L, 1) DLE's symbol mask; inside (B, 1, L) = within the item.

        Masking with `inside` between layers is what DLE lacks; it changes nothing for a lone item.
        """
        x = (enc * mask).transpose(1, 2)
        for i, layer in enumerate(self.layers):
            x = layer(x if i == 0 else x * inside)
        return self.fc(x.transpose(1, 2)) * mask  # (B, L, n_out)


class FastPitch(nn.Module):
    """FastPitch 1.1 with DLE parameter names. See the module docstring for the data flow."""

    kind = "fastpitch"
    role = "acoustic"
    Dims = FastPitchDims
    pitch_mean: Tensor  # buffers, registered in __init__
    pitch_std: Tensor

    def __init__(self, dims: FastPitchDims) -> None:
        super().__init__()
        d = self.dims = dims
        dim = d.symbols_embedding_dim
        self.encoder = FFTransformer(d, "in_fft_", embed=True)
        self.speaker_emb = nn.Embedding(d.n_speakers, dim) if d.n_speakers > 1 else None
        self.duration_predictor = TemporalPredictor(d, "dur_predictor_")
        self.decoder = FFTransformer(d, "out_fft_", embed=False)
        n_pitch, k = d.pitch_conditioning_formants, d.pitch_embedding_kernel_size
        self.pitch_predictor = TemporalPredictor(d, "pitch_predictor_", n_pitch)
        self.pitch_emb = nn.Conv1d(n_pitch, dim, k, padding=(k - 1) // 2)
        self.register_buffer("pitch_mean", torch.zeros(1))  # Hz, training-set statistics
        self.register_buffer("pitch_std", torch.zeros(1))
        if d.energy_conditioning:
            self.energy_predictor = TemporalPredictor(d, "energy_predictor_")
            k = d.energy_embedding_kernel_size
            self.energy_emb = nn.Conv1d(1, dim, k, padding=(k - 1) // 2)
        self.proj = nn.Linear(dim, d.n_mel_channels)

    def _check_inputs(self, ids: Tensor, lengths: Tensor) -> None:
        if ids.dim() != 2 or lengths.shape != ids.shape[:1]:
            shapes = f"{tuple(ids.shape)} and {tuple(lengths.shape)}"
            raise SpeechRTError(f"fastpitch: expected ids (B, L) and lengths (B,), got {shapes}")
        integer = (torch.int32, torch.int64)
        if ids.dtype not in integer or lengths.dtype not in integer:
            raise SpeechRTError("fastpitch: ids and lengths must be integer tensors")
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < self.dims.n_symbols:
            raise SpeechRTError(f"fastpitch: symbol ids must lie in [0, {self.dims.n_symbols})")
        if lengths.numel() and not 1 <= int(lengths.min()) <= int(lengths.max()) <= ids.size(1):
            raise SpeechRTError(f"fastpitch: lengths must lie in [1, {ids.size(1)}]")

    def _pitch_std(self) -> Tensor | float:
        """Hz per unit of normalised pitch; DLE falls back to LJSpeech's when the buffer is 0."""
        return LJ_PITCH_STD if float(self.pitch_std[0]) == 0.0 else self.pitch_std[0]

    def infer(
        self,
        ids: Tensor,
        lengths: Tensor,
        options: SynthesisOptions | None = None,
        max_frames: int = MAX_FRAMES,
        batch_invariant: bool = False,
    ) -> FastPitchOutput:
        """ids (B, L) right-padded symbol ids, lengths (B,) -> FastPitchOutput.

        Uses options.pace, .speaker (one for the batch, as DLE) and the pitch transforms, which
        compose in DLE's CLI order: flatten (x0), amplify (x pitch_scale), shift (+ Hz / std).
        `batch_invariant`: each item attends over its own length (see speechrt.device).
        """
        opt = options or SynthesisOptions()
        self._check_inputs(ids, lengths)
        B, L = ids.shape
        if opt.speaker >= self.dims.n_speakers:
            raise SpeechRTError(
                f"fastpitch: speaker id {opt.speaker} out of range [0, {self.dims.n_speakers})"
            )
        conditioning: Tensor | int = 0
        if self.speaker_emb is not None:
            spk = torch.full((B,), opt.speaker, dtype=torch.long, device=ids.device)
            conditioning = self.speaker_emb(spk)[:, None, :] * self.dims.speaker_emb_weight

        inside_bl = lengths_mask(lengths, L)  # (B, L)
        sym_mask = inside_bl & (ids != self.dims.padding_idx)  # DLE's mask: ids != pad
        enc = self.encoder(ids, sym_mask, inside_bl, conditioning, batch_invariant)  # (B, L, D)
        dtype = enc.dtype
        mask = sym_mask[:, :, None].to(dtype)  # (B, L, 1)
        inside = inside_bl[:, None, :].to(dtype)  # (B, 1, L)

        log_dur = self.duration_predictor(enc, mask, inside).squeeze(2)
        durations = torch.clamp(torch.exp(log_dur) - 1, 0, MAX_DURATION)  # (B, L)

        pitch = self.pitch_predictor(enc, mask, inside).permute(0, 2, 1)  # (B, formants, L)
        if opt.pitch_flatten or opt.pitch_scale != 1.0 or opt.pitch_shift != 0.0:
            if opt.pitch_flatten:
                pitch = pitch * 0.0
            if opt.pitch_scale != 1.0:
                pitch = pitch * opt.pitch_scale
            if opt.pitch_shift != 0.0:
                pitch = pitch + opt.pitch_shift / self._pitch_std()
            pitch = pitch * inside  # DLE shifts padding too, which would leak into pitch_emb
        enc = enc + self.pitch_emb(pitch).transpose(1, 2)

        energy = None
        if self.dims.energy_conditioning:
            energy = self.energy_predictor(enc, mask, inside).squeeze(2)  # (B, L)
            enc = enc + self.energy_emb(energy[:, None, :]).transpose(1, 2)

        frames, mel_lengths = regulate_length(durations, enc, opt.pace, max_frames)
        frames_mask = lengths_mask(mel_lengths, frames.size(1))
        dec = self.decoder(frames, frames_mask, frames_mask, 0, batch_invariant)
        mel = self.proj(dec).permute(0, 2, 1)  # (B, n_mels, T)
        return FastPitchOutput(mel, mel_lengths, durations, pitch, energy)

    forward = infer

    @torch.no_grad()
    def generate_mel(
        self,
        ids: Tensor,
        lengths: Tensor,
        options: SynthesisOptions,
        seeds: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """ids (B, L), lengths (B,) -> mel (B, n_mels, T), mel_lengths (B,).

        FastPitch draws no random numbers, so `seeds` is accepted and unused.
        """
        out = self.infer(ids, lengths, options)
        return out.mel, out.mel_lengths
