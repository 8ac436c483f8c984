"""The registry finds every module of speechrt.arch: an architecture written as
docs/adding-a-model.md says (an arch file and a model file, tests/toy_arch/toy.py and
tests/toy_model.py here) is discovered, built from a preset, saved, loaded, run by its graph
wrapper and exported, with no other edit; a conversion file is optional. No other source file
names an architecture or a graph (test_an_architecture_is_named_only_in_its_own_files)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

import speechrt.arch
from speechrt import registry
from speechrt.arch import GraphCode
from speechrt.convert.checkpoints import convert_checkpoint, detect_kind
from speechrt.errors import SpeechRTError
from speechrt.models import build_model
from speechrt.registry import ARCHITECTURES, GRAPHS, Architecture
from speechrt.repo import ComponentInfo, load_component, save_component
from speechrt.runtime.graphs import build_graph, example_feeds

KINDS = {"fastpitch", "fastspeech", "tacotron2", "hifigan", "waveglow", "jasper", "quartznet"}
KINDS |= {"parakeet_ctc", "parakeet_transducer"}
TOY_ARCH = Path(__file__).parent / "toy_arch"
ROOT = Path(__file__).resolve().parents[1]
# The files of an architecture family <f>, as docs/adding-a-model.md lists them (the last two
# optional), besides any other module its entries name (convert/nemo.py reads Parakeet's files)
OWN_FILES = (
    "src/speechrt/arch/<f>.py",
    "src/speechrt/models/<f>.py",
    "src/speechrt/runtime/graphs/<f>.py",
    "src/speechrt/convert/<f>.py",
)
# The names other source files may use, and why: the stages add the shared denoiser graph to
# every vocoder; the transducer decoder drives the Parakeet transducer's two step graphs; the
# text front ends are named after DLE's recipes, not after the models.
NAMED_ELSEWHERE = {
    "src/speechrt/runtime/stages.py": {"denoiser"},
    "src/speechrt/bench/inprocess.py": {"denoiser"},
    "src/speechrt/asr/transducer.py": {"parakeet.predict", "parakeet.joint"},
    "src/speechrt/text/processor.py": {"fastpitch", "tacotron2"},
}


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Architecture:
    """The registry as it is when tests/toy_arch/toy.py lies in src/speechrt/arch/."""
    monkeypatch.setattr(speechrt.arch, "__path__", [*speechrt.arch.__path__, str(TOY_ARCH)])
    found = registry.discover()
    assert set(found) == KINDS | {"toy"}
    monkeypatch.setitem(ARCHITECTURES, "toy", found["toy"])
    for name, graph in registry.graphs_over(found).items():
        monkeypatch.setitem(GRAPHS, name, graph)
    return found["toy"]


def test_discovery_finds_every_architecture() -> None:
    assert set(registry.discover()) == set(ARCHITECTURES) == KINDS


def test_every_entry_resolves() -> None:
    for kind, entry in ARCHITECTURES.items():
        cls = registry.model_class(kind)
        assert cls.kind == kind and entry.kind == kind and cls.Dims is entry.dims
        assert {"default", "tiny"} <= set(entry.presets)
        assert registry.preset(kind) == entry.dims() and registry.preset(kind, "tiny").n_mels > 0
        if entry.reads is None:  # else whole files of another project (.nemo)
            assert callable(registry.converter(kind))
        for graph, file in entry.graphs:
            assert GRAPHS[graph.name] is graph and file.endswith(".onnx")
            code = registry.graph_code(graph.name)  # a GraphCode, its stage as the entry says
            assert isinstance(code, GraphCode) and callable(code.build) and callable(code.example)
    readers = {k for k, a in ARCHITECTURES.items() if a.reads is not None}
    assert registry.file_reader(".nemo") is not None and registry.file_reader(".pt") is None
    assert readers == {"parakeet_ctc", "parakeet_transducer"}
    assert set(registry.detectors()) == set(ARCHITECTURES) - readers


def test_names_that_are_not_what_they_say_are_clear_errors() -> None:
    with pytest.raises(SpeechRTError, match="speechrt.arch.hifigan:PRESETS is not a GraphCode"):
        registry.load("speechrt.arch.hifigan:PRESETS", GraphCode)
    with pytest.raises(SpeechRTError, match="speechrt.arch:nonesuch is not a type: NoneType"):
        registry.load("speechrt.arch:nonesuch", type)


def _files(family: str) -> set[str]:
    return {f.replace("<f>", family) for f in OWN_FILES}


def _module_file(path: str) -> str:
    return "src/" + path.partition(":")[0].replace(".", "/") + ".py"


def _string_names(path: Path, names: set[str]) -> set[str]:
    """The strings of `names` that the code of `path` holds (docstrings left out)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in docs
    }


