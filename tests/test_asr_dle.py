"""Jasper / QuartzNet checkpoints in the DLE layout -> `speechrt convert` -> same log-probs, and
by default (no voice activity detection: the checkpoint does not ask for it) the transcripts of
DLE's inference on whole files, through the CLI and the server.

The reference is a DLE-layout module and DLE's inference written for these tests
(tests/dle_jasper.py).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from torch import nn

from dle_jasper import (
    LABELS,
    TINY,
    DLEModel,
    block_cfg,
    dle_inference,
    dle_model,
    speechlike,
    talkative_model,
)
from speechrt.arch.jasper import PRESETS
from speechrt.cli import main
from speechrt.convert.jasper import from_dle
from speechrt.errors import SpeechRTError
from speechrt.models.jasper import Jasper, QuartzNet
from speechrt.repo import load_component

KEYS = Path(__file__).parent / "data" / "checkpoint_keys"

pytestmark = pytest.mark.usefixtures("one_thread")


def preset_cfg(name: str) -> list[dict]:
    p = PRESETS[name]
    cols = zip(
        *(p[k] for k in ("filters", "kernels", "repeats", "strides", "dilations")), strict=True
    )
    return [
        block_cfg(f, k, r, s, d, sep, res != "none", res == "dense")
        for (f, k, r, s, d), sep, res in zip(cols, p["separable"], p["residual"], strict=True)
    ]


def dle_config(kind: str, blocks: list[dict] | None = None) -> dict:
    enc = {"activation": "relu", "frame_splicing": 1, "in_feats": 64, "use_conv_masks": True}
    fb = {"sample_rate": 16000, "window_size": 0.02, "window_stride": 0.01, "n_fft": 512}
    fb.update(n_filt=64, window="hann", normalize="per_feature", pad_align=16, dither=1e-5)
    return {
        "labels": LABELS,
        kind: {"encoder": {**enc, "blocks": copy.deepcopy(blocks or TINY[kind])}},
        "input_val": {"filterbank_features": fb},
    }


def convert(tmp_path: Path, ckpt: dict, name: str = "ckpt") -> Path:
    src, out = tmp_path / f"{name}.pt", tmp_path / name
    torch.save(ckpt, src)
    assert main(["convert", str(src), str(out)]) == 0
    return out


def batch(seed: int = 3, lengths=(96, 61, 80)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths)
    x = torch.randn(len(lengths), 64, max(lengths), generator=g)
    t = torch.arange(x.shape[2])
    return x.masked_fill((t[None] >= lens[:, None])[:, None], 0), lens


def assert_same_outputs(ref: nn.Module, model: nn.Module, tol: float = 1e-5) -> None:
    x, lens = batch()
    with torch.no_grad():
        want, want_lens = ref(x, lens)
        got, got_lens = model(x, lens)
    assert torch.equal(want_lens, got_lens)
    assert got.shape == want.shape
    for i, n in enumerate(got_lens.tolist()):
        assert (got[i, :n] - want[i, :n]).abs().max().item() <= tol


@pytest.mark.parametrize(
    ("kind", "preset"), [("jasper", "jasper-10x5"), ("quartznet", "quartznet-15x5")]
)
def test_default_dims_layout_matches_published_keys(kind: str, preset: str) -> None:
    published = json.loads((KEYS / f"{kind}.json").read_text())["state_dict"]
    with torch.device("meta"):  # shapes only, no 333 M floats
        ref = DLEModel(kind, preset_cfg(preset))
    sd = ref.state_dict()
    assert {k: list(v.shape) for k, v in sd.items()} == published
    conv = from_dle({"state_dict": sd}, Jasper if kind == "jasper" else QuartzNet)
    assert conv.dims == (Jasper if kind == "jasper" else QuartzNet).Dims()  # preset inferred
    with torch.device("meta"):
        model = (Jasper if kind == "jasper" else QuartzNet)(conv.dims)
    model.load_state_dict(conv.state_dict, strict=True, assign=True)


@pytest.mark.parametrize("kind", ["jasper", "quartznet"])
def test_convert_matches_dle_module(tmp_path: Path, kind: str) -> None:
    ref = dle_model(kind)
    out = convert(tmp_path, {"state_dict": ref.state_dict(), "config": dle_config(kind)})
    model, info = load_component(out)
    assert info.kind == kind and model.role == "asr"
    assert info.meta["pad_leading"] == (16 if kind == "jasper" else 0)
    assert info.meta["labels"] == LABELS and info.meta["features"]["dither"] == 0.0
    assert_same_outputs(ref, model)


@pytest.mark.parametrize("kind", ["jasper", "quartznet"])
def test_convert_without_config_infers_strides(tmp_path: Path, kind: str) -> None:
    ref = dle_model(kind, seed=5)
    out = convert(tmp_path, {"state_dict": ref.state_dict(), "epoch": 3})
    model, info = load_component(out)
    assert info.dims["strides"][0] == 2 and 2 in info.dims["dilations"]
    assert_same_outputs(ref, model)


def test_ema_weights_preferred(tmp_path: Path) -> None:
    ref, other = dle_model("quartznet", seed=1), dle_model("quartznet", seed=2)
    ckpt = {"state_dict": other.state_dict(), "ema_state_dict": ref.state_dict(), "step": 10}
    model, info = load_component(convert(tmp_path, ckpt))
    assert info.meta["weights"] == "ema_state_dict"
    assert_same_outputs(ref, model)


def test_jasper_v1_keys(tmp_path: Path) -> None:
    ref = dle_model("jasper", seed=4)
    v1 = {}
    for k, v in ref.state_dict().items():
        k = k.replace("encoder.layers.", "jasper_encoder.encoder.")
        v1["module." + k.replace("decoder.layers.", "jasper_decoder.decoder_layers.")] = v
    v1["audio_preprocessor.featurizer.fb"] = torch.zeros(1, 64, 257)
    model, _ = load_component(convert(tmp_path, {"state_dict": v1}))
    assert_same_outputs(ref, model)


@pytest.mark.parametrize("kind", ["jasper", "quartznet"])
def test_batched_equals_single(tmp_path: Path, kind: str) -> None:
    model, _ = load_component(convert(tmp_path, {"state_dict": dle_model(kind).state_dict()}))
    x, lens = batch(seed=9, lengths=(112, 37, 80, 64))
    with torch.no_grad():
        full, full_lens = model(x, lens)
        for i, n in enumerate(lens.tolist()):
            t = -(-n // 16) * 16  # the item alone, padded as the pipeline pads it
            one, one_lens = model(x[i : i + 1, :, :t], lens[i : i + 1])
            assert one_lens.item() == full_lens[i].item()
            # valid frames and the padded tail that DLE decodes at batch size 1
            assert (one[0] - full[i, : one.shape[1]]).abs().max().item() <= 1e-5


def test_bad_checkpoints(tmp_path: Path) -> None:
    sd = dle_model("jasper").state_dict()
    del sd["encoder.layers.2.conv.5.running_var"]
    torch.save({"state_dict": sd}, tmp_path / "a.pt")
    assert main(["convert", str(tmp_path / "a.pt"), str(tmp_path / "a")]) == 2
    sd = dle_model("quartznet").state_dict()
    sd["encoder.layers.1.extra.weight"] = torch.zeros(3)
    with pytest.raises(SpeechRTError, match="unexpected key"):
        from_dle({"state_dict": sd}, QuartzNet)
    cfg = dle_config("jasper")
    cfg["jasper"]["encoder"]["blocks"][2]["filters"] = 99
    with pytest.raises(SpeechRTError, match="block 2"):
        from_dle({"state_dict": dle_model("jasper").state_dict(), "config": cfg})


@pytest.mark.slow
def test_quartznet_15x5_default_dims(tmp_path: Path) -> None:
    ref = dle_model("quartznet", blocks=preset_cfg("quartznet-15x5"))
    out = convert(tmp_path, {"ema_state_dict": ref.state_dict()})
    model, info = load_component(out)
    assert info.dims == {
        k: list(v) if isinstance(v, tuple) else v for k, v in PRESETS["quartznet-15x5"].items()
    }
    assert_same_outputs(ref, model)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two 16-bit WAVs as a user records them: speech-like sound between 0.6 s and 0.8 s of
    quiet, over a -60 dBFS noise floor (what a voice activity detector cuts away)."""
    root, paths = tmp_path_factory.mktemp("dle_wavs"), []
    for seed in (210, 225):  # each frame's best label beats the next by > 5e-3 (asserted below)
        x = np.concatenate([np.zeros(9600), speechlike(2.5, seed), np.zeros(12800)])
        x += 0.001 * np.random.default_rng(seed).standard_normal(x.size)
        paths.append(root / f"rec{seed}.wav")
        sf.write(paths[-1], x.astype(np.float32), 16000, subtype="PCM_16")
    return paths


