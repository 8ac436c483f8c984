"""Reading .nemo files: what is refused, and that nothing in the file runs."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import torch
import yaml

from speechrt.cli import main
from speechrt.convert.nemo import resolve, sentencepiece_pieces, surface


def nemo_file(path: Path, config: dict, weights: object = None, mode: str = "w") -> Path:
    """A .nemo-shaped tar: model_config.yaml, model_weights.ckpt (torch.save of `weights`)."""
    buf = io.BytesIO()
    torch.save(weights if weights is not None else {"w": torch.zeros(1)}, buf)
    with tarfile.open(path, mode) as tar:
        for name, data in (
            ("./model_config.yaml", yaml.safe_dump(config).encode()),
            ("./model_weights.ckpt", buf.getvalue()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def one_line_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "target",
    [
        "nemo.collections.asr.models.EncDecMultiTaskModel",  # Canary
        "nemo.collections.asr.models.SpeechEncDecSelfSupervisedModel",
        "nemo.collections.asr.models.ClusteringDiarizer",
        "nemo.collections.tts.models.FastPitchModel",
    ],
)
def test_kinds_speechrt_does_not_serve_get_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    path = nemo_file(tmp_path / "x.nemo", {"target": target})
    err = one_line_error(["convert", str(path), str(tmp_path / "out")], capsys)
    assert target.rsplit(".", 1)[1] in err and "EncDecRNNTBPEModel" in err
    assert not (tmp_path / "out").exists()


class Evil:
    def __reduce__(self) -> tuple:
        return (Path.touch, (Path("/tmp/speechrt-evil-ran"),))


def test_pickled_objects_in_the_weights_are_refused_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = Path("/tmp/speechrt-evil-ran")
    marker.unlink(missing_ok=True)
    config = {"target": "nemo.collections.asr.models.EncDecCTCModelBPE", "tokenizer": {}}
    path = nemo_file(tmp_path / "x.nemo", config, weights={"w": Evil()})
    err = one_line_error(["convert", str(path), str(tmp_path / "out")], capsys)
    assert not marker.exists()
    assert "refusing to unpickle" in err


def test_links_in_the_archive_are_not_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "x.nemo"
    with tarfile.open(path, "w") as tar:
        link = tarfile.TarInfo("model_config.yaml")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    err = one_line_error(["convert", str(path), str(tmp_path / "out")], capsys)
    assert "no model_config.yaml" in err


def test_not_an_archive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.nemo").write_bytes(b"not a tar file at all")
    err = one_line_error(["convert", str(tmp_path / "x.nemo"), str(tmp_path / "out")], capsys)
    assert "not a readable .nemo archive" in err


def test_interpolations_resolve_against_the_root() -> None:
    config = {
        "sample_rate": 16000,
        "preprocessor": {"sample_rate": "${sample_rate}", "window": "${model.win}"},
        "win": "hann",
        "note": "rate ${sample_rate} Hz",
    }
    got = resolve(config)
    assert got["preprocessor"] == {"sample_rate": 16000, "window": "hann"}
    assert got["note"] == "rate 16000 Hz"
    with pytest.raises(Exception, match="cannot resolve"):
        resolve({"a": "${nowhere.at.all}"})
    with pytest.raises(Exception, match="nest too deeply"):
        resolve({"a": "${b}", "b": "${a}"})


def test_sentencepiece_pieces_from_protobuf_bytes() -> None:
    """A ModelProto's repeated pieces (field 1: piece, score, type), hand-encoded."""

    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    def piece(text: str, kind: int) -> bytes:
        return field(1, field(1, text.encode()) + bytes([3 << 3, kind]))

    model = piece("<unk>", 2) + piece("\u2581Hello", 1) + piece(",", 1) + field(2, b"\x08\x01")
    pieces = sentencepiece_pieces(model)
    assert pieces == [("<unk>", 2), ("\u2581Hello", 1), (",", 1)]
    assert [surface(p, k) for p, k in pieces] == [" \u2047 ", " Hello", ","]
