"""`python -m speechrt_train people --out corpus/people.pt`: real people saying English words
and short phrases, from Debian packages that are not the test set, as one recogniser voice.

    Debian packages (apt-get download) -> unpacked (+ the .pk3 zips inside) -> per source: the
    files whose words the package states (file name, a .txt beside it) -> 16 kHz mono
    -> corpus/people.pt, the voice "people" (every item a training item)

TRAINING DATA, kept apart from human_speech (the test set): no package here is one of its
packages (`build` checks), and none of their speakers is one of its speakers. The words come
from the packages themselves, never from listening or from a recogniser, so only clips whose
words are certain are kept; sounds that are not words (grunts, laughs, phonics sounds such as
"th") and spoken letter names (a name has no written form a recogniser prints: the test set
drops them too) are left out. Four or five minutes of speech in all, most of it single words:
a small voice that `--voice-repeat people=N` weighs up.

| package | what is spoken | words from |
| klettres-data | short words (en and en_GB speakers) | the file name |
| ktuberling-data | the names of the toy's pieces (en) | the file name, theme prefix dropped |
| tuxpaint-stamps-default | "a lion": stamp descriptions; digits (en, en_GB) | the stamp's .txt |
| hedgewars-data | voice packs Default, Classic, British: "take cover" | the file name |
| openarena-081-misc | the announcer: "excellent", "one", "two" | the file name |
| openarena-data | the rott voice: "cover me", "roger that" | the file name |
"""

from __future__ import annotations

import re
import subprocess
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from speechrt.text.numbers import number_words
from speechrt_train.human_speech import PACKAGES as TEST_PACKAGES
from speechrt_train.human_speech import apt_download, reference

VOICE = "people"

Clip = tuple[Path, str, str]  # (audio file, the words as the package states them, speaker)


def klettres(root: Path) -> list[Clip]:
    """KLettres' syllable drills that are English words ("dog", "sky"), US and British."""
    out = []
    for lang in ("en", "en_GB"):
        for f in sorted((root / "usr/share/klettres" / lang / "syllab").glob("*.ogg")):
            if f.stem not in ("aw", "ch", "th"):  # sounds, not words
                out.append((f, f.stem, f"klettres/{lang}"))
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
        out.append((f, KTUBERLING_SPELLING.get(name, name), "ktuberling/en"))
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
            out.append((f, f"{m.group(1)} {name}", "tuxpaint/descriptions"))
    for f in sorted((stamps / "symbols/math").glob("[0-9]*.ogg")):
        digit, _, lang = f.stem.partition("_")
        if digit.isdigit() and lang in ("", "en_GB"):
            out.append((f, number_words(digit), f"tuxpaint/digits-{lang or 'en'}"))
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
                out.append((f, HEDGEWARS[f.stem], f"hedgewars/{pack}"))
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
    return [(f, f.stem.rstrip("2"), "openarena/announcer") for f in files if f.stem in ANNOUNCER]


def openarena_rott(root: Path) -> list[Clip]:
    pk3 = root / "usr/share/games/openarena/missionpack/mp-pak0.pk3"
    files = _from_pk3(pk3, "sound/voices/rott/", root / "pk3")
    return [(f, ROTT[f.stem], "openarena/rott") for f in files if f.stem in ROTT]


@dataclass(frozen=True)
class Source:
    package: str
    license: str
    clips: Callable[[Path], list[Clip]]  # the unpacked package -> its clips


SOURCES = (
    Source("klettres-data", "GPL-2+", klettres),
    Source("ktuberling-data", "GPL-2+", ktuberling),
    Source("tuxpaint-stamps-default", "GPL-2", tuxpaint),
    Source("hedgewars-data", "GFDL-1.3", hedgewars),
    Source("openarena-081-misc", "GPL-2+", openarena_announcer),
    Source("openarena-data", "GPL-2+", openarena_rott),
)


def unpack(source: Source, cache: Path) -> Path:
    """Download and unpack a source's package into cache/<package>/ (once) -> the root."""
    root = cache / source.package
    if not (root / ".unpacked").exists():
        downloads = cache / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        archive, _ = apt_download(source.package, downloads)
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(archive), str(root)], check=True)
        (root / ".unpacked").touch()
    return root


def load_clip(path: Path, rate: int = 16000) -> np.ndarray:
    """A clip as float32 mono at `rate`, its level as recorded."""
    import soundfile as sf

    from speechrt.audio.io import resample

    audio, sr = sf.read(str(path), dtype="float32", always_2d=True)
    return resample(audio.mean(axis=1), sr, rate)


def items(roots: dict[str, Path], sources: tuple[Source, ...] = SOURCES) -> list[dict[str, Any]]:
    """{package: unpacked root} -> the shard's items (corpus.make_shard), one per clip whose
    words normalise to something speakable; the same file twice (a pack reusing a take) once."""
    from speechrt_train.corpus import ASR_RATE

    out, seen = [], set()
    for source in sources:
        for path, words, speaker in source.clips(roots[source.package]):
            spoken = reference(words)
            data = path.read_bytes()
            if spoken is None or data in seen:
                continue
            seen.add(data)
            audio = load_clip(path, ASR_RATE)
            key = f"{speaker}/{path.stem}"
            out.append({
                "key": key, "text": words, "spoken": spoken, "heldout": False, "codec": "",
                "audio": np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16),
            })  # fmt: skip
    return out


def build(out: Path, cache: Path, sources: tuple[Source, ...] = SOURCES) -> dict[str, Any]:
    """Fetch, unpack and read every source -> corpus shard at `out`; returns a summary."""
    from speechrt_train.corpus import ASR_RATE, make_shard
    from speechrt_train.loop import save_atomic

    tested = {p.name for packages in TEST_PACKAGES.values() for p in packages}
    if clash := tested & {s.package for s in sources}:
        raise ValueError(f"test-set packages cannot train: {', '.join(sorted(clash))}")
    roots = {s.package: unpack(s, cache) for s in sources}
    its = items(roots, sources)
    shard = make_shard(VOICE, its)
    save_atomic(shard, out)
    speakers = sorted({k.rsplit("/", 1)[0] for k in shard["keys"]})
    return {
        "voice": VOICE,
        "utterances": len(its),
        "heldout": 0,
        "hours": round(len(shard["audio"]) / ASR_RATE / 3600, 3),
        "words": sum(len(x["spoken"].split()) for x in its),
        "speakers": speakers,
    }
