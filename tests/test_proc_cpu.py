"""scripts/proc_cpu.py: where a machine's CPU time goes while a command runs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "proc_cpu.py"
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def _module():
    spec = importlib.util.spec_from_file_location("proc_cpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stat_line_with_a_command_name_holding_spaces_and_parentheses():
    m = _module()
    fields = ["S", *map(str, range(4, 14)), "250", "150", *map(str, range(16, 53))]
    line = "4242 (odd (name) x) " + " ".join(fields)
    assert m.cpu_seconds(line) == pytest.approx(400 / m.TICK)


def test_difference_counts_new_and_reused_pids_from_zero():
    m = _module()
    before = {
        1: {"name": "a", "cmdline": "a", "cpu_s": 5.0, "threads": {1: ("a", 5.0)}},
        2: {"name": "b", "cmdline": "b --old", "cpu_s": 9.0, "threads": {2: ("b", 9.0)}},
    }
    after = {
        1: {
            "name": "a",
            "cmdline": "a",
            "cpu_s": 6.5,
            "threads": {1: ("a", 5.5), 7: ("worker", 1.0)},
        },  # fmt: skip
        2: {"name": "b", "cmdline": "b --new", "cpu_s": 2.0, "threads": {2: ("b", 2.0)}},
        3: {"name": "c", "cmdline": "c", "cpu_s": 0.5, "threads": {3: ("c", 0.5)}},
    }
    rows = m.difference(before, after)
    assert [(r["pid"], r["cpu_s"]) for r in rows] == [(2, 2.0), (1, 1.5), (3, 0.5)]
    assert rows[1]["threads"] == [{"name": "worker", "cpu_s": 1.0}, {"name": "a", "cpu_s": 0.5}]


def test_script_runs_the_command_and_counts_its_cpu(tmp_path):
    out = tmp_path / "cpu.json"
    work = "import sys; sum(range(3 * 10**7)); sys.exit(3)"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--", sys.executable, "-c", work],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 3  # the command's status
    result = json.loads(out.read_text())
    assert result["command"][-1] == work
    assert result["command_cpu_s"] > 0  # the summing child, which ended before the snapshot
    assert all(r["cpu_s"] > 0 for r in result["processes"])
    assert "CPU seconds in" in done.stderr
