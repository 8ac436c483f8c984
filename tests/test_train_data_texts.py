"""speechrt_train's data side without any synthesizer: texts, alignment, pitch and transcript
targets, and batching."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from speechrt_train.align import AlignError, align, make_processor, tokenize, tp_plain
from speechrt_train.asr_data import fft_resample, label_ids, transcript
from speechrt_train.features import average_per_symbol, normalize_pitch, yin
from speechrt_train.loop import Batches
from speechrt_train.teachers import Segment, parse_festival_dump, scheme_string
from speechrt_train.texts import acceptable, entries, entry_text, is_heldout, sentences_of, split

FPS = 22050 / 256

FORTUNE = """A lifetime isn't nearly long enough to figure out what it's all about.
%
A fake fortuneteller can be tolerated.  But an authentic soothsayer should
be shot on sight.
		-- R. A. Heinlein
%
(1) Avoid fried meats which angry up the blood.
(2) if this line is lower case.
%
while (x < 3) { y++; }
%
"""


def test_fortune_entries_and_filters():
    blocks = list(entries(FORTUNE))
    assert len(blocks) == 4
    assert entry_text(blocks[1]).endswith("be shot on sight.")  # attribution dropped
    assert entry_text(blocks[2]).startswith("Avoid fried meats")  # numbering dropped
    texts = [s.text for s in sentences_of([FORTUNE, FORTUNE])]  # duplicates merged
    assert "A fake fortuneteller can be tolerated." in texts
    assert "But an authentic soothsayer should be shot on sight." in texts
    assert not any("{" in t or "Heinlein" in t for t in texts)
    assert len(texts) == len(set(texts))
    assert not acceptable("WARNING: THIS IS LOUD.")  # shouting
    assert not acceptable("Go to http://x.org now.")
    assert not acceptable("Too short.")


def test_heldout_split_is_a_function_of_the_text():
    sentences = sentences_of([FORTUNE])
    train, heldout = split(sentences)
    assert sorted(s.text for s in train + heldout) == sorted(s.text for s in sentences)
    assert all(is_heldout(s.text) for s in heldout) and not any(s.heldout for s in train)
    many = [f"Sentence number {i} is here." for i in range(2000)]
    share = sum(map(is_heldout, many)) / len(many)
    assert 0.015 < share < 0.05  # ~3 %


def test_scheme_string_and_dump_parsing():
    assert scheme_string('say "hi" \\ now') == '"say \\"hi\\" \\\\ now"'
    words, segs = parse_festival_dump("W _1 hello\nS pau 0.1 0\nS hh 0.2 _1\n")
    assert words == [("_1", "hello")]
    assert segs == [Segment("pau", 0.1, "0"), Segment("hh", 0.2, "_1")]


def _festival(words: list[tuple[str, list[str]]], step: float = 0.05, pauses=None):
    """Fake festival output: each phone lasts `step` s; pauses (after word k: seconds)."""
    pauses = pauses or {}
    out_words, segs, t = [], [Segment("pau", 0.2, "0")], 0.2
    for k, (name, phones) in enumerate(words):
        wid = f"_{k + 1}"
        out_words.append((wid, name))
        for p in phones:
            t += step
            segs.append(Segment(p, t, wid))
        if k in pauses:
            t += pauses[k]
            segs.append(Segment("pau", t, "0"))
    segs.append(Segment("pau", t + 0.5, "0"))
    return out_words, segs


def test_align_exact_durations_pauses_and_ids():
    tp = make_processor()
    sentence = "The cat sat, dog."
    tokens = tokenize(tp_plain(tp).normalize(sentence), tp)
    fest = [(t.text, ["x"] * len(t.ids)) for t in tokens if t.is_word]
    words, segs = _festival(fest, pauses={2: 0.3})
    a = align(sentence, tp, words, segs, FPS)
    assert a.ids == tp.text_to_ids(sentence)
    assert sum(a.durations) == a.frames and len(a.durations) == len(a.ids)
    assert a.start == pytest.approx(0.2)  # leading pause cut
    symbols = [tp.symbols[i] for i in a.ids]
    comma = symbols.index(",")
    # frame boundaries are rounded times, so a span may be one frame off its rounded length
    assert abs(a.durations[comma] - 0.3 * FPS) < 1  # the pause sits on the comma
    assert a.durations[comma + 1] == 0  # the space after it gets nothing
    assert abs(a.durations[-1] - 0.15 * FPS) < 1  # final "." keeps 0.15 s of the last pause
    cat = [i for i, s in enumerate(symbols) if s == "@K"]
    assert cat and a.durations[cat[0]] in (4, 5)  # one phone = 0.05 s = 4.3 frames


def test_align_spreads_phones_over_letters_and_rejects_mismatches():
    tp = make_processor()
    words, segs = _festival([("the", ["dh", "ax"]), ("end", ["eh", "n", "d"])])
    a = align("the end", tp, words, segs, FPS)
    the = a.durations[:3]  # "the" stays letters (several pronunciations): 2 phones over 3
    assert abs(sum(the) - 0.1 * FPS) < 1 and min(the) > 0
    words, segs = _festival([("the", ["dh", "ax"]), ("and", ["ae", "n", "d"]), ("x", ["k"])])
    with pytest.raises(AlignError):
        align("the end", tp, words, segs, FPS)


def test_yin_pitch_and_symbol_averages():
    sr = 22050
    t = torch.arange(sr) / sr
    for f0 in (90.0, 180.0, 320.0):
        x = sum(torch.sin(2 * math.pi * f0 * k * t) / k for k in range(1, 6)) * 0.3
        est = yin(x, sr, 256)[4:-4]
        assert est.shape[0] == sr // 256 + 1 - 8
        assert (est - f0).abs().max() < 0.005 * f0
    assert yin(torch.zeros(sr), sr, 256).abs().max() == 0  # silence is unvoiced
    values = torch.tensor([0.0, 2.0, 4.0, 0.0, 0.0, 6.0])
    means = average_per_symbol(values, torch.tensor([3, 2, 0, 1]))
    assert means.tolist() == [3.0, 0.0, 0.0, 6.0]
    assert normalize_pitch(torch.tensor([0.0, 200.0]), 100.0, 50.0).tolist() == [0.0, 2.0]


def test_transcripts_and_resampling():
    assert transcript("forty-two, o'clock!  Done.") == "forty two o'clock done"
    assert label_ids("ab 'c'd") == [1, 2, 0, 3, 27, 4]  # a quoting apostrophe is no label
    assert transcript("our motto is 'it hurts.' the boys'") == "our motto is it hurts the boys"
    sr_in, sr_out = 22050, 16000
    t = np.arange(sr_in) / sr_in
    x = torch.tensor(np.sin(2 * np.pi * 440 * t), dtype=torch.float32)
    y = fft_resample(x, sr_in, sr_out)
    assert y.shape[0] == sr_out
    ref = np.sin(2 * np.pi * 440 * np.arange(sr_out) / sr_out)
    assert np.abs(y.numpy()[100:-100] - ref[100:-100]).max() < 0.02


def test_batches_deterministic_bucketed_and_resumable():
    lengths = np.random.default_rng(0).integers(10, 100, 50)
    a = Batches(lengths, batch_size=4, seed=3, max_units=250)
    seen = [next(a) for _ in range(40)]  # crosses an epoch boundary
    first_epoch = [i for b in seen[: len(a._order)] for i in b]
    assert sorted(first_epoch) == list(range(50))
    assert all(len(b) <= 4 and len(b) * max(lengths[b]) <= max(250, max(lengths[b])) for b in seen)
    b = Batches(lengths, batch_size=4, seed=3, max_units=250)
    for _ in range(17):
        next(b)
    c = Batches(lengths, batch_size=4, seed=99, max_units=250)
    c.load_state_dict(b.state_dict())
    assert [next(c) for _ in range(23)] == seen[17:]


def test_packed_data_keeps_items_and_segments_match_slices():
    from speechrt.audio.mel import MelConfig
    from speechrt_train.tts_data import VoiceData, segment_batch

    cfg = MelConfig()
    frames = [20, 5, 33, 8]  # item 1 is shorter than the window: padded
    mels = [torch.randn(cfg.n_mels, t) for t in frames]
    audio = [torch.randn(t * cfg.hop_length) for t in frames]
    empty = [torch.zeros(0)] * len(frames)
    data = VoiceData(cfg, list("abcd"), list(audio), mels, empty, empty, empty, empty)
    index = [2, 1, 0, 3, 2]
    mel, wave = segment_batch(data, index, 8, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(data.audio, audio, strict=True))
    u = torch.rand(len(index), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    floor = float(torch.log(torch.tensor(cfg.log_clamp)))
    hop = cfg.hop_length
    for k, i in enumerate(index):
        room = max(frames[i] - 8, 0)
        s = min(int(u[k] * (room + 1)), room)
        n = min(8, frames[i] - s)
        assert torch.equal(mel[k, :, :n], mels[i][:, s : s + n])
        assert (mel[k, :, n:] == floor).all() and not wave[k, n * hop :].any()
        assert torch.equal(wave[k, : n * hop], audio[i][s * hop : (s + n) * hop])
