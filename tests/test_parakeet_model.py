"""Parakeet's parts on random weights: batch independence, the device-side greedy loop against
the NumPy reference, the graphs' export, and (requires_cuda) the cuda runner against eager.

Parity with NeMo itself is tests/test_parakeet_nemo.py (recorded NeMo outputs)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from parakeet_models import steps_of, talkative
from speechrt.asr.transducer import TransducerSpec, greedy
from speechrt.models.parakeet import ParakeetTransducer, depthwise_taps
from speechrt.registry import preset
from speechrt.runtime.graphs.parakeet import EncoderGraph
from speechrt.runtime.transducer_cuda import CudaGreedy

requires_cuda = pytest.mark.requires_cuda


@pytest.mark.parametrize("att_context", [None, 3])
def test_encoder_item_alone_equals_item_in_a_padded_batch(att_context: int | None) -> None:
    model = talkative("parakeet_transducer", att_context=att_context)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 80, 301, generator=g)
    lengths = torch.tensor([301, 200, 97])
    with torch.inference_mode():
        enc, n = model.encoder(x, lengths)
        for i in range(3):
            one, m = model.encoder(x[i : i + 1, :, : lengths[i]], lengths[i : i + 1])
            assert m.item() == n[i].item()
            err = (one[0] - enc[i, : n[i]]).abs().max().item()
            assert err <= 1e-5 * max(1.0, one.abs().max().item())


def test_local_attention_sees_only_its_band() -> None:
    """With att_context w, a change at frame 0 moves encoder frames farther than the receptive
    field of (conv kernel + band) x layers not at all; without it, it moves every frame."""
    local = talkative("parakeet_ctc", att_context=2)
    full = talkative("parakeet_ctc")
    x = torch.randn(1, 80, 800)
    y = x.clone()
    y[:, :, :8] += 1.0  # the first encoder frame's features
    lengths = torch.tensor([800])
    with torch.inference_mode():
        reach = local.dims.n_layers * (2 + local.dims.conv_kernel // 2) + 2
        a, _ = local.encoder(x, lengths)
        b, _ = local.encoder(y, lengths)
        moved = (a - b).abs().amax(-1)[0] > 1e-6
        assert moved[0] and not moved[reach:].any()
        a, _ = full.encoder(x, lengths)
        b, _ = full.encoder(y, lengths)
        assert ((a - b).abs().amax(-1)[0] > 1e-6).all()


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("head", ["tdt", "rnnt"])
def test_device_loop_takes_the_reference_greedy_decisions(head: str, scan: bool) -> None:
    """CudaGreedy's step (here uncaptured, on the CPU) against the NumPy label-looping
    reference: the same tokens, frames and skips, items of several lengths together."""
    durations = (0, 1, 2, 3, 4) if head == "tdt" else ()
    model = talkative("parakeet_transducer", head=head, durations=durations)
    predict, joint, spec = steps_of(model)
    loop = CudaGreedy(model, block=3, scan=scan)
    g = torch.Generator().manual_seed(2)
    emitted = 0
    for _ in range(4):
        f = torch.randn(3, 37, model.dims.joint_hidden, generator=g) * 3
        lengths = torch.tensor([37, 20, 1])
        want = greedy(f.numpy(), lengths.numpy(), predict, joint, spec)
        assert loop(f, lengths) == want
        emitted += sum(len(w) for w in want)
    assert emitted > 20


def test_greedy_stops_after_max_symbols_on_a_frame() -> None:
    """A joint that always emits token 1 with skip 0: max_symbols tokens per frame, then the
    frame is forced forward (NeMo's rule), for every frame of the item."""
    spec = TransducerSpec(blank=4, durations=(0, 1), max_symbols=3, state_shape=(1, 2))

    def predict(tokens: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple:
        return np.zeros((tokens.shape[0], 2), np.float32), h, c

    def joint(f: np.ndarray, g: np.ndarray) -> np.ndarray:
        logits = np.zeros((f.shape[0], 7), np.float32)
        logits[:, 1] = 1.0  # token 1
        logits[:, 5] = 1.0  # skip 0
        return logits

    tokens = greedy(np.zeros((1, 4, 2), np.float32), np.array([4]), predict, joint, spec)[0]
    assert tokens == [(1, t, 0) for t in range(4) for _ in range(3)]


def test_graphs_export_and_onnx_matches_eager(tmp_path: Path) -> None:
    """The three graphs export, and onnxruntime matches eager at other sizes (export's check,
    max error relative to outputs above 1)."""
    from speechrt.repo import ComponentInfo, save_component
    from speechrt.runtime.export import export_dir

    model = talkative("parakeet_transducer", att_context=4)
    info = ComponentInfo(kind=model.kind, dims=model.dims, meta={})
    save_component(tmp_path, info, model.state_dict())
    written, checks = export_dir(tmp_path)
    assert {p.name for p in written} == {"model.onnx", "predict.onnx", "joint.onnx"}
    assert checks and all(c.max_abs_error < 1e-4 for c in checks)


@requires_cuda
@pytest.mark.parametrize("kind", ["parakeet_ctc", "parakeet_transducer"])
@pytest.mark.parametrize("wide", [False, True])
def test_cuda_runner_matches_eager_fp32(kind: str, wide: bool) -> None:
    """The cuda runner (bf16, layers compiled, one CUDA graph) against eager fp32: relative
    error of the head's output on each item's frames under 2e-2 (measured 6e-3), and on the
    same fp32 frames the captured device loop equals the NumPy reference. wide: layers and a
    batch large enough for the SiLU / GLU epilogue kernel (speechrt.runtime.linear_act)."""
    from speechrt.registry import contract
    from speechrt.runtime import linear_act
    from speechrt.runtime.cuda import CudaRunner

    model = talkative(kind, **(dict(d_model=256, n_heads=4) if wide else {}))
    d = model.dims
    c = contract("parakeet", d)
    runner = CudaRunner("parakeet", EncoderGraph(model), c, dtype=torch.bfloat16)
    B = 24 if wide else 2  # wide: 24 x 50 frames, over linear_act.MIN_ROWS
    assert not wide or B * 50 >= linear_act.MIN_ROWS
    x = torch.randn(B, 80, 400)
    lengths = torch.tensor([400, 250] * (B // 2))
    with torch.inference_mode():
        want = dict(zip(c.output_names, EncoderGraph(model)(x, lengths), strict=True))
        for _ in range(2):  # capture, then replay
            got = runner.run({"features": x.cuda(), "feature_lengths": lengths.cuda()})
    key = "joint_encoded" if d.transducer else "log_probs"
    for b, n in enumerate(want["encoded_lengths"].tolist()):  # padded frames: nobody reads them
        g, w = got[key][b, :n].float().cpu(), want[key][b, :n]
        assert (g - w).norm() / w.norm() < 2e-2
    assert got["encoded_lengths"].tolist() == want["encoded_lengths"].tolist()
    if d.transducer:
        assert isinstance(model, ParakeetTransducer)
        predict, joint, spec = steps_of(model)
        f, n = want["joint_encoded"], want["encoded_lengths"]
        want = greedy(f.numpy(), n.numpy(), predict, joint, spec)
        for scan in (False, True):
            loop = CudaGreedy(copy.deepcopy(model).cuda(), scan=scan)
            for _ in range(2):
                assert loop(f.cuda(), n.cuda()) == want


@requires_cuda
@pytest.mark.parametrize(
    "dims",
    [{}, dict(head="rnnt", durations=()), dict(pred_hidden=64, joint_hidden=64, pred_layers=2)],
    ids=["tdt", "rnnt", "two-layers"],
)
def test_fused_step_takes_the_reference_greedy_decisions(dims: dict) -> None:
    """The captured loop with the Triton step (speechrt.runtime.transducer_step), fp32, against
    the NumPy reference: the same tokens, frames and skips at several batch sizes (buckets
    padded with inactive items) and ragged lengths, with and without the scan."""
    model = talkative("parakeet_transducer", **dims)
    predict, joint, spec = steps_of(model)
    J = model.dims.joint_hidden
    g = torch.Generator().manual_seed(5)
    emitted = 0
    for scan in (False, True):
        loop = CudaGreedy(copy.deepcopy(model).cuda(), fused_step=True, scan=scan)
        assert loop.fused
        for B, T in ((1, 7), (3, 40), (13, 33), (64, 90)):
            f = torch.randn(B, T, J, generator=g) * 3
            lengths = torch.randint(0, T + 1, (B,), generator=g)
            lengths[0] = T
            want = greedy(f.numpy(), lengths.numpy(), predict, joint, spec)
            for _ in range(2):  # capture, then replay
                assert loop(f.cuda(), lengths.cuda()) == want
            emitted += sum(len(w) for w in want)
    assert emitted > 200


def test_stacked_positions_and_padded_ctc_head_keep_the_log_probs() -> None:
    """The cuda runner's two layouts (every layer's positions as one GEMM with rows padded to
    64, the CTC head's rows padded to 64) leave the log-probs as the reference computes them,
    within float32 rounding (1e-5 of their scale)."""
    model = talkative("parakeet_ctc")
    x = torch.randn(2, 80, 170)
    lengths = torch.tensor([170, 111])
    with torch.inference_mode():
        want, n = model(x, lengths)
        pos = model.encoder.positions(22, x.device)
        layers = list(model.encoder.layers)
        model.encoder.pos_weight = torch.cat([m.self_attn.linear_pos.weight for m in layers])
        model.pad_ctc_head()
        padded = model.encoder.positions(22, x.device)
        got, m = model(x, lengths)
    assert pos.shape == (len(layers), 43, model.dims.d_model) and padded.shape[1] == 64
    assert (padded[:, :43] - pos).abs().max().item() <= 1e-5 * pos.abs().max().item()
    assert padded[:, 43:].abs().max().item() == 0.0
    assert model.ctc_weight is not None and model.ctc_weight.shape[0] % 64 == 0
    assert m.tolist() == n.tolist() and got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_strided_taps_equal_the_convolutions() -> None:
    """The cuda runner's convolutions as shifted slices (subsampling, conv module) against
    nn.Conv2d and nn.Conv1d."""
    model = talkative("parakeet_ctc", subsampling_channels=16)
    sub = model.encoder.pre_encode
    x = torch.randn(3, 333, 80)
    lengths = torch.tensor([333, 200, 50])
    with torch.inference_mode():
        want, n = sub(x, lengths)
        sub.taps = True
        got, m = sub(x, lengths)
    assert n.tolist() == m.tolist()
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    conv = model.encoder.layers[0].conv
    x = torch.randn(2, model.dims.d_model, 41)
    with torch.inference_mode():
        want = conv.depthwise_conv(x)
        got = depthwise_taps(x, conv.depthwise_conv)
        assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
        x = torch.randn(2, 41, model.dims.d_model)
        pad = torch.arange(41)[None, None, :] >= torch.tensor([41, 30])[:, None, None]
        want = conv(x, pad)
        conv.taps = True
        got = conv(x, pad)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


@requires_cuda
@pytest.mark.parametrize("att_context", [None, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_attention_equals_the_reference(att_context: int | None, dtype: torch.dtype) -> None:
    """The cuda runner's rel-pos attention kernel against the reference (shifted scores, SDPA)
    on the valid frames of a padded batch, over several key blocks: float32 within 1e-4 of the
    output's scale, bf16 within 2e-2."""
    from speechrt.models.parakeet import RelPositionAttention, relative_positions, valid_mask
    from speechrt.runtime.relpos_attention import relpos_attention

    torch.manual_seed(0)
    d = preset("parakeet_ctc", "tiny", d_model=256, n_heads=4, att_context=att_context)
    att = RelPositionAttention(d).cuda().to(dtype).eval()
    with torch.no_grad():
        att.pos_bias_u.normal_(0, 0.5)
        att.pos_bias_v.normal_(0, 0.5)
    T, lengths = 150, torch.tensor([150, 97, 12], device="cuda")
    x = torch.randn(3, T, 256, device="cuda", dtype=dtype)
    valid = valid_mask(lengths, T)
    see = valid[:, None, :] & valid[:, :, None]
    if att_context is not None:
        offset = torch.arange(T, device="cuda")
        see = see & ((offset[None, :] - offset[:, None]).abs() <= att_context)
    pe, pad = relative_positions(T, 256, x.device), ~valid[:, None, :]
    with torch.inference_mode():
        p = att.project(pe)
        want = att(x, p, ~see[:, None], pad).float()
        att.use_kernel(relpos_attention)
        got = att(x, p, ~see[:, None], pad).float()
    err = max((got[b, :n] - want[b, :n]).abs().max().item() for b, n in enumerate(lengths))
    assert err <= (1e-4 if dtype == torch.float32 else 2e-2) * want.abs().max().item()


@pytest.mark.parametrize("act", ["silu", "glu"])
def test_linear_act_interleaves_glu_and_runs_small_layers_on_the_linear(act: str) -> None:
    """linear_act's GLU weights are its pointwise conv's rows interleaved (value, gate); below
    MIN_ROWS rows (and off the GPU) it is linear then the activation, to float rounding."""
    from speechrt.runtime import linear_act as la

    torch.manual_seed(0)
    x, w, b = torch.randn(3, 50, 96), torch.randn(512, 96), torch.randn(512)
    want = F.linear(x, w, b)
    want = F.glu(want, -1) if act == "glu" else F.silu(want)
    if act == "glu":
        wi = la.interleave_glu(w)
        assert torch.equal(wi[0::2], w[:256]) and torch.equal(wi[1::2], w[256:])
        w, b = wi, la.interleave_glu(b)
    got = la.apply(x, w, b, act)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


@requires_cuda
@pytest.mark.parametrize("act", ["silu", "glu"])
@pytest.mark.parametrize("rows", [999, 1500, 4100])
def test_linear_act_equals_linear_then_activation(act: str, rows: int) -> None:
    """The activation as the GEMM's epilogue (Triton; below MIN_ROWS cuBLAS, then the
    activation) against float32 linear + activation, bf16 inputs: within 1e-2 of the output's
    scale, row counts that are no multiple of a tile and both tile shapes."""
    from speechrt.runtime import linear_act as la

    torch.manual_seed(0)
    K, N = 512, 2048
    x = torch.randn(rows, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    want = F.linear(x.float(), w.float(), b.float())
    want = F.glu(want, -1) if act == "glu" else F.silu(want)
    if act == "glu":
        w, b = la.interleave_glu(w), la.interleave_glu(b)
    got = la.apply(x, w, b, act).float()
    assert (got - want).abs().max().item() <= 1e-2 * want.abs().max().item()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_depthwise_silu_equals_mask_taps_silu(dtype: torch.dtype) -> None:
    """The conv module's mask, depthwise conv and SiLU as one kernel against the reference's
    three steps, on the valid frames of a padded batch: float32 within 1e-5 of the output's
    scale, bf16 within 1e-2 (the reference rounds between its steps)."""
    from speechrt.models.parakeet import ConvModule
    from speechrt.runtime.depthwise_silu import launch

    torch.manual_seed(0)
    conv = ConvModule(preset("parakeet_ctc", "tiny", d_model=200)).depthwise_conv
    conv = conv.cuda().to(dtype)
    x = torch.randn(3, 70, 200, device="cuda", dtype=dtype)
    lengths = torch.tensor([70, 41, 5], device="cuda")
    valid = torch.arange(70, device="cuda")[None] < lengths[:, None]
    with torch.inference_mode():
        want = depthwise_taps(x.masked_fill(~valid[:, :, None], 0.0), conv, time_dim=1)
        want = F.silu(want).float()
        got = launch(x, valid.to(torch.int8), conv.weight[:, 0], conv.bias).float()
    err = max((got[b, :n] - want[b, :n]).abs().max().item() for b, n in enumerate(lengths))
    assert err <= (1e-5 if dtype == torch.float32 else 1e-2) * want.abs().max().item()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_subsampling_stem_equals_the_convs(dtype: torch.dtype) -> None:
    """The subsampling on its kernels (the first conv, ReLU, mask and depthwise conv as one,
    each later ReLU, mask and depthwise conv as one) against the reference's convs, on the
    valid frames of a padded batch (lengths cut inside
    the image, at an odd frame and short of a whole stride): float32 within 1e-4 of the
    output's scale (the reference's 9-tap GEMM on cuBLAS: 3e-5 seen on an H200), bf16 within
    2e-2 (the reference rounds between its convs)."""
    from speechrt.models.parakeet import Subsampling
    from speechrt.runtime.subsampling_stem import strided_depthwise, subsampling_stem

    torch.manual_seed(0)
    d = preset("parakeet_ctc", "tiny", subsampling_channels=40, n_mels=80)
    sub = Subsampling(d).cuda().to(dtype).eval()
    sub.taps = True  # the reference's strided convs as the runner's taps
    x = torch.randn(4, 203, 80, device="cuda", dtype=dtype)
    lengths = torch.tensor([203, 150, 33, 1], device="cuda")
    # the reference's pointwise convs in float32, as the kernels' GEMMs (cuDNN's take TF32)
    with torch.inference_mode(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        want, want_n = sub(x, lengths)
        sub.stem, sub.depthwise = subsampling_stem, strided_depthwise
        got, got_n = sub(x, lengths)
    assert got_n.tolist() == want_n.tolist()
    err = max((got[b, :n] - want[b, :n]).abs().max().item() for b, n in enumerate(want_n))
    assert err <= (1e-4 if dtype == torch.float32 else 2e-2) * want.abs().max().item()


def test_compiled_loop_keeps_a_variant_per_bucket() -> None:
    """A compiled device loop raises Dynamo's limit of compiled variants per function (8 by
    default; past it Dynamo silently runs the step uncompiled, several times slower) to one
    per bucket shape."""
    import torch._dynamo.config as dynamo_config

    from speechrt.runtime.cuda import RECOMPILE_LIMIT

    old = dynamo_config.recompile_limit
    try:
        dynamo_config.recompile_limit = 8
        CudaGreedy(talkative("parakeet_transducer"), compile_step=True)
        assert dynamo_config.recompile_limit >= RECOMPILE_LIMIT
    finally:
        dynamo_config.recompile_limit = old
