"""speechrt_train's data side without any synthesizer: texts, alignment, targets, batching."""

from __future__ import annotations

import dataclasses
import json
import math
import threading

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


def _speech(n_items: int = 5, seed: int = 0):
    from speechrt_train.asr_data import SpeechData

    rng = np.random.default_rng(seed)
    audio = []
    for k in range(n_items):  # speech-like: a few harmonics with a slow envelope, 0.4-3 s
        n = int(rng.integers(6400, 48000))
        t = np.arange(n) / 16000
        f0 = 90 + 40 * k
        x = sum(np.sin(2 * np.pi * f0 * h * t) / h for h in range(1, 5))
        audio.append(torch.tensor(0.2 * x * np.sin(np.pi * t / t[-1]), dtype=torch.float32))
    targets = [torch.tensor(label_ids("ab c")) for _ in audio]
    return SpeechData(audio, ["ab c"] * n_items, targets, ["v"] * n_items)


def test_batched_speed_perturbation_equals_per_item_interpolate():
    from speechrt_train.asr_data import Augment, augment_audio_reference, augment_batch

    data = _speech()
    index = [3, 0, 4, 1]
    quiet = Augment(noise_prob=0.0)  # noise draws differ by design (one batched draw)
    ref = augment_audio_reference(
        [data.audio[i] for i in index], quiet, torch.Generator().manual_seed(7), None
    )
    audio, lengths = augment_batch(
        data, index, quiet, torch.Generator().manual_seed(7), torch.Generator()
    )
    assert lengths == [r.shape[0] for r in ref] and audio.shape[1] == max(lengths)
    assert len(set(lengths)) == 4 and lengths != [data.audio[i].shape[0] for i in index]
    for row, r, n in zip(audio, ref, lengths, strict=True):
        assert (row[:n] - r).abs().max() < 1e-5
        assert not row[n:].any()  # padding stays silent


def test_batched_noise_has_the_drawn_snr_on_the_noisy_items():
    from speechrt_train.asr_data import Augment, augment_batch

    data = _speech(8)
    index = list(range(8))
    aug = Augment(speed=(1.0, 1.0), gain_db=(0.0, 0.0), snr_db=(20.0, 20.0))
    clean, _ = augment_batch(data, index, dataclasses.replace(aug, noise_prob=0.0), None, None)
    noisy, lengths = augment_batch(
        data, index, aug, torch.Generator(), torch.Generator().manual_seed(1)
    )
    u = torch.rand(8, 4, generator=torch.Generator(), dtype=torch.float64)
    for k, n in enumerate(lengths):
        diff = noisy[k, :n] - clean[k, :n]
        if u[k, 2] < 0.5:  # drawn noisy: 20 dB below the item's power
            snr = 10 * torch.log10(clean[k, :n].square().mean() / diff.square().mean())
            assert abs(float(snr) - 20.0) < 0.5
        else:
            assert not diff.any()


def test_batched_features_equal_speechrt_batch_features():
    from speechrt.audio.features import FeatureConfig
    from speechrt.runtime.featurizer import batch_features
    from speechrt_train.asr_data import batched_features, padded_audio

    data = _speech()
    cfg = FeatureConfig()
    index = [2, 0, 4]
    audio, sizes = padded_audio(data, index)
    feats, lengths = batched_features(audio, sizes, cfg, None)
    ref, ref_lengths = batch_features([data.audio[i] for i in index], cfg)
    assert feats.shape == ref.shape and torch.equal(lengths, ref_lengths)
    assert (feats - ref).abs().max() < 1e-4


def test_spec_augment_on_the_device_equals_the_per_item_loop():
    from speechrt_train.asr_data import Augment, spec_augment, spec_augment_reference

    feats = torch.randn(6, 64, 200) + 3
    lengths = [200, 37, 150, 5, 120, 64]
    for seed in range(5):
        a = spec_augment(feats, lengths, Augment(), torch.Generator().manual_seed(seed))
        b = spec_augment_reference(feats, lengths, Augment(), torch.Generator().manual_seed(seed))
        assert torch.equal(a, b)
    masked = (a == 0).float().mean()
    assert 0.05 < masked < 0.6  # masks exist but leave most of the features


def _channel(aug, data, seed: int = 0):
    from speechrt_train.asr_data import padded_audio
    from speechrt_train.channels import channel_batch

    audio, sizes = padded_audio(data, list(range(len(data.audio))))
    g, g_noise = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    out, lengths = channel_batch(audio, sizes, aug, g, g_noise)
    return audio, sizes, out, lengths


def test_channel_silence_moves_the_speech_and_keeps_it():
    from speechrt_train.asr_data import Augment

    data = _speech(6)
    audio, sizes, out, lengths = _channel(Augment(pad_prob=1.0, pad_s=0.5), data)
    assert out.shape[1] == max(lengths) and all(n >= s for n, s in zip(lengths, sizes, strict=True))
    assert any(n > s for n, s in zip(lengths, sizes, strict=True))
    for row, x, n, s in zip(out, audio, lengths, sizes, strict=True):
        lead = max(range(n - s + 1), key=lambda k: float(row[k : k + s] @ x[:s]))
        assert (row[lead : lead + s] - x[:s]).abs().max() < 1e-4  # unchanged, moved
        silence = torch.cat([row[:lead], row[lead + s :]])  # before, after, past the length
        assert silence.abs().max() < 1e-4


