import json

import pytest
import torch

from speechrt.cli import main
from speechrt.convert.checkpoints import (
    detect_kind,
    fold_weight_norm,
    load_checkpoint,
    strip_prefix,
)
from speechrt.errors import SpeechRTError
from speechrt.repo import read_info


class Opaque:  # an arbitrary object: weights_only loading must refuse to unpickle it
    pass


def test_missing_and_corrupt_checkpoints(tmp_path):
    with pytest.raises(SpeechRTError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "none.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(SpeechRTError, match="not a readable PyTorch checkpoint"):
        load_checkpoint(bad)
    evil = tmp_path / "evil.pt"
    torch.save({"state_dict": {}, "obj": Opaque()}, evil)
    with pytest.raises(SpeechRTError, match="refusing to unpickle anything but tensors"):
        load_checkpoint(evil)
    lst = tmp_path / "list.pt"
    torch.save([1, 2], lst)
    with pytest.raises(SpeechRTError, match="expected a dict"):
        load_checkpoint(lst)


def test_cli_convert_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert main(["convert", str(bad), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a readable PyTorch checkpoint" in err
    unknown = tmp_path / "unknown.pt"
    torch.save({"state_dict": {"foo.weight": torch.zeros(2)}}, unknown)
    assert main(["convert", str(unknown), str(tmp_path / "out")]) == 2
    assert "cannot tell the model kind" in capsys.readouterr().err


def test_fold_weight_norm_matches_torch():
    conv = torch.nn.utils.weight_norm(torch.nn.Conv1d(3, 5, 4))
    sd = fold_weight_norm(conv.state_dict())
    assert set(sd) == {"weight", "bias"}
    torch.testing.assert_close(sd["weight"], conv.weight.detach(), rtol=0, atol=1e-6)
    tconv = torch.nn.utils.weight_norm(torch.nn.ConvTranspose1d(4, 2, 3))  # [in, out, k], dim 0
    torch.testing.assert_close(
        fold_weight_norm(tconv.state_dict())["weight"], tconv.weight.detach(), rtol=0, atol=1e-6
    )


def test_strip_prefix_and_detect():
    sd = strip_prefix({"module.a": torch.zeros(1), "b.module.c": torch.zeros(1)})
    assert set(sd) == {"a", "b.module.c"}
    with pytest.raises(SpeechRTError, match="pass --kind"):
        detect_kind({"state_dict": {"x": torch.zeros(1)}})


def test_read_info_errors(tmp_path):
    with pytest.raises(SpeechRTError, match="not a model directory"):
        read_info(tmp_path / "nope")
    with pytest.raises(SpeechRTError, match="no model.json"):
        read_info(tmp_path)
    (tmp_path / "model.json").write_text("{broken")
    with pytest.raises(SpeechRTError, match="corrupt model description"):
        read_info(tmp_path)
    (tmp_path / "model.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(SpeechRTError, match="unsupported"):
        read_info(tmp_path)