def test_an_architecture_is_named_only_in_its_own_files() -> None:
    """Adding an architecture edits no list elsewhere: every source file that names a kind or a
    graph (a string in its code) is one of that family's files (OWN_FILES, as
    docs/adding-a-model.md lists them, or a module its entry names), or NAMED_ELSEWHERE says
    why. Every module an entry names is one of its family's files too (or a reader of whole
    model files of another project)."""
    doc = (ROOT / "docs" / "adding-a-model.md").read_text()
    assert all(f.replace("<f>", "<kind>") in doc for f in OWN_FILES)
    allowed: dict[str, set[str]] = {}  # name -> the files that may hold it
    for kind, a in ARCHITECTURES.items():
        family = a.dims.__module__.rpartition(".")[2]  # arch/<family>.py
        named = {_module_file(a.model)} | {_module_file(g.code) for g, _ in a.graphs}
        assert _module_file(a.model) in _files(family), kind
        if a.convert is not None:
            assert _module_file(a.convert) in _files(family) or a.reads is not None, kind
            named.add(_module_file(a.convert))
        allowed[kind] = _files(family) | named
        for g, _ in a.graphs:  # a shared graph (the denoiser) is its own arch file's
            g_family = g.contract.__module__.rpartition(".")[2]
            assert _module_file(g.code) in _files(g_family), g.name
            allowed.setdefault(g.name, set()).update(_files(g_family) | named)
    found = {}
    for path in sorted((ROOT / "src").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for name in _string_names(path, set(allowed)):
            if rel not in allowed[name] and name not in NAMED_ELSEWHERE.get(rel, set()):
                found.setdefault(rel, set()).add(name)
    assert not found, found


def test_every_preset_builds_and_tiny_is_tiny() -> None:
    for kind, entry in ARCHITECTURES.items():
        sizes = {}
        for name in entry.presets:
            with torch.device("meta"):  # shapes only: the published sizes allocate nothing
                model = build_model(kind, registry.preset(kind, name))
            sizes[name] = sum(p.numel() for p in model.parameters())
        assert sizes["tiny"] * 10 < min(n for name, n in sizes.items() if name != "tiny"), kind


def test_derived_sizes_are_the_graphs_output_sizes() -> None:
    """The output axes the registry derives from input sizes (plain arithmetic: what a server
    on onnxruntime uses) are the sizes the graph gives, for every graph that derives some."""
    checked = set()
    for kind, entry in ARCHITECTURES.items():
        for graph, _ in entry.graphs:
            if graph.derived_sizes is None:
                continue
            dims = registry.preset(kind, "tiny")
            wrapper = build_graph(graph.name, build_model(kind, dims).eval(), None)
            feeds = example_feeds(graph.name, wrapper, 2, 23, seed=0)
            c = registry.contract(graph.name, dims)
            sizes = {
                a: feeds[t.name].shape[i] for t in c.inputs for i, a in t.dynamic_axes().items()
            }
            derive = registry.derived_sizes(graph.name, dataclasses.asdict(dims))
            assert derive is not None
            derived = derive(sizes)
            with torch.inference_mode():
                outs = wrapper(**feeds)
            got = {
                a: value.shape[i]
                for t, value in zip(c.outputs, outs, strict=True)
                for i, a in t.dynamic_axes().items()
                if a in derived
            }
            assert got == {a: n for a, n in derived.items() if a in got} and got, kind
            checked.add(graph.name)
    assert checked == {"hifigan", "waveglow", "jasper", "parakeet"}


def test_unknown_kind_graph_and_preset_are_clear_errors() -> None:
    with pytest.raises(SpeechRTError, match="unknown model kind 'nonesuch'; known: fastpitch"):
        registry.model_class("nonesuch")
    with pytest.raises(SpeechRTError, match="no graph 'nonesuch'"):
        registry.contract("nonesuch", {})
    with pytest.raises(SpeechRTError, match="hifigan: no preset 'v9'; known: default, tiny"):
        registry.preset("hifigan", "v9")
    with pytest.raises(SpeechRTError, match="unknown dims \\['n_flows'\\]"):
        registry.contract("hifigan", {"n_flows": 12})


def test_an_added_architecture_needs_no_other_table(toy: Architecture, tmp_path: Path) -> None:
    model = build_model("toy", registry.preset("toy", "tiny"))
    with torch.no_grad():
        model.gain.copy_(torch.tensor([2.0, -1.0]))
    info = ComponentInfo("toy", model.dims)
    save_component(tmp_path / "toy", info, model.state_dict())
    # the weights get the json's permissions (0666 less the umask), not safetensors' 0600
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "toy").iterdir()}
    assert modes["model.safetensors"] == modes["model.json"], modes

    model, info = load_component(tmp_path / "toy")
    wrapper = build_graph("toy", model, info)
    feeds = example_feeds("toy", wrapper, batch=2, length=5)
    c = registry.contract("toy", info.dims)
    assert c.check_feeds(feeds) == {"batch": 2, "frames": 5}
    y, y_lengths = wrapper(*(feeds[n] for n in c.input_names))
    assert torch.equal(y_lengths, feeds["lengths"])
    want = feeds["x"][1, :, :4] * torch.tensor([2.0, -1.0])[:, None]
    assert torch.allclose(y[1, :, :4], want) and not y[1, :, 4:].any()
    with pytest.raises(SpeechRTError, match="toy: no checkpoint conversion"):
        registry.converter("toy")


