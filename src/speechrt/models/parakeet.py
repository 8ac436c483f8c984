"""Parakeet: NeMo's FastConformer encoder with CTC and transducer (RNN-T / TDT) heads.

    features (B, n_mels, T) -> dw_striding subsampling (x8) -> x * sqrt(d_model) (xscaling)
    -> n_layers x [ x + FF/2 -> x + rel-pos MHSA -> x + conv module -> x + FF/2 -> LayerNorm ]
    -> encoded (B, T', d_model)
    CTC:        1x1 conv -> log-softmax                     -> log_probs (B, T', vocab + 1)
    transducer: joint(enc(f_t) + pred(g_u)) -> ReLU -> linear -> token (+ TDT duration) scores

Masks (what makes an item's valid frames independent of its padding and its batch-mates): the
subsampling zeroes frames past the running length before each strided conv; attention scores
of padded keys are -10000 (NeMo's value); the conv module zeroes padded frames before its
depthwise conv. Frames past an item's length carry values nobody reads.

Relative positions as Transformer-XL (NeMo's RelPositionalEncoding): the score of query i and
key j adds (q_i + pos_bias_v) . linear_pos(pe(i - j)), pe sinusoidal over i - j = T-1 ... -(T-1).
Limited-context ("local") attention is the same score restricted to a band of keys around the
query (NeMo's rel_pos_local_attn computes that band in overlapping chunks; the values agree).
BatchNorm of the conv module is folded into the depthwise conv at conversion.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.arch.parakeet import (
    ParakeetCTCDims,
    ParakeetDims,
    ParakeetTransducerDims,
    encoder_frames,
    halve,
)

MASKED = -10000.0  # NeMo's INF_VAL: the score of a key a query may not see


def valid_mask(lengths: Tensor, T: int) -> Tensor:
    """(B,) lengths -> (B, T) bool, True on valid frames."""
    return torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]


def strided_taps(x: Tensor, conv: nn.Conv2d) -> Tensor:
    """conv(x) for a 3x3, stride-2, padding-1 conv with one input channel or one per group
    (depthwise), from the input shifted by each of its 9 taps and taken every other row and
    column. x: (B, C_in, H, W) -> (B, C_out, H', W')

    One input channel: the 9 shifted planes (B, H', W', 9) times the weights (9, C_out), a
    GEMM whose output is channels-last. Depthwise: the weighted sum of the 9 shifted planes."""
    B, C, H, W = x.shape
    Ho, Wo = (H - 1) // 2 + 1, (W - 1) // 2 + 1
    xp = F.pad(x, (1, 1, 1, 1))
    parts = [
        xp[:, :, kh : kh + 2 * Ho - 1 : 2, kw : kw + 2 * Wo - 1 : 2]
        for kh in range(3)
        for kw in range(3)
    ]
    w = conv.weight.reshape(conv.out_channels, 9)  # (C_out, 9): one input channel per output
    if C == 1:
        planes = torch.stack([p[:, 0] for p in parts], -1)  # (B, H', W', 9)
        return F.linear(planes, w, conv.bias).permute(0, 3, 1, 2)  # (B, C_out, H', W') view
    out = w[None, :, 0, None, None] * parts[0]
    for k, part in enumerate(parts[1:], 1):
        out = out + w[None, :, k, None, None] * part
    return out if conv.bias is None else out + conv.bias[None, :, None, None]


def depthwise_taps(x: Tensor, conv: nn.Conv1d, time_dim: int = 2) -> Tensor:
    """conv(x) for a depthwise 1-D conv with 'same' padding, as the weighted sum of its k
    shifted copies of x (the cuda runner compiles it into the layer's kernels; a separate
    depthwise kernel took 5.6 ms of 24 layers at batch 128).
    x: (B, C, T) -> (B, C, T), or with time_dim=1 (B, T, C) -> (B, T, C)"""
    k = conv.kernel_size[0]
    if time_dim == 1:
        return depthwise_taps(x.transpose(1, 2), conv).transpose(1, 2)
    T = x.shape[2]
    xp = F.pad(x, ((k - 1) // 2, k // 2))
    w = conv.weight[:, 0]  # (C, k)
    out = w[None, :, 0, None] * xp[:, :, :T]
    for i in range(1, k):
        out = out + w[None, :, i, None] * xp[:, :, i : i + T]
    return out if conv.bias is None else out + conv.bias[None, :, None]


class Subsampling(nn.Module):
    """dw_striding: conv 3x3/2 -> ReLU, then (depthwise 3x3/2 -> pointwise -> ReLU) x (n - 1),
    over (time, mel) as a 2-D image, then a linear over channels x mels per frame."""

    def __init__(self, d: ParakeetDims) -> None:
        super().__init__()
        c, n = d.subsampling_channels, d.subsampling_layers
        convs: list[nn.Conv2d] = [nn.Conv2d(1, c, 3, 2, 1)]
        for _ in range(n - 1):
            convs += [nn.Conv2d(c, c, 3, 2, 1, groups=c), nn.Conv2d(c, c, 1)]
        self.convs = nn.ModuleList(convs)
        mels = d.n_mels
        for _ in range(n):
            mels = (mels - 1) // 2 + 1
        self.out = nn.Linear(c * mels, d.d_model)
        # the strided convs as 9 shifted, weighted slices (strided_taps): compiled, one pass
        # over memory; cuDNN's kernels for a 1-channel and a depthwise 3x3 are slow (cuda)
        self.taps = False
        # the cuda runner's kernels (speechrt.runtime.subsampling_stem), forward_kernels: the
        # first conv, ReLU, mask and depthwise conv in one, (x (B, T, F), lengths, w1 (C, 9),
        # b1, wd (C, 9), bd) -> (B, T/4, F/4, C); each later ReLU, mask and depthwise conv in
        # one, (x (B, H, W, C), lengths, wd, bd) -> (B, H/2, W/2, C). None: the convs one by one
        self.stem: Callable[..., Tensor] | None = None
        self.depthwise: Callable[..., Tensor] | None = None

    def forward(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, T, n_mels), lengths (B,) -> (B, T', d_model), (B,)"""
        if self.stem is not None:
            return self.forward_kernels(x, lengths)
        x = x[:, None]  # (B, 1, T, F)
        for i, conv in enumerate(self.convs):
            assert isinstance(conv, nn.Conv2d)
            if conv.stride[0] == 2:  # zero the frames past the length, then halve it
                x = x * valid_mask(lengths, x.shape[2])[:, None, :, None].to(x.dtype)
                lengths = halve(lengths)
                x = strided_taps(x, conv) if self.taps else conv(x)
            else:
                x = conv(x)
            if i == 0 or conv.stride[0] == 1:  # after the first conv and each pointwise
                x = F.relu(x)
        x = x * valid_mask(lengths, x.shape[2])[:, None, :, None].to(x.dtype)
        B, C, T, Fr = x.shape
        return self.out(x.transpose(1, 2).reshape(B, T, C * Fr)), lengths  # channel-major

    def forward_kernels(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """forward on the stem and depthwise kernels, channels last: each pointwise conv a
        GEMM whose ReLU the next kernel applies as it reads."""
        assert self.stem is not None and self.depthwise is not None
        convs = [c for c in self.convs if isinstance(c, nn.Conv2d)]
        c1, dw = convs[0], convs[1]
        x = self.stem(x, lengths, c1.weight.flatten(1), c1.bias, dw.weight.flatten(1), dw.bias)
        lengths = halve(halve(lengths))  # x: (B, T/4, F/4, C)
        pw = convs[2]
        x = F.linear(x, pw.weight.flatten(1), pw.bias)
        for dw, pw in zip(convs[3::2], convs[4::2], strict=True):  # (depthwise, pointwise)
            x = self.depthwise(x, lengths, dw.weight.flatten(1), dw.bias)
            lengths = halve(lengths)
            x = F.linear(x, pw.weight.flatten(1), pw.bias)
        x = F.relu(x) * valid_mask(lengths, x.shape[1])[:, :, None, None].to(x.dtype)
        B, T, Fr, C = x.shape
        return self.out(x.transpose(2, 3).reshape(B, T, C * Fr)), lengths  # channel-major


def relative_positions(T: int, d_model: int, device: torch.device) -> Tensor:
    """Sinusoidal encodings of relative positions T-1 ... -(T-1): (2T - 1, d_model) float32;
    sin on even channels, cos on odd (NeMo's PositionalEncoding.create_pe)."""
    pos = torch.arange(T - 1, -T, -1, dtype=torch.float32, device=device)[:, None]
    div = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=device)
        * -(math.log(10000.0) / d_model)
    )
    pe = torch.stack((torch.sin(pos * div), torch.cos(pos * div)), dim=-1)  # (2T-1, D/2, 2)
    return pe.reshape(2 * T - 1, d_model)


