"""The `speechrt` command: one parser, a module per subcommand (imported lazily when run).

Every user-facing failure is a SpeechRTError, printed as one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

# subcommand -> module defining `add_arguments(parser)` and `run(args) -> int`, and a one-line help.
COMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("speechrt.cli.convert", "turn a DLE/NGC checkpoint into a model directory"),
    "synthesize": ("speechrt.cli.synthesize", "text to speech"),
    "bench": ("speechrt.cli.bench", "benchmark pipelines: latency percentiles, throughput, RTF"),
    "transcribe": ("speechrt.cli.transcribe", "speech to text (QuartzNet, Jasper, Parakeet)"),
    "eval": ("speechrt.cli.eval", "word/character error rates of a speech recogniser"),
    "serve": ("speechrt.cli.serve", "HTTP server: OpenAI audio API, KServe v2, metrics"),
    "export": (
        "speechrt.cli.export",
        "write a model directory's ONNX graphs (checked by onnxruntime)",
    ),
    "verify": ("speechrt.cli.verify", "compare two backends activation by activation"),
}


def build_parser() -> argparse.ArgumentParser:
    from speechrt import __version__

    parser = argparse.ArgumentParser(prog="speechrt", description="Neural speech inference.")
    parser.add_argument("--version", action="version", version=f"speechrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    from speechrt.errors import SpeechRTError

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args._argv = argv  # the command line, for benchmark stamps

    def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"speechrt {args.command}: warning: {message}", file=sys.stderr)

    saved, warnings.showwarning = warnings.showwarning, one_line_warning
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except SpeechRTError as e:
        print(f"speechrt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        warnings.showwarning = saved


if __name__ == "__main__":
    sys.exit(main())
