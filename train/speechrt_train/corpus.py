"""`python -m speechrt_train corpus`: every teacher voice reads its share of the sentences.

    sentences (texts.py) -> per voice: train slice + held-out slice -> worker processes
    (one festival process per batch; flite per sentence) -> resampled, aligned (TTS voice)
    -> corpus/<voice>.pt (one "shard" per voice) + corpus/manifest.json (hours, speeds, skips)

A shard is a dict of plain tensors and lists (torch.load(weights_only=True) reads it):
    voice, sample_rate, keys, texts (the sentence), spoken (what the teacher read: the
    sentence normalized, or for SHORT_SHARE of a recogniser voice's train items a few of its
    words alone, short_span), heldout,
    codec (the lossy round trip a recogniser voice's training item went through, or ""),
    audio (int16, all utterances concatenated), audio_offsets (N + 1,),
    and for the TTS voice: ids, id_offsets (N + 1,), durations (frames per id; no ids = not
    aligned, so ASR-only), frames (N,).
Train slices of different voices are disjoint where the sentences allow, so the recogniser hears
as many different sentences as possible.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing as mp
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from speechrt.audio.io import resample, to_int16
from speechrt.audio.mel import MelConfig
from speechrt_train.loop import save_atomic
from speechrt_train.texts import Sentence, hash64, load_sentences, split

TTS_VOICE = "slt-hts"  # the voice our FastPitch + HiFi-GAN learn
HELDOUT_VOICE = "rms"  # the voice no recogniser trains on: its held-out sentences measure WER
ASR_RATE = 16000
TTS_MEL = MelConfig()  # DLE's: 22050 Hz, hop 256, 80 mels up to 8 kHz
BATCH = 32  # sentences per worker task

# voice -> (train sentences, held-out sentences). "full" ~ 5 h TTS voice + 4-4.5 h per flite
# voice, about 1 900 CPU-seconds at the speeds measured on this project's machines (docs/models).
PLANS: dict[str, dict[str, tuple[int, int]]] = {
    "full": {
        "slt-hts": (4900, 200),
        "slt": (4000, 200),
        "awb": (4000, 200),
        "kal16": (4432, 200),  # with the above: every one of the 17 432 train sentences once
        "ked": (4000, 200),  # a fifth training speaker (festival diphones), reading them again
        "pico-us": (4000, 200),  # SVOX Pico's US and British voices, reading them again
        "pico-gb": (4000, 200),
        "espeak": (2000, 200),  # espeak-ng, a different accent and variant per sentence
        "rms": (0, 300),
    },
    # with --text-root (docs/models/README.md, "The corpus"): the 62 946 train sentences
    # of the fortunes and the extra text nearly all read once (~54 h, ~4 500 CPU-seconds)
    "wide": {
        "slt-hts": (14000, 200),
        "slt": (12000, 200),
        "awb": (12000, 200),
        "kal16": (12000, 200),
        "ked": (12000, 200),
        "pico-us": (12000, 200),  # these three read 30 000 of the sentences a second time
        "pico-gb": (12000, 200),
        "espeak": (6000, 200),
        "rms": (0, 300),
    },
    # the Piper voice, made where piper-tts runs (not the GPU image) and carried packed
    # (pack_shard); its train side joins any corpus's shards
    "piper": {"joe": (3000, 200)},
    # Kokoro's speakers, made where its packages are (teachers.kokoro_files) and carried packed
    # the same way; kokoro-x, its held-out speakers, reads held-out sentences only
    "kokoro": {"kokoro": (12000, 100), "kokoro-x": (0, 200)},
    "small": {v: (200, 20) for v in ("slt-hts", "slt", "awb", "kal16")} | {"rms": (0, 100)},
    # the TTS voice alone (Tacotron 2's stop-step evidence: gpu_train.sh MODELS=tacotron2)
    "tts": {"slt-hts": (4900, 300)},
    "tiny": {"slt-hts": (12, 3), "slt": (8, 2), "rms": (0, 4)},
}
# wide with the Piper voice made beside the others, where piper-tts and the voice's wheel are
# importable (on the GPU image: both carried and put on PYTHONPATH, docs/models/README.md)
PLANS["wide-piper"] = PLANS["wide"] | {"joe": (12000, 200)}
# and joe's readings changed to a woman's pitch and formants (needs praat-parselmouth too)
PLANS["wide-piper-f"] = PLANS["wide-piper"] | {"joe-f": (10000, 200)}
# and a higher man's voice made from joe the same way
PLANS["wide-piper-fh"] = PLANS["wide-piper-f"] | {"joe-h": (8000, 200)}
# voices no recogniser trains on (every plan gives them held-out sentences only): rms, and the
# natural-prosody voice joe-x that selection reads (speechrt_train.pick)
HELDOUT_VOICES = (HELDOUT_VOICE, "joe-x")


@dataclass
class Task:
    voice: str
    sentences: list[Sentence]


ROUND_SHIFT = 0.381966  # of the train sentences, per round: far from any small fraction


def assign(
    plan: dict[str, tuple[int, int]], sentences: list[Sentence], round_: int = 0
) -> list[Task]:
    """Each voice's batches: held-out sentences first, then a train slice (consecutive slices
    for consecutive voices, wrapping round). Batches of all voices are interleaved in proportion,
    so a run stopped at its deadline still has every voice's share done equally far.

    `round_` N starts the slices N x ROUND_SHIFT of the way round the train sentences: another
    round pairs voices and train sentences afresh (and with them the prosody and codec drawn
    from a hash of the pair); the held-out side stays the same."""
    train, heldout = split(sentences)
    ranked: list[tuple[float, int, Task]] = []
    offset = int(round_ * ROUND_SHIFT * len(train)) % max(len(train), 1)
    for v, (voice, (n_train, n_heldout)) in enumerate(plan.items()):
        if n_train > len(train) or n_heldout > len(heldout):
            raise ValueError(f"{voice}: plan wants more sentences than there are")
        picked = heldout[:n_heldout] + [train[(offset + i) % len(train)] for i in range(n_train)]
        offset += n_train
        batches = [picked[i : i + BATCH] for i in range(0, len(picked), BATCH)]
        ranked += [(k / len(batches), v, Task(voice, b)) for k, b in enumerate(batches)]
    return [task for _, _, task in sorted(ranked, key=lambda r: r[:2])]


_worker: dict[str, Any] = {}


def _prepare(prefix: str | None) -> None:
    """Load the front end once in the parent: forked workers share it (seconds per worker)."""
    from speechrt_train.align import make_processor
    from speechrt_train.teachers import Teachers

    _worker["teachers"] = Teachers(prefix)
    _worker["tp"] = make_processor()
    _worker["tp"].text_to_ids("warm up 1 2 3.")


STALL_SECONDS = 120  # a batch taking longer than this dumps its worker's Python stack


def _init() -> None:
    torch.set_num_threads(1)


def _synthesize_robustly(voice: str, texts: list[str]) -> list[Any]:
    """The batch at once; if that fails, sentence by sentence, None where one fails (an
    unattended run must not die for one odd sentence). Gives up when every one fails."""
    from speechrt_train.teachers import TeacherError

    teachers = _worker["teachers"]
    try:
        return teachers.synthesize(voice, texts)
    except TeacherError:
        out: list[Any] = []
        for text in texts:
            try:
                out += teachers.synthesize(voice, [text])
            except TeacherError:
                out.append(None)
        if all(u is None for u in out):
            raise
        return out


def _run_task(task: Task) -> tuple[str, list[dict[str, Any]], float, float]:
    """Synthesize one batch -> (voice, utterances, CPU s of the synthesizer, CPU s of Python)."""
    from speechrt_train.align import AlignError, align, tp_plain

    tp = _worker["tp"]
    faulthandler.dump_traceback_later(STALL_SECONDS)  # (to stderr) where a stuck batch waits
    self_before = time.process_time()
    whole = [tp_plain(tp).normalize(s.text).strip() for s in task.sentences]
    spoken = whole
    if task.voice != TTS_VOICE:  # (the TTS voice's sentences are aligned whole)
        spoken = [
            t if s.heldout else short_span(t, f"{task.voice}/{s.key}")
            for s, t in zip(task.sentences, whole, strict=True)
        ]
    before, self_synth = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
    utts = _synthesize_robustly(task.voice, spoken)
    self_synth = time.process_time() - self_synth  # (piper runs in this process)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) + self_synth
    out = []
    for s, text, full, u in zip(task.sentences, spoken, whole, utts, strict=True):
        if u is None:  # the synthesizer failed on this sentence: left out
            continue
        item: dict[str, Any] = {"key": s.key, "text": s.text, "spoken": text, "heldout": s.heldout}
        item["short"] = text != full  # (counted in the manifest)
        if task.voice == TTS_VOICE:
            sr, hop = TTS_MEL.sampling_rate, TTS_MEL.hop_length
            audio = resample(u.audio, u.sample_rate, sr)
            try:
                a = align(s.text, tp, u.words, u.segments, sr / hop)
                start = int(round(a.start * sr))
                audio = audio[start : start + a.frames * hop]
                audio = np.pad(audio, (0, a.frames * hop - len(audio)))
                item.update(ids=a.ids, durations=a.durations, frames=a.frames)
            except AlignError as e:
                item.update(ids=[], durations=[], frames=0, skip=str(e))
        else:
            audio = resample(u.audio, u.sample_rate, ASR_RATE)
            if not s.heldout:  # evaluation reads the held-out items as the voice made them
                audio, item["codec"] = codec_round_trip(audio, f"{task.voice}/{s.key}")
        item["audio"] = np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16)
        out.append(item)
    faulthandler.cancel_dump_traceback_later()
    return task.voice, out, cpu, time.process_time() - self_before - self_synth


SHORT_SHARE = 0.1  # of a recogniser voice's training items: a few of the sentence's words alone
SHORT_WORDS = 3


def short_span(spoken: str, key: str) -> str:
    """For SHORT_SHARE of the keys (a hash of `key`), 1-SHORT_WORDS consecutive words of the
    sentence `spoken`, the span's length and start drawn from the hash; else the sentence.
    People often say a word or two (an answer, a command, a menu prompt), and read sentences
    alone would teach the recogniser that speech always goes on."""
    h = hash64(f"short\n{key}")
    words = spoken.split()
    if (h % 1000) / 1000 >= SHORT_SHARE or len(words) <= 1:
        return spoken
    h //= 1000
    n = 1 + h % min(SHORT_WORDS, len(words))
    start = (h // SHORT_WORDS) % (len(words) - n + 1)
    return " ".join(words[start : start + n])


CODEC_SHARE = 0.2  # of a recogniser voice's training items, through a lossy codec and back
G722_RATES = (64000, 56000, 48000)  # G.722's three modes (bit/s)
G722_DELAY = 22  # samples its encoder and decoder's filter banks delay the audio by (measured)


def check_codecs() -> None:
    """codec_round_trip's libsndfile must write MP3 and Opus, and the G722 package be there;
    a clear error if not."""
    import importlib.util

    import soundfile as sf

    if "MP3" not in sf.available_formats() or "OPUS" not in sf.available_subtypes("OGG"):
        raise RuntimeError(
            f"libsndfile {sf.__libsndfile_version__} cannot write MP3 and Opus "
            "(the corpus's codec round trips need both: soundfile >= 0.12's wheel has them)"
        )
    if importlib.util.find_spec("G722") is None:
        raise RuntimeError(
            "the corpus's G.722 round trips need the G722 package (pip install G722)"
        )


def codec_round_trip(audio: np.ndarray, key: str) -> tuple[np.ndarray, str]:
    """16 kHz float audio through MP3, Opus or G.722 and back, for CODEC_SHARE of the keys (a
    hash of `key` picks which, the codec and its compression level or bit rate) -> (audio,
    what was done: "mp3 0.63", "opus 0.20", "g722 56000" or "" for unchanged). libsndfile
    (soundfile) does MP3 and Opus, the G722 package (ITU-T G.722, wideband telephony) G.722,
    its delay taken out."""
    import io

    import soundfile as sf

    h = hash64(key)
    if (h % 1000) / 1000 >= CODEC_SHARE:
        return audio, ""
    h //= 1000
    codec, h = ("mp3", "opus", "g722")[h % 3], h // 3
    if codec == "g722":
        import G722

        rate = G722_RATES[h % len(G722_RATES)]
        pcm = np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16)
        coded = G722.G722(ASR_RATE, rate).encode(
            np.concatenate([pcm, np.zeros(G722_DELAY, np.int16)])
        )
        decoded = np.asarray(G722.G722(ASR_RATE, rate).decode(coded), dtype=np.float32) / 32768.0
        return decoded[G722_DELAY : G722_DELAY + audio.shape[0]], f"g722 {rate}"
    fmt, subtype = ("MP3", "MPEG_LAYER_III") if codec == "mp3" else ("OGG", "OPUS")
    level = round(0.2 + 0.6 * (h % 1000) / 1000, 2)  # 0 best, 1 smallest
    buf = io.BytesIO()
    sf.write(buf, audio, ASR_RATE, format=fmt, subtype=subtype, compression_level=level)
    buf.seek(0)
    coded, rate = sf.read(buf, dtype="float32")
    assert rate == ASR_RATE
    return coded, f"{codec} {level:.2f}"


def _concat(parts: list[list[int]] | list[np.ndarray], dtype: torch.dtype) -> tuple:
    lengths = [len(p) for p in parts]
    offsets = torch.zeros(len(parts) + 1, dtype=torch.long)
    offsets[1:] = torch.tensor(lengths, dtype=torch.long).cumsum(0)
    flat = np.concatenate([np.asarray(p) for p in parts]) if parts else np.zeros(0)
    return torch.from_numpy(flat.astype(np.int64)).to(dtype), offsets


def make_shard(voice: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    items = sorted(items, key=lambda x: (x["heldout"], x["key"]))
    audio, audio_offsets = _concat([x["audio"] for x in items], torch.int16)
    shard: dict[str, Any] = {
        "voice": voice,
        "sample_rate": TTS_MEL.sampling_rate if voice == TTS_VOICE else ASR_RATE,
        "keys": [x["key"] for x in items],
        "texts": [x["text"] for x in items],
        "spoken": [x["spoken"] for x in items],
        "heldout": [bool(x["heldout"]) for x in items],
        "codec": [x.get("codec", "") for x in items],  # codec_round_trip's record
        "audio": audio,
        "audio_offsets": audio_offsets,
    }
    if voice == TTS_VOICE:
        shard["ids"], shard["id_offsets"] = _concat([x["ids"] for x in items], torch.int16)
        shard["durations"], _ = _concat([x["durations"] for x in items], torch.int16)
        shard["frames"] = torch.tensor([x["frames"] for x in items], dtype=torch.long)
        shard["mel"] = TTS_MEL.to_dict()
    return shard


def build(
    out_dir: str | Path,
    plan: str | dict[str, tuple[int, int]] = "small",
    jobs: int = 0,
    prefix: str | None = None,
    fortunes_root: str | Path = "/",
    minutes: float | None = None,
    progress: bool = True,
    text_root: str | Path | None = None,
    round_: int = 0,
) -> dict[str, Any]:
    """Synthesize the corpus into out_dir; returns (and writes) the manifest.

    `text_root`: a Debian root holding more English text (language_model.extra_texts), whose
    acceptable sentences join the train side (language_model.speech_sentences), merged with the
    fortunes' in hash order; the held-out sentences stay exactly the fortunes' own.

    `minutes`: stop handing out batches after this long and keep what is done (the batches are
    interleaved across voices, so each voice gets its proportional share).

    `round_`: which voice reads which train sentence (`assign`)."""
    from tqdm import tqdm

    plan = PLANS[plan] if isinstance(plan, str) else plan
    check_codecs()  # before the workers start, not in each of them
    sentences = load_sentences(fortunes_root)
    if not sentences:
        raise FileNotFoundError(f"no fortune files under {fortunes_root} (unpack the .debs)")
    extra = []
    if text_root is not None:
        from speechrt_train.language_model import speech_sentences

        extra = speech_sentences(text_root, sentences)
        sentences = sorted(sentences + extra, key=lambda s: s.key)
    tasks = assign(plan, sentences, round_)
    jobs = jobs or mp.cpu_count()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    _prepare(prefix)
    items: dict[str, list[dict[str, Any]]] = {v: [] for v in plan}
    synth_cpu = {v: 0.0 for v in plan}
    python_cpu = {v: 0.0 for v in plan}
    deadline = t0 + 60 * minutes if minutes else float("inf")
    total = sum(len(t.sentences) for t in tasks)
    stopped = False
    with (
        mp.get_context("fork").Pool(jobs, _init) as pool,
        tqdm(total=total, unit="utt", desc="corpus", disable=not progress, mininterval=5) as bar,
    ):
        results = pool.imap_unordered(_run_task, tasks)
        while True:  # the deadline holds even while no batch finishes
            wait = max(deadline - time.time(), 0.0) if minutes else None
            try:
                voice, done, synth, python = results.next(timeout=wait)
            except StopIteration:
                break
            except mp.TimeoutError:
                stopped = True
                pool.terminate()
                break
            items[voice] += done
            synth_cpu[voice] += synth
            python_cpu[voice] += python
            bar.update(len(done))
    manifest: dict[str, Any] = {
        "plan": plan,
        "round": round_,
        "jobs": jobs,
        "wall_seconds": round(time.time() - t0, 1),
        "stopped_at_deadline": stopped,
        "sentences": {"fortunes": len(sentences) - len(extra), "extra text": len(extra)},
    }
    voices = {}
    for voice, its in items.items():
        shard = make_shard(voice, its)
        save_atomic(shard, out / f"{voice}.pt")  # (a new file: a mapped old one stays whole)
        seconds = len(shard["audio"]) / shard["sample_rate"]
        cpu = synth_cpu[voice] + python_cpu[voice]
        info = {
            "utterances": len(its),
            "heldout": sum(shard["heldout"]),
            "hours": round(seconds / 3600, 3),
            "synth_cpu_seconds": round(synth_cpu[voice], 1),
            "python_cpu_seconds": round(python_cpu[voice], 1),
            "audio_seconds_per_synth_cpu_second": round(seconds / max(synth_cpu[voice], 1e-9), 1),
            "audio_seconds_per_cpu_second": round(seconds / max(cpu, 1e-9), 1),
            "codec_round_trips": sum(bool(c) for c in shard["codec"]),
            "short_spans": sum(x["short"] for x in its),
        }
        if voice == TTS_VOICE:
            skips = [x.get("skip") for x in its if x.get("skip")]
            info["aligned"] = len(its) - len(skips)
            info["skipped_examples"] = skips[:5]
        voices[voice] = info
    manifest["voices"] = voices
    manifest["total_cpu_seconds"] = round(sum(synth_cpu.values()) + sum(python_cpu.values()), 1)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def list_voice(shard_path: Path, shard: dict[str, Any], how: str) -> None:
    """A voice made after its corpus (unpacked, or read from a package) joins the manifest
    beside its shard, if there is one, so the manifest lists every voice trained on."""
    manifest = shard_path.parent / "manifest.json"
    if not manifest.exists():
        return
    listing = json.loads(manifest.read_text())
    listing["voices"][shard["voice"]] = {
        "utterances": len(shard["keys"]),
        "heldout": sum(shard["heldout"]),
        "hours": round(len(shard["audio"]) / shard["sample_rate"] / 3600, 3),
        "made": how,
    }
    manifest.write_text(json.dumps(listing, indent=1) + "\n")


PACK_LEVEL = 0.9  # libsndfile's Opus compression level for pack_shard: ~32 kbit/s at 16 kHz


def pack_shard(shard: dict[str, Any]) -> dict[str, Any]:
    """A recogniser voice's shard with each utterance's audio as Ogg Opus bytes (about an
    eighth of the int16 size) in `opus` (uint8) + `opus_offsets`, to carry it where it cannot
    be made; `unpack_shard` gives the audio back (lossy: as through one more codec)."""
    import io

    import soundfile as sf

    if "ids" in shard:
        raise ValueError("the TTS voice's shard (aligned to its mel frames) is not packed")
    coded = []
    for i in range(len(shard["keys"])):
        buf = io.BytesIO()
        sf.write(buf, utterance_audio(shard, i).numpy(), shard["sample_rate"], format="OGG",
                 subtype="OPUS", compression_level=PACK_LEVEL)  # fmt: skip
        coded.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
    packed = {k: v for k, v in shard.items() if k not in ("audio", "audio_offsets")}
    packed["opus"], packed["opus_offsets"] = _concat(coded, torch.uint8)
    return packed


def unpack_shard(packed: dict[str, Any]) -> dict[str, Any]:
    """pack_shard's inverse: the audio decoded to int16 again, each utterance as long as
    before."""
    import io

    import soundfile as sf

    opus, offsets = packed["opus"].numpy(), packed["opus_offsets"]
    parts = []
    for i in range(len(packed["keys"])):
        data = opus[int(offsets[i]) : int(offsets[i + 1])].tobytes()
        audio, rate = sf.read(io.BytesIO(data), dtype="float32")
        if rate != packed["sample_rate"]:
            raise ValueError(f"utterance {i}: {rate} Hz in a {packed['sample_rate']} Hz shard")
        parts.append(to_int16(audio))
    shard = {k: v for k, v in packed.items() if k not in ("opus", "opus_offsets")}
    shard["audio"], shard["audio_offsets"] = _concat(parts, torch.int16)
    return shard


def load_shard(path: str | Path) -> dict[str, Any]:
    """A voice's shard, its tensors mapped from the file (read as used, shared between the
    processes of a data-parallel run) rather than copied into memory first."""
    return torch.load(path, weights_only=True, mmap=True)


def utterance_audio(shard: dict[str, Any], i: int) -> torch.Tensor:
    """Utterance i's samples as float32 in [-1, 1]."""
    a, b = int(shard["audio_offsets"][i]), int(shard["audio_offsets"][i + 1])
    return shard["audio"][a:b].float() / 32768.0
