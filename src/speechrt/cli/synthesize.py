"""`speechrt synthesize "Text." -o out.wav` or `--file phrases.txt --out-dir DIR`"""

from __future__ import annotations

import argparse
from pathlib import Path

from speechrt.cli.flags import add_runtime_options
from speechrt.defaults import voice_dirs
from speechrt.errors import SpeechRTError

MAX_CLI_CHARS = 1_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "text", nargs="?", help='text to speak, or SSML ("<speak>...</speak>"; or use --file)'
    )
    p.add_argument("-o", "--output", help="output file for TEXT (default: out.<format>)")
    p.add_argument(
        "--file", help="UTF-8 text file: one phrase per line, written as 1.wav ... N.wav"
    )
    p.add_argument("--out-dir", help="directory for --file outputs (default: current directory)")
    p.add_argument(
        "--timestamps",
        metavar="WORDS.json|.srt|.vtt",
        help="also write each word's start and end (TEXT only; FastPitch voices)",
    )
    p.add_argument("--url", help="use a running `speechrt serve` at URL instead of local models")
    p.add_argument("--acoustic", help="acoustic model directory (FastPitch, ...)")
    p.add_argument("--vocoder", help="vocoder model directory (HiFi-GAN, ...)")
    add_runtime_options(p)
    p.add_argument("--batch-size", type=int, default=8, help="sentences per batch (default: 8)")
    p.add_argument(
        "--format",
        choices=("wav", "flac", "pcm", "mp3", "opus"),  # speechrt.audio.codecs.FORMATS
        help="output format (default: the suffix; opus is written at 48 kHz)",
    )
    p.add_argument(
        "--sample-format",
        choices=("int16", "float32"),
        default="int16",
        help="int16 (default) or float32 samples (WAV/PCM: the model output exactly)",
    )
    g = p.add_argument_group("synthesis options")
    g.add_argument("--pace", type=float, default=1.0, help="speaking rate, > 1 is faster")
    g.add_argument("--pitch-shift", type=float, default=0.0, help="shift pitch by this many Hz")
    g.add_argument("--pitch-scale", type=float, default=1.0, help="amplify pitch variation")
    g.add_argument("--pitch-flatten", action="store_true", help="monotone pitch")
    g.add_argument("--speaker", type=int, default=0, help="speaker id (multi-speaker models)")
    g.add_argument("--denoise", type=float, default=0.0, help="denoiser strength, e.g. 0.01")
    g.add_argument("--sigma", type=float, help="WaveGlow latent scale (default: the model's)")
    g.add_argument("--max-decoder-steps", type=int, help="Tacotron2 step limit (default: model's)")
    g.add_argument("--seed", type=int, default=0, help="base random seed")


def read_phrases(path: str) -> list[str]:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SpeechRTError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpeechRTError(f"{path} is not UTF-8 text (bad byte at offset {e.start})") from None
    phrases = [line.strip() for line in text.splitlines() if line.strip()]
    if not phrases:
        raise SpeechRTError(f"{path} holds no phrases")
    return phrases


def run(args: argparse.Namespace) -> int:
    from speechrt.audio.codecs import write_audio
    from speechrt.options import SynthesisOptions
    from speechrt.tts import TTS

    if (args.text is None) == (args.file is None):
        raise SpeechRTError("give either TEXT or --file PHRASES")
    if args.text is not None and len(args.text) > MAX_CLI_CHARS:
        raise SpeechRTError(f"text is longer than {MAX_CLI_CHARS} characters")
    if args.timestamps is not None and (args.text is None or args.url is not None):
        raise SpeechRTError("--timestamps works with TEXT on local models (not --file or --url)")
    if args.timestamps is not None:
        from speechrt.captions import caption_format

        caption_format(args.timestamps)  # a bad suffix fails before any synthesis
    texts = [args.text] if args.text is not None else read_phrases(args.file)
    from speechrt.text import ssml

    for text in texts:  # bad SSML fails before any model loads
        if ssml.is_ssml(text):
            ssml.parse(text)
    options = SynthesisOptions(
        pace=args.pace,
        pitch_shift=args.pitch_shift,
        pitch_scale=args.pitch_scale,
        pitch_flatten=args.pitch_flatten,
        speaker=args.speaker,
        denoise=args.denoise,
        sigma=args.sigma,
        max_decoder_steps=args.max_decoder_steps,
        seed=args.seed,
    )
    if args.url is None:
        args.acoustic, args.vocoder = voice_dirs(args.acoustic, args.vocoder)
    ext = args.format or "wav"
    if args.file is None:
        outputs = [Path(args.output or f"out.{ext}")]
    else:
        out_dir = Path(args.out_dir or ".")
        out_dir.mkdir(parents=True, exist_ok=True)
        outputs = [out_dir / f"{i}.{ext}" for i in range(1, len(texts) + 1)]
    if args.url is not None:
        from speechrt.client import synthesize_files

        synthesize_files(args.url, texts, outputs, args.format, options, args.batch_size)
        print(f"{len(outputs)} file(s) from {args.url}: {', '.join(map(str, outputs[:3]))}")
        return 0

    backend = args.backend
    if backend == "auto" and args.denoise > 0:
        from speechrt.runtime import has_onnx

        # auto picks by what the call needs: denoising on onnx needs the vocoder's denoiser
        # graph, which the bundled voice does not ship; without it the voice runs eagerly
        backend = "auto" if has_onnx(args.vocoder) else "eager"
    tts = TTS(
        args.acoustic,
        args.vocoder,
        device=args.device,
        precision=args.precision,
        backend=backend,
    )
    if args.timestamps is not None:
        from speechrt.captions import write_captions

        wave, words = tts.synthesize_with_words(texts[0], options, batch_size=args.batch_size)
        write_captions(args.timestamps, words)
        audio = [wave]
    elif args.file is None:
        audio = tts.synthesize(texts, options, batch_size=args.batch_size)
    else:
        from tqdm import tqdm

        with tqdm(total=len(texts), unit="phrase", desc="synthesize") as bar:
            # Phrases are synthesized in chunks so the bar moves and memory stays bounded.
            audio = []
            for start in range(0, len(texts), args.batch_size):
                chunk = texts[start : start + args.batch_size]
                seeds = [args.seed + start + i for i in range(len(chunk))]
                audio += tts.synthesize(chunk, options, batch_size=args.batch_size, seeds=seeds)
                bar.update(len(chunk))
    for path, wav in zip(outputs, audio, strict=True):
        write_audio(path, wav, tts.sampling_rate, args.format, args.sample_format)
    if args.file is None:
        print(f"{outputs[0]}: {len(audio[0]) / tts.sampling_rate:.2f} s at {tts.sampling_rate} Hz")
    else:
        print(f"{len(outputs)} files in {outputs[0].parent}")
    return 0