def rel_shift(x: Tensor) -> Tensor:
    """(B, H, T, 2T - 1) scores against positions T-1 ... -(T-1) -> (B, H, T, T) where
    [i, j] holds the score of relative position i - j (Transformer-XL's shift)."""
    B, H, T, P = x.shape
    x = F.pad(x, (1, 0)).view(B, H, P + 1, T)
    return x[:, :, 1:].reshape(B, H, T, P)[..., :T]


class RelPositionAttention(nn.Module):
    qkv_weight: Tensor  # buffers of the kernel path (use_kernel)
    qkv_bias: Tensor

    def __init__(self, d: ParakeetDims) -> None:
        super().__init__()
        D, H = d.d_model, d.n_heads
        self.h, self.d_k = H, D // H
        self.linear_q, self.linear_k = nn.Linear(D, D), nn.Linear(D, D)
        self.linear_v, self.linear_out = nn.Linear(D, D), nn.Linear(D, D)
        self.linear_pos = nn.Linear(D, D, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(H, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(H, self.d_k))
        self.context = -1 if d.att_context is None else d.att_context
        # the cuda runner's fused attention (speechrt.runtime.relpos_attention): (q, k, v, bd,
        # bias_pos, keys, pos_bias_u, scale, context) -> (B, T, H, d_k); None: the reference.
        # Set by use_kernel, with the path's one q, k, v GEMM
        self.kernel: Callable[..., Tensor] | None = None

    def use_kernel(self, kernel: Callable[..., Tensor] | None) -> None:
        """Attention by `kernel` (None: the reference), its q, k and v from one GEMM over
        linear_q's, linear_k's and linear_v's weights and biases concatenated (qkv_weight
        (3D, D), qkv_bias (3D,): buffers not saved, copied from the weights now)."""
        self.kernel = kernel
        lin = (self.linear_q, self.linear_k, self.linear_v)
        with torch.no_grad():
            w, b = torch.cat([m.weight for m in lin]), torch.cat([m.bias for m in lin])
        self.register_buffer("qkv_weight", w, persistent=False)
        self.register_buffer("qkv_bias", b, persistent=False)

    def project(self, pe: Tensor) -> Tensor:
        """relative_positions (2T - 1, D) -> linear_pos(pe) in this layer's dtype, forward's p"""
        return self.linear_pos(pe.to(self.linear_pos.weight.dtype))

    def forward(self, x: Tensor, p: Tensor, bias_mask: Tensor, pad: Tensor) -> Tensor:
        """x: (B, T, D), p: (P >= 2T - 1, D) project(pe) (rows past 2T - 1 unread),
        bias_mask: (B, 1, T, T) True where a query may not see a key, pad: (B, 1, T) True on
        padded frames -> (B, T, D)"""
        B, T, D = x.shape
        scale = 1.0 / math.sqrt(self.d_k)
        if self.kernel is not None:  # shift, scale, mask and attention in one kernel
            # q, k, v as one GEMM over the cuda runner's concatenated weight (qkv_weight,
            # qkv_bias: linear_q's, linear_k's, linear_v's rows): (B, T, 3, H, d_k) views
            qkv = F.linear(x, self.qkv_weight, self.qkv_bias).view(B, T, 3, self.h, self.d_k)
            q, k, v = qkv.unbind(2)
            # the position term as one GEMM per head over all frames of the batch (a matmul
            # broadcasting p over the batch copies it per item): (H, d_k, P'), P' >= 2T - 1
            # (the cuda runner pads the rows to a multiple of 64: FastConformer.positions)
            P = 2 * T - 1
            p = p.view(-1, self.h, self.d_k).permute(1, 2, 0)
            # (q + pos_bias_v) . p = q . p + pos_bias_v . p: q straight from qkv's rows (an
            # (H, B * T, d_k) view with rows of stride 3D, no copy), the bias term once per
            # head and position, (H, P'), added by the kernel
            q_h = q.permute(2, 0, 1, 3).reshape(self.h, B * T, self.d_k)
            bd = torch.bmm(q_h, p).view(self.h, B, T, -1).transpose(0, 1)[..., :P]
            bias_pos = (self.pos_bias_v[:, :, None].float() * p.float()).sum(1).to(x.dtype)
            keys = (~pad[:, 0]).to(torch.int8)  # (B, T) 1 on valid frames
            out = self.kernel(q, k, v, bd, bias_pos, keys, self.pos_bias_u, scale, self.context)
            return self.linear_out(out.reshape(B, T, D))
        q = self.linear_q(x).view(B, T, self.h, self.d_k)
        k = self.linear_k(x).view(B, T, self.h, self.d_k)
        v = self.linear_v(x).view(B, T, self.h, self.d_k)
        p = p[: 2 * T - 1].view(-1, self.h, self.d_k).permute(1, 2, 0)  # (H, d_k, 2T - 1)
        q_v = (q + self.pos_bias_v).transpose(1, 2)  # (B, H, T, d_k)
        bd = torch.matmul(q_v, p)  # (B, H, T, 2T - 1): position term, before the shift
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        # masked_fill (not an added -10000) keeps NeMo's exact masked score
        bias = (rel_shift(bd) * scale).masked_fill(bias_mask, MASKED)  # (B, H, T, T)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q_u, k, v, attn_mask=bias, scale=scale)
        return self.linear_out(out.transpose(1, 2).reshape(B, T, D))


class FeedForward(nn.Module):
    def __init__(self, d: ParakeetDims) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d.d_model, d.d_model * d.ff_expansion)
        self.linear2 = nn.Linear(d.d_model * d.ff_expansion, d.d_model)
        # the cuda runner's linear1 + SiLU in one GEMM (speechrt.runtime.linear_act): (x, w, b,
        # "silu") -> silu(linear1(x)); None: the two apart
        self.kernel: Callable[..., Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) -> (B, T, D)"""
        if self.kernel is not None:
            return self.linear2(self.kernel(x, self.linear1.weight, self.linear1.bias, "silu"))
        return self.linear2(F.silu(self.linear1(x)))


class ConvModule(nn.Module):
    """pointwise (2x) -> GLU -> zero padded frames -> depthwise (BatchNorm folded) -> SiLU ->
    pointwise."""

    def __init__(self, d: ParakeetDims) -> None:
        super().__init__()
        D, k = d.d_model, d.conv_kernel
        self.pointwise_conv1 = nn.Conv1d(D, 2 * D, 1)
        self.depthwise_conv = nn.Conv1d(D, D, k, padding=(k - 1) // 2, groups=D)
        self.pointwise_conv2 = nn.Conv1d(D, D, 1)
        self.taps = False  # the depthwise conv as shifted copies (depthwise_taps): cuda
        # the cuda runner's pointwise_conv1 + GLU in one GEMM (speechrt.runtime.linear_act),
        # over glu_weight and glu_bias, pointwise_conv1's rows interleaved value, gate, ...
        self.kernel: Callable[..., Tensor] | None = None
        # and its mask, depthwise conv and SiLU in one kernel (speechrt.runtime.depthwise_silu):
        # (x, keys (B, T) int8 1 on valid frames, w (C, k), bias) -> (B, T, C)
        self.depthwise_kernel: Callable[..., Tensor] | None = None

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        """x: (B, T, D), pad: (B, 1, T) True on padded frames -> (B, T, D)"""
        if self.taps:
            return self.forward_taps(x, pad)
        x = F.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1).masked_fill(pad, 0.0)
        return self.pointwise_conv2(F.silu(self.depthwise_conv(x))).transpose(1, 2)

    def forward_taps(self, x: Tensor, pad: Tensor) -> Tensor:
        """forward in the (B, T, D) layout: the pointwise convs as GEMMs, the depthwise conv
        as its shifted copies (depthwise_taps), no transposes (the cuda runner's form)."""
        pw1, pw2 = self.pointwise_conv1, self.pointwise_conv2
        if self.kernel is not None:
            x = self.kernel(x, self.glu_weight, self.glu_bias, "glu")
        else:
            x = F.glu(F.linear(x, pw1.weight[:, :, 0], pw1.bias), dim=-1)
        dw = self.depthwise_conv
        if self.depthwise_kernel is not None:
            keys = (~pad[:, 0]).to(torch.int8)  # (B, T) 1 on valid frames
            x = self.depthwise_kernel(x, keys, dw.weight[:, 0], dw.bias)
        else:
            x = x.masked_fill(pad.transpose(1, 2), 0.0)  # (B, T, D)
            x = F.silu(depthwise_taps(x, dw, time_dim=1))
        return F.linear(x, pw2.weight[:, :, 0], pw2.bias)


class ConformerLayer(nn.Module):
    def __init__(self, d: ParakeetDims) -> None:
        super().__init__()
        D = d.d_model
        self.norm_feed_forward1, self.feed_forward1 = nn.LayerNorm(D), FeedForward(d)
        self.norm_self_att, self.self_attn = nn.LayerNorm(D), RelPositionAttention(d)
        self.norm_conv, self.conv = nn.LayerNorm(D), ConvModule(d)
        self.norm_feed_forward2, self.feed_forward2 = nn.LayerNorm(D), FeedForward(d)
        self.norm_out = nn.LayerNorm(D)

    def forward(
        self, x: Tensor, p: Tensor, bias_mask: Tensor, pad: Tensor, h: Tensor | None = None
    ) -> Tensor:
        """x (B, T, D), p: self_attn.project(pe) -> (B, T, D); h: norm_feed_forward1(x) where
        the caller has it"""
        h = self.norm_feed_forward1(x) if h is None else h
        x = x + 0.5 * self.feed_forward1(h)
        x = x + self.self_attn(self.norm_self_att(x), p, bias_mask, pad)
        x = x + self.conv(self.norm_conv(x), pad)
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)


