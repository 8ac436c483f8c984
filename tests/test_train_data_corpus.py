"""speechrt_train's corpus without any synthesizer: the plan of voices and sentences, codec round
trips, short spans, the build's deadline, and packed shards."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch


def test_corpus_plan_gives_voices_disjoint_train_slices_interleaved():
    from speechrt_train.corpus import BATCH, assign
    from speechrt_train.texts import Sentence, text_key

    texts = [f"Sentence {i} is a fine line of prose." for i in range(3000)]
    sentences = [Sentence(text_key(t), t) for t in texts]
    plan = {"slt-hts": (200, 10), "slt": (100, 10), "rms": (0, 20)}
    tasks = assign(plan, sentences)
    by_voice: dict[str, list] = {}
    for t in tasks:
        assert 0 < len(t.sentences) <= BATCH
        by_voice.setdefault(t.voice, []).extend(t.sentences)
    assert {v: len(s) for v, s in by_voice.items()} == {"slt-hts": 210, "slt": 110, "rms": 20}
    train = {v: {s.key for s in ss if not s.heldout} for v, ss in by_voice.items()}
    assert not train["slt-hts"] & train["slt"] and not train["rms"]
    assert all(s.heldout for s in by_voice["rms"])
    assert [s.key for s in by_voice["slt"] if s.heldout] == [
        s.key for s in by_voice["slt-hts"] if s.heldout
    ]  # every voice reads the same first held-out sentences
    first_half = {t.voice for t in tasks[: len(tasks) // 2]}
    assert first_half == set(plan)  # interleaved: a deadline cuts every voice alike
    with pytest.raises(ValueError, match="more sentences"):
        assign({"slt": (5000, 0)}, sentences)


def test_corpus_round_pairs_voices_and_sentences_afresh():
    from speechrt_train.corpus import assign
    from speechrt_train.texts import Sentence, text_key

    texts = [f"Sentence {i} is a fine line of prose." for i in range(3000)]
    sentences = [Sentence(text_key(t), t) for t in texts]
    plan = {"slt-hts": (900, 10), "slt": (900, 10), "awb": (900, 10), "rms": (0, 20)}

    def read(round_: int) -> dict[str, list]:
        by_voice: dict[str, list] = {}
        for t in assign(plan, sentences, round_):
            by_voice.setdefault(t.voice, []).extend(t.sentences)
        return by_voice

    first, second = read(0), read(1)
    for voice in plan:
        assert len(first[voice]) == len(second[voice])
        assert [s.key for s in first[voice] if s.heldout] == [
            s.key for s in second[voice] if s.heldout
        ]  # the held-out side does not move
    train = [
        {v: {s.key for s in ss if not s.heldout} for v, ss in r.items()} for r in (first, second)
    ]
    for voice in ("slt-hts", "slt", "awb"):
        # a voice now reads mostly sentences it did not read in round 0
        assert len(train[1][voice] & train[0][voice]) < 0.5 * len(train[0][voice])
    assert not train[1]["slt"] & train[1]["awb"]  # still disjoint slices within a round
    assert [s.key for s in read(1)["slt"]] == [s.key for s in second["slt"]]  # deterministic


def test_codec_round_trip_for_a_share_of_keys():
    from speechrt_train.corpus import CODEC_SHARE, codec_round_trip

    t = np.arange(4000) / 16000
    x = (0.3 * np.sin(2 * np.pi * 440 * t) * np.sin(np.pi * t / t[-1])).astype(np.float32)
    done = [codec_round_trip(x, f"slt/{i}") for i in range(300)]
    again = [codec_round_trip(x, f"slt/{i}")[1] for i in range(20)]
    assert again == [what for _, what in done[:20]]  # a function of the key
    kinds = [what.split()[0] for _, what in done if what]
    assert abs(len(kinds) / len(done) - CODEC_SHARE) < 0.07
    assert {"mp3", "opus", "g722"} == set(kinds)
    for audio, what in done[:80]:
        if not what:
            assert audio is x  # the others are left as they are
        else:  # a lossy copy: as long, as loud (within 2 dB), not the same samples
            assert audio.shape == x.shape and not np.array_equal(audio, x)
            ratio = np.sqrt(np.mean(audio**2) / np.mean(x**2))
            assert abs(20 * np.log10(ratio)) < 2.0
        if what.startswith("g722"):  # in time with the input: its delay taken out
            assert np.corrcoef(audio, x)[0, 1] > 0.99


def test_short_spans_for_a_share_of_training_items():
    from speechrt_train.corpus import SHORT_SHARE, SHORT_WORDS, short_span

    sentence = "the quick brown fox jumps over the lazy dog."
    spans = [short_span(sentence, f"slt/{k}") for k in range(4000)]
    short = [s for s in spans if s != sentence]
    assert abs(len(short) / len(spans) - SHORT_SHARE) < 0.02
    assert all(1 <= len(s.split()) <= SHORT_WORDS and s in sentence for s in short)
    assert {len(s.split()) for s in short} == set(range(1, SHORT_WORDS + 1))
    assert len(set(short)) > 15  # spans from all over the sentence
    assert spans == [short_span(sentence, f"slt/{k}") for k in range(4000)]  # deterministic
    assert short_span("hello.", "slt/0") == "hello."  # one word stays itself


def test_corpus_task_reads_short_spans_for_recogniser_voices_only(monkeypatch):
    from speechrt_train import corpus
    from speechrt_train.align import make_processor, tp_plain
    from speechrt_train.teachers import Utterance
    from speechrt_train.texts import Sentence, text_key

    asked: dict[str, list[str]] = {}

    class Recording:
        def synthesize(self, voice, texts):
            asked[voice] = list(texts)
            return [Utterance(np.zeros(1600, dtype=np.float32), 16000) for _ in texts]

    tp = make_processor()
    monkeypatch.setitem(corpus._worker, "teachers", Recording())
    monkeypatch.setitem(corpus._worker, "tp", tp)
    texts = [f"Sentence number {i} is a fine line of prose to read." for i in range(2000)]
    pool = [Sentence(text_key(t), t) for t in texts]
    sentences = [s for s in pool if not s.heldout][:60] + [s for s in pool if s.heldout][:5]
    _, items, _, _ = corpus._run_task(corpus.Task("slt", sentences))
    whole = [tp_plain(tp).normalize(s.text).strip() for s in sentences]
    assert asked["slt"] == [x["spoken"] for x in items]
    short = [x for x, w in zip(items, whole, strict=True) if x["spoken"] != w]
    assert short and all(x["short"] and not x["heldout"] for x in short)
    assert len(short) < len(items) / 3
    assert all(len(x["spoken"].split()) <= corpus.SHORT_WORDS for x in short)
    assert not any(x["short"] for x in items[-5:])  # held-out items are read whole


def _stuck(task):
    threading.Event().wait()  # a batch that never finishes (a hung synthesizer)


def test_corpus_deadline_holds_while_every_batch_is_stuck(monkeypatch, tmp_path):
    from speechrt_train import corpus
    from speechrt_train.texts import Sentence, text_key

    texts = [f"Sentence number {i} is a fine line of prose to read." for i in range(200)]
    monkeypatch.setattr(
        corpus, "load_sentences", lambda root: [Sentence(text_key(t), t) for t in texts]
    )
    monkeypatch.setattr(corpus, "check_codecs", lambda: None)
    monkeypatch.setattr(corpus, "_prepare", lambda prefix: None)
    monkeypatch.setattr(corpus, "_run_task", _stuck)
    manifest = corpus.build(tmp_path, {"slt": (8, 0)}, jobs=2, minutes=0.01, progress=False)
    assert manifest["stopped_at_deadline"] and manifest["voices"]["slt"]["utterances"] == 0


def test_packed_shard_carries_the_same_utterances(tmp_path):
    """pack_shard / unpack_shard (and the CLI's pack / unpack): every field kept, the audio as
    long and about the same (Opus at ~32 kbit/s), the file several times smaller."""
    from speechrt_train.__main__ import main
    from speechrt_train.corpus import ASR_RATE, make_shard, pack_shard

    rng = np.random.default_rng(0)
    items = []
    for i, n in enumerate((8000, 12345, 20000)):
        t = np.arange(n) / ASR_RATE
        tone = 0.3 * np.sin(2 * np.pi * (220 + 110 * i) * t) * np.sin(np.pi * t / t[-1])
        tone += 0.01 * rng.standard_normal(n)
        text, audio = f"text {i}", (tone * 32767).astype(np.int16)
        items.append(
            {"key": f"k{i}", "text": text, "spoken": text, "heldout": i == 2, "codec": "",
             "audio": audio}
        )  # fmt: skip
    shard = make_shard("joe", items)
    torch.save(shard, tmp_path / "joe.pt")
    assert main(["pack", str(tmp_path / "joe.pt"), "--out", str(tmp_path / "packed.pt")]) == 0
    assert main(["unpack", str(tmp_path / "packed.pt"), "--out", str(tmp_path / "back.pt")]) == 0
    assert (tmp_path / "packed.pt").stat().st_size < (tmp_path / "joe.pt").stat().st_size / 4
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert set(back) == set(shard)
    for key in ("voice", "sample_rate", "keys", "texts", "spoken", "heldout", "codec"):
        assert back[key] == shard[key]
    assert torch.equal(back["audio_offsets"], shard["audio_offsets"])
    a, b = shard["audio"].float(), back["audio"].float()
    assert np.corrcoef(a.numpy(), b.numpy())[0, 1] > 0.95
    assert abs(20 * np.log10(b.pow(2).mean().sqrt() / a.pow(2).mean().sqrt())) < 1.0
    with pytest.raises(ValueError, match="not packed"):
        pack_shard(shard | {"ids": torch.zeros(1)})
    corpus = tmp_path / "corpus"  # unpacked into a corpus, the voice joins its manifest
    corpus.mkdir()
    (corpus / "manifest.json").write_text(json.dumps({"voices": {"slt": {"utterances": 5}}}))
    assert main(["unpack", str(tmp_path / "packed.pt"), "--out", str(corpus / "joe.pt")]) == 0
    voices = json.loads((corpus / "manifest.json").read_text())["voices"]
    assert voices["slt"] == {"utterances": 5}
    assert voices["joe"] == {
        "utterances": 3, "heldout": 1, "hours": round(40345 / ASR_RATE / 3600, 3),
        "made": "unpacked from packed.pt",
    }  # fmt: skip
    beside = tmp_path / "corpus-people"  # made beside the corpus, then joined to it
    beside.mkdir()
    torch.save(make_shard("ann", items[:2]), beside / "ann.pt")
    assert main(["join", str(beside / "ann.pt"), "--corpus", str(corpus)]) == 0
    assert not (beside / "ann.pt").exists() and (corpus / "ann.pt").exists()
    voices = json.loads((corpus / "manifest.json").read_text())["voices"]
    assert set(voices) == {"slt", "joe", "ann"}
    assert voices["ann"] == {
        "utterances": 2, "heldout": 0, "hours": round(20345 / ASR_RATE / 3600, 3),
        "made": "made beside the corpus, in corpus-people/",
    }  # fmt: skip
