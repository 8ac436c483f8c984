"""The cuda runner (fp16, compiled, bucketed, CUDA graphs) against the eager float32 path, on a GPU.

Default-dims components with random weights that behave (gpu_models.py). Tolerances: every float
output of every graph and every pipeline's audio within SNR >= 30 dB of eager float32, integer
outputs (lengths) identical; ASR text identical, or where a greedy label flips, the reference's
top-two margin at that frame is within 4x the measured log-prob error (random weights give
near-ties that any rounding flips). Skipped where torch sees no CUDA device (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_models import build, speechlike
from speechrt.audio.mel import MelConfig
from speechrt.repo import ComponentInfo, save_component

pytestmark = pytest.mark.requires_cuda

MIN_SNR_DB = 30.0
PRECISION = "fp16"
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speech synthesis on a graphics processor, checked against its reference, item by item.",
]
KINDS = ("fastpitch", "hifigan", "quartznet", "fastspeech", "tacotron2", "waveglow", "jasper")
PIPELINES = (("fastpitch", "hifigan"), ("tacotron2", "waveglow"), ("fastspeech", "hifigan"))
FEED_LENGTH = {"denoiser": 200, "jasper": 300}  # per graph; others 120


def snr_db(ref: torch.Tensor | np.ndarray, x: torch.Tensor | np.ndarray) -> float:
    r = torch.as_tensor(ref).double().cpu()
    e = (torch.as_tensor(x).double().cpu() - r).pow(2).sum()
    return float("inf") if e == 0 else float(10 * torch.log10(r.pow(2).sum() / e))


@pytest.fixture(scope="module")
def component(tmp_path_factory: pytest.TempPathFactory):
    """kind -> model directory of a default-dims random-weight component, built once per kind."""
    root, dirs = tmp_path_factory.mktemp("cuda_models"), {}

    def get(kind: str) -> Path:
        if kind not in dirs:
            model, meta = build(kind, torch.device("cuda"))
            d = model.dims
            n_mels = getattr(d, "n_mel_channels", None) or getattr(d, "n_mels", 80)
            mel = None if model.role == "asr" else MelConfig(n_mels=n_mels)
            info = ComponentInfo(kind, dataclasses.asdict(d), mel, meta)
            dirs[kind] = save_component(root / kind, info, model.state_dict())
        return dirs[kind]

    return get


@pytest.mark.parametrize("kind", KINDS)
def test_cuda_graphs_match_eager_fp32(kind: str, component) -> None:
    from speechrt.device import PRECISIONS
    from speechrt.registry import contract, graphs_of
    from speechrt.repo import load_component
    from speechrt.runtime.buckets import Buckets
    from speechrt.runtime.cuda import cuda_runner
    from speechrt.runtime.eager import EagerRunner
    from speechrt.runtime.graphs import build_graph, example_feeds

    device = torch.device("cuda")
    model, info = load_component(component(kind), device, torch.float32)
    # HiFi-GAN also at batch 1: a single item runs its wide resblocks on cuDNN, the rest fused
    batches = (1, 2) if kind == "hifigan" else (2,)
    for graph, batch in ((g, b) for g in graphs_of(info.kind) for b in batches):
        wrapper = build_graph(graph, model, info)
        c = contract(graph, info.dims)
        feeds = example_feeds(graph, wrapper, batch, FEED_LENGTH.get(graph, 120))
        feeds = {k: v.to(device) for k, v in feeds.items()}
        ref = EagerRunner(wrapper, c).run(feeds)
        runner = cuda_runner(graph, wrapper, c, device=device, dtype=PRECISIONS[PRECISION],
                             buckets=Buckets(), mode="reduce-overhead")  # fmt: skip
        for _ in range(2):  # the second call replays what the first compiled and captured
            got = runner.run(feeds)
        for name in c.output_names:
            a, b = ref[name], got[name]
            assert a.shape == b.shape, (graph, name)
            if a.is_floating_point():
                assert snr_db(a, b) >= MIN_SNR_DB, (graph, name, snr_db(a, b))
            else:
                assert torch.equal(a.cpu(), b.cpu()), (graph, name)


@pytest.mark.parametrize("acoustic,vocoder", PIPELINES)
def test_tts_pipeline_cuda_matches_eager_fp32(acoustic: str, vocoder: str, component) -> None:
    from speechrt.options import SynthesisOptions
    from speechrt.tts import TTS

    a, v = component(acoustic), component(vocoder)
    opts = SynthesisOptions(denoise=0.01, seed=1)
    ref = TTS(a, v, device="cuda").synthesize(TEXTS, opts, seeds=[1, 2])
    tts = TTS(a, v, device="cuda", precision=PRECISION, backend="cuda")
    for _ in range(2):
        audio = tts.synthesize(TEXTS, opts, seeds=[1, 2])
    assert [len(x) for x in audio] == [len(x) for x in ref]
    for x, y in zip(ref, audio, strict=True):
        assert len(x) > 0 and snr_db(x, y) >= MIN_SNR_DB, snr_db(x, y)


@pytest.mark.parametrize("kind", ["quartznet", "jasper"])
def test_asr_one_graph_matches_two(kind: str, component) -> None:
    """The cuda ASR's one graph from audio to log-probs (FeaturesToLogProbs) against its
    featurizer then its acoustic runner, two graphs: same frames to decode, log-probs within
    1e-3 of their peak, at batch 1 and 2 (two buckets)."""
    from speechrt.asr import ASR

    asr = ASR(component(kind), device="cuda", precision=PRECISION, backend="cuda")
    assert asr.front is not None
    waves = [speechlike(s, i) for i, s in enumerate((6.0, 2.5))]
    for batch in ([waves[1]], waves):
        segs = [seg for i, w in enumerate(batch) for seg in asr.segments(i, w)]
        for _ in range(2):  # the first call compiles and captures, the second replays
            one, n_one = asr.log_probs(segs)
            two, n_two = asr.acoustic(*asr.featurize(segs))
            assert one.shape == two.shape and n_one.tolist() == n_two.tolist()
            peak = float(two.abs().max())
            assert float((one - two).abs().max()) <= 1e-3 * peak


@pytest.mark.parametrize("kind", ["quartznet", "jasper"])
def test_asr_cuda_matches_eager_fp32(kind: str, component) -> None:
    from speechrt.asr import ASR

    waves = [speechlike(s, i) for i, s in enumerate((6.0, 2.5))]

    def run(asr: ASR) -> tuple[list[str], torch.Tensor]:
        texts = [r.text for r in asr.transcribe(waves, batch_size=2)]
        segs = [seg for i, w in enumerate(waves) for seg in asr.segments(i, w)]
        return texts, asr.log_probs(segs)[0].float().cpu()  # (B, T', V)

    ref, ref_lp = run(ASR(component(kind), device="cuda"))
    assert sum(len(t.split()) for t in ref) > 0  # identical empty texts would prove nothing
    fast = ASR(component(kind), device="cuda", precision=PRECISION, backend="cuda")
    assert fast.front is not None  # features and acoustic model as one graph
    texts, log_probs = run(fast)
    if texts != ref:
        err = float((log_probs - ref_lp).abs().max())
        top2 = ref_lp.topk(2, dim=-1).values
        margin = top2[..., 0] - top2[..., 1]
        flipped = log_probs.argmax(-1) != ref_lp.argmax(-1)
        assert bool((margin[flipped] <= 4 * err).all()), (texts, ref, err)
