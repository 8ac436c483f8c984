"""Data-parallel QuartzNet training (speechrt_train.distributed): 2 CPU ranks over gloo, started
by the real launcher, running the real CLI and loop (instrumented by tests/ddp_probe.py).

"Exact" for N ranks: after resuming last.pt, every rank's parameters and optimizer state, and
rank 0's whole model state (BatchNorm statistics included), are bitwise those of the same
ranks trained without a stop; the other ranks' BatchNorm statistics (used by nothing: rank 0
evaluates, checkpoints and exports) restart from rank 0's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from speechrt_train.__main__ import main
from speechrt_train.distributed import Ranks
from speechrt_train.loop import run

ROOT = Path(__file__).parents[1]
TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return tmp_path_factory.mktemp("ddp")


def _args(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    """8 training items in global batches of 7 and 1 (sorted by length, shuffled): in every
    other step rank 1 has no item and adds zero gradients."""
    return [
        "quartznet",
        "--corpus", str(corpus), "--run", str(run_dir), "--preset", "quartznet-tiny",
        "--limit", "4", "--batch-size", "7", "--lr", "1e-2", "--set", "warmup=5",
        "--device", "cpu", "--quiet", "--log-every", "1", *extra,
    ]  # fmt: skip


def _env(out: Path, **probe: str) -> dict[str, str]:
    path = os.pathsep.join(str(p) for p in (ROOT / "src", ROOT / "train", TESTS))
    out.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "PYTHONPATH": path, "PROBE_OUT": str(out), **probe}


def _launch(argv: list[str], out: Path, timeout: float = 60, **probe: str) -> tuple[int, str]:
    """`launch(2, argv)` of tests/ddp_probe.py in a process of its own -> (status, output)."""
    code = "import sys; from speechrt_train.distributed import launch; "
    code += f"sys.exit(launch(2, {argv!r}, module='ddp_probe'))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(out, **probe),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout + done.stderr


def _ranks(out: Path) -> tuple[dict, dict]:
    return tuple(torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1))


def _params(state: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state["model"].items() if "running" not in k and "tracked" not in k}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _same_optimizer(a: dict, b: dict) -> bool:
    return all(_equal(a["state"][i], b["state"][i]) for i in a["state"]) and a.keys() == b.keys()


@pytest.fixture(scope="module")
def whole(corpus, paths):
    """One process 3 steps (compact file) -> 2 ranks warm-started from it, 16 steps in one go,
    checkpointing before every step (last.pt at step 8 kept), every step's state kept."""
    one = paths / "one.pt"
    args = _args(corpus, paths / "runs" / "one", "--max-steps", "3", "--compact-out", str(one))
    assert main(args) == 0
    argv = _args(corpus, paths / "runs" / "whole", "--max-steps", "16", "--warm-start", str(one))
    argv += ["--checkpoint-minutes", "0", "--compact-out", str(paths / "two.pt")]
    status, output = _launch(argv, paths / "whole", PROBE_EVERY="1", PROBE_KEEP="8")
    assert status == 0, output
    return paths / "whole", paths / "runs" / "whole"


def test_two_ranks_learn_with_bitwise_identical_replicas(whole):
    out, run_dir = whole
    r0, r1 = _ranks(out)
    assert r0["step"] == r1["step"] == 16 and r0["steps"][0] == (4, 1.0)  # warm start: step 3
    assert _equal(_params(r0), _params(r1))
    assert _same_optimizer(r0["optimizer"], r1["optimizer"])
    # each rank normalised its own share of every batch: different BatchNorm statistics;
    # rank 1 had no share of the one-item batches (one step in two, from the warm start on)
    key = "sub_bn.0.0.running_mean"
    assert not torch.equal(r0["model"][key], r1["model"][key])
    tracked = [int(r["model"]["sub_bn.0.0.num_batches_tracked"]) for r in (r0, r1)]
    assert tracked[0] == 3 + 13 and 3 + 6 <= tracked[1] <= 3 + 7, tracked
    log = [json.loads(x) for x in (run_dir / "log.jsonl").read_text().splitlines()]
    losses = [r["ctc"] for r in log if "ctc" in r]
    assert len(losses) == 13 and sum(losses[-4:]) < 0.8 * sum(losses[:4]), losses