def dle_transcripts(kind: str, ref: DLEModel, paths: list[Path]) -> list[str]:
    texts = []
    for path in paths:
        audio, _ = sf.read(path, dtype="float32")  # as DLE reads a WAV: int16 / 32768
        text, log_probs = dle_inference(kind, ref, audio)
        # speechrt's log-probs are within ~2e-4 of these (float32 features against float64):
        # no frame's best label is that close to a tie, so the transcripts must be equal
        top2 = np.sort(log_probs, axis=1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0]).min() > 5e-3
        assert len(text.split()) >= 10  # the test model does say things
        texts.append(text)
    return texts


def transcribe_cli(capsys: pytest.CaptureFixture, paths: list[Path], *flags: str) -> list[str]:
    capsys.readouterr()  # what came before
    assert main(["transcribe", *map(str, paths), *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(p) for p in paths]
    return [line.split("\t", 1)[1] for line in lines]


@pytest.mark.parametrize("kind", ["jasper", "quartznet"])
def test_cli_transcribes_as_dle_by_default(
    tmp_path: Path, kind: str, recordings: list[Path], capsys: pytest.CaptureFixture
) -> None:
    """`speechrt transcribe WAV --model DIR` on a converted checkpoint gives DLE's transcripts;
    --vad turns the detector on for it (the cuts change every transcript), --no-vad is the
    default spelt out."""
    from speechrt.asr import ASR

    ref = talkative_model(kind)
    model_dir = convert(tmp_path, {"state_dict": ref.state_dict(), "config": dle_config(kind)})
    assert "vad" not in load_component(model_dir)[1].meta  # the checkpoint asks for none
    want = dle_transcripts(kind, ref, recordings)
    assert transcribe_cli(capsys, recordings, "--model", str(model_dir)) == want
    assert transcribe_cli(capsys, recordings, "--model", str(model_dir), "--no-vad") == want
    with_vad = transcribe_cli(capsys, recordings, "--model", str(model_dir), "--vad")
    assert all(got != text for got, text in zip(with_vad, want, strict=True))
    detected = ASR(model_dir, vad=True)
    assert detected.vad is not None and ASR(model_dir).vad is None
    assert with_vad == [t.text for t in detected.transcribe([str(p) for p in recordings])]


def test_server_transcribes_as_dle_by_default(tmp_path: Path, recordings: list[Path]) -> None:
    """`speechrt serve --asr DIR` on a converted checkpoint: uploads, and streamed ones (whose
    final text is the realtime sessions' too: speechrt.serving.streams), give DLE's
    transcripts; `serve --vad` turns the detector on."""
    import asyncio

    import httpx

    from speechrt.cli import build_parser
    from speechrt.cli.serve import load_server
    from speechrt.serving import create_app

    ref = talkative_model("quartznet")
    model_dir = convert(tmp_path, {"state_dict": ref.state_dict()})
    want = dle_transcripts("quartznet", ref, recordings)

    async def served(*flags: str) -> tuple[list[str], list[str]]:
        args = build_parser().parse_args(["serve", "--asr", str(model_dir), *flags])
        app = create_app(load_server(args))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        texts, streamed = [], []
        async with app.router.lifespan_context(app), client:
            for path in recordings:
                for stream, out in (("false", texts), ("true", streamed)):
                    r = await client.post(
                        "/v1/audio/transcriptions",
                        data={"model": "asr", "stream": stream},
                        files={"file": (path.name, path.read_bytes(), "audio/wav")},
                    )
                    assert r.status_code == 200, r.text
                    if stream == "false":
                        out.append(r.json()["text"])
                        continue
                    events = [
                        json.loads(line[6:]) for line in r.text.splitlines() if line[:6] == "data: "
                    ]
                    assert events[-1]["type"] == "transcript.text.done"
                    out.append(events[-1]["text"])
        return texts, streamed

    assert asyncio.run(served()) == (want, want)
    with_vad, streamed = asyncio.run(served("--vad"))
    assert streamed == with_vad and all(a != b for a, b in zip(with_vad, want, strict=True))
