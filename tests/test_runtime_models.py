"""Runtimes for Tacotron2, WaveGlow, FastSpeech and QuartzNet: graphs and stages == the models,
on every backend (cuda: the runner logic, uncompiled on the CPU), and the pipelines end to end."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from runtime_models import MEL, exported, fastspeech, quartznet, randomize, tacotron2, waveglow
from speechrt.models.tacotron2 import DECODER_OUTPUTS, Tacotron2, Tacotron2Dims
from speechrt.models.waveglow import WaveGlow, WaveGlowDims
from speechrt.options import SynthesisOptions
from speechrt.repo import ComponentInfo
from speechrt.runtime.buckets import Buckets
from speechrt.runtime.graphs.fastspeech import FastSpeechGraph
from speechrt.runtime.graphs.tacotron2 import DecoderStepGraph, EncoderGraph, example_decoder_step
from speechrt.runtime.graphs.waveglow import WaveGlowGraph
from speechrt.runtime.graphs.waveglow import example as wg_example
from speechrt.runtime.stages import TTSStages
from speechrt.runtime.tacotron2 import FusedStep

IDS = torch.tensor(
    [[3, 7, 1, 12, 5, 9, 2, 14, 6], [4, 8, 11, 2, 0, 0, 0, 0, 0], [5, 5, 5] + [0] * 6]
)
LENS = torch.tensor([9, 4, 3])
SEEDS = torch.tensor([11, 12, 13])
SMALL = Buckets({"batch": (4,), "symbols": (16,), "frames": (16, 32), "samples": (512,)})
CPU = torch.device("cpu")


def info(model: torch.nn.Module) -> ComponentInfo:
    return ComponentInfo(model.kind, dataclasses.asdict(model.dims), MEL)


def stages(backend: str, acoustic: torch.nn.Module, vocoder: torch.nn.Module) -> TTSStages:
    a = (acoustic, info(acoustic), exported()[acoustic.kind])
    v = (vocoder, info(vocoder), exported()[vocoder.kind])
    return TTSStages(backend, CPU, "fp32", a, v, buckets=SMALL, compile_mode=None)


def test_encoder_graph_equals_packed_lstm() -> None:
    model = tacotron2()
    with torch.no_grad():
        ref = model.encoder(IDS, LENS)
        got = EncoderGraph(model)(IDS, LENS)
    for a, b in zip(ref, got, strict=True):
        assert a.shape == b.shape and (a - b).abs().max() <= 1e-6


@pytest.mark.parametrize("defaults", [False, True])
def test_fused_decoder_step_equals_decoder_step(defaults: bool) -> None:
    """FusedStep (merged GEMMs, location conv + dense as one conv) is DecoderStep's function:
    every output within 1e-5 at the tiny and the default (DLE) dims."""
    model = Tacotron2(Tacotron2Dims()).eval() if defaults else tacotron2()
    step = model.decoder
    feeds = example_decoder_step(DecoderStepGraph(model), 2, 37, seed=5)
    with torch.no_grad():
        ref = step(*feeds.values())
        got = FusedStep(step)(*feeds.values())
    for name, a, b in zip(DECODER_OUTPUTS, ref, got, strict=True):
        assert a.shape == b.shape, name
        assert (a - b).abs().max() <= 1e-5, (name, float((a - b).abs().max()))


@pytest.mark.parametrize("defaults", [False, True])
def test_fused_step_with_bf16_lstm_gemms_stays_near_float32(defaults: bool) -> None:
    """FusedStep.lstm_in(bfloat16): the two LSTM weights in bf16, every output and the state
    still float32 and within bf16's rounding of the float32 step (bound 2e-2 of each output's
    scale; the stop step's evidence is scripts/tacotron2_stop_steps.py on a trained model)."""
    model = Tacotron2(Tacotron2Dims()).eval() if defaults else tacotron2()
    feeds = example_decoder_step(DecoderStepGraph(model), 2, 37, seed=5)
    half = FusedStep(model.decoder).lstm_in(torch.bfloat16)
    assert half.att_w.dtype == half.dec_w.dtype == torch.bfloat16
    assert half.out_w.dtype == half.query_w.dtype == torch.float32
    with torch.no_grad():
        ref = model.decoder(*feeds.values())
        got = half(*feeds.values())
    for name, a, b in zip(DECODER_OUTPUTS, ref, got, strict=True):
        assert b.dtype == torch.float32 and a.shape == b.shape, name
        err = float((a - b).abs().max())
        assert 0 < err <= 2e-2 * max(1.0, float(a.abs().max())), (name, err)