def run_subsampling(sub: Subsampling, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    return sub(x, lengths)


def run_layer(
    layer: ConformerLayer, x: Tensor, p: Tensor, mask: Tensor, pad: Tensor, h: Tensor,
    next_norm: nn.LayerNorm,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """One layer, h = its first layer norm of x, and the next layer's first layer norm of its
    output -> (output, next_norm(output)): compiled, the layer's last norm and the next one's
    first are one kernel, which reads the output once."""
    out = layer(x, p, mask, pad, h)
    return out, next_norm(out)


class FastConformer(nn.Module):
    def __init__(self, d: ParakeetDims) -> None:
        super().__init__()
        self.d = d
        self.pre_encode = Subsampling(d)
        self.layers = nn.ModuleList(ConformerLayer(d) for _ in range(d.n_layers))
        # how a layer runs: run_layer, or (cuda runner) one torch.compile of it shared by
        # every layer (its weights are the compiled function's inputs); likewise subsampling
        self.layer_fn = run_layer
        self.subsample_fn = run_subsampling
        # the cuda runner's every layer's linear_pos weight, stacked (n_layers * D, D): the
        # positions of all layers as one GEMM (positions); None: each layer's project
        self.pos_weight: Tensor | None
        self.register_buffer("pos_weight", None, persistent=False)

    def positions(self, T: int, device: torch.device) -> Tensor:
        """Each layer's projected relative positions, (n_layers, P, D): P = 2T - 1, or with
        pos_weight one GEMM and P rounded up to a multiple of 64 with zero rows (cuBLAS's
        fast kernels want aligned rows)."""
        pe = relative_positions(T, self.d.d_model, device)
        if self.pos_weight is None:
            layers = [layer for layer in self.layers if isinstance(layer, ConformerLayer)]
            return torch.stack([layer.self_attn.project(pe) for layer in layers])
        pe = F.pad(pe, (0, 0, 0, -pe.shape[0] % 64)).to(self.pos_weight.dtype)
        return F.linear(pe, self.pos_weight).view(pe.shape[0], -1, self.d.d_model).transpose(0, 1)

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """features: (B, n_mels, T), lengths (B,) -> encoded (B, T', d_model), lengths (B,)"""
        x, lengths = self.subsample_fn(self.pre_encode, features.transpose(1, 2), lengths)
        if self.d.xscaling:
            x = x * math.sqrt(self.d.d_model)
        T = x.shape[1]
        valid = valid_mask(lengths, T)  # (B, T)
        see = valid[:, None, :] & valid[:, :, None]  # (B, T, T): query i may see key j
        if self.d.att_context is not None:  # limited context: keys within [i - w, i + w]
            offset = torch.arange(T, device=x.device)
            offset = offset[None, :] - offset[:, None]  # j - i
            see = see & (offset.abs() <= self.d.att_context)
        bias_mask = ~see[:, None]  # (B, 1, T, T)
        pad = ~valid[:, None, :]  # (B, 1, T)
        pos = self.positions(T, x.device)  # (n_layers, P, D)
        layers = [layer for layer in self.layers if isinstance(layer, ConformerLayer)]
        h = layers[0].norm_feed_forward1(x)
        for i, layer in enumerate(layers):
            # the next layer's first norm; after the last layer a stand-in (layer 0's), its
            # output unused, so that every layer is the same compiled function
            next_norm = layers[(i + 1) % len(layers)].norm_feed_forward1
            x, h = self.layer_fn(layer, x, pos[i], bias_mask, pad, h, next_norm)
        return x, lengths


class Predictor(nn.Module):
    """The prediction network: embedding (the blank's row is zero) -> LSTM."""

    def __init__(self, d: ParakeetDims) -> None:
        super().__init__()
        self.embed = nn.Embedding(d.n_classes, d.pred_hidden, padding_idx=d.vocab_size)
        self.lstm = nn.LSTM(d.pred_hidden, d.pred_hidden, d.pred_layers)

    def forward(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (B,), h, c (layers, B, H) -> output (B, H), h, c"""
        out, (h, c) = self.lstm(self.embed(tokens)[None], (h, c))
        return out[0], h, c


class Joint(nn.Module):
    def __init__(self, d: ParakeetDims) -> None:
        super().__init__()
        self.enc = nn.Linear(d.d_model, d.joint_hidden)
        self.pred = nn.Linear(d.pred_hidden, d.joint_hidden)
        self.out = nn.Linear(d.joint_hidden, d.n_joint_out)

    def forward(self, f: Tensor, g: Tensor) -> Tensor:
        """f = enc(encoded), g = pred(prediction): (..., J) each -> logits (..., n_joint_out)"""
        return self.out(F.relu(f + g))


class ParakeetCTC(nn.Module):
    """FastConformer + CTC head: forward(features, lengths) -> (log_probs, lengths)."""

    kind = "parakeet_ctc"
    role = "asr"
    Dims: type[ParakeetDims] = ParakeetCTCDims

    def __init__(self, dims: ParakeetDims) -> None:
        super().__init__()
        self.dims = dims
        self.encoder = FastConformer(dims)
        self.add_ctc_head()

    def add_ctc_head(self) -> None:
        self.ctc = nn.Conv1d(self.dims.d_model, self.dims.n_classes, 1)
        # the cuda runner's CTC head with zero rows up to a multiple of 64 (cuBLAS ran vocab +
        # 1 = 1025 rows on an unaligned kernel: 0.45 ms at batch 128 x 10 s); None: ctc's
        self.ctc_weight: Tensor | None
        self.ctc_bias: Tensor | None
        self.register_buffer("ctc_weight", None, persistent=False)
        self.register_buffer("ctc_bias", None, persistent=False)

    def pad_ctc_head(self) -> None:
        """Set ctc_weight and ctc_bias: the head's rows, zero rows after to a multiple of 64."""
        n = -self.dims.n_classes % 64
        assert self.ctc.bias is not None
        with torch.no_grad():
            self.ctc_weight = F.pad(self.ctc.weight[:, :, 0], (0, 0, 0, n))
            self.ctc_bias = F.pad(self.ctc.bias, (0, n))

    def ctc_log_probs(self, encoded: Tensor) -> Tensor:
        """encoded (B, T', D) -> (B, T', vocab + 1) float32 log-probs"""
        w, b = self.ctc.weight[:, :, 0], self.ctc.bias  # the 1x1 conv as a linear
        if self.ctc_weight is not None:
            w, b = self.ctc_weight, self.ctc_bias
        logits = F.linear(encoded, w, b)[..., : self.dims.n_classes]
        return logits.float().log_softmax(-1)

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        encoded, lengths = self.encoder(features, lengths)
        return self.ctc_log_probs(encoded), lengths

    def output_lengths(self, lengths: Tensor) -> Tensor:
        return torch.tensor([encoder_frames(self.dims, int(n)) for n in lengths.tolist()])


class ParakeetTransducer(ParakeetCTC):
    """FastConformer + RNN-T / TDT head (+ the CTC head of a hybrid)."""

    kind = "parakeet_transducer"
    Dims = ParakeetTransducerDims

    def __init__(self, dims: ParakeetDims) -> None:
        nn.Module.__init__(self)
        self.dims = dims
        self.encoder = FastConformer(dims)
        if dims.has_ctc:
            self.add_ctc_head()
        self.predictor = Predictor(dims)
        self.joint = Joint(dims)

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """-> joint_encoded (B, T', J), lengths: what greedy decoding reads"""
        encoded, lengths = self.encoder(features, lengths)
        return self.joint.enc(encoded), lengths

    def predict(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One prediction step, through the joint's projection: -> (B, J), h, c"""
        g, h, c = self.predictor(tokens, h, c)
        return self.joint.pred(g), h, c

    def start_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The zero LSTM state (layers, B, H)."""
        d = self.dims
        return torch.zeros(d.pred_layers, batch, d.pred_hidden, device=device, dtype=dtype)
