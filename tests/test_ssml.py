"""SSML (speechrt.text.ssml): each element read into the front end's text, breaks as exact
silence, prosody as per-piece options; bad markup refused with the problem named, through the
parser, the real server (HTTP 400) and the CLI (one line, exit 2)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from speechrt.cli import main
from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions
from speechrt.text.ssml import Segment, is_ssml, parse
from speechrt.tts import PAUSE_SECONDS, TTS

DATE = '<speak>On <say-as interpret-as="date">{}</say-as>.</speak>'


def texts(ssml: str) -> list[str]:
    return [s.text for s in parse(ssml).segments]


@pytest.fixture(scope="module")
def voice() -> TTS:
    return TTS(backend="onnx")  # the bundled voice: its front end reads ARPAbet


def seconds(tts: TTS, text: str, **options: float) -> float:
    (audio,) = tts.synthesize([text], SynthesisOptions(**options))  # type: ignore[arg-type]
    return len(audio) / tts.sampling_rate


# -- the parser, element by element --------------------------------------------------------------


def test_only_text_starting_with_speak_or_an_xml_declaration_is_ssml():
    assert is_ssml("  <speak>Hi.</speak>") and not is_ssml("Say <speak> aloud.")
    assert not is_ssml("<speaker>Hi.</speaker>") and not is_ssml("xml <?xml version='1.0'?>")
    declared = '<?xml version="1.0" encoding="UTF-8"?>\n<speak>Hello   there.</speak>'
    assert is_ssml(declared) and parse(declared).segments == (Segment("Hello there."),)
    with pytest.raises(SpeechRTError, match="malformed SSML"):
        parse('<?xml version="1.0"?>Hello there.')  # a declaration, then no document
    assert parse("<speak version='1.1' xml:lang='en-US'\n>Hello   there.</speak>").segments == (
        Segment("Hello there."),
    )


def test_p_and_s_start_sentences_and_text_between_them_joins():
    segs = parse("<speak><p><s>One</s><s>two</s></p>three <p>four</p></speak>").segments
    assert [(s.text, s.sentence) for s in segs] == [
        ("One", True),  # (the first segment's flag is never used: nothing comes before it)
        ("two", True),
        ("three", True),
        ("four", True),
    ]


@pytest.mark.parametrize(
    ("attrs", "want"),
    [('time="500ms"', 0.5), ('time="1s"', 1.0), ('time="1.5s"', 1.5),
     ('strength="weak"', 0.25), ('strength="x-strong"', 1.0), ("", 0.5),
     ('time="250ms" strength="x-strong"', 0.25)],
)  # fmt: skip
def test_break_times_and_strengths(attrs, want):
    segs = parse(f"<speak>Before it <break {attrs}/> after it.</speak>").segments
    assert [(s.text, s.before, s.sentence) for s in segs] == [
        ("Before it", 0.0, False),
        ("after it.", want, False),  # the break cut the sentence
    ]


def test_breaks_at_the_ends_and_between_sentences():
    script = parse('<speak><break time="1s"/>One. <break time="2s"/>Two.<break time="3s"/></speak>')
    assert [(s.text, s.before, s.sentence) for s in script.segments] == [
        ("One.", 1.0, False),
        ("Two.", 2.0, True),  # after a sentence's end: the sentence pause stays
    ]
    assert script.after == 3.0


def test_prosody_rates_and_pitches_nest():
    ssml = (
        '<speak>a <prosody rate="slow" pitch="+20Hz">b <prosody rate="50%" pitch="low">c'
        '</prosody></prosody> <prosody rate="+25%" pitch="-15Hz">d</prosody>'
        '<prosody rate="1.5" pitch="x-high">e</prosody></speak>'
    )
    segs = parse(ssml).segments
    assert [(s.text, s.rate, s.pitch) for s in segs] == [
        ("a", 1.0, 0.0),
        ("b", 0.8, 20.0),
        ("c", pytest.approx(0.4), -10.0),
        ("d", 1.25, -15.0),
        ("e", 1.5, 60.0),
    ]


def test_phoneme_sub_and_say_as():
    assert texts(
        '<speak>A <phoneme alphabet="x-arpabet" ph="T AH0  M EY1 T OW2">tomato</phoneme>, '
        '<sub alias="World Wide Web">WWW</sub>.</speak>'
    ) == ["A {T AH0 M EY1 T OW2}, World Wide Web."]
    say = '<speak><say-as interpret-as="{}"{}>{}</say-as></speak>'
    cases = [
        ("characters", "", "AB-1", "{EY1} {B IY1} one"),
        ("cardinal", "", "1,234", "one thousand, two hundred and thirty-four"),
        ("cardinal", "", "-7", "minus seven"),
        ("ordinal", "", "22", "twenty-second"),
        ("ordinal", "", "11th", "eleventh"),
        ("date", "", "2024-01-05", "January fifth, twenty twenty four"),
        ("date", ' format="dmy"', "5/1/2024", "January fifth, twenty twenty four"),
        ("date", "", "12/25/1999", "December twenty-fifth, nineteen ninety nine"),
        ("telephone", "", "+1 555-0100", "plus one, five five five, zero one zero zero"),
    ]
    for kind, fmt, content, want in cases:
        assert texts(say.format(kind, fmt, content)) == [want], (kind, content)


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ssml", "problem"),
    [
        ("<speak>Hi <s>there</speak>", "malformed SSML: mismatched tag"),
        ("<speak>Hi &nbsp; there</speak>", "malformed SSML: undefined entity"),
        ("<speak>Hi</speak><speak>again</speak>", "malformed SSML: junk after document"),
        ("<speak>Hi <emphasis>there</emphasis></speak>", "unsupported SSML element <emphasis>"),
        ("<speak><audio src='x.wav'/></speak>", "unsupported SSML element <audio>"),
        ('<speak><prosody volume="loud">x</prosody></speak>', "unsupported attribute 'volume'"),
        ('<speak><break time="5 minutes"/>x</speak>', "<break time='5 minutes'>"),
        ('<speak><break time="11s"/>x</speak>', "at most 10 s per break"),
        ('<speak><break strength="huge"/>x</speak>', "<break strength='huge'>"),
        ('<speak><break time="1s">x</break></speak>', "<break> must be empty"),
        ('<speak><prosody rate="10">x</prosody></speak>', "<prosody rate='10'>"),
        ('<speak><prosody pitch="+10%">x</prosody></speak>', "<prosody pitch='+10%'>"),
        ('<speak><phoneme alphabet="ipa" ph="a">x</phoneme></speak>', "only alphabet="),
        ('<speak><phoneme alphabet="x-arpabet" ph="HH XX">x</phoneme></speak>', "'XX'"),
        ("<speak><sub>x</sub></speak>", "<sub> needs an alias"),
        ('<speak><say-as interpret-as="time">1:00</say-as></speak>', "interpret-as='time'"),
        ('<speak><say-as interpret-as="cardinal">many</say-as></speak>', "not a whole number"),
        ('<speak><say-as interpret-as="date">2024-02-30</say-as></speak>', "day is out of range"),
        (DATE.format("1/5/" + "9" * 20), "is not a date like 2024-01-05"),
        (DATE.format("1/5/" + "9" * 5000), "is not a date like 2024-01-05"),
        (DATE.format("99999999999999999999/5/2024"), "is not a date like 2024-01-05"),
        (DATE.format("123/5/2024"), "take at most two digits"),
        (DATE.format("1/5/２０２４"), "is not a date like 2024-01-05"),  # (full-width digits)
        ('<speak><say-as interpret-as="cardinal"><s>1</s></say-as></speak>', "only text"),
        ("<speak><speak>x</speak></speak>", "cannot be nested"),
        ("<speak>" + '<break time="9s"/>' * 7 + "x</speak>", "more than 60 s"),
    ],
)
def test_bad_markup_names_the_problem(ssml, problem):
    with pytest.raises(SpeechRTError, match=None) as e:
        parse(ssml)
    assert problem in str(e.value) and "\n" not in str(e.value)


def test_dtds_and_entities_are_refused_before_expanding():
    laughs = (
        '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY a "ha"><!ENTITY b "&a;&a;&a;">]>'
        "<speak>&b;</speak>"
    )
    for ssml in (laughs.split("?>", 1)[1], '<!DOCTYPE speak SYSTEM "file:///etc/passwd"><speak/>'):
        with pytest.raises(SpeechRTError, match="must not declare a DOCTYPE"):
            parse(ssml)


# -- through the pipeline ------------------------------------------------------------------------


def test_a_break_adds_exactly_its_time(voice):
    frame = voice.mel.hop_length / voice.sampling_rate
    plain = seconds(voice, "The first sentence. The second sentence.")
    with_break = seconds(
        voice, '<speak>The first sentence. <break time="500ms"/> The second sentence.</speak>'
    )
    assert abs(with_break - plain - 0.5) <= 2 * frame
    at_ends = seconds(
        voice, '<speak><break time="1s"/>The first sentence.<break time="250ms"/></speak>'
    )
    assert abs(at_ends - seconds(voice, "The first sentence.") - 1.25) <= 2 * frame


def test_plain_text_and_its_ssml_read_the_same(voice):
    text = "It costs $3.50 on Jan. 5th. Then it doesn't!"
    (a,) = voice.synthesize([text])
    (b,) = voice.synthesize([f"<speak>{text}</speak>"])
    assert a.shape == b.shape and np.array_equal(a, b)
    assert [p.ids for p in voice.text_to_pieces([text], [0])] == [
        p.ids for p in voice.text_to_pieces([f"<speak><s>{text}</s></speak>"], [0])
    ]


def test_phoneme_sub_and_say_as_read_as_their_text(voice):
    def ids(text: str) -> list[list[int]]:
        return [p.ids for p in voice.text_to_pieces([text], [0])]

    ph = '<speak>Say <phoneme alphabet="x-arpabet" ph="T AH0 M EY1 T OW2">x</phoneme>.</speak>'
    assert ids(ph) == ids("Say {T AH0 M EY1 T OW2}.")
    assert ids('<speak><sub alias="World Wide Web">WWW</sub></speak>') == ids("World Wide Web")
    assert ids('<speak>Call <say-as interpret-as="telephone">555-0100</say-as>.</speak>') == ids(
        "Call five five five, zero one zero zero."
    )


def test_prosody_reads_its_piece_at_its_rate_and_pitch(voice):
    slow = '<speak>Now <prosody rate="50%" pitch="+30Hz">this is slow</prosody>, not this.</speak>'
    pieces = voice.text_to_pieces([slow], [0])
    assert [(p.rate, p.pitch) for p in pieces] == [(1.0, 0.0), (0.5, 30.0), (1.0, 0.0)]
    opts = pieces[1].options(SynthesisOptions(pace=1.2, pitch_shift=10.0))
    assert (opts.pace, opts.pitch_shift) == (pytest.approx(0.6), 40.0)
    plain = "<speak>Now <prosody>this is slow</prosody>, not this.</speak>"  # the same cuts
    assert seconds(voice, slow) > seconds(voice, plain) + 0.5
    assert [p.before for p in pieces[1:]] == [0.0, 0.0]  # cut mid-sentence: no sentence pause
    assert voice.text_to_pieces(["One. Two."], [0])[1].silence(1000)[0].shape == (
        int(PAUSE_SECONDS * 1000),
    )


# -- through the server and the CLI --------------------------------------------------------------


def test_the_server_reads_ssml_and_refuses_bad_markup(speech_server):
    def speech(text: str, speed: float = 1.0) -> httpx.Response:
        body = {"model": "tts", "voice": "0", "input": text, "response_format": "pcm"}
        body["speed"] = speed
        return httpx.post(f"{speech_server}/v1/audio/speech", json=body, timeout=60)

    plain = speech("A sentence. Another one.")
    broken = speech('<speak>A sentence. <break time="500ms"/>Another one.</speak>')
    assert plain.status_code == broken.status_code == 200
    sr = int(plain.headers["x-sample-rate"])
    assert len(broken.content) - len(plain.content) == 2 * int(0.5 * sr)  # int16 samples
    bad = speech("<speak>Hello <emphasis>you</emphasis></speak>")
    assert bad.status_code == 400 and "<emphasis>" in bad.json()["error"]["message"]
    bad = speech("<speak>Hello <s>you</speak>")
    assert bad.status_code == 400 and "malformed SSML" in bad.json()["error"]["message"]
    for year in ("9" * 20, "9" * 1900):  # (this server takes 2,000 characters) once 500s
        bad = speech(DATE.format(f"1/5/{year}"))
        assert bad.status_code == 400 and "not a date" in bad.json()["error"]["message"]
    bad = speech(DATE.format("99999999999999999999/5/2024"))  # a huge month
    assert bad.status_code == 400 and "not a date" in bad.json()["error"]["message"]
    fast = '<speak><prosody rate="4">Quick.</prosody></speak>'
    assert speech(fast).status_code == 200
    too_fast = speech(fast, speed=4.0)  # pace 16: beyond what a voice reads
    assert too_fast.status_code == 400 and "pace" in too_fast.json()["error"]["message"]


def test_the_server_reads_an_xml_declared_document_as_ssml(speech_server):
    """The declaration is not read aloud: the captioned words are the document's only."""
    ssml = '<?xml version="1.0"?><speak>Hello <break time="200ms"/>there.</speak>'
    body = {"model": "tts", "voice": "0", "input": ssml, "response_format": "wav"}
    r = httpx.post(f"{speech_server}/v1/audio/speech/captioned", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert [w["word"] for w in r.json()["words"]] == ["hello", "there"]


def test_the_cli_reads_ssml_and_fails_in_one_line(tiny_voice, tmp_path, capsys):
    out = tmp_path / "out.wav"
    voice = ["--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1])]
    ssml = '<speak>Hi. <break time="1s"/>There.</speak>'
    assert main(["synthesize", ssml, "-o", str(out), *voice, "--device", "cpu"]) == 0
    assert main(["synthesize", "<speak>Hi <s>there</speak>", "-o", str(out), *voice]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("speechrt synthesize: error: malformed SSML: mismatched tag")
    assert "\n" not in err
    year = DATE.format("1/5/" + "9" * 20)  # a traceback once (OverflowError)
    assert main(["synthesize", year, "-o", str(out), *voice]) == 2
    err = capsys.readouterr().err
    assert err.startswith('speechrt synthesize: error: <say-as interpret-as="date">')
    assert err.count("\n") == 1 and "not a date like 2024-01-05" in err
