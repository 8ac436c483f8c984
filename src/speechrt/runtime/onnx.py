"""The ONNX runner: onnxruntime on numpy arrays. Imports no torch (a test checks).

Providers are picked from what the installed onnxruntime offers: TensorRT, then CUDA, then CPU
(`device="cpu"` keeps to the CPU). On a GPU provider the inputs and outputs go through IO binding:
inputs are copied once to the device, outputs are allocated there by onnxruntime and copied back
once per call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from speechrt.arch import Regulated
from speechrt.contracts import Contract
from speechrt.errors import SpeechRTError
from speechrt.registry import contract, graphs_of
from speechrt.runtime.bounds import attention_cells, decode_groups, stack_rows
from speechrt.runtime.onnx_cache import cpu_session

PREFERRED = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


def pick_providers(device: str = "auto", available: Sequence[str] | None = None) -> list[str]:
    """The execution providers to use, best first: TensorRT, CUDA where installed, else CPU."""
    import onnxruntime as ort

    have = list(available if available is not None else ort.get_available_providers())
    if device == "cpu":
        return ["CPUExecutionProvider"]
    picked = [p for p in PREFERRED if p in have]
    if device.startswith("cuda") and not any(p != "CPUExecutionProvider" for p in picked):
        raise SpeechRTError(
            "onnx backend on cuda needs onnxruntime-gpu (installed providers: "
            + ", ".join(have)
            + ")"
        )
    return picked or ["CPUExecutionProvider"]


class OnnxRunner:
    """One ONNX graph in an onnxruntime session, checked against its contract."""

    backend = "onnx"

    def __init__(
        self,
        path: str | Path,
        contract: Contract,
        device: str = "auto",
        extra_outputs: Sequence[str] = (),
        threads: int = 0,
    ) -> None:
        import onnxruntime as ort

        self.contract = contract
        self.path = Path(path)
        if not self.path.is_file():
            raise SpeechRTError(
                f"{self.path}: no such file (run `speechrt export` first, or use the eager backend)"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self.providers = pick_providers(device)
        self.graph = self.path  # the graph the session was built from (a cached copy on a CPU)
        try:
            if extra_outputs:
                model = with_extra_outputs(self.path, extra_outputs)
                self.session = ort.InferenceSession(model, options, providers=self.providers)
            elif self.providers == ["CPUExecutionProvider"]:
                self.session, self.graph = cpu_session(self.path, options, ort)
            else:
                self.session = ort.InferenceSession(
                    str(self.path), options, providers=self.providers
                )
        except Exception as e:  # onnxruntime raises its own exception types
            raise SpeechRTError(
                f"{self.path}: onnxruntime cannot load it ({e}); if it was exported from other "
                "weights than the model.safetensors beside it, re-export it (speechrt export)"
            ) from None
        names = [i.name for i in self.session.get_inputs()]
        outs = [o.name for o in self.session.get_outputs()]
        if names != contract.input_names or outs[: len(contract.output_names)] != (
            contract.output_names
        ):
            raise SpeechRTError(
                f"{self.path}: graph has inputs {names} and outputs {outs}, but the "
                f"{contract.name} contract says {contract.input_names} -> {contract.output_names}"
                " (re-export it)"
            )
        self.output_names = outs
        self.on_gpu = self.session.get_providers()[0] != "CPUExecutionProvider"
        self.run_options = ort.RunOptions()
        if not self.on_gpu:
            # The CPU arena keeps what a run allocated (and doubles it on the next long run:
            # +166 MB after two runs of a 1,899-frame FastPitch item, +246 MB after two of a
            # 2,048-frame HiFi-GAN call); shrunk after every run, the memory goes back to the
            # system and RSS returns to where it was.
            self.run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self._check_sizes()

    def _check_sizes(self) -> None:
        """The graph's fixed axis sizes (mel channels, feature bands, classes, ...) against the
        contract's, which model.json's dims give: SpeechRTError naming the first difference
        (dims that contradict the graph would be believed by whatever reads the contract)."""
        args = [*self.session.get_inputs(), *self.session.get_outputs()]
        for arg, spec in zip(args, [*self.contract.inputs, *self.contract.outputs], strict=False):
            graph_shape = list(arg.shape)
            fixed = [(i, a) for i, a in enumerate(spec.shape) if isinstance(a, int)]
            if len(graph_shape) != len(spec.shape) or any(
                isinstance(graph_shape[i], int) and graph_shape[i] != a for i, a in fixed
            ):
                raise SpeechRTError(
                    f"{self.path}: {spec.name!r} is {graph_shape} in the graph, but model.json's "
                    f"dims make it {spec.shape_text()} (fix model.json, or re-export)"
                )

    @classmethod
    def from_dir(cls, model_dir: str | Path, graph: str | None = None, **kw: Any) -> OnnxRunner:
        """The runner of `graph` (default: the kind's main graph) exported into model_dir."""
        info = json.loads((Path(model_dir) / "model.json").read_text())
        files = graphs_of(info["kind"])
        graph = graph or next(iter(files))
        if graph not in files:
            raise SpeechRTError(f"{model_dir}: a {info['kind']} has no {graph!r} graph")
        return cls(Path(model_dir) / files[graph], contract(graph, info["dims"]), **kw)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{input name: array} -> {output name: array} (extra outputs included)."""
        self.contract.check_feeds(feeds)
        arrays = {n: np.ascontiguousarray(feeds[n]) for n in self.contract.input_names}
        if not self.on_gpu:
            # copied out of the arena: an output left there pins the arena region holding it
            # (+50 MB after four HiFi-GAN runs whose outputs were kept), copied it is freed
            # as soon as the run returns (the copy costs ~1 ms per 1 M samples)
            values = [
                np.array(v) for v in self.session.run(self.output_names, arrays, self.run_options)
            ]
        else:
            binding = self.session.io_binding()
            for name, value in arrays.items():
                binding.bind_cpu_input(name, value)
            for name in self.output_names:
                binding.bind_output(name, "cuda")
            self.session.run_with_iobinding(binding)
            values = binding.copy_outputs_to_cpu()
        return dict(zip(self.output_names, values, strict=True))


class RegulatedOnnxRunner(OnnxRunner):
    """A length-regulated graph (FastPitch) whose output frames are bounded before its decoder
    runs (speechrt.runtime.bounds): an item of more than `max_frames` frames is refused, and a
    batch runs in groups of rows that each cost at most one item at the limit.

    The frames come from the graph's durations, computed by a second session of the graph cut
    down to what they depend on (the encoder and the duration predictor: ~15% of the bundled
    voice's acoustic model), built on first need; a batch whose symbols cannot reach the limit
    even at the longest duration skips it.
    """

    def __init__(
        self, path: str | Path, contract: Contract, regulated: Regulated, device: str = "auto"
    ) -> None:
        super().__init__(path, contract, device=device)
        self.regulated = regulated
        self.max_frames = regulated.max_frames  # per item; None: no bound (a server sets it)
        self._durations: Any = None  # the durations session, once built

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        limit = self.max_frames
        if limit is None:
            return super().run(feeds)
        self.contract.check_feeds(feeds)
        r, budget = self.regulated, limit * limit
        symbols = feeds["ids"].shape[1]
        pace = np.asarray(feeds[r.pace], dtype=np.float32)
        # at most max_duration frames per symbol: no need to ask the encoder below that
        most = np.asarray(feeds["lengths"]) * np.floor(np.float32(r.max_duration) / pace + 0.5)
        if len(most) * int(attention_cells(symbols, most).max(initial=0)) <= budget:
            return super().run(feeds)
        frames = self.frames(feeds, budget)
        return self._in_groups(feeds, decode_groups(self.contract.name, symbols, frames, limit))

    def _in_groups(
        self, feeds: Mapping[str, np.ndarray], groups: list[np.ndarray]
    ) -> dict[str, np.ndarray]:
        if len(groups) == 1:
            return OnnxRunner.run(self, feeds)
        parts = [OnnxRunner.run(self, {k: v[g] for k, v in feeds.items()}) for g in groups]
        return stack_rows(parts, groups)

    def durations_session(self) -> Any:
        """The graph cut down to its durations, in a session of its own (built once)."""
        import onnxruntime as ort

        if self._durations is None:
            model = only_outputs(self.path, [self.regulated.durations])
            self._durations = ort.InferenceSession(model, providers=self.providers)
        return self._durations

    def frames(self, feeds: Mapping[str, np.ndarray], budget: int) -> np.ndarray:
        """(B,) int64: the frames each item will decode, from the durations session (in calls
        of rows whose encoder attention stays within `budget` cells)."""
        r, session = self.regulated, self.durations_session()
        names = [i.name for i in session.get_inputs()]
        symbols = feeds["ids"].shape[1]
        rows = len(feeds["ids"])
        step = max(1, budget // max(1, symbols * symbols))
        parts = []
        for a in range(0, rows, step):
            arrays = {n: np.ascontiguousarray(feeds[n][a : a + step]) for n in names}
            parts.append(np.array(session.run([r.durations], arrays, self.run_options)[0]))
        d = np.concatenate(parts)  # (B, L)
        pace = np.asarray(feeds[r.pace], dtype=np.float32)[:, None]
        # floor(d / pace + 0.5) in float32, as the graph's length regulator rounds
        reps = np.floor(d.astype(np.float32) / pace + np.float32(0.5))
        return reps.sum(axis=1).astype(np.int64)


def only_outputs(path: Path, names: Sequence[str]) -> bytes:
    """The serialized model at `path` (weights read in) cut down to the nodes, initializers and
    inputs that the named outputs depend on."""
    import onnx

    model = onnx.load(str(path))
    g = model.graph
    producer = {out: node for node in g.node for out in node.output}
    kept: set[int] = set()
    wanted = list(names)
    while wanted:
        node = producer.get(wanted.pop())
        if node is not None and id(node) not in kept:
            kept.add(id(node))
            wanted += list(node.input)
    nodes = [n for n in g.node if id(n) in kept]
    used = {i for n in nodes for i in n.input} | set(names)
    for field, keep in (
        (g.node, nodes),
        (g.output, [o for o in g.output if o.name in names]),
        (g.input, [i for i in g.input if i.name in used]),
        (g.initializer, [t for t in g.initializer if t.name in used]),
    ):
        kept_copies = [type(x)() for x in keep]
        for copy, x in zip(kept_copies, keep, strict=True):
            copy.CopyFrom(x)
        del field[:]
        field.extend(kept_copies)
    return model.SerializeToString()


def with_extra_outputs(path: Path, names: Sequence[str]) -> bytes:
    """The serialized model at `path` with the named intermediate values added as outputs."""
    import onnx

    model = onnx.load(str(path))
    have = {o.name for o in model.graph.output}
    for name in names:
        if name not in have:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    return model.SerializeToString()
