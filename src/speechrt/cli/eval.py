"""`speechrt eval --manifest PATH --model DIR [--csv out.csv]`: WER and CER of a recogniser.

PATH is a LibriSpeech-style directory (`*.trans.txt` files of `UTT-ID TEXT` lines beside
`UTT-ID.flac`), or a JSON-lines manifest of {"audio_filepath", "duration", "text"} objects (paths
relative to the manifest). Transcripts are normalised before scoring (lowercase, punctuation except
apostrophes removed). An utterance whose audio cannot be read is scored with an empty hypothesis,
reported on stderr and in the CSV's error column, and makes the exit status 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from speechrt.cli.flags import add_runtime_options
from speechrt.cli.transcribe import add_decoder_arguments, decoder_options
from speechrt.errors import SpeechRTError

if TYPE_CHECKING:
    from speechrt.asr import ASR
    from speechrt.asr.wer import ErrorCounts

UTTERANCES_PER_CHUNK = 64
CSV_FIELDS = (
    "id", "audio", "duration", "reference", "hypothesis", "word_errors", "ref_words", "wer",
    "char_errors", "ref_chars", "cer", "error",
)  # fmt: skip


@dataclass(frozen=True)
class Utterance:
    id: str
    audio: Path
    text: str


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--manifest", required=True, help="LibriSpeech-style directory or JSON lines")
    p.add_argument(
        "--model", required=True, help="ASR model directory (QuartzNet, Jasper, Parakeet)"
    )
    p.add_argument("--csv", help="write per-utterance results to this CSV file")
    add_runtime_options(p)
    p.add_argument("--batch-size", type=int, default=16, help="windows per batch (default: 16)")
    add_decoder_arguments(p)


def librispeech_utterances(root: Path) -> list[Utterance]:
    """Every `ID TEXT` line of every *.trans.txt below root, audio = ID.flac (or .wav) beside it."""
    out = []
    for trans in sorted(root.rglob("*.trans.txt")):
        for n, line in enumerate(_read_text(trans).splitlines(), 1):
            if not line.strip():
                continue
            uid, _, text = line.strip().partition(" ")
            if not text:
                raise SpeechRTError(f"{trans}:{n}: expected 'UTTERANCE-ID TRANSCRIPT'")
            audio = trans.parent / f"{uid}.flac"
            if not audio.exists() and (trans.parent / f"{uid}.wav").exists():
                audio = trans.parent / f"{uid}.wav"
            out.append(Utterance(uid, audio, text))
    if not out:
        raise SpeechRTError(f"{root}: no *.trans.txt transcripts found")
    return out


def jsonl_utterances(path: Path) -> list[Utterance]:
    """A JSON-lines manifest: {"audio_filepath", "text"[, "duration"]} per line."""
    out = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            audio, text = Path(entry["audio_filepath"]), str(entry["text"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SpeechRTError(
                f"{path}:{n}: not a manifest line with audio_filepath and text ({e})"
            ) from None
        audio = audio if audio.is_absolute() else path.parent / audio
        out.append(Utterance(entry.get("id", audio.stem), audio, text))
    if not out:
        raise SpeechRTError(f"{path}: empty manifest")
    return out


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise SpeechRTError(f"cannot read {path}: {e}") from None


def load_manifest(path: str) -> list[Utterance]:
    p = Path(path)
    if p.is_dir():
        return librispeech_utterances(p)
    if p.is_file():
        return jsonl_utterances(p)
    raise SpeechRTError(f"{path}: no such manifest file or directory")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from speechrt.asr import ASR
    from speechrt.asr.wer import ErrorCounts, char_errors, word_errors

    utterances = load_manifest(args.manifest)
    options = decoder_options(args)
    asr = ASR(
        args.model, device=args.device, precision=args.precision, backend=args.backend, **options
    )
    writer, csv_file = None, None
    if args.csv:
        try:
            csv_file = open(args.csv, "w", newline="", encoding="utf-8")  # noqa: SIM115
        except OSError as e:
            raise SpeechRTError(f"cannot write {args.csv}: {e.strerror or e}") from None
        writer = csv.DictWriter(csv_file, fieldnames=CSV_FIELDS)
        writer.writeheader()
    words, chars, failed, seconds, compute = ErrorCounts(), ErrorCounts(), 0, 0.0, 0.0
    try:
        with tqdm(total=len(utterances), unit="utt", desc="eval", file=sys.stderr) as bar:
            for first in range(0, len(utterances), UTTERANCES_PER_CHUNK):
                chunk = utterances[first : first + UTTERANCES_PER_CHUNK]
                hyps, errors = transcribe_chunk(asr, chunk, args.batch_size)
                for utt, (hyp, duration, spent), err in zip(chunk, hyps, errors, strict=True):
                    w, c = word_errors(utt.text, hyp), char_errors(utt.text, hyp)
                    words, chars = words + w, chars + c
                    seconds += duration
                    compute += spent
                    if err:
                        failed += 1
                        tqdm.write(f"speechrt eval: error: {err}", file=sys.stderr)
                    if writer:
                        writer.writerow(_row(utt, hyp, duration, w, c, err))
                bar.update(len(chunk))
    finally:
        if csv_file:
            csv_file.close()
    rtf = f", RTF {seconds / compute:.1f}" if compute > 0 else ""
    fails = f", {failed} unreadable (scored as empty)" if failed else ""
    print(
        f"WER {100 * words.rate:.2f}% ({words.errors}/{words.ref_len} words), "
        f"CER {100 * chars.rate:.2f}% ({chars.errors}/{chars.ref_len} chars) on "
        f"{len(utterances)} utterances, {seconds / 3600:.2f} h of audio{rtf}{fails}"
    )
    return 2 if failed else 0


def transcribe_chunk(
    asr: ASR, chunk: list[Utterance], batch_size: int
) -> tuple[list[tuple[str, float, float]], list[str]]:
    """-> per utterance (hypothesis, duration s, compute s) and an error message ("" if none)."""
    waves, ok, errors = [], [], [""] * len(chunk)
    for i, utt in enumerate(chunk):
        try:
            waves.append(asr.load_audio(utt.audio))
            ok.append(i)
        except SpeechRTError as e:
            errors[i] = str(e)
    results = asr.transcribe(waves, batch_size=batch_size) if waves else []
    hyps = [("", 0.0, 0.0)] * len(chunk)
    for i, t in zip(ok, results, strict=True):
        hyps[i] = (t.text, t.duration, t.duration / t.rtf if t.rtf > 0 else 0.0)
    return hyps, errors


def _row(
    utt: Utterance, hyp: str, duration: float, w: ErrorCounts, c: ErrorCounts, err: str
) -> dict[str, str | int]:
    return {
        "id": utt.id, "audio": str(utt.audio), "duration": f"{duration:.3f}",
        "reference": utt.text, "hypothesis": hyp,
        "word_errors": w.errors, "ref_words": w.ref_len, "wer": f"{w.rate:.4f}",
        "char_errors": c.errors, "ref_chars": c.ref_len, "cer": f"{c.rate:.4f}",
        "error": err,
    }  # fmt: skip
