"""Where a machine's CPU time goes while a command runs: every process's user + system CPU
seconds from /proc before and after the command, the difference per process (and its busiest
threads, by the names the OS knows them by), largest first.

    python scripts/proc_cpu.py --out cpu.json [--top 12] -- COMMAND [ARGS...]

Runs COMMAND and exits with its status. --out gets {command, wall_s, command_cpu_s (the
command and the children it waited for), processes: [{pid, name, cmdline, cpu_s, threads:
[{name, cpu_s}]}]}; the top rows are printed to stderr. A process that starts during the
command counts from zero; one that ends during it is missed (/proc no longer has it), except
the command's own children, which command_cpu_s counts. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(stat: str) -> float:
    """A /proc/.../stat line -> utime + stime in seconds (fields 14 and 15, counted after the
    ')' that ends the command name, which may hold spaces)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # gone, or not ours to read
        return None


def snapshot(proc: Path = Path("/proc")) -> dict[int, dict[str, Any]]:
    """pid -> {name, cmdline, cpu_s, threads: {tid: (name, cpu_s)}} of every process now."""
    out: dict[int, dict[str, Any]] = {}
    for d in proc.iterdir():
        if not d.name.isdigit() or (stat := _read(d / "stat")) is None:
            continue
        threads = {}
        for t in (d / "task").iterdir() if (d / "task").is_dir() else []:
            if (tstat := _read(t / "stat")) is not None:
                threads[int(t.name)] = ((_read(t / "comm") or "?").strip(), cpu_seconds(tstat))
        cmdline = (_read(d / "cmdline") or "").replace("\0", " ").strip()
        name = (_read(d / "comm") or "?").strip()
        out[int(d.name)] = {
            "name": name,
            "cmdline": cmdline,
            "cpu_s": cpu_seconds(stat),
            "threads": threads,
        }
    return out


def difference(
    before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]], top_threads: int = 5
) -> list[dict[str, Any]]:
    """Each process of `after`: its CPU seconds since `before` (all of them if it is new),
    largest first, with its `top_threads` busiest threads."""
    rows = []
    for pid, p in after.items():
        old = before.get(pid)
        same = old is not None and old["cmdline"] == p["cmdline"]  # (a reused pid is new)
        cpu = p["cpu_s"] - (old["cpu_s"] if same else 0.0)
        threads = [
            {
                "name": name,
                "cpu_s": round(c - (old["threads"].get(tid, ("", 0.0))[1] if same else 0.0), 2),
            }
            for tid, (name, c) in p["threads"].items()
        ]
        threads.sort(key=lambda t: -t["cpu_s"])
        rows.append(
            {
                "pid": pid,
                "name": p["name"],
                "cmdline": p["cmdline"][:300],
                "cpu_s": round(cpu, 2),
                "threads": threads[:top_threads],
            }
        )
    rows.sort(key=lambda r: -r["cpu_s"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--top", type=int, default=12, help="rows to print (default 12)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    before, children, t0 = snapshot(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    status = subprocess.call(command)
    wall = time.time() - t0
    after, done = snapshot(), resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (done.ru_utime - children.ru_utime) + (done.ru_stime - children.ru_stime)
    rows = [r for r in difference(before, after) if r["pid"] != os.getpid() and r["cpu_s"] > 0]
    result = {
        "command": command,
        "wall_s": round(wall, 2),
        "command_cpu_s": round(own, 2),
        "processes": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"CPU seconds in {wall:.1f} s (the command and its children: {own:.1f}):", file=sys.stderr
    )
    for r in rows[: args.top]:
        busiest = ", ".join(f"{t['name']} {t['cpu_s']:.1f}" for t in r["threads"][:3])
        print(f"{r['cpu_s']:8.1f}  {r['pid']:>7}  {r['name']:<16} [{busiest}]", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
