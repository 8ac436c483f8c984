"""What the Triton repository tests share: the tiny exported components (the QuartzNet given
labels and features), a repository written from them, and config.pbtxt parsed by Triton's
ModelConfig. The fixtures `dirs` and `repo` (one per test module) reach the tests through
conftest.py's pytest_plugins."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from runtime_models import exported
from speechrt.audio.features import FeatureConfig
from speechrt.models.jasper import LABELS
from speechrt.triton.writer import RepoOptions, write_repository

OPTIONS = RepoOptions(max_batch_size=4, queue_delay_us=2500)
FEATURES = FeatureConfig(n_mels=12)  # the tiny QuartzNet's inputs


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The exported tiny components; the QuartzNet copied and given labels and features."""
    out = dict(exported())
    asr = tmp_path_factory.mktemp("asr") / "quartznet"
    shutil.copytree(out["quartznet"], asr)
    info = json.loads((asr / "model.json").read_text())
    info["meta"] = {"labels": list(LABELS), "features": FEATURES.to_dict()}
    (asr / "model.json").write_text(json.dumps(info))
    out["quartznet"] = asr
    return out


@pytest.fixture(scope="module")
def repo(dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository of the tiny FastPitch, HiFi-GAN and QuartzNet (with OPTIONS): their graphs,
    python models and ensembles."""
    out = tmp_path_factory.mktemp("triton") / "repo"
    written, notes = write_repository(
        out, [dirs["fastpitch"], dirs["hifigan"], dirs["quartznet"]], OPTIONS
    )
    assert sorted(p.name for p in written) == sorted(p.name for p in out.iterdir())
    assert notes == []
    return out


def config(path: Path) -> Any:
    """config.pbtxt as Triton's ModelConfig message (tritonclient imported here: the plugin
    loads on machines without it, such as the GPU image)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse((path / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
