"""`speechrt transcribe FILE... --model DIR [--json] [--device D] [--batch-size N]
[--decoder auto|greedy|beam|ctc] [--lm DIR] [--beam-size N] [--alpha A] [--beta B] [--[no-]vad]
[--stream [--realtime] [--chunk-ms MS]]`

One line per file: `FILE<TAB>text`, or with --json one JSON object per line (file, text, words
with start/end seconds, duration, rtf). A file that cannot be read gets an error line on stderr;
the others are still transcribed, and the exit status is then 2.

Decoding: a CTC prefix beam search with a word LM when the model directory holds one (lm.json +
lm.safetensors) or --lm names one, else greedy (speechrt.asr.beam).
Voice activity detection: as the model's model.json says, unless --vad or --no-vad
(docs/design.md).

--stream feeds each file as a microphone would, showing partial text as it comes
(speechrt.cli.transcribe_stream).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from speechrt.cli.flags import add_runtime_options

if TYPE_CHECKING:
    from speechrt.asr.decoding import DecoderOptions

FILES_PER_CHUNK = 32


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "files", nargs="+", metavar="FILE", help="audio files (WAV, FLAC, OGG; any rate)"
    )
    p.add_argument("--model", help="ASR model directory (default: the bundled model, if any)")
    p.add_argument("--url", help="use a running `speechrt serve` at URL instead of --model")
    p.add_argument("--json", action="store_true", help="JSON lines with word times")
    add_runtime_options(p)
    p.add_argument("--batch-size", type=int, default=16, help="windows per batch (default: 16)")
    g = p.add_argument_group("streaming")
    g.add_argument(
        "--stream",
        action="store_true",
        help="feed each file in chunks, as from a microphone, showing partial text on stderr",
    )
    g.add_argument(
        "--realtime", action="store_true", help="with --stream: pace the chunks in real time"
    )
    g.add_argument(
        "--chunk-ms", type=float, default=100.0, help="with --stream: audio per chunk (100)"
    )
    add_decoder_arguments(p)


def add_decoder_arguments(p: argparse.ArgumentParser) -> None:
    """--decoder, --lm and the beam options (transcribe, eval, serve)."""
    g = p.add_argument_group("decoding")
    g.add_argument(
        "--decoder",
        choices=("auto", "greedy", "beam", "ctc"),
        help="greedy, or beam search with a word LM; auto (default): beam when the model "
        "directory holds an LM (lm.json) or --lm is given, else greedy; ctc: a hybrid "
        "transducer's CTC head (Parakeet TDT-CTC), as auto (its transducer head: greedy)",
    )
    g.add_argument("--lm", help="LM directory (lm.json + lm.safetensors) for the beam search")
    g.add_argument("--beam-size", type=int, help="prefixes kept per frame (default: the LM's)")
    g.add_argument("--alpha", type=float, help="LM weight (default: the LM's tuned value)")
    g.add_argument("--beta", type=float, help="bonus per word (default: the LM's tuned value)")
    g.add_argument(
        "--vad",
        action=argparse.BooleanOptionalAction,
        help="transcribe only the speech that voice activity detection finds (silence and "
        "steady noise give no words); --no-vad: all of the audio in fixed windows (default: as "
        "the model's model.json says: on for the bundled recogniser, off for a converted "
        "checkpoint)",
    )


def decoder_options(args: argparse.Namespace) -> DecoderOptions:
    """The ASR(...) keywords of add_decoder_arguments' flags (vad only with --vad/--no-vad)."""
    options: DecoderOptions = {
        "decoder": args.decoder or "auto",
        "lm": args.lm,
        "beam_size": args.beam_size,
        "alpha": args.alpha,
        "beta": args.beta,
    }
    if args.vad is not None:  # else the model's own setting (ASR's vad=None)
        options["vad"] = args.vad
    return options


def run(args: argparse.Namespace) -> int:
    from speechrt.asr import ASR
    from speechrt.errors import SpeechRTError

    decoding = decoder_options(args)
    if (args.realtime or args.chunk_ms != 100.0) and not args.stream:
        raise SpeechRTError("--realtime and --chunk-ms go with --stream")
    if args.url is not None:
        from speechrt.client import transcribe_files

        flags = [v for k, v in decoding.items() if k not in ("decoder", "vad")]
        if args.decoder or args.vad is not None or any(v is not None for v in flags):
            raise SpeechRTError("--url: the server decodes as it was started (speechrt serve)")
    if args.stream:
        from speechrt.cli.transcribe_stream import run_stream

        return run_stream(args, decoding)
    if args.url is not None:
        return transcribe_files(args.url, args.files, args.json)
    asr = ASR(
        args.model, device=args.device, precision=args.precision, backend=args.backend, **decoding
    )
    failed = 0
    # Files are read and transcribed a chunk at a time, so memory stays bounded for long lists.
    for first in range(0, len(args.files), FILES_PER_CHUNK):
        names, waves = [], []
        for path in args.files[first : first + FILES_PER_CHUNK]:
            try:
                waves.append(asr.load_audio(path))
                names.append(path)
            except SpeechRTError as e:
                print(f"speechrt transcribe: error: {e}", file=sys.stderr)
                failed += 1
        results = asr.transcribe(waves, batch_size=args.batch_size) if waves else []
        for name, t in zip(names, results, strict=True):
            if args.json:
                print(json.dumps({"file": name, **t.to_dict()}, ensure_ascii=False), flush=True)
            else:
                print(f"{name}\t{t.text}", flush=True)
    return 2 if failed else 0
