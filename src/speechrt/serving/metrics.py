"""Prometheus metrics in the text exposition format, with Triton's metric names.

Request-level (one HTTP/infer request):  nv_inference_request_success / _failure (reason label),
nv_inference_request_duration_us.  Batch-level (one engine item / batch): nv_inference_count,
nv_inference_exec_count, nv_inference_queue_duration_us, nv_inference_compute_infer_duration_us
(each item is charged its batch's compute time, as Triton does), speechrt_batch_size (histogram).
nv_inference_pending_request_count is read from the engines when scraped;
speechrt_dropped_items_total counts queued items dropped unstarted (their client went away, their
deadline passed, or another item of their request failed).
Everything is updated on the event loop thread, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from speechrt.serving.engine import BatchStats

VERSION = "1"  # every model has one version
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

_HELP = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests"),
    "nv_inference_count": ("counter", "Number of inferences performed (batch items)"),
    "nv_inference_exec_count": ("counter", "Number of model executions (batches)"),
    "nv_inference_request_duration_us": (
        "counter",
        "Cumulative end-to-end inference request handling time (microseconds)",
    ),
    "nv_inference_queue_duration_us": (
        "counter",
        "Cumulative time items waited in the batcher queue (microseconds)",
    ),
    "nv_inference_compute_infer_duration_us": (
        "counter",
        "Cumulative compute time charged to items, each its batch's time (microseconds)",
    ),
    "nv_inference_pending_request_count": (
        "gauge",
        "Items queued or executing in the batcher",
    ),
    "speechrt_dropped_items_total": (
        "counter",
        "Queued items dropped unstarted: their request was cancelled, timed out or failed",
    ),
}


def _labels(pairs: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{esc(v)}"' for k, v in pairs.items())


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


class Metrics:
    """Counters per (metric, model, extra labels) plus the batch-size histogram."""

    def __init__(self) -> None:
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(
            lambda: defaultdict(float)
        )
        self._hist: dict[str, list[int]] = {}  # model -> bucket counts (+Inf last)
        self._hist_sum: dict[str, float] = defaultdict(float)
        self._pending: dict[str, Callable[[], int]] = {}

    def _inc(self, name: str, model: str, value: float = 1.0, **extra: str) -> None:
        labels = (("model", model), ("version", VERSION), *sorted(extra.items()))
        self._counters[name][labels] += value

    def value(self, name: str, model: str, **extra: str) -> float:
        """A counter's current value (for tests and the client)."""
        labels = (("model", model), ("version", VERSION), *sorted(extra.items()))
        return self._counters[name].get(labels, 0.0)

    def register_engine(self, name: str, pending: Callable[[], int]) -> None:
        self._pending[name] = pending
        self._hist.setdefault(name, [0] * (len(BATCH_BUCKETS) + 1))

    def record_batch(self, stats: BatchStats) -> None:
        m = stats.engine
        self._inc("nv_inference_exec_count", m)
        self._inc("nv_inference_queue_duration_us", m, round(sum(stats.queue_s) * 1e6))
        compute_us = round(stats.compute_s * 1e6) * stats.size
        self._inc("nv_inference_compute_infer_duration_us", m, compute_us)
        if stats.ok:
            self._inc("nv_inference_count", m, stats.size)
        counts = self._hist.setdefault(m, [0] * (len(BATCH_BUCKETS) + 1))
        for i, bound in enumerate(BATCH_BUCKETS):
            if stats.size <= bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
        self._hist_sum[m] += stats.size

    def record_dropped(self, model: str, count: int) -> None:
        self._inc("speechrt_dropped_items_total", model, count)

    def record_request(self, model: str, seconds: float, failure: str | None = None) -> None:
        """failure: None for success, else Triton's reason (REJECTED, CANCELED, BACKEND, OTHER)."""
        if failure is None:
            self._inc("nv_inference_request_success", model)
        else:
            self._inc("nv_inference_request_failure", model, reason=failure)
        self._inc("nv_inference_request_duration_us", model, round(seconds * 1e6))

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

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        lines: list[str] = []
        for name, (kind, help_) in _HELP.items():
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            if name == "nv_inference_pending_request_count":
                for model, pending in sorted(self._pending.items()):
                    labels = _labels({"model": model, "version": VERSION})
                    lines.append(f"{name}{{{labels}}} {pending()}")
                continue
            for pairs, v in sorted(self._counters.get(name, {}).items()):
                lines.append(f"{name}{{{_labels(dict(pairs))}}} {_num(v)}")
        name = "speechrt_batch_size"
        lines += [f"# HELP {name} Items per executed batch", f"# TYPE {name} histogram"]
        for model, counts in sorted(self._hist.items()):
            base = {"model": model, "version": VERSION}
            total = 0
            for bound, c in zip((*map(str, BATCH_BUCKETS), "+Inf"), counts, strict=True):
                total += c
                lines.append(f"{name}_bucket{{{_labels({**base, 'le': bound})}}} {total}")
            lines.append(f"{name}_sum{{{_labels(base)}}} {_num(self._hist_sum[model])}")
            lines.append(f"{name}_count{{{_labels(base)}}} {total}")
        return "\n".join(lines) + "\n"


def failure_reason(e: BaseException) -> str:
    """Triton's failure reasons: REJECTED (bad input, full queue), CANCELED, BACKEND."""
    from speechrt.errors import SpeechRTError
    from speechrt.serving.engine import DeadlineExceeded, Overloaded
    from speechrt.serving.errors import ApiError

    if isinstance(e, (Overloaded, SpeechRTError)) or (isinstance(e, ApiError) and e.status < 500):
        return "REJECTED"
    if isinstance(e, (DeadlineExceeded, asyncio.CancelledError)):
        return "CANCELED"
    return "BACKEND"