def test_resume_stops_at_rank_0s_deadline_and_continues_exactly(whole, corpus, paths):
    whole_out, _ = whole
    split = paths / "runs" / "split"
    split.mkdir(parents=True)
    shutil.copy(whole_out / "last-8.pt", split / "last.pt")  # written before step 9
    # rank 0's clock reaches the 1.8 s deadline after 4 steps (0.5 s a step); rank 1's would
    # go on for 18, but rank 0 decides for both
    argv = _args(corpus, split, "--minutes", "0.03", "--max-steps", "16")
    status, output = _launch(argv, paths / "split", PROBE_CLOCK="0.5,0.1")
    assert status == 0, output
    assert "resumed" in output and "at step 8" in output
    s0, s1 = _ranks(paths / "split")
    k = s0["step"]
    assert k == s1["step"] == 12 and s0["steps"] == s1["steps"]
    w0, w1 = (torch.load(whole_out / f"rank{r}-{k}.pt", weights_only=True) for r in (0, 1))
    assert _equal(s0["model"], w0["model"])  # rank 0: BatchNorm statistics too
    assert _equal(_params(s1), _params(w1))
    assert _same_optimizer(s0["optimizer"], w0["optimizer"])
    assert _same_optimizer(s1["optimizer"], w1["optimizer"])


def test_a_two_rank_compact_file_warm_starts_one_process(whole, corpus, paths):
    argv = _args(corpus, paths / "runs" / "after", "--max-steps", "18")
    assert main([*argv, "--warm-start", str(paths / "two.pt")]) == 0
    log = [json.loads(x) for x in (paths / "runs" / "after" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "ctc" in r] == [17, 18]


def test_a_failing_rank_ends_the_job_at_once(corpus, paths):
    """Rank 1 fails in its third step of a five-minute run: rank 0, in step with it, never gets
    past its third step and never finishes (the 90 s bound only stops a hung job)."""
    argv = _args(corpus, paths / "runs" / "fail", "--minutes", "5")
    status, output = _launch(argv, paths / "fail", timeout=90, PROBE_FAIL="3")
    assert status == 1 and "probe: rank 1 fails" in output and "rank 1 failed" in output
    assert not (paths / "fail" / "rank0.pt").exists()
    assert len((paths / "fail" / "rank0.steps").read_text().splitlines()) <= 3
    assert len((paths / "fail" / "rank1.steps").read_text().splitlines()) == 2


class Follower:
    """A rank other than 0 as loop.run sees it: rank 0's decisions come by broadcast."""

    def __init__(self, decisions: list[list[float]]) -> None:
        self.rank, self.world, self.main = 1, 2, False
        self.decisions, self.gathered = decisions, 0

    def broadcast(self, values: list[float]) -> list[float]:
        return self.decisions.pop(0)

    def gather(self, obj: object) -> None:
        self.gathered += 1
        return None


class Recorder:
    """The smallest trainer: records the lr_scale each step is given."""

    lr_scale = 1.0

    def __init__(self) -> None:
        self.step_count, self.scales = 0, []

    def step(self) -> dict[str, float]:
        self.scales.append(self.lr_scale)
        self.step_count += 1
        return {"loss": 0.0}

    def evaluate(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {"step": self.step_count}

    def rank_state(self) -> dict:
        return {}

    def parameter_digest(self) -> str:
        return ""


class FollowerRecorder(Recorder):
    def evaluate(self) -> dict[str, float]:
        raise AssertionError("only rank 0 evaluates")


def test_anneal_decays_the_learning_rate_to_zero_by_the_end_of_the_budget(tmp_path):
    trainer = Recorder()  # one process: its own clock sets lr_scale
    run(trainer, tmp_path / "r", minutes=0.01, anneal_minutes=0.005, progress=False)
    s = trainer.scales
    assert s[0] == 1.0 and all(a >= b for a, b in zip(s, s[1:], strict=False))
    assert 0.0 <= s[-1] < 0.05 and any(0.3 < x < 0.7 for x in s)


def test_other_ranks_follow_rank_0s_stop_anneal_and_checkpoints(tmp_path):
    # (go on?, lr_scale, checkpoint first?) as rank 0 broadcasts them; this rank's own budget
    # (an hour, no annealing) is not what stops it or sets its learning rate
    ranks = Follower([[1, 0.75, 0], [1, 0.5, 1], [1, 0.25, 0], [0, 0.0, 0]])
    trainer = FollowerRecorder()
    summary = run(trainer, tmp_path / "r", 60, anneal_minutes=1, progress=False, ranks=ranks)
    assert trainer.scales == [0.75, 0.5, 0.25] and summary["steps"] == 3
    assert ranks.gathered == 2  # the checkpoint before step 2 and the last one: rank 0 writes
    assert not (tmp_path / "r" / "last.pt").exists() and not (tmp_path / "r" / "log.jsonl").exists()


def test_without_a_launcher_a_process_is_rank_0_of_1(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ranks, device = Ranks.from_env("cuda")
    assert (ranks.rank, ranks.world, ranks.main, device) == (0, 1, True, "cuda")
    assert ranks.broadcast([1.0, 0.5]) == [1.0, 0.5] and ranks.gather("x") == ["x"]
