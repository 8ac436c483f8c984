"""`python -m speechrt_train COMMAND`: corpus, fastpitch, hifigan, quartznet, fastconformer,
tacotron2, lm, export, evaluate, cards.

Every training command is time-budgeted (`--minutes`) and resumable: run it again with the same
`--run` folder and it continues from run/last.pt. See docs/models/README.md for the recipe.

QuartzNet and FastConformer train data-parallel on N GPUs of one machine with `--gpus N` (one
process each; `--batch-size` is the global batch, split across them; speechrt_train.distributed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

TRAINED = ("fastpitch", "hifigan", "quartznet")  # the shipped defaults (export, cards)
EXPORTED = (*TRAINED, "fastconformer")  # not yet a default: export with --models fastconformer
# tacotron2: the stop-step evidence of a half-precision decoder (scripts/tacotron2_stop_steps.py)
TRAINERS = (*EXPORTED, "tacotron2")
ASR_TRAINERS = ("quartznet", "fastconformer")


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def _common(p: argparse.ArgumentParser, model: str) -> None:
    p.add_argument("--corpus", default="corpus", help="corpus folder (default: corpus)")
    p.add_argument("--run", default=f"runs/{model}", help=f"run folder (default: runs/{model})")
    p.add_argument("--minutes", type=float, default=8.0, help="wall-time budget (default: 8)")
    p.add_argument("--max-steps", "--steps", type=int, help="stop at this step count")
    p.add_argument("--deadline", type=float, help="unix time by which to stop stepping")
    p.add_argument("--preset", "--dims", help="model size preset")
    p.add_argument("--batch-size", "--batch", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="any config field"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--limit", type=int, help="use at most this many utterances (smoke tests)")
    p.add_argument("--checkpoint-minutes", type=float, default=3.0)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--eval-every", type=int, help="evaluate every N steps (always at the end)")
    p.add_argument(
        "--anneal-minutes",
        type=float,
        default=0.0,
        help="decay the learning rate linearly to 0 over the budget's last M minutes",
    )
    p.add_argument(
        "--warm-start",
        help="compact file to start from when the run has no last.pt (quartznet: or an exported "
        "model directory, e.g. src/speechrt/defaults/asr)",
    )
    p.add_argument("--compact-out", help="also write the weights (fp16) to this compact file")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m speechrt_train", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("corpus", help="synthesize the teacher corpus")
    p.add_argument("--out", default="corpus")
    p.add_argument(
        "--plan",
        default="small",
        help="full, wide, wide-piper, wide-piper-f, wide-piper-fh, small, tts, tiny or synthetic "
        "(default: small)",
    )
    p.add_argument("--jobs", type=int, default=0, help="worker processes (default: all cores)")
    p.add_argument("--prefix", help="unpacked .debs (train/corpus/unpack.sh); default: system")
    p.add_argument(
        "--fortunes-root", help="Debian root holding the fortunes (default: prefix or /)"
    )
    p.add_argument("--minutes", type=float, help="stop handing out work after this long")
    p.add_argument(
        "--text-root",
        help="Debian root with more English text unpacked (as for `lm`): its sentences join "
        "the train side (plan wide)",
    )
    p.add_argument(
        "--round",
        type=int,
        default=0,
        help="pair voices and train sentences afresh: round N of the plan (default 0)",
    )
    p.add_argument("--quiet", action="store_true")
    for name in TRAINERS:
        _common(sub.add_parser(name, help=f"train {name} (time-budgeted, resumable)"), name)
    for name in ASR_TRAINERS:
        sub.choices[name].add_argument(
            "--gpus",
            type=int,
            default=1,
            help="data-parallel processes, one per GPU (cuda:0..N-1; with --device cpu: N CPU "
            "processes); --batch-size is split across them",
        )
        sub.choices[name].add_argument(
            "--voice-repeat",
            action="append",
            default=[],
            metavar="VOICE=N",
            help="train on VOICE's utterances N times per pass (e.g. joe=3: a voice with few "
            "sentences weighs as the others); repeatable",
        )
    sub.choices["fastconformer"].add_argument(
        "--vocab-size", type=int, help="SentencePiece pieces at most (default 256)"
    )
    sub.choices["hifigan"].add_argument(
        "--mels-from",
        metavar="DIR",
        help="a FastPitch component (e.g. src/speechrt/defaults/voice-acoustic): train on its "
        "teacher-forced mels instead of the ground truth (fine-tuning the vocoder to it)",
    )
    p = sub.add_parser("pack", help="a recogniser voice's shard with its audio as Opus (to carry)")
    p.add_argument("shard", help="corpus/VOICE.pt")
    p.add_argument("--out", required=True, help="the packed file")
    p = sub.add_parser("people", help="real people's speech from Debian packages: voices")
    p.add_argument(
        "--out-dir", required=True, help="where VOICE.pt go (people, queen, drascula, steelsky)"
    )
    p.add_argument("--cache", default="out/people", help="downloads and unpacked packages")
    p.add_argument("--voices", nargs="+", help="only these (default: all)")
    p = sub.add_parser("unpack", help="a packed shard back to a corpus shard (int16 audio)")
    p.add_argument("packed", help="pack's output")
    p.add_argument("--out", required=True, help="corpus/VOICE.pt")
    p = sub.add_parser(
        "join", help="a voice's shard made beside a corpus into it (moved, and listed)"
    )
    p.add_argument("shard", help="a corpus shard (VOICE.pt) made elsewhere, e.g. by `people`")
    p.add_argument("--corpus", default="corpus", help="corpus folder (default: corpus)")
    p = sub.add_parser("lm", help="the recogniser's word trigram model (train split only)")
    p.add_argument("--out", required=True, help="folder for lm.json + lm.safetensors")
    p.add_argument("--words", help="extra vocabulary, one word a line (e.g. wamerican's)")
    p.add_argument("--fortunes-root", default="/", help="Debian root holding the fortunes")
    p.add_argument(
        "--text-root",
        help="Debian root with more English text unpacked (fortune-anarchism, dict-jargon, "
        "dict-devil, wordnet-base): all of it LM text",
    )
    p.add_argument("--order", type=int, default=3)
    p.add_argument("--prune", type=int, help="drop top-order n-grams seen fewer times")
    for name in ("beam_size", "max_chars"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help="decoding default")
    for name in ("alpha", "beta", "oov_penalty", "oov_char_penalty", "prune_logp"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, help="decoding default")
    p = sub.add_parser("average", help="weighted average of compact files of one model")
    p.add_argument(
        "files",
        nargs="+",
        help="compact files (--compact-out) of one model, or exported model directories of "
        "one component (their folded weights averaged; --out a directory)",
    )
    p.add_argument(
        "--weights", type=float, nargs="+", help="one each, summing to 1 (default: equal)"
    )
    p.add_argument("--out", required=True, help="the averaged compact file")
    p = sub.add_parser("export", help="runs -> model directories (+ evaluation)")
    p.add_argument("--runs", default="runs", help="folder of run folders (default: runs)")
    p.add_argument("--out", default="src/speechrt/defaults")
    p.add_argument("--fp32", action="store_true", help="keep float32 weights")
    p.add_argument(
        "--models",
        nargs="+",
        choices=EXPORTED,
        help="only these runs (default: the defaults' runs found under --runs)",
    )
    p.add_argument("--evaluate", action="store_true", help="also run `evaluate` on the result")
    p.add_argument(
        "--precise-bn",
        action="store_true",
        help="recompute QuartzNet's BatchNorm statistics on clean training speech before folding "
        "(off by default: it raised held-out WER; docs/models/README.md, export)",
    )
    p.add_argument("--corpus", default="corpus")
    p.add_argument("--metrics", help="write the summary (JSON) here too")
    p.add_argument("--device", default="auto")
    p = sub.add_parser("cards", help="write docs/models/<model>.md from an export's metrics")
    p.add_argument("--metrics", required=True)
    p.add_argument("--out", default="docs/models")
    p.add_argument("--models", nargs="+", choices=TRAINED, help="only these (default: all)")
    p.add_argument("--hardware", default="GPU", help="where it trained, for the cards")
    p.add_argument("--decoding", help="speechrt_train.asr_eval's JSON: the recogniser with its LM")
    p = sub.add_parser("evaluate", help="WERs of exported defaults through speechrt's pipelines")
    p.add_argument("--defaults", default="src/speechrt/defaults")
    p.add_argument("--corpus", default="corpus")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--device", default="auto")
    p.add_argument("--metrics", help="write the result (JSON) here too")
    return parser


def _overrides(args: argparse.Namespace, config: Any) -> Any:
    changes = {k: getattr(args, k) for k in ("preset", "batch_size", "lr") if getattr(args, k)}
    fields = {f.name: f.type for f in dataclasses.fields(config)}
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--set {item}: no field {key!r} in {sorted(fields)}")
        kind = {
            "int": int,
            "float": float,
            "bool": lambda v: v.lower() in ("1", "true"),
            "int | None": lambda v: None if v.lower() == "none" else int(v),
        }
        changes[key] = kind.get(str(fields[key]), str)(value)
    return dataclasses.replace(config, **changes)


def _predict_mels(model_dir: str, voices: list[Any], device: str) -> None:
    """Every item's mel in `voices` (VoiceData) replaced by FastPitch's teacher-forced one."""
    from speechrt.errors import SpeechRTError
    from speechrt_train.fastpitch_train import load_mel_teacher, predicted_mels

    try:
        teacher = load_mel_teacher(model_dir, voices[0].mel_config, device)
    except (ValueError, SpeechRTError) as e:
        raise SystemExit(f"--mels-from: {e}") from None
    for data in voices:
        data.replace_mels(predicted_mels(teacher, data))


def _trainer(args: argparse.Namespace, device: str, ranks: Any) -> Any:
    from speechrt_train.corpus import HELDOUT_VOICE, TTS_VOICE, load_shard

    corpus = Path(args.corpus)
    if args.command in ("fastpitch", "hifigan", "tacotron2"):
        from speechrt_train.tts_data import load_voice

        shard = load_shard(corpus / f"{TTS_VOICE}.pt")
        train = load_voice(shard, heldout=False, device=device, limit=args.limit)
        val = load_voice(shard, heldout=True, device=device, limit=args.limit)
        if args.command == "fastpitch":
            from speechrt_train.fastpitch_train import FastPitchConfig, FastPitchTrainer

            return FastPitchTrainer(train, val, _overrides(args, FastPitchConfig()), device)
        if args.command == "tacotron2":
            from speechrt_train.tacotron2_train import Tacotron2Config, Tacotron2Trainer

            try:
                return Tacotron2Trainer(train, val, _overrides(args, Tacotron2Config()), device)
            except ValueError as e:
                raise SystemExit(f"speechrt_train tacotron2: {e}") from None
        from speechrt_train.hifigan_train import HiFiGANConfig, HiFiGANTrainer

        config = _overrides(args, HiFiGANConfig())
        if args.mels_from:
            _predict_mels(args.mels_from, [train, val], device)
        config = dataclasses.replace(config, mels_from=args.mels_from)  # not from --set
        return HiFiGANTrainer(train, val, config, device)
    from speechrt_train.asr_data import load_speech

    shards = [load_shard(p) for p in sorted(corpus.glob("*.pt")) if p.stem != HELDOUT_VOICE]
    repeat = {}
    for item in args.voice_repeat:
        voice, _, n = item.partition("=")
        if not n.isdigit() or int(n) < 1:
            raise SystemExit(f"--voice-repeat {item}: expected VOICE=N with N >= 1")
        repeat[voice] = int(n)
    try:
        train = load_speech(shards, heldout=False, device=device, limit=args.limit, repeat=repeat)
    except ValueError as e:
        raise SystemExit(f"speechrt_train {args.command}: {corpus}: {e}") from None
    val = None  # only rank 0 evaluates
    if ranks.main:
        val = load_speech([load_shard(corpus / f"{HELDOUT_VOICE}.pt")], True, device=device)
    if args.command == "fastconformer":
        from speechrt_train.fastconformer_train import FastConformerConfig, FastConformerTrainer

        config = _overrides(args, FastConformerConfig())
        if args.vocab_size:
            config = dataclasses.replace(config, vocab_size=args.vocab_size)
        try:
            return FastConformerTrainer(
                train, val, config, device, rank=ranks.rank, world=ranks.world
            )
        except ValueError as e:
            raise SystemExit(f"speechrt_train fastconformer: {e}") from None
    from speechrt_train.quartznet_train import QuartzNetConfig, QuartzNetTrainer

    config = _overrides(args, QuartzNetConfig())
    return QuartzNetTrainer(train, val, config, device, rank=ranks.rank, world=ranks.world)


def train(args: argparse.Namespace) -> dict[str, Any] | None:
    """One training chunk -> its summary (None on data-parallel ranks other than 0)."""
    import time

    import torch

    from speechrt_train.distributed import Ranks
    from speechrt_train.loop import WarmStartError, run, write_compact

    ranks, device = Ranks.from_env(_device(args.device))
    if ranks.world > 1 and args.command not in ASR_TRAINERS:
        raise SystemExit(f"{args.command}: data-parallel training is for the recognisers only")
    if device.startswith("cuda"):
        torch.set_float32_matmul_precision("high")  # TF32 for the float32 parts
        # HiFi-GAN sees one segment shape: let cuDNN pick its fastest kernels once
        torch.backends.cudnn.benchmark = args.command == "hifigan"
    loading = time.time()
    trainer = _trainer(args, device, ranks)
    if ranks.main:  # what a chunk spends before its first step, on the corpus
        print(f"{args.command}: corpus loaded in {time.time() - loading:.1f} s", flush=True)
    minutes = args.minutes
    if args.deadline:  # data loading took part of the chunk: step only until the deadline
        minutes = max(0.0, min(minutes, (args.deadline - time.time()) / 60))
    try:
        summary = run(
            trainer,
            args.run,
            minutes,
            max_steps=args.max_steps,
            checkpoint_minutes=args.checkpoint_minutes,
            log_every=args.log_every,
            eval_every=args.eval_every,
            warm_start=args.warm_start,
            progress=not args.quiet,
            name=args.command,
            anneal_minutes=args.anneal_minutes,
            ranks=ranks,
        )
    except WarmStartError as e:
        raise SystemExit(f"speechrt_train {args.command}: {e}") from None
    # (an error above ends this process with the process group open: torchrun ends the rest)
    ranks.close()
    if not ranks.main:
        return None
    if args.compact_out:
        write_compact(trainer, args.run, args.compact_out)
    return summary


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if getattr(args, "gpus", 1) > 1 and "WORLD_SIZE" not in os.environ:
        import torch

        from speechrt_train.distributed import launch

        if _device(args.device).startswith("cuda") and torch.cuda.device_count() < args.gpus:
            n = torch.cuda.device_count()
            print(f"--gpus {args.gpus}: only {n} GPU(s) visible", file=sys.stderr)
            return 2
        return launch(args.gpus, argv)  # N copies of this command, each one rank
    if args.command == "corpus" and args.plan == "synthetic":
        from speechrt_train.synthetic import write_corpus

        result: dict[str, Any] = write_corpus(args.out)
    elif args.command == "corpus":
        from speechrt_train.corpus import build

        root = args.fortunes_root or args.prefix or "/"
        try:
            result = build(
                args.out,
                args.plan,
                args.jobs,
                args.prefix,
                root,
                args.minutes,
                not args.quiet,
                args.text_root,
                args.round,
            )
        except (FileNotFoundError, ValueError) as e:
            print(f"speechrt_train corpus: {e}", file=sys.stderr)
            return 2
    elif args.command == "people":
        from speechrt_train.people import SOURCES
        from speechrt_train.people import build as build_people

        voices = args.voices or sorted({s.voice for s in SOURCES})
        picked = tuple(s for s in SOURCES if s.voice in voices)
        if unknown := set(voices) - {s.voice for s in SOURCES}:
            print(f"speechrt_train people: no voice {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        result = build_people(Path(args.out_dir), Path(args.cache), picked)
    elif args.command in ("pack", "unpack"):
        import torch

        from speechrt_train.corpus import list_voice, pack_shard, unpack_shard
        from speechrt_train.loop import save_atomic

        source = args.shard if args.command == "pack" else args.packed
        convert = pack_shard if args.command == "pack" else unpack_shard
        shard = convert(torch.load(source, weights_only=True))
        save_atomic(shard, Path(args.out))
        result = {"utterances": len(shard["keys"]), "bytes": Path(args.out).stat().st_size}
        if args.command == "unpack":  # into a corpus: its manifest lists this voice too
            list_voice(Path(args.out), shard, f"unpacked from {Path(source).name}")
    elif args.command == "join":
        from speechrt_train.corpus import list_voice, load_shard

        source = Path(args.shard)
        shard = load_shard(source)  # mapped: listing it reads its keys, not its audio
        dest = Path(args.corpus) / source.name
        source.replace(dest)
        list_voice(dest, shard, f"made beside the corpus, in {source.parent.name}/")
        result = {"voice": shard["voice"], "utterances": len(shard["keys"])}
    elif args.command in TRAINERS:
        summary = train(args)
        if summary is None:  # a data-parallel rank other than 0: rank 0 reports
            return 0
        result = summary
    elif args.command == "lm":
        from speechrt_train.language_model import DECODING, PRUNE, build

        decoding = {k: getattr(args, k) for k in DECODING if getattr(args, k) is not None}
        prune = PRUNE if args.prune is None else args.prune
        try:
            result = build(
                args.out,
                args.fortunes_root,
                args.words,
                args.order,
                prune,
                decoding,
                args.text_root,
            )
        except FileNotFoundError as e:
            print(f"speechrt_train lm: {e}", file=sys.stderr)
            return 2
    elif args.command == "average":
        from speechrt.errors import SpeechRTError
        from speechrt_train.loop import average_compact, save_atomic

        weights = args.weights or [1 / len(args.files)] * len(args.files)
        try:
            if all(Path(f).is_dir() for f in args.files):
                from speechrt_train.export import average_exported

                result = average_exported(args.files, weights, args.out)
            else:
                state = average_compact(args.files, weights)
                save_atomic(state, Path(args.out))
                result = {"out": args.out, "step": state["step"], "averaged": state["averaged"]}
        except (FileNotFoundError, ValueError, SpeechRTError) as e:
            print(f"speechrt_train average: {e}", file=sys.stderr)
            return 2
    elif args.command == "export":
        from speechrt_train.export import evaluate, export, write_metrics

        models = args.models or TRAINED
        runs = {m: Path(args.runs) / m for m in models if (Path(args.runs) / m).exists()}
        if not runs:
            print(f"no runs under {args.runs}", file=sys.stderr)
            return 2
        device = _device(args.device)
        speech = None
        if args.precise_bn and "quartznet" in runs:
            if not (Path(args.corpus) / "manifest.json").exists():
                print(f"--precise-bn: no corpus in {args.corpus}", file=sys.stderr)
                return 2
            from speechrt_train.asr_data import load_speech
            from speechrt_train.corpus import HELDOUT_VOICE, load_shard

            shards = [
                load_shard(p)
                for p in sorted(Path(args.corpus).glob("*.pt"))
                if p.stem != HELDOUT_VOICE
            ]
            speech = load_speech(shards, heldout=False, device=device, limit=1000)
        result = {"export": export(runs, args.out, not args.fp32, speech, device)}
        manifest = Path(args.corpus) / "manifest.json"
        if manifest.exists():
            result["corpus"] = json.loads(manifest.read_text())
        if args.evaluate:
            result["eval"] = evaluate(args.out, args.corpus, device=device)
        if args.metrics:
            write_metrics(args.metrics, result)
    elif args.command == "cards":
        from speechrt_train.cards import write_cards

        result = {
            "written": [
                str(p)
                for p in write_cards(
                    args.metrics, args.out, args.models, args.hardware, args.decoding
                )
            ]
        }
    else:
        from speechrt_train.export import evaluate, write_metrics

        result = evaluate(
            args.defaults, args.corpus, n_sentences=args.sentences, device=_device(args.device)
        )
        if args.metrics:
            write_metrics(args.metrics, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
