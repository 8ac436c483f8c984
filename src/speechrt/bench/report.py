"""Benchmark output: a rich table on screen, JSON (stamped), CSV and PNG plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table


def flatten(row: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def speedups(rows: list[dict], baseline: tuple[str, str] = ("eager", "fp16")) -> None:
    """Add `speedup` = baseline mean latency / row mean latency, per task and batch size."""
    base = {
        (r.get("task"), r.get("audio_s"), r["batch_size"]): r["latency_s"]["mean"]
        for r in rows
        if (r["backend"], r["precision"]) == baseline
    }
    for r in rows:
        ref = base.get((r.get("task"), r.get("audio_s"), r["batch_size"]))
        r["speedup_vs_" + "_".join(baseline)] = ref / r["latency_s"]["mean"] if ref else None


def print_table(rows: list[dict], title: str, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=title)
    cols = ["backend", "prec", "BS", "avg ms", "std", "p50", "p90", "p95", "p99", "e2e ms", "RTF"]
    cols += ["items/s"]
    extra = [k for k in ("audio_s",) if any(k in r for r in rows)]
    for c in extra + cols + ["speed-up"]:
        table.add_column(c, justify="right")
    for r in rows:
        lat = {k: v * 1e3 for k, v in r["latency_s"].items()}
        sp = next((v for k, v in r.items() if k.startswith("speedup_vs")), None)
        table.add_row(
            *[f"{r[k]:g}" for k in extra],
            r["backend"],
            r["precision"],
            str(r["batch_size"]),
            f"{lat['mean']:.2f}",
            f"{lat['std']:.2f}",
            *(f"{lat[p]:.2f}" for p in ("p50", "p90", "p95", "p99")),
            f"{r['end_to_end_s']['mean'] * 1e3:.2f}" if r.get("end_to_end_s") else "-",
            f"{r['rtf']:.1f}" if r.get("rtf") is not None else "-",
            f"{r['inferences_s']:.1f}",
            f"{sp:.2f}x" if sp else "-",
        )
    console.print(table)


def write_outputs(result: dict, out_dir: str | Path, name: str) -> list[Path]:
    """result = {"stamp": ..., "config": ..., "rows": [...]} -> name.json, name.csv, name.png"""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.csv"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    flat = [flatten(r) for r in result["rows"]]
    fields = sorted({k for r in flat for k in r})
    with paths[1].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(flat)
    png = plot_rtf(result["rows"], out / f"{name}.png", title=name)
    return paths + ([png] if png else [])


def plot_rtf(rows: list[dict], path: Path, title: str) -> Path | None:
    """RTF (or items/s) against batch size, one line per backend/precision."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "rtf" if all(r.get("rtf") is not None for r in rows) else "inferences_s"
    fig, ax = plt.subplots(figsize=(6, 4))
    groups: dict[str, list[dict]] = {}
    for r in rows:
        label = f"{r['backend']} {r['precision']}" + (f" {r['audio_s']}s" if "audio_s" in r else "")
        groups.setdefault(label, []).append(r)
    for label, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["batch_size"])
        ax.plot([r["batch_size"] for r in rs], [r[key] for r in rs], marker="o", label=label)
    ax.set_xlabel("batch size")
    ax.set_ylabel("RTF (audio s / compute s)" if key == "rtf" else "inferences / s")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def print_load_table(rows: list[dict], title: str, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=title)
    cols = ["target", "mode", "level", "req", "err", "req/s", "p50 ms", "p90", "p95", "p99"]
    for c in cols + ["queue ms", "compute ms", "batch", "GPU busy %"]:
        table.add_column(c, justify="right")

    def ms(r: dict, p: str) -> str:
        return f"{r['latency_s'][p] * 1e3:.1f}" if r["latency_s"] else "-"

    def opt(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    for r in rows:
        table.add_row(
            r["target"],
            r["mode"],
            f"{r['level']:g}",
            str(r["requests"]),
            str(r["errors"]),
            f"{r['throughput_rps']:.2f}",
            *(ms(r, p) for p in ("p50", "p90", "p95", "p99")),
            opt(r["server_queue_ms_per_item"], ".1f"),
            opt(r["server_compute_ms_per_item"], ".1f"),
            opt(r["mean_batch_size"], ".2f"),
            " ".join(f"{v:.0f}" for v in (r.get("gpu_busy_pct") or {}).values()) or "-",
        )
    console.print(table)