def test_an_added_architecture_exports(toy: Architecture, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from speechrt.runtime.export import export_dir

    model = build_model("toy", registry.preset("toy"))
    save_component(tmp_path / "toy", ComponentInfo("toy", model.dims), model.state_dict())
    paths, checks = export_dir(tmp_path / "toy")
    assert [p.name for p in paths] == ["model.onnx"] and all(p.is_file() for p in paths)
    assert checks and all(c.graph == "toy" and c.max_abs_error < 1e-5 for c in checks)


def test_a_conversion_file_makes_checkpoints_readable(
    toy: Architecture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The optional step: convert/<kind>.py (tests/toy_convert.py), reached by the entry."""

    entry = dataclasses.replace(toy, convert="toy_convert:CONVERSION")
    monkeypatch.setitem(ARCHITECTURES, "toy", entry)
    ckpt = {"state_dict": {"module.toy_gain": torch.tensor([1.0, 2.0, -1.0, 0.5])}}
    torch.save(ckpt, tmp_path / "toy.pt")
    assert detect_kind(ckpt) == "toy"

    info = convert_checkpoint(tmp_path / "toy.pt", tmp_path / "toy")
    assert info.kind == "toy" and info.dims.n_channels == 4
    model, _ = load_component(tmp_path / "toy")
    assert torch.equal(model.gain, torch.tensor([1.0, 2.0, -1.0, 0.5]))
