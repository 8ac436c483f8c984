"""onnxruntime sessions on the CPU that keep their optimised graph for the next process.

Building a session optimises the graph first (constant folding, node fusions); for a large model
that is most of a command's start-up: a 26 M-parameter FastConformer takes ~380 ms to build on
2 cores, ~95 ms from the graph optimised once (its float16 weights already widened, its nodes
already fused), running as fast. `cpu_session` saves the graph onnxruntime optimised at the
extended level (no layout changes tied to this CPU) into a cache folder the first time, and
afterwards builds the session from that copy with optimisation off.

    $SPEECHRT_ONNX_CACHE   the folder (default $XDG_CACHE_HOME/speechrt/onnx, else
                           ~/.cache/speechrt/onnx); "off" turns the cache off

One folder per model path; in it one entry, named by a fingerprint of onnxruntime's version and
the size and modification time of every file beside the model (its external weights among them):
an entry of other files or another onnxruntime is replaced. An entry is written under a temporary
name and renamed into place, so concurrent processes never read half of one. A folder that cannot
be written leaves the session as it would be without the cache; an entry onnxruntime cannot read
is removed (with a warning) and made again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV_VAR = "SPEECHRT_ONNX_CACHE"
GRAPH, WEIGHTS = "model.onnx", "model.data"  # an entry's files


def cache_root() -> Path | None:
    """The cache folder, or None where $SPEECHRT_ONNX_CACHE is "off" (or no home is known)."""
    value = os.environ.get(ENV_VAR, "")
    if value.lower() == "off":
        return None
    if value:
        return Path(value)
    try:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    except RuntimeError:  # no home directory to be found: no cache
        return None
    return Path(base) / "speechrt" / "onnx"


def fingerprint(model: Path, ort_version: str) -> str:
    """onnxruntime's version and (name, size, mtime) of every file in the model's folder."""
    h = hashlib.sha256(ort_version.encode())
    for f in sorted(model.parent.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"\0{f.name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def entry_dir(root: Path, model: Path, ort_version: str) -> Path:
    """root/<hash of the model's path>/<fingerprint>"""
    place = hashlib.sha256(str(model.resolve()).encode()).hexdigest()[:16]
    return root / place / fingerprint(model, ort_version)


def cpu_session(model: Path, options: Any, ort: Any) -> tuple[Any, Path]:
    """An InferenceSession of `model` on the CPU provider, through the cache; returns it and the
    graph it was built from (the cached copy, or `model` itself)."""
    providers = ["CPUExecutionProvider"]
    default_level = options.graph_optimization_level  # the caller's, for a session not cached
    root = cache_root()
    if root is None:
        return ort.InferenceSession(str(model), options, providers=providers), model
    entry = entry_dir(root, model, ort.__version__)
    graph = entry / GRAPH
    if graph.is_file():
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return ort.InferenceSession(str(graph), options, providers=providers), graph
        except Exception as e:  # onnxruntime raises its own exception types
            log.warning("%s: unreadable cached graph, made again (%s)", entry, e)
            shutil.rmtree(entry, ignore_errors=True)
            options.graph_optimization_level = default_level
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
    except OSError as e:
        log.debug("%s: no ONNX cache here (%s)", root, e)
        return ort.InferenceSession(str(model), options, providers=providers), model
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(scratch / GRAPH)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", WEIGHTS
    )
    try:
        session = ort.InferenceSession(str(model), options, providers=providers)
    except Exception:  # not saved (or not loadable: the plain build below says so)
        shutil.rmtree(scratch, ignore_errors=True)
        options.optimized_model_filepath = ""
        options.graph_optimization_level = default_level
        return ort.InferenceSession(str(model), options, providers=providers), model
    for stale in entry.parent.iterdir():  # other fingerprints: the model or onnxruntime changed
        if stale.name.startswith(".tmp-"):  # another process's, or one that died an hour ago
            with contextlib.suppress(OSError):  # (gone meanwhile)
                if stale != scratch and time.time() - stale.stat().st_mtime > 3600:
                    shutil.rmtree(stale, ignore_errors=True)
        elif stale != entry:  # (entry: a concurrent process's, complete)
            shutil.rmtree(stale, ignore_errors=True)
    try:
        scratch.rename(entry)
    except OSError:  # another process put its entry there first
        shutil.rmtree(scratch, ignore_errors=True)
    return session, model