def test_channel_telephone_band_and_mu_law():
    from speechrt_train.asr_data import Augment, SpeechData

    noise = torch.randn(3, 16000, generator=torch.Generator().manual_seed(0)) * 0.1
    data = SpeechData(list(noise), ["a"] * 3, [torch.tensor(label_ids("a"))] * 3, ["v"] * 3)
    _, _, out, lengths = _channel(Augment(phone_prob=1.0), data)
    assert lengths == [16000] * 3
    power = torch.fft.rfft(out).abs().square()  # bins of 1 Hz
    in_band = power[:, 500:3000].mean()
    assert power[:, 4500:].mean() < 1e-3 * in_band  # > 30 dB down above the band
    assert power[:, 20:120].mean() < 0.1 * in_band  # and below it
    from speechrt_train.asr_data import AUGMENTS, narrowband
    from speechrt_train.channels import _mu_law

    # the recogniser that trains on this band is told to hear 8 kHz sources through it
    assert narrowband(AUGMENTS["recordings"]) == "telephone"
    assert narrowband(AUGMENTS["synthetic"]) is None and narrowband(None) is None
    x = torch.linspace(-1, 1, 10001)
    coded = _mu_law(x)
    assert len(torch.unique(coded)) <= 256  # 8-bit codes
    assert ((coded - x).abs() <= 0.025 * x.abs() + 2e-4).all()  # log-spaced steps


def test_channel_room_spreads_energy_past_the_speech():
    from speechrt_train.asr_data import Augment

    data = _speech(4)
    dry = Augment(pad_prob=1.0, pad_s=0.5)
    wet = dataclasses.replace(dry, reverb_prob=1.0, rt60_s=(0.6, 0.6), drr_db=(0.0, 0.0))
    _, sizes, a, lengths = _channel(dry, data)
    _, _, b, lengths_b = _channel(wet, data)
    assert lengths == lengths_b
    for k, (s, n) in enumerate(zip(sizes, lengths, strict=True)):
        lead = max(range(n - s + 1), key=lambda j: float(a[k, j : j + s] @ data.audio[k]))
        after = slice(lead + s, min(lead + s + 1600, n))  # 0.1 s after the speech
        if after.stop - after.start < 800:
            continue
        assert a[k, after].square().mean() < 1e-8
        assert b[k, after].square().mean() > 1e-5  # the room's tail
        rms = [float(x[k, lead : lead + s].square().mean().sqrt()) for x in (a, b)]
        assert abs(rms[1] / rms[0] - 1) < 0.01  # the speech's RMS is kept


def test_channel_coloured_noise_at_the_drawn_snr():
    from speechrt_train.asr_data import Augment

    data = _speech(6)
    aug = Augment(colour_noise_prob=1.0, colour_snr_db=(15.0, 15.0))
    _, _, clean, _ = _channel(dataclasses.replace(aug, colour_noise_prob=0.0), data)
    _, _, noisy, lengths = _channel(aug, data)
    for k, n in enumerate(lengths):
        diff = noisy[k, :n] - clean[k, :n]
        snr = 10 * torch.log10(clean[k, :n].square().mean() / diff.square().mean())
        assert abs(float(snr) - 15.0) < 1.0


def test_vtlp_warp_moves_a_tone_and_one_is_the_identity():
    from speechrt.audio.features import FeatureConfig
    from speechrt_train.asr_data import batched_features
    from speechrt_train.channels import vtlp_source_bins

    n = 257
    ident = vtlp_source_bins(torch.ones(1), n)
    assert torch.allclose(ident, torch.arange(n, dtype=torch.float32)[None])
    src = vtlp_source_bins(torch.tensor([0.9, 1.1]), n)
    assert src[:, 0].eq(0).all() and src[:, -1].eq(n - 1).all()  # DC and Nyquist stay
    assert (src[:, 1:] >= src[:, :-1]).all()  # monotonic
    cfg = FeatureConfig(dither=0.0)
    t = torch.arange(16000) / 16000
    tone = (0.3 * torch.sin(2 * torch.pi * 1000 * t))[None].repeat(2, 1)
    plain, _ = batched_features(tone, [16000] * 2, cfg, None)
    same, _ = batched_features(tone, [16000] * 2, cfg, None, torch.ones(2))
    assert (plain - same).abs().max() < 1e-4
    warped, _ = batched_features(tone, [16000] * 2, cfg, None, torch.tensor([0.9, 1.1]))
    peak = [int(f[:, 10:-10].mean(1).argmax()) for f in (plain[0], warped[0], warped[1])]
    assert peak[1] < peak[0] < peak[2]  # alpha < 1 moves it down, alpha > 1 up


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
