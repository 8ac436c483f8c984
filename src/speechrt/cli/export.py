"""`speechrt export DIR... [--opset N]`: write each DIR/model.onnx (and the component's other
graphs); with `--triton-repo OUT`, build a Triton model repository from exported DIRs instead
(no DIR: the bundled models, which ship their graphs)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    from speechrt.runtime import DEFAULT_OPSET

    p.add_argument(
        "model_dirs",
        nargs="*",
        metavar="DIR",
        help="model directory (from `speechrt convert`); with --triton-repo and no DIR, the "
        "bundled voice and recogniser",
    )
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (default: 17)")
    p.add_argument(
        "--graph",
        action="append",
        dest="graphs",
        metavar="NAME",
        help="export only this graph (repeatable; default: every graph of the component)",
    )
    p.add_argument(
        "--no-check",
        action="store_true",
        help="skip running onnxruntime against eager at other sizes after export",
    )
    g = p.add_argument_group("Triton model repository (docs/triton.md)")
    g.add_argument(
        "--triton-repo",
        metavar="OUT",
        help="instead of exporting, write a Triton model repository to OUT from the DIRs' "
        "exported graphs: a config.pbtxt per graph, python models for the text front end, ASR "
        "features and CTC, and the tts / asr ensembles",
    )
    g.add_argument(
        "--max-batch-size", type=int, default=8, help="every model's max_batch_size (default: 8)"
    )
    g.add_argument(
        "--max-queue-delay-ms",
        type=float,
        default=5.0,
        help="dynamic batching's longest wait for batch-mates (default: 5)",
    )
    g.add_argument(
        "--buckets",
        default="",
        metavar="SPEC",
        help="length buckets the python models pad to, e.g. 'symbols=32,64,128;"
        "feature_frames=200,400' (default: speechrt's)",
    )


def run(args: argparse.Namespace) -> int:
    from speechrt.errors import SpeechRTError

    if args.triton_repo:
        return triton_repo(args)
    if not args.model_dirs:
        raise SpeechRTError(
            "give the model directories to export (the bundled models ship their graphs; "
            "--triton-repo OUT with no DIR builds a repository from them)"
        )
    from speechrt.runtime.export import CHECKS, export_dir

    for model_dir in args.model_dirs:
        paths, checks = export_dir(
            model_dir, args.opset, check=not args.no_check, graphs=args.graphs
        )
        for path in paths:
            print(f"wrote {path}")
        if checks:
            worst = max(c.max_abs_error for c in checks)
            sizes = ", ".join(f"{b}x{n}" for b, n in CHECKS)
            print(
                f"onnxruntime matches eager at batch x length {sizes}: "
                f"max error {worst:.3g} (absolute; relative to outputs above 1)"
            )
    return 0


def triton_repo(args: argparse.Namespace) -> int:
    from speechrt.errors import SpeechRTError
    from speechrt.runtime.buckets import Buckets
    from speechrt.triton.writer import RepoOptions, write_repository

    if args.graphs:
        raise SpeechRTError("--graph and --triton-repo do not go together")
    try:
        buckets = Buckets.parse(args.buckets)
    except ValueError as e:
        raise SpeechRTError(str(e)) from None
    options = RepoOptions(args.max_batch_size, round(args.max_queue_delay_ms * 1000), buckets)
    dirs = args.model_dirs or bundled_dirs()
    written, notes = write_repository(args.triton_repo, dirs, options)
    for path in written:
        print(f"wrote {path}")
    for note in notes:
        print(f"note: {note}")
    print(f"run: tritonserver --model-repository {args.triton_repo}")
    return 0


def bundled_dirs() -> list[Path]:
    """The bundled models' directories (voice and recogniser), or SpeechRTError if none."""
    from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, VOICE_VOCODER, default_model
    from speechrt.errors import SpeechRTError

    dirs = [default_model(n) for n in (VOICE_ACOUSTIC, VOICE_VOCODER, ASR_MODEL)]
    found = [d for d in dirs if d is not None]
    if not found:
        raise SpeechRTError("no model directory given and none bundled: give DIR ...")
    return found
