"""`speechrt verify`: run two backends on the same inputs, compare every activation and output.

Like DLE FastSpeech's verify_trt.py: for each named intermediate activation (forward hooks on the
graph's named submodules) and each output, print the max abs error, how many elements differ by
more than the tolerance, and whether the two are identical. Only the outputs decide the verdict.

onnx intermediates come from a probe export: the same wrapper traced with the hooked activations
as extra graph outputs (written to a temporary directory); the outputs are the ones of the
model directory's own ONNX file.
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from speechrt.contracts import Contract, TensorSpec
from speechrt.registry import graphs_of
from speechrt.runtime.cuda import CudaRunner
from speechrt.runtime.eager import capture


@dataclass
class Comparison:
    name: str
    kind: str  # "activation" or "output"
    shape: tuple[int, ...]  # compared region (common leading block of both shapes)
    max_abs_error: float
    mismatches: int  # elements with |a - b| > tolerance
    total: int
    identical: bool
    snr_db: float  # 10 log10(sum a^2 / sum (a - b)^2); inf when identical


def compare(name: str, kind: str, a: Tensor, b: Tensor, tolerance: float) -> Comparison:
    """Compare a and b on their common region (padding from buckets is cut off)."""
    if a.dim() != b.dim():
        return Comparison(name, kind, tuple(a.shape), float("inf"), a.numel(), a.numel(), False, 0)
    region = tuple(min(x, y) for x, y in zip(a.shape, b.shape, strict=True))
    index = tuple(slice(0, n) for n in region)
    x, y = a[index].double().cpu(), b[index].double().cpu()
    diff = (x - y).abs()
    err = float(diff.max()) if diff.numel() else 0.0
    noise = float((diff**2).sum())
    signal = float((x**2).sum())
    snr = float("inf") if noise == 0 else 10 * torch.log10(torch.tensor(signal / noise)).item()
    same = a.shape == b.shape and bool(torch.equal(x, y))
    return Comparison(
        name, kind, region, err, int((diff > tolerance).sum()), diff.numel(), same, snr
    )


def probe_names(graph: nn.Module, max_depth: int = 4) -> list[str]:
    """Named submodules worth hooking: those with parameters, at most max_depth names deep."""
    names = []
    for name, m in graph.named_modules():
        if not name or name.count(".") >= max_depth:
            continue
        if isinstance(m, nn.ModuleList | nn.Sequential | nn.ModuleDict):
            continue
        if next(m.parameters(recurse=False), None) is None and not any(True for _ in m.children()):
            continue
        names.append(name)
    return names


class Probe(nn.Module):
    """The wrapper with the hooked activations appended to its outputs (for a probe export)."""

    def __init__(self, graph: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.graph, self.names = graph, names

    def forward(self, *args: Tensor) -> tuple[Tensor, ...]:
        with capture(self.graph, self.names) as found:
            outs = self.graph(*args)
        outs = (outs,) if isinstance(outs, Tensor) else tuple(outs)
        return (*outs, *(found[n] for n in self.names))


def eager_activations(
    graph: nn.Module, c: Contract, feeds: dict[str, Tensor]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(outputs, activations) of the eager wrapper."""
    from speechrt.runtime.eager import EagerRunner

    names = probe_names(graph)
    with capture(graph, names) as found:
        outs = EagerRunner(graph, c).run(feeds)
    return outs, dict(found)


