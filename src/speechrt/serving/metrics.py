"""Prometheus metrics with Triton's metric names, kept by prometheus-client.

Request-level (one HTTP/infer request):  nv_inference_request_success / _failure (reason label),
nv_inference_request_duration_us.  Batch-level (one engine item / batch): nv_inference_count,
nv_inference_exec_count, nv_inference_queue_duration_us, nv_inference_compute_infer_duration_us
(each item is charged its batch's compute time, as Triton does), speechrt_batch_size (histogram).
nv_inference_pending_request_count: items queued or executing in the batcher;
speechrt_dropped_items_total counts queued items dropped unstarted (their client went away, their
deadline passed, or another item of their request failed).
Latency histograms, in seconds, for p50/p99 (histogram_quantile in Prometheus):
speechrt_request_duration_seconds (per request, success or not), speechrt_queue_duration_seconds
(per batch item), speechrt_compute_duration_seconds (per executed batch).

Several processes, one /metrics: with PROMETHEUS_MULTIPROC_DIR set in the environment before
prometheus_client is first imported (what `speechrt serve --ray` does for its replicas), every
process writes its values to memory-mapped files in that directory and /metrics, whichever
process answers it, reads all of them (prometheus-client's multi-process mode). We chose this over
Ray's metrics export because the counts are exact at any instant: a value is in the shared file
as soon as it is incremented, so /metrics after N responses shows N, whereas Ray's exporter pushes
every few seconds and is read from Ray's own per-node endpoints, not from the application's route.
Its scope is one host: replicas on other nodes write their own node's directory (docs/ray.md).

Exposition: prometheus-client's own writer would rename Triton's counters (`_total` appended) and
reorder labels, so `render` writes the text format (0.0.4) itself from the collected samples.
Everything is updated on the event loop thread.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector

from speechrt.serving.engine import BatchStats

VERSION = "1"  # every model has one version
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# seconds: a short sentence on a GPU (ms) up to a long request on a busy CPU (a minute)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LABELS = ("model", "version")

# exposed name -> (type, help, extra label names); the order of /metrics
_SPEC: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests", ()),
    "nv_inference_request_failure": (
        "counter",
        "Number of failed inference requests",
        ("reason",),
    ),
    "nv_inference_count": ("counter", "Number of inferences performed (batch items)", ()),
    "nv_inference_exec_count": ("counter", "Number of model executions (batches)", ()),
    "nv_inference_request_duration_us": (
        "counter",
        "Cumulative end-to-end inference request handling time (microseconds)",
        (),
    ),
    "nv_inference_queue_duration_us": (
        "counter",
        "Cumulative time items waited in the batcher queue (microseconds)",
        (),
    ),
    "nv_inference_compute_infer_duration_us": (
        "counter",
        "Cumulative compute time charged to items, each its batch's time (microseconds)",
        (),
    ),
    "nv_inference_pending_request_count": ("gauge", "Items queued or executing in the batcher", ()),
    "speechrt_dropped_items_total": (
        "counter",
        "Queued items dropped unstarted: their request was cancelled, timed out or failed",
        (),
    ),
    "speechrt_batch_size": ("histogram", "Items per executed batch", ()),
    "speechrt_request_duration_seconds": (
        "histogram",
        "End-to-end request handling time, successful or not (seconds)",
        (),
    ),
    "speechrt_queue_duration_seconds": (
        "histogram",
        "Time each batch item waited in the batcher queue (seconds)",
        (),
    ),
    "speechrt_compute_duration_seconds": ("histogram", "Compute time per batch (seconds)", ()),
}


def shared_dir() -> str | None:
    """The multi-process directory, if prometheus_client runs in multi-process mode."""
    if values.ValueClass is values.MutexValue:  # decided when prometheus_client was imported
        return None
    return os.environ.get(MULTIPROC_ENV)


def _metric(name: str, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
    kind, help_, extra = _SPEC[name]
    labels = (*LABELS, *extra)
    if kind == "counter":  # prometheus_client keeps the name without `_total`
        return Counter(name.removesuffix("_total"), help_, labels, registry=registry)
    if kind == "gauge":  # summed over live processes; each writes its own engines' counts
        return Gauge(name, help_, labels, registry=registry, multiprocess_mode="livesum")
    buckets = BATCH_BUCKETS if name == "speechrt_batch_size" else LATENCY_BUCKETS
    return Histogram(name, help_, labels, registry=registry, buckets=buckets)


def _labels(pairs: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    # model, version, then the rest by name, `le` last: what Triton's exposition does
    first = [k for k in LABELS if k in pairs]
    rest = sorted(k for k in pairs if k not in LABELS and k != "le")
    keys = first + rest + (["le"] if "le" in pairs else [])
    return ",".join(f'{k}="{esc(pairs[k])}"' for k in keys)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


class Metrics:
    """Triton's counters, the batch-size and latency histograms, the pending-items gauge."""

    def __init__(self) -> None:
        # Each Metrics has its own registry (tests build many servers in one process); in
        # multi-process mode the values live in the shared files instead and are read from there.
        self.registry = CollectorRegistry(auto_describe=False)
        self._m = {name: _metric(name, self.registry) for name in _SPEC}
        self._pending: dict[str, Callable[[], int]] = {}

    def _inc(self, name: str, model: str, value: float = 1.0, **extra: str) -> None:
        metric = self._m[name]
        assert isinstance(metric, Counter)
        metric.labels(model=model, version=VERSION, **extra).inc(value)

    def _observe(self, name: str, model: str, value: float) -> None:
        metric = self._m[name]
        assert isinstance(metric, Histogram)
        metric.labels(model=model, version=VERSION).observe(value)

    def value(self, name: str, model: str, **extra: str) -> float:
        """A counter's or gauge's current value (for tests and the client)."""
        want = {"model": model, "version": VERSION, **extra}
        for exposed, _, labels, v in self._samples():
            if exposed == name and labels == want:
                return v
        return 0.0

    def register_engine(self, name: str, pending: Callable[[], int]) -> None:
        self._pending[name] = pending
        self._refresh_pending()

    def _refresh_pending(self) -> None:
        # Written, not read at scrape time: another process's /metrics must see it too.
        gauge = self._m["nv_inference_pending_request_count"]
        assert isinstance(gauge, Gauge)
        for model, pending in self._pending.items():
            gauge.labels(model, VERSION).set(pending())

    def record_batch(self, stats: BatchStats) -> None:
        m = stats.engine
        self._inc("nv_inference_exec_count", m)
        self._inc("nv_inference_queue_duration_us", m, round(sum(stats.queue_s) * 1e6))
        compute_us = round(stats.compute_s * 1e6) * stats.size
        self._inc("nv_inference_compute_infer_duration_us", m, compute_us)
        if stats.ok:
            self._inc("nv_inference_count", m, stats.size)
        self._observe("speechrt_batch_size", m, stats.size)
        for q in stats.queue_s:
            self._observe("speechrt_queue_duration_seconds", m, q)
        self._observe("speechrt_compute_duration_seconds", m, stats.compute_s)
        self._refresh_pending()

    def record_dropped(self, model: str, count: int) -> None:
        self._inc("speechrt_dropped_items_total", model, count)

    def record_request(self, model: str, seconds: float, failure: str | None = None) -> None:
        """failure: None for success, else Triton's reason (REJECTED, CANCELED, BACKEND, OTHER)."""
        if failure is None:
            self._inc("nv_inference_request_success", model)
        else:
            self._inc("nv_inference_request_failure", model, reason=failure)
        self._inc("nv_inference_request_duration_us", model, round(seconds * 1e6))
        self._observe("speechrt_request_duration_seconds", model, seconds)
        self._refresh_pending()

    @asynccontextmanager
    async def track(self, model: str) -> AsyncIterator[None]:
        """Time a request; an exception escaping the block counts as a failure."""
        t0 = time.perf_counter()
        try:
            yield
        except BaseException as e:
            reason = failure_reason(e)
            self.record_request(model, time.perf_counter() - t0, reason)
            raise
        self.record_request(model, time.perf_counter() - t0)

    def _samples(self) -> Iterable[tuple[str, str, dict[str, str], float]]:
        """(exposed family name, sample name, labels, value) of this process, or of every
        process sharing the multi-process directory."""
        self._refresh_pending()
        path = shared_dir()
        if path is not None:
            families = MultiProcessCollector(None, path).collect()
        else:
            families = self.registry.collect()
        exposed = {n.removesuffix("_total") if _SPEC[n][0] == "counter" else n: n for n in _SPEC}
        for family in families:
            name = exposed.get(family.name)
            if name is None:  # another library's metric in the shared directory
                continue
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                sample = name if _SPEC[name][0] == "counter" else s.name
                yield name, sample, dict(s.labels), s.value

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        by_family: dict[str, list[tuple[str, dict[str, str], float]]] = {n: [] for n in _SPEC}
        for name, sample, labels, v in self._samples():
            by_family[name].append((sample, labels, v))
        lines: list[str] = []
        for name, (kind, help_, _) in _SPEC.items():
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            rows = []
            for sample, labels, v in by_family[name]:
                if "le" in labels and labels["le"] != "+Inf":
                    labels["le"] = _num(float(labels["le"]))
                key = (sorted((k, x) for k, x in labels.items() if k != "le"), sample)
                le = labels.get("le", "")
                order = float("inf") if le in ("+Inf", "") else float(le)
                rows.append((key, order, f"{sample}{{{_labels(labels)}}} {_num(v)}"))
            lines += [line for _, _, line in sorted(rows, key=lambda r: (r[0], r[1]))]
        return "\n".join(lines) + "\n"


def failure_reason(e: BaseException) -> str:
    """Triton's failure reasons: REJECTED (bad input, full queue), CANCELED (also a client that
    went away while it was answered: whichever of the reading and the writing side notices
    first), BACKEND."""
    from speechrt.errors import SpeechRTError
    from speechrt.serving.engine import DeadlineExceeded, Overloaded
    from speechrt.serving.http_errors import ApiError

    if isinstance(e, (Overloaded, SpeechRTError)) or (isinstance(e, ApiError) and e.status < 500):
        return "REJECTED"
    if isinstance(e, (DeadlineExceeded, asyncio.CancelledError, ConnectionError)):
        return "CANCELED"
    return "BACKEND"
