"""The CPU session cache (speechrt.runtime.onnx_cache): the second session of a graph is built
from the graph onnxruntime optimised for the first, computes the same, and a changed model,
an unreadable entry or an unwritable folder never changes what the runner computes."""

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from runtime_models import exported
from speechrt.runtime.onnx import OnnxRunner
from speechrt.runtime.onnx_cache import ENV_VAR, GRAPH, WEIGHTS

FEEDS = {
    "mel": np.random.default_rng(0).standard_normal((2, 10, 37)).astype(np.float32),
    "mel_lengths": np.array([37, 20]),
}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A copy of the tiny exported HiFi-GAN (its files' times are the test's to change)."""
    return Path(shutil.copytree(exported()["hifigan"], tmp_path / "hifigan"))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "cache"))
    return tmp_path / "cache"


def audio(runner: OnnxRunner) -> np.ndarray:
    return runner.run(FEEDS)["audio"]


def entries(cache: Path) -> list[Path]:
    return [e for place in cache.iterdir() for e in place.iterdir()]


def test_second_session_is_built_from_the_cached_graph(model, cache, monkeypatch):
    first = OnnxRunner.from_dir(model, device="cpu")
    assert first.graph == model / "model.onnx"  # built from the model, and saved
    [entry] = entries(cache)
    assert (entry / GRAPH).is_file() and (entry / WEIGHTS).is_file()
    second = OnnxRunner.from_dir(model, device="cpu")
    assert second.graph == entry / GRAPH
    monkeypatch.setenv(ENV_VAR, "off")
    plain = OnnxRunner.from_dir(model, device="cpu")
    assert plain.graph == model / "model.onnx"
    # the optimised graph may order float sums otherwise: equal within float32 rounding
    np.testing.assert_allclose(audio(second), audio(plain), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(audio(first), audio(plain), rtol=1e-5, atol=1e-6)


def test_a_changed_model_replaces_its_entry(model, cache):
    OnnxRunner.from_dir(model, device="cpu")
    [old] = entries(cache)
    weights = model / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # re-exported, say
    again = OnnxRunner.from_dir(model, device="cpu")
    assert again.graph == model / "model.onnx"
    [new] = entries(cache)
    assert new != old and not old.exists()
    assert OnnxRunner.from_dir(model, device="cpu").graph == new / GRAPH


def test_an_unreadable_entry_is_made_again(model, cache, caplog):
    reference = audio(OnnxRunner.from_dir(model, device="cpu"))
    [entry] = entries(cache)
    (entry / GRAPH).write_bytes(b"not a graph")
    with caplog.at_level(logging.WARNING, logger="speechrt.runtime.onnx_cache"):
        runner = OnnxRunner.from_dir(model, device="cpu")
    assert runner.graph == model / "model.onnx"
    assert "unreadable cached graph" in caplog.text
    np.testing.assert_array_equal(audio(runner), reference)
    assert OnnxRunner.from_dir(model, device="cpu").graph == entry / GRAPH  # made again


def test_off_or_unwritable_leaves_the_session_as_it_was(model, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "off")
    reference = audio(OnnxRunner.from_dir(model, device="cpu"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(ENV_VAR, str(blocker / "cache"))  # a folder that cannot be made
    runner = OnnxRunner.from_dir(model, device="cpu")
    assert runner.graph == model / "model.onnx"
    np.testing.assert_array_equal(audio(runner), reference)
    assert not (tmp_path / "cache").exists()


def test_a_concurrent_entry_is_kept_and_a_dead_scratch_removed(model, cache):
    """Another process renamed its entry into place while this one built: this one keeps it
    (its rename fails, its scratch goes); a scratch folder older than an hour is removed."""
    OnnxRunner.from_dir(model, device="cpu")
    [entry] = entries(cache)
    shutil.rmtree(entry)
    entry.mkdir()
    (entry / "theirs").write_text("")  # an entry another process put there, not yet a graph
    dead = entry.parent / ".tmp-dead"
    dead.mkdir()
    os.utime(dead, (0, 0))
    runner = OnnxRunner.from_dir(model, device="cpu")
    assert runner.graph == model / "model.onnx"
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name]
    assert [p.name for p in entry.iterdir()] == ["theirs"]


def test_the_cache_folder(tmp_path, monkeypatch):
    from speechrt.runtime.onnx_cache import cache_root

    monkeypatch.setenv(ENV_VAR, "OFF")
    assert cache_root() is None
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "speechrt" / "onnx"
    monkeypatch.delenv("XDG_CACHE_HOME")

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory")

    monkeypatch.setattr(Path, "home", no_home)
    assert cache_root() is None
