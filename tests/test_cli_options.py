"""The shared option groups: every subcommand declares --device, --precision and --backend alike."""

from __future__ import annotations

import argparse

from speechrt.cli import build_parser

EXPECTED = {"device": "auto", "precision": "fp32", "backend": "auto"}


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_runtime_options_have_one_default_everywhere():
    seen: dict[str, set[str]] = {dest: set() for dest in EXPECTED}
    for name, p in subcommands().items():
        for action in p._actions:
            if action.dest in EXPECTED:
                assert action.default == EXPECTED[action.dest], (name, action.dest)
                seen[action.dest].add(name)
                if action.dest != "device":
                    assert action.choices is not None, (name, action.dest)
    assert {"synthesize", "transcribe", "eval", "serve", "bench", "verify"} <= seen["device"]
    assert {"synthesize", "transcribe", "eval", "serve", "verify"} <= seen["precision"]
    assert {"synthesize", "transcribe", "eval", "serve"} <= seen["backend"]


def test_default_backend_on_a_cpu_is_eager_for_unexported_models(tmp_path):
    from speechrt.runtime import resolve_backend

    args = subcommands()["transcribe"].parse_args(["a.wav"])
    assert (args.device, args.precision, args.backend) == ("auto", "fp32", "auto")
    assert resolve_backend(args.backend, "cpu", [tmp_path]) == "eager"
