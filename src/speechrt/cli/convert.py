"""`speechrt convert CHECKPOINT OUT_DIR [--kind KIND] [--dtype fp32|fp16]`, or an ARPA word LM
(`.arpa`, `.arpa.gz`) into lm.json + lm.safetensors (beside a model, or a folder for --lm)."""

from __future__ import annotations

import argparse

from speechrt.registry import ARCHITECTURES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        help="DLE/NGC training checkpoint (.pt), NeMo model (.nemo) or ARPA word LM (.arpa[.gz])",
    )
    p.add_argument("out_dir", help="model directory to write (model.json + model.safetensors)")
    p.add_argument(
        "--kind", choices=sorted(ARCHITECTURES), help="architecture (detected when omitted)"
    )
    p.add_argument(
        "--dtype", choices=("fp32", "fp16"), default="fp32", help="storage precision of the weights"
    )


def run(args: argparse.Namespace) -> int:
    if args.checkpoint.endswith((".arpa", ".arpa.gz")):
        from speechrt.asr.lm import read_arpa
        from speechrt.errors import SpeechRTError

        if args.kind or args.dtype != "fp32":
            raise SpeechRTError("--kind and --dtype are for model checkpoints, not an ARPA LM")

        lm = read_arpa(args.checkpoint, progress=True)
        lm.save(args.out_dir)
        print(f"{args.out_dir}: {lm.order}-gram word LM of {len(lm)} words from {args.checkpoint}")
        return 0
    import torch

    from speechrt.convert.checkpoints import convert_checkpoint

    dtype = torch.float16 if args.dtype == "fp16" else None
    info = convert_checkpoint(args.checkpoint, args.out_dir, kind=args.kind, dtype=dtype)
    print(f"{args.out_dir}: {info.kind} from {info.source['file']}")
    return 0
