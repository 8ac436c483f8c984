"""The model repository: model.json's dims are checked against the weights before building."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from speechrt.cli import main
from speechrt.errors import SpeechRTError
from speechrt.repo import check_dims, load_component, read_info, weight_shapes


def with_dims(src: Path, dst: Path, **changes: object) -> Path:
    """A copy of model directory `src` whose model.json dims carry `changes`."""
    shutil.copytree(src, dst)
    info = json.loads((dst / "model.json").read_text())
    info["dims"].update(changes)
    (dst / "model.json").write_text(json.dumps(info))
    return dst


def test_weight_shapes_come_from_the_header(tiny_asr: Path) -> None:
    model, _ = load_component(tiny_asr)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert weight_shapes(tiny_asr) == want
    check_dims(tiny_asr, read_info(tiny_asr))  # the real thing passes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # would allocate terabytes if built: caught by comparing shapes on the meta device
        (
            {"n_feats": 10**9},
            r"the dims make \[1000000000, 1, 11\], the weights hold \[64, 1, 11\]",
        ),
        ({"filters": [16, 3_000_000, 32]}, r"the dims make \[3000000, 16, 1\]"),
        ({"n_feats": -64}, r"dims.n_feats = -64 is not a valid integer >= 0"),
        ({"kernels": [11, 3e6, 1]}, r"dims.kernels = \[11, 3000000.0, 1\] is not a valid tuple"),
        ({"separable": [1, 1, 0]}, r"dims.separable = \[1, 1, 0\] is not a valid tuple of boolean"),
        ({"residual": ["none", "plain", "lots"]}, r"model.json: quartznet: unknown residual type"),
        ({"n_classes": 30}, r"decoder\.\w+: the dims make \[30"),
    ],
)
def test_absurd_dims_are_one_line_errors(
    tiny_asr: Path, tmp_path: Path, changes: dict, message: str
) -> None:
    bad = with_dims(tiny_asr, tmp_path / "bad", **changes)
    with pytest.raises(SpeechRTError, match=message) as e:
        load_component(bad)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)


def test_cli_names_the_bad_dims_in_one_line(
    tiny_voice: tuple[Path, Path], tiny_asr: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    wav = tmp_path / "a.wav"
    sf.write(wav, np.zeros(16000, dtype=np.float32), 16000)
    bad_asr = with_dims(tiny_asr, tmp_path / "asr", n_feats=10**9)
    assert main(["transcribe", str(wav), "--model", str(bad_asr), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "weights do not match model.json" in err
    bad_vocoder = with_dims(tiny_voice[1], tmp_path / "voc", n_mels=10**9)
    out = str(tmp_path / "out.wav")
    args = ["--acoustic", str(tiny_voice[0]), "--vocoder", str(bad_vocoder), "--device", "cpu"]
    assert main(["synthesize", "Hello.", "-o", out, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1000000000" in err


def test_models_build_on_the_meta_device_as_they_do_for_real() -> None:
    """check_dims relies on it: every kind's state dict has the same shapes on both."""
    from speechrt.models import build_model, model_class
    from speechrt.registry import ARCHITECTURES

    for kind in ARCHITECTURES:
        dims = model_class(kind).Dims()
        with torch.device("meta"):
            meta = build_model(kind, dims)
        real = build_model(kind, dims)
        shapes = {k: v.shape for k, v in real.state_dict().items()}
        assert {k: v.shape for k, v in meta.state_dict().items()} == shapes, kind
        assert all(v.is_meta for v in meta.state_dict().values()), kind


def test_weight_dims_name_the_axes_the_dims_size() -> None:
    """Architecture.weight_dims (what the onnx path checks without torch) against the module
    the dims build, for every preset of every kind (and a multi-speaker FastPitch)."""
    from speechrt.models import build_model
    from speechrt.registry import ARCHITECTURES, preset

    for kind, arch in ARCHITECTURES.items():
        assert arch.weight_dims, kind
        variants = [preset(kind, name) for name in arch.presets]
        if kind == "fastpitch":
            variants.append(preset(kind, "tiny", n_speakers=3))
        for dims in variants:
            with torch.device("meta"):
                state = build_model(kind, dims).state_dict()
            for field, (key, axis) in arch.weight_dims.items():
                if key in state:
                    assert state[key].shape[axis] == getattr(dims, field), (kind, field)
                else:  # only a weight the dims leave out may be absent
                    assert field == "n_speakers" and dims.n_speakers == 1, (kind, key)


BUNDLED_CHANGES = [
    # (component, dims changed, what the one-line error says)
    ("voice-acoustic", {"n_mel_channels": 10**9}, "n_mel_channels is 1000000000, but proj.weight"),
    ("voice-acoustic", {"n_symbols": 10**6}, "n_symbols is 1000000, but encoder.word_emb.weight"),
    ("voice-acoustic", {"pitch_conditioning_formants": 2}, "'pitch' is ['batch', 1, 'symbols']"),
    ("voice-vocoder", {"n_mels": 10**9}, "n_mels is 1000000000, but conv_pre.weight"),
]
# the recogniser's row: a dim its kind checks against a weight
ASR_CHANGES = {
    "quartznet": (
        {"n_feats": 10**9},
        "n_feats is 1000000000, but blocks.0.subs.0.depthwise.weight",
    ),
    "parakeet_ctc": ({"d_model": 10**9}, "d_model is 1000000000, but encoder.layers.0.norm_out"),
}


def _bundled_asr_kind() -> str:
    from speechrt.defaults import ASR_MODEL, default_model

    d = default_model(ASR_MODEL)
    return "quartznet" if d is None else read_info(d).kind


BUNDLED_CHANGES.append(("asr", *ASR_CHANGES[_bundled_asr_kind()]))


@pytest.mark.parametrize(("component", "changes", "message"), BUNDLED_CHANGES)
def test_the_onnx_path_refuses_dims_that_contradict_the_weights(
    component: str, changes: dict, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The CPU's default backend never builds the module, so the eager path's strict load never
    runs: its dims are checked against the safetensors header and the graph's own shapes."""
    from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, VOICE_VOCODER, default_model

    dirs = {n: default_model(n) for n in (VOICE_ACOUSTIC, VOICE_VOCODER, ASR_MODEL)}
    if None in dirs.values():
        pytest.skip("needs the bundled models")
    bad = with_dims(dirs[component], tmp_path / component, **changes)
    dirs[component] = bad
    if component == ASR_MODEL:
        wav = tmp_path / "a.wav"
        sf.write(wav, np.zeros(16000, dtype=np.float32), 16000)
        args = ["transcribe", str(wav), "--model", str(bad)]
    else:
        voice = ["--acoustic", str(dirs[VOICE_ACOUSTIC]), "--vocoder", str(dirs[VOICE_VOCODER])]
        args = ["synthesize", "Hello.", "-o", str(tmp_path / "out.wav"), *voice]
    assert main([*args, "--backend", "onnx", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(bad) in err, err
