"""Runners: graph wrappers equal the models, buckets change nothing, batch independence,
backend resolution, pipeline stages, and a torch-free onnx runner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime_models import MEL, exported, fastpitch, hifigan, voice
from speechrt.audio.mel import MelConfig
from speechrt.errors import SpeechRTError
from speechrt.models.denoiser import Denoiser
from speechrt.options import SynthesisOptions
from speechrt.registry import contract, graphs_of
from speechrt.repo import ComponentInfo, load_component
from speechrt.runtime import resolve_backend
from speechrt.runtime.buckets import Buckets
from speechrt.runtime.cuda import cuda_runner
from speechrt.runtime.eager import EagerRunner
from speechrt.runtime.graphs import build_graph, example_feeds
from speechrt.runtime.graphs.denoiser import DenoiserGraph
from speechrt.runtime.graphs.fastpitch import FastPitchGraph
from speechrt.runtime.stages import TTSStages, make_runner

IDS = torch.tensor([[3, 7, 1, 12, 5, 9, 2, 14, 6], [4, 8, 11, 2, 0, 0, 0, 0, 0]])
LENS = torch.tensor([9, 4])
SMALL = Buckets({"batch": (4,), "symbols": (16, 32), "frames": (32, 64), "samples": (1024,)})


def per_item(opts: SynthesisOptions, B: int) -> list[torch.Tensor]:
    scale = 0.0 if opts.pitch_flatten else opts.pitch_scale
    return [torch.full((B,), v) for v in (opts.pace, opts.pitch_shift, scale)]


@pytest.mark.parametrize(
    "opts",
    [
        SynthesisOptions(),
        SynthesisOptions(pace=1.3, pitch_shift=25.0, pitch_scale=1.5),
        SynthesisOptions(pace=0.7, pitch_flatten=True, pitch_shift=-10.0),
    ],
)
@pytest.mark.parametrize("std", [50.0, 0.0])  # 0: no statistics, LJSpeech's std is used
def test_fastpitch_graph_matches_infer(opts: SynthesisOptions, std: float) -> None:
    """The graph with per-item options = infer with shared ones: durations and lengths exactly,
    floats bitwise with MKL on Intel CPUs and within float32 rounding on an AMD EPYC, whose
    sgemm rounds by shape (the graph's shapes differ: 1e-6 of the largest value)."""
    model = fastpitch(energy_conditioning=True)
    model.pitch_std.fill_(std)
    with torch.no_grad():
        ref = model.infer(IDS, LENS, opts)
        out = FastPitchGraph(model)(IDS, LENS, *per_item(opts, 2))
    for a, b in zip(ref, out, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.is_floating_point():
            assert (a - b).abs().max() <= 1e-6 * max(1.0, float(a.abs().max()))
        else:
            assert torch.equal(a, b)


def test_hifigan_graph_equals_mel_to_audio() -> None:
    model = hifigan()
    mel, lengths = torch.randn(2, 10, 13), torch.tensor([13, 6])
    audio, audio_lengths = model.mel_to_audio(mel, lengths)
    out = EagerRunner(build_graph("hifigan", model, None), contract("hifigan", {"n_mels": 10}))
    got = out.run({"mel": mel, "mel_lengths": lengths})
    assert torch.equal(got["audio"], audio) and torch.equal(got["audio_lengths"], audio_lengths)


@pytest.mark.parametrize("mel", [MEL, MelConfig(n_mels=10)])  # 64- and 1024-point STFTs
def test_denoiser_graph_equals_denoiser(mel: MelConfig) -> None:
    den = Denoiser.from_vocoder(hifigan(), MEL)
    den = Denoiser(Denoiser.Dims(mel.n_fft, mel.n_fft // 4, mel.win_length))
    den.bias.copy_(torch.rand(den.bias.shape) * 0.05)
    audio = (torch.randn(3, 5000) * 0.3).clamp(-1, 1)
    lengths = torch.tensor([5000, 3001, 1])
    ref = den(audio, 0.5, lengths)
    got = DenoiserGraph(den)(audio, lengths, torch.full((3,), 0.5))
    assert (ref - got).abs().max() <= 1e-5


def runners(model_dir: Path, graph: str) -> dict[str, object]:
    model, info = load_component(model_dir)
    c = contract(graph, info.dims)
    wrapper = build_graph(graph, model, info)
    cpu = torch.device("cpu")
    return {
        "eager": EagerRunner(wrapper, c),
        "onnx": make_runner(graph, model, info, "onnx", cpu, model_dir=model_dir),
        "cuda": cuda_runner(
            graph, wrapper, c, device="cpu", dtype=torch.float32, mode=None, buckets=SMALL
        ),
    }


EVERY_GRAPH = [(kind, graph) for kind in exported() for graph in graphs_of(kind)]


@pytest.mark.parametrize("kind, graph", EVERY_GRAPH)
def test_batch_independence_and_buckets(kind: str, graph: str) -> None:
    """Every backend: item i of a batch == item i alone; bucketed (cuda) == unbucketed (eager)."""
    rs = runners(exported()[kind], graph)
    wrapper = rs["eager"].graph
    feeds = example_feeds(graph, wrapper, 3, 19, seed=5)
    c = rs["eager"].contract
    ref = rs["eager"].run(feeds)
    for backend, r in rs.items():
        batched = r.run(feeds)
        for i in range(3):
            alone = {k: v[i : i + 1] for k, v in feeds.items()}
            one = r.run(alone)
            for name in c.output_names:
                a, b, e = batched[name][i], one[name][0], ref[name][i]
                region = tuple(slice(0, n) for n in b.shape)  # the item's own (shorter) extent
                assert (a[region].double() - b.double()).abs().max() <= 1e-5, (backend, name)
                assert (e[region].double() - b.double()).abs().max() <= 1e-4, (backend, name)
        for name in c.output_names:  # same shapes as unbucketed, lengths identical
            assert batched[name].shape == ref[name].shape
            if name.endswith("lengths"):
                assert torch.equal(batched[name], ref[name])


def test_buckets() -> None:
    b = Buckets({"batch": (1, 4, 8), "frames": (32, 64)})
    assert [b.size("batch", n) for n in (1, 2, 4, 5, 9, 17)] == [1, 4, 4, 8, 16, 24]
    assert [b.size("frames", n) for n in (1, 33, 64, 65, 129)] == [32, 64, 64, 128, 192]
    assert b.size("symbols", 7) == 7  # an axis without buckets keeps its size
    parsed = Buckets.parse("batch=1,2; symbols=8,16")
    assert parsed.sizes["batch"] == (1, 2) and parsed.sizes["symbols"] == (8, 16)
    assert parsed.sizes["frames"] == Buckets().sizes["frames"]
    with pytest.raises(ValueError):
        Buckets({"batch": (4, 2)})
    with pytest.raises(ValueError):
        Buckets.parse("batch=1,x")


def test_bf16_cuda_runner_stays_close() -> None:
    model = fastpitch()
    graph = FastPitchGraph(model)
    c = contract("fastpitch", ComponentInfo("fastpitch", model.dims.__dict__).dims)
    r = cuda_runner("fastpitch", graph, c, device="cpu", dtype=torch.bfloat16, mode=None)
    feeds = dict(zip(c.input_names, [IDS, LENS, *per_item(SynthesisOptions(), 2)], strict=True))
    ref, got = EagerRunner(graph, c).run(feeds), r.run(feeds)
    # durations come from the float32 encoder (padded to a bucket): identical frame counts
    assert torch.equal(ref["mel_lengths"], got["mel_lengths"])
    assert (ref["durations"] - got["durations"]).abs().max() <= 1e-5
    assert got["mel"].dtype == torch.float32
    noise = (ref["mel"] - got["mel"]).pow(2).sum()
    assert 10 * torch.log10(ref["mel"].pow(2).sum() / noise) > 30


@pytest.mark.parametrize("kind, channels_last", [("jasper", True), ("quartznet", False)])
def test_cuda_runner_layout(kind: str, channels_last: bool) -> None:
    """Jasper's dense convs run channels-last on the cuda runner; QuartzNet's graph stays NCHW
    (its wrapper says so: its depthwise convs are slower channels-last)."""
    from torch import nn

    from speechrt.models.jasper import Jasper, QuartzNet
    from speechrt.registry import preset

    model = (QuartzNet if kind == "quartznet" else Jasper)(preset(kind, "tiny"))
    info = ComponentInfo(kind, model.dims.__dict__)
    wrapper = build_graph("jasper", model, info)
    c = contract("jasper", info.dims)
    r = cuda_runner("jasper", wrapper, c, device="cpu", dtype=torch.float32, mode=None)
    assert r.channels_last is channels_last
    assert any(type(m) is nn.Conv1d for m in r.graph.modules()) is not channels_last
    forced = cuda_runner("jasper", wrapper, c, device="cpu", mode=None, channels_last=True)
    assert forced.channels_last


def test_resolve_backend(tmp_path: Path) -> None:
    assert resolve_backend("auto", "cuda") == "cuda"
    assert (
        resolve_backend("auto", "cpu", [exported()["fastpitch"], exported()["hifigan"]]) == "onnx"
    )
    plain = voice(tmp_path)
    assert resolve_backend("auto", "cpu", plain) == "eager"
    assert resolve_backend("onnx", "cpu") == "onnx"
    with pytest.raises(SpeechRTError, match="needs a CUDA device"):
        resolve_backend("cuda", "cpu")
    with pytest.raises(SpeechRTError, match="unknown backend"):
        resolve_backend("tensorrt", "cpu")


def test_stages_match_the_modules() -> None:
    """ids -> mel -> audio -> denoised through each backend's stages == the eager modules."""
    dirs = exported()["fastpitch"], exported()["hifigan"]
    (a_model, a_info), (v_model, v_info) = (load_component(d) for d in dirs)
    opts = SynthesisOptions(pace=1.2, pitch_shift=10.0, denoise=0.1)
    seeds = torch.zeros(2, dtype=torch.long)
    mel, mel_lengths = a_model.generate_mel(IDS, LENS, opts)
    audio, audio_lengths = v_model.mel_to_audio(mel, mel_lengths)
    denoised = Denoiser.from_vocoder(v_model, MEL)(audio, opts.denoise, audio_lengths)
    cpu = torch.device("cpu")
    for backend in ("onnx", "cuda"):
        stages = TTSStages(
            backend,
            cpu,
            "fp32",
            (a_model, a_info, dirs[0]),
            (v_model, v_info, dirs[1]),
            buckets=SMALL,
            compile_mode=None,
        )
        m, ml = stages.acoustic(IDS, LENS, opts, seeds)
        assert torch.equal(ml, mel_lengths) and (m - mel).abs().max() <= 1e-4
        au, al = stages.vocoder(m, ml, opts, seeds)
        assert torch.equal(al, audio_lengths) and (au - audio).abs().max() <= 1e-4
        dn = stages.denoiser(au, al, opts.denoise)
        assert (dn - denoised).abs().max() <= 1e-4
        with pytest.raises(SpeechRTError, match="speaker id 2"):
            stages.acoustic(IDS, LENS, SynthesisOptions(speaker=2), seeds)


def test_onnx_runner_imports_no_torch() -> None:
    code = f"""
import sys
import numpy as np
from speechrt.runtime.onnx import OnnxRunner
r = OnnxRunner.from_dir({str(exported()["hifigan"])!r}, device="cpu")
out = r.run({{"mel": np.zeros((1, 10, 5), np.float32), "mel_lengths": np.array([5])}})
assert out["audio"].shape == (1, 80) and out["audio_lengths"].tolist() == [80]
assert "torch" not in sys.modules, "torch was imported"
"""
    subprocess.run([sys.executable, "-c", code], check=True)