def onnx_activations(
    graph_name: str,
    graph: nn.Module,
    c: Contract,
    path: Path,
    feeds: dict[str, Tensor],
    names: list[str],
    opset: int,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(outputs of `path`, activations from a probe export) run by onnxruntime on the CPU."""
    from speechrt.runtime.export import export_graph
    from speechrt.runtime.onnx import OnnxRunner

    arrays = {k: v.cpu().numpy() for k, v in feeds.items()}
    outs = OnnxRunner(path, c, device="cpu").run(arrays)
    outputs = {k: torch.from_numpy(v) for k, v in outs.items()}
    acts: dict[str, Tensor] = {}
    if names:
        with capture(graph, names) as found, torch.no_grad():  # which fire, and their ranks
            graph(*(feeds[n].cpu() for n in c.input_names))
        names = [n for n in names if n in found]
        probes = tuple(
            TensorSpec(f"probe.{n}", "float32", tuple(f"probe{i}_{d}" for d in range(t.dim())))
            for i, (n, t) in enumerate((n, found[n]) for n in names)
        )
        probe_contract = Contract(c.name, c.inputs, c.outputs + probes)
        with tempfile.TemporaryDirectory() as tmp:
            probe_path = Path(tmp) / "probe.onnx"
            probe = Probe(graph, names)
            export_graph(graph_name, probe, probe_contract, probe_path, opset, example_of=graph)
            ort = OnnxRunner(probe_path, probe_contract, device="cpu")
            got = ort.session.run(None, arrays)
        acts = {n: torch.from_numpy(v) for n, v in zip(names, got[len(c.outputs) :], strict=True)}
    return outputs, acts


def cuda_activations(
    runner: CudaRunner, feeds: dict[str, Tensor], names: list[str]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(outputs of the compiled runner, activations of an uncompiled run of the same modules)."""
    outputs = runner.run(feeds)
    acts: dict[str, Tensor] = {}
    with ExitStack() as stack:
        for m in runner.modules():
            own = set(dict(m.named_modules()))
            found = stack.enter_context(capture(m, [n for n in names if n in own]))
            # a module a runner does not call (FastPitch's fp32 decoder copy) records nothing
            stack.callback(acts.update, found)
        runner.run(feeds, compiled=False)
    return outputs, acts


def graphs_in(kind: str, only: str | None = None) -> list[str]:
    graphs = list(graphs_of(kind))
    return [g for g in graphs if only in (None, g)]


@dataclass
class GraphReport:
    graph: str
    a: str
    b: str
    comparisons: list[Comparison]
    note: str  # what was compared, e.g. that a side exposes no activations
    passed: bool  # every output within the tolerance


@dataclass
class Side:
    """One backend's view of one graph on fixed inputs: call(backend) -> (outputs, activations)."""

    graph: str
    wrapper: nn.Module
    contract: Contract
    feeds: dict[str, Tensor]
    names: list[str]
    onnx_path: Path
    notes: list[str]
    precision: str = "fp32"
    opset: int = 17

    def __call__(self, backend: str) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        from speechrt.device import PRECISIONS
        from speechrt.errors import SpeechRTError
        from speechrt.runtime.cuda import cuda_runner
        from speechrt.runtime.eager import module_device

        g, w, c = self.graph, self.wrapper, self.contract
        if backend == "eager":
            return eager_activations(w, c, self.feeds)
        if backend == "onnx":
            device = module_device(w)
            try:
                return onnx_activations(
                    g, w.cpu(), c, self.onnx_path, self.feeds, self.names, self.opset
                )
            finally:
                w.to(device)
        if backend == "cuda":
            device = module_device(w)
            mode = "reduce-overhead" if device.type == "cuda" else None
            if mode is None:
                self.notes.append("cuda runner on the CPU runs uncompiled")
            dtype = PRECISIONS[self.precision]
            r = cuda_runner(g, w, c, device=device, dtype=dtype, mode=mode)
            return cuda_activations(r, self.feeds, self.names)
        raise SpeechRTError(f"unknown backend {backend!r}")


def verify_dir(
    model_dir: str | Path,
    a: str = "eager",
    b: str = "onnx",
    precision: str = "fp32",
    tolerance: float = 1e-4,
    batch: int = 2,
    length: int = 23,
    device: str = "cpu",
    graph: str | None = None,
    opset: int = 17,
    seed: int = 0,
) -> list[GraphReport]:
    """Compare backends a and b on every graph of the component in model_dir."""
    from speechrt.device import resolve_device
    from speechrt.errors import SpeechRTError
    from speechrt.registry import contract
    from speechrt.repo import load_component
    from speechrt.runtime.graphs import build_graph, example_feeds

    dev = resolve_device(device)
    model, info = load_component(model_dir, dev, torch.float32)
    graphs = graphs_in(info.kind, graph)
    if not graphs:
        raise SpeechRTError(f"{model_dir}: a {info.kind} has no graph {graph!r}")
    reports = []
    for g in graphs:
        wrapper = build_graph(g, model, info)
        c = contract(g, info.dims)
        feeds = {k: v.to(dev) for k, v in example_feeds(g, wrapper, batch, length, seed).items()}
        names = probe_names(wrapper)
        notes: list[str] = []
        run = Side(g, wrapper, c, feeds, names, Path(model_dir) / graphs_of(info.kind)[g], notes)
        run.precision, run.opset = precision, opset
        out_a, act_a = run(a)
        out_b, act_b = run(b)
        # activations in the order the reference computed them
        rows = [
            compare(n, "activation", act_a[n], act_b[n], tolerance) for n in act_a if n in act_b
        ]
        rows += [compare(n, "output", out_a[n], out_b[n], tolerance) for n in c.output_names]
        if not names:
            notes.append("the graph has no named submodules: outputs only")
        passed = all(
            r.max_abs_error <= tolerance and out_a[r.name].shape == out_b[r.name].shape
            for r in rows
            if r.kind == "output"
        )
        reports.append(GraphReport(g, a, b, rows, "; ".join(notes), passed))
    return reports


def format_report(report: GraphReport, tolerance: float) -> str:
    """A table: one row per activation and output."""
    lines = [
        f"== {report.graph}: {report.a} vs {report.b} (tolerance {tolerance:g})"
        + (f"  [{report.note}]" if report.note else ""),
        f"{'tensor':44} {'shape':22} {'max abs err':>11} {'mismatches':>17} {'SNR dB':>7}"
        "  identical?",
    ]
    for r in report.comparisons:
        name = ("out: " if r.kind == "output" else "") + r.name
        snr = "inf" if r.snr_db == float("inf") else f"{r.snr_db:.1f}"
        lines.append(
            f"{name[:44]:44} {str(r.shape):22} {r.max_abs_error:11.3g} "
            f"{f'{r.mismatches}/{r.total}':>17} {snr:>7}  {r.identical}"
        )
    lines.append("PASS" if report.passed else "FAIL: an output differs by more than the tolerance")
    return "\n".join(lines)