def test_cuda_steps_take_bf16_lstm_gemms() -> None:
    """CudaSteps(lstm_dtype=bfloat16) (uncompiled on the CPU) runs the decoder loop with them:
    stop steps within 1 of float32's on the tiny model, mel within 0.1 (the bounds of the
    eager half-precision test above)."""
    from speechrt.runtime.tacotron2 import CudaSteps, Tacotron2Stage

    tac, wg = tacotron2(), waveglow()
    s = stages("cuda", tac, wg)
    ref_stage = s.acoustic
    assert isinstance(ref_stage, Tacotron2Stage) and isinstance(ref_stage.steps, CudaSteps)
    steps = CudaSteps(tac.decoder, CPU, SMALL, None, lstm_dtype=torch.bfloat16)
    assert steps.decoder.att_w.dtype == torch.bfloat16
    half_stage = Tacotron2Stage(tac.dims, ref_stage.encoder, steps, ref_stage.postnet)
    opts = SynthesisOptions(seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mel, lengths = ref_stage(IDS, LENS, opts, SEEDS)
        m16, l16 = half_stage(IDS, LENS, opts, SEEDS)
    assert (l16 - lengths).abs().max() <= 1 and m16.dtype == torch.float32
    t = min(mel.shape[2], m16.shape[2]) - 1
    assert (m16[:, :, :t] - mel[:, :, :t]).abs().max() <= 0.1


def test_waveglow_gemm_equals_graph() -> None:
    """WaveGlowGemm (convs as matmuls over (B, L, C)) is WaveGlowGraph's function: audio within
    1e-6 of its peak for a batch of different lengths, at the tiny and the 256-channel dims
    (measured: 3e-7 and 6e-7)."""
    gen = torch.Generator().manual_seed(0)
    for model in (waveglow(), WaveGlow(WaveGlowDims(n_channels=256)).eval()):
        randomize(model, 4, 0.02)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".end." in name:  # small coupling outputs, as trained: exp(s) stays tame
                    p.mul_(0.1)
            for inv in model.convinv:  # W^-1 is a buffer: make it a general matrix
                inv.inverse += 0.3 * torch.randn(inv.inverse.shape, generator=gen)
        graph = WaveGlowGraph(model)
        feeds = wg_example(graph, 3, 12, seed=1)
        with torch.no_grad():
            ref, ref_lengths = graph(*feeds.values())
            got, lengths = graph.fused()(*feeds.values())
        assert torch.equal(lengths, ref_lengths) and got.shape == ref.shape
        n = int(lengths[2])  # item 2 is 6 frames short: zeros past its end
        assert n < ref.shape[1] and (ref[2, n:] == 0).all() and (got[2, n:] == 0).all()
        assert float((got - ref).abs().max()) <= 1e-6 * float(ref.abs().max())


def test_eager_half_precision_tacotron2_runs_its_own_outputs() -> None:
    """A half-precision model on the eager runner takes its own (float32, per the contract)
    outputs back as inputs: the decoder loop runs, and the mel stays near float32's (measured
    1.2e-2 max difference, same lengths; bounds: 0.1 and +-1 frame for the stop step)."""
    tac, wg = tacotron2(), waveglow()
    half = tacotron2().half()
    ref = stages("eager", tac, wg)
    h = TTSStages("eager", CPU, "fp16", (half, info(half), None), (wg, info(wg), None),
                  compile_mode=None)  # fmt: skip
    opts = SynthesisOptions(seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mel, lengths = ref.acoustic(IDS, LENS, opts, SEEDS)
        m16, l16 = h.acoustic(IDS, LENS, opts, SEEDS)
    assert m16.dtype == torch.float32 and (l16 - lengths).abs().max() <= 1
    t = min(mel.shape[2], m16.shape[2]) - 1
    assert (m16[:, :, :t] - mel[:, :, :t]).abs().max() <= 0.1


@pytest.mark.parametrize("backend", ["onnx", "cuda"])
def test_tacotron2_and_waveglow_stages(backend: str) -> None:
    """Per-item stopping, seeded prenet masks and WaveGlow noise as the modules draw them."""
    tac, wg = tacotron2(), waveglow()
    opts = SynthesisOptions(seed=3, sigma=0.8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mel, mel_lengths = tac.generate_mel(IDS, LENS, opts, SEEDS)
        audio, audio_lengths = wg.mel_to_audio(mel, mel_lengths, opts, SEEDS)
        s = stages(backend, tac, wg)
        m, ml = s.acoustic(IDS, LENS, opts, SEEDS)
        assert len(set(ml.tolist())) == 3 and int(ml.min()) > 8  # distinct, > one k-step block
        assert torch.equal(ml, mel_lengths) and m.shape == mel.shape
        assert (m - mel).abs().max() <= 1e-4
        a, al = s.vocoder(mel, mel_lengths, opts, SEEDS)
        assert torch.equal(al, audio_lengths) and (a - audio).abs().max() <= 1e-4
        # item 1 alone (its own seed) == item 1 in the batch
        m1, ml1 = s.acoustic(IDS[1:2, :4], LENS[1:2], opts, SEEDS[1:2])
        assert torch.equal(ml1[0], ml[1]) and (m1[0] - m[1, :, : m1.shape[2]]).abs().max() <= 1e-5
        # max_decoder_steps cuts every item, with a warning
        short = SynthesisOptions(seed=3, max_decoder_steps=5)
        with pytest.warns(UserWarning, match="max_decoder_steps"):
            _, cut = s.acoustic(IDS, LENS, short, SEEDS)
        assert cut.tolist() == [5, 5, 5]


@pytest.mark.parametrize("pace", [1.0, 1.25, 0.7])
def test_fastspeech_graph_equals_generate_mel(pace: float) -> None:
    model = fastspeech()
    mel, lengths = model.generate_mel(IDS, LENS, SynthesisOptions(pace=pace))
    with torch.no_grad():
        m, ml = FastSpeechGraph(model)(IDS, LENS, torch.full((3,), pace))
    assert torch.equal(ml, lengths) and torch.equal(m, mel)


@pytest.mark.parametrize("backend", ["onnx", "cuda"])
def test_fastspeech_stage(backend: str) -> None:
    model, wg = fastspeech(), waveglow()
    opts = SynthesisOptions(pace=1.25)
    mel, lengths = model.generate_mel(IDS, LENS, opts)
    m, ml = stages(backend, model, wg).acoustic(IDS, LENS, opts, SEEDS)
    assert torch.equal(ml, lengths) and (m - mel).abs().max() <= 1e-4


def test_asr_pipeline_on_each_backend(tmp_path) -> None:
    """Identical text and word times from eager, onnx and the (uncompiled) cuda runner."""
    from dle_jasper import speechlike, talkative_model
    from speechrt.asr import ASR
    from speechrt.cli import main
    from speechrt.runtime.cuda import cuda_runner
    from speechrt.runtime.graphs import build_graph

    torch.save({"state_dict": talkative_model("quartznet").state_dict()}, tmp_path / "qn.pt")
    d = tmp_path / "qn"
    assert main(["convert", str(tmp_path / "qn.pt"), str(d)]) == 0
    assert main(["export", str(d)]) == 0
    waves = [speechlike(s, i) for i, s in enumerate((2.5, 1.0, 1.7))]
    ref = ASR(d, backend="eager").transcribe(waves, batch_size=3)
    assert sum(len(t.words) for t in ref) >= 5
    onnx = ASR(d, backend="onnx")
    assert onnx.backend == "onnx"
    cuda = ASR(
        d, backend="eager"
    )  # the cuda runner's logic (buckets, padding) without a GPU: uncompiled
    c = onnx.runner.contract
    cuda.runner = cuda_runner(
        "jasper", build_graph("jasper", cuda.model, cuda.info), c, device="cpu",
        dtype=torch.float32, mode=None, buckets=Buckets({"batch": (4,), "feature_frames": (512,)}),
    )  # fmt: skip
    for asr in (onnx, cuda):
        got = asr.transcribe(waves, batch_size=3)
        assert [t.text for t in got] == [t.text for t in ref]
        assert [t.words for t in got] == [t.words for t in ref]


def test_quartznet_graph_equals_module() -> None:
    model = quartznet()
    feats, lengths = torch.randn(2, 12, 40), torch.tensor([40, 23])
    ref = model(feats, lengths)
    from speechrt.runtime.graphs.jasper import JasperGraph

    got = JasperGraph(model)(feats, lengths)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])


@pytest.mark.parametrize("preset_name", ["tiny", "hifigan-v3"])
def test_hifigan_fused_resblocks_equal_graph(preset_name: str) -> None:
    """HiFiGANGraph.fused() (each resblock conv with its leaky ReLU, mask and residual sum one
    lrelu_conv; torch ops on the CPU) is the graph's function: audio within 1e-6 of its peak
    for a batch of different lengths (ResBlock1 and ResBlock2)."""
    from runtime_models import HOP16
    from speechrt.models.hifigan import HiFiGAN
    from speechrt.registry import preset
    from speechrt.runtime.graphs.hifigan import HiFiGANGraph
    from speechrt.runtime.graphs.hifigan import example as hg_example

    model = HiFiGAN(preset("hifigan", preset_name, n_mels=MEL.n_mels, **HOP16)).eval()
    randomize(model, 3, 0.1)
    graph = HiFiGANGraph(model)
    feeds = hg_example(graph, 3, 20, seed=2)
    with torch.no_grad():
        ref, ref_lengths = graph(*feeds.values())
        got, lengths = graph.fused()(*feeds.values())
    assert torch.equal(lengths, ref_lengths) and got.shape == ref.shape
    n = int(lengths[2])
    assert n < ref.shape[1] and (got[2, n:] == 0).all()
    assert float((got - ref).abs().max()) <= 1e-6 * float(ref.abs().max())


def test_fused_resblock_variants_name_each_kernel_shape() -> None:
    """What the fused kernels of HiFi-GAN V1 are compiled for: per stage (256 to 32 channels)
    and kernel size, the three dilated convs and the plain one that adds the residual; and
    which blocks a single item runs on cuDNN."""
    from speechrt.models.hifigan import HiFiGAN
    from speechrt.registry import preset
    from speechrt.runtime.graphs.hifigan import FusedResBlock, HiFiGANGraph

    graph = HiFiGANGraph(HiFiGAN(preset("hifigan", "hifigan-v1"))).fused()
    blocks = [m for m in graph.modules() if isinstance(m, FusedResBlock)]
    got = graph.fused_variants()
    want = {(c, k, d, False) for c in (256, 128, 64, 32) for k in (3, 7, 11) for d in (1, 3, 5)}
    want |= {(c, k, 1, True) for c in (256, 128, 64, 32) for k in (3, 7, 11)}
    assert len(blocks) == 12 and got == want
    # a single item runs cuDNN's convs in the blocks of 256 and 128 channels, the fused kernel
    # in those of 64 and 32 (measured fastest so on an H100)
    assert [b.cudnn_single for b in blocks] == [True] * 6 + [False] * 6


FUSED_CONV_CHECK = """
import torch, torch.nn.functional as F
from speechrt.runtime.fused_conv import fused_conv1d  # noqa: F401 (registers the op)
g = torch.Generator().manual_seed(0)
worst = 0.0
for B, ci, co, T, K, d, channels_last, res in [(2, 8, 16, 37, 3, 1, False, False),
                                              (2, 16, 16, 50, 7, 3, True, True),
                                              (1, 32, 8, 20, 11, 5, True, True)]:
    x = torch.randn(B, ci, T, generator=g)
    if channels_last:
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    w, bias = torch.randn(co, ci, K, generator=g) * 0.1, torch.randn(co, generator=g)
    mask = (torch.arange(T)[None, None] < torch.tensor([T // 3, T][:B])[:, None, None]).float()
    r = torch.randn(B, co, T, generator=g) if res else None
    ref = F.conv1d(F.leaky_relu(x, 0.1), w, bias, padding=d * (K - 1) // 2, dilation=d) * mask
    ref = ref + r if res else ref
    y = torch.ops.speechrt.fused_conv1d(x, w.permute(2, 1, 0).contiguous(), bias, d, 0.1, mask, r)
    assert y.shape == ref.shape and (y.stride(1) == 1) == channels_last
    worst = max(worst, float((y - ref).abs().max()))
from speechrt.runtime.fused_conv import launch
for flat in (False, True):  # both loop forms with small tiles: several channel blocks per tap
    x = torch.randn(2, 16, 45, generator=g).transpose(1, 2).contiguous().transpose(1, 2)
    w, bias = torch.randn(24, 16, 5, generator=g) * 0.1, torch.randn(24, generator=g)
    r, mask = torch.randn(2, 24, 45, generator=g), torch.ones(2, 1, 45)
    ref = F.conv1d(F.leaky_relu(x, 0.1), w, bias, padding=4, dilation=2) + r
    y = launch(x, w.permute(2, 1, 0).contiguous(), bias, 2, 0.1, mask, r,
               tiles=(16, 16, 8, 4, 2, flat))
    worst = max(worst, float((y - ref).abs().max()))
assert worst < 1e-5, worst
print("ok", worst)
"""


def test_fused_conv_kernel_in_triton_interpreter() -> None:
    """The Triton kernel of lrelu_conv, run by Triton's CPU interpreter where Triton is
    installed (a GPU install; the CPU install lacks it): within 1e-5 of torch's conv1d after
    leaky ReLU, times the mask, plus the residual, at three shapes and both layouts, and with
    the taps unrolled and as one flat loop."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", FUSED_CONV_CHECK], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stderr[-2000:]
