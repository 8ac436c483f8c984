"""Parakeet's graphs: the encoder (features -> lengths, CTC log-probs, joint-projected frames),
one prediction-network step and one joint step (the contracts in speechrt.arch.parakeet), and
the encoder's cuda fast path (precompile)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from speechrt.arch import GraphCode
from speechrt.arch.parakeet import derived_sizes
from speechrt.models.parakeet import (
    ConformerLayer,
    ParakeetCTC,
    ParakeetTransducer,
    run_layer,
    run_subsampling,
    valid_mask,
)
from speechrt.runtime import depthwise_silu, linear_act, subsampling_stem
from speechrt.runtime import relpos_attention as fused

# the cuda runner's attention: one Triton kernel (speechrt.runtime.relpos_attention), or the
# reference's shifted scores and SDPA (False; scripts/bench_parakeet.py times both)
FUSED_ATTENTION = True
# the feed-forwards' SiLU and the conv module's GLU as their GEMM's epilogue (one Triton kernel,
# speechrt.runtime.linear_act) and the conv module's mask, depthwise conv and SiLU as one
# (speechrt.runtime.depthwise_silu); False: cuBLAS, then Inductor's kernels
FUSED_EPILOGUES = True
# the subsampling's first conv, ReLU, mask and depthwise conv as one kernel
# (speechrt.runtime.subsampling_stem); False: compiled shifted slices (strided_taps)
FUSED_STEM = True


class EncoderGraph(nn.Module):
    """features, feature_lengths -> encoded_lengths[, log_probs][, joint_encoded]"""

    # the cuda runner captures this graph as it is, after precompile() compiled its layers:
    # compiling 24 identical layers once each per shape would take minutes
    compiles_parts = True

    def __init__(self, model: ParakeetCTC) -> None:
        super().__init__()
        self.model = model

    def precompile(self) -> None:
        """One torch.compile of a conformer layer (static shapes), shared by every layer, and
        one of the subsampling."""
        import torch._dynamo.config as dynamo_config

        dynamo_config.inline_inbuilt_nn_modules = True  # weights as inputs: one compilation
        encoder = self.model.encoder
        # realize_reads_threshold 2: the conv module's GLU output is written once, not
        # recomputed in each of its depthwise taps (layer 1.92 -> 1.83 ms at 0.6B, batch 128)
        options: dict[str, str | int | bool | Callable[..., Any]] = {"realize_reads_threshold": 2}
        encoder.layer_fn = torch.compile(run_layer, dynamic=False, options=options)
        # its masks and ReLUs fused, its convolutions in the layout Inductor picks (the
        # depthwise 3x3 ran on a slow NCHW kernel uncompiled: 9 of 70 ms at batch 128)
        # realize_reads_threshold 1: each conv's output is written once, not recomputed in
        # each of the next conv's 9 taps (batch 128 x 10 s at 0.6B: 3.33 -> 3.01 ms; the
        # subsampling part of scripts/sweep_parakeet_parts.py)
        encoder.subsample_fn = torch.compile(
            run_subsampling, dynamic=False, options={"realize_reads_threshold": 1}
        )
        encoder.pre_encode.taps = True
        if FUSED_STEM and subsampling_stem.supported(next(self.parameters())):
            encoder.pre_encode.stem = subsampling_stem.subsampling_stem
            encoder.pre_encode.depthwise = subsampling_stem.strided_depthwise
        if self.model.dims.has_ctc:
            self.model.pad_ctc_head()
        layers = [layer for layer in encoder.layers if isinstance(layer, ConformerLayer)]
        with torch.no_grad():  # every layer's positions as one GEMM
            encoder.pos_weight = torch.cat([layer.self_attn.linear_pos.weight for layer in layers])
        for layer in layers:
            layer.conv.taps = True
            if FUSED_ATTENTION and fused.supported(layer.self_attn.d_k):
                layer.self_attn.use_kernel(fused.relpos_attention)
            weight = layer.conv.pointwise_conv1.weight
            if FUSED_EPILOGUES and linear_act.supported(weight):
                layer.feed_forward1.kernel = layer.feed_forward2.kernel = linear_act.apply
                bias = layer.conv.pointwise_conv1.bias
                assert bias is not None
                layer.conv.register_buffer(
                    "glu_weight", linear_act.interleave_glu(weight[:, :, 0]), persistent=False
                )
                layer.conv.register_buffer(
                    "glu_bias", linear_act.interleave_glu(bias), persistent=False
                )
                layer.conv.kernel = linear_act.apply
            k = layer.conv.depthwise_conv.kernel_size[0]
            if FUSED_EPILOGUES and depthwise_silu.supported(weight, k):
                assert layer.conv.depthwise_conv.bias is not None  # BatchNorm folded into it
                layer.conv.depthwise_kernel = depthwise_silu.depthwise_silu

    def derived_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        return derived_sizes(self.model.dims, sizes)

    def forward(self, features: Tensor, feature_lengths: Tensor) -> tuple[Tensor, ...]:
        m = self.model
        dtype = next(m.parameters()).dtype
        encoded, lengths = m.encoder(features.to(dtype), feature_lengths)
        out = [lengths]
        if m.dims.has_ctc:
            out.append(m.ctc_log_probs(encoded))
        if m.dims.transducer:
            assert isinstance(m, ParakeetTransducer)
            out.append(m.joint.enc(encoded).float())
        return tuple(out)


class PredictGraph(nn.Module):
    def __init__(self, model: ParakeetTransducer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        dtype = next(self.model.parameters()).dtype
        g, h, c = self.model.predict(tokens, h.to(dtype), c.to(dtype))
        return g.float(), h.float(), c.float()


class JointGraph(nn.Module):
    def __init__(self, model: ParakeetTransducer) -> None:
        super().__init__()
        self.joint = model.joint

    def forward(self, joint_encoded: Tensor, joint_predicted: Tensor) -> Tensor:
        dtype = self.joint.out.weight.dtype
        return self.joint(joint_encoded.to(dtype), joint_predicted.to(dtype)).float()


def build(model: ParakeetCTC, info: object = None) -> EncoderGraph:
    return EncoderGraph(model)


def example(graph: EncoderGraph, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([max(9, length - 7 * i) for i in range(batch)])
    feats = torch.randn(batch, graph.model.dims.n_mels, length, generator=g)
    return {"features": feats * valid_mask(lengths, length)[:, None], "feature_lengths": lengths}


def build_predict(model: ParakeetTransducer, info: object = None) -> PredictGraph:
    return PredictGraph(model)


def example_predict(graph: PredictGraph, batch: int, length: int, seed: int = 0) -> dict:
    d = graph.model.dims
    g = torch.Generator().manual_seed(seed)
    state = (d.pred_layers, batch, d.pred_hidden)
    return {
        "tokens": torch.randint(0, d.n_classes, (batch,), generator=g),
        "h": torch.randn(*state, generator=g),
        "c": torch.randn(*state, generator=g),
    }


def build_joint(model: ParakeetTransducer, info: object = None) -> JointGraph:
    return JointGraph(model)


def example_joint(graph: JointGraph, batch: int, length: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    J = graph.joint.enc.out_features
    return {
        "joint_encoded": torch.randn(batch, J, generator=g),
        "joint_predicted": torch.randn(batch, J, generator=g),
    }


# named by the registry entries (speechrt.arch.parakeet)
ENCODER_CODE = GraphCode(build, example)
PREDICT_CODE = GraphCode(build_predict, example_predict)
JOINT_CODE = GraphCode(build_joint, example_joint)
