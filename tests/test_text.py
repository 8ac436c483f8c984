"""English text front end: expected values are what NVIDIA DeepLearningExamples' own code produces
(FastPitch common/text, Tacotron2 tacotron2/text), checked by running it on these inputs; the two
places where speechrt deliberately differs are marked DIFFERS."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest

from speechrt.errors import SpeechRTError
from speechrt.text import TextProcessor, clean_text, get_symbols, split_sentences
from speechrt.text.cmudict import CMUDict, heteronyms, load_dictionary, word_to_arpabet
from speechrt.text.numbers import number_words
from speechrt.text.sentences import split_ids

# A small dictionary in cmudict-0.7b format: one ambiguous word, one heteronym, one bad phone.
TINY_DICT = """;;; comment
HELLO  HH AH0 L OW1
HELLO(1)  HH EH0 L OW1
WORLD  W ER1 L D
LIVE  L IH1 V
CAT  K AE1 T
JOHN  JH AA1 N
DON'T  D OW1 N T
I  AY1
BAD  B AE1 D XX1
"""


@pytest.fixture(scope="module")
def tiny() -> CMUDict:
    return CMUDict.from_lines(TINY_DICT.splitlines())


@pytest.fixture(scope="module")
def fastpitch() -> TextProcessor:
    return TextProcessor()  # english_basic, english_cleaners_v2, p_arpabet 0


@pytest.fixture(scope="module")
def tacotron2() -> TextProcessor:
    return TextProcessor(cleaners="english_cleaners")


# (input, DLE FastPitch output: sequence_to_text(encode_text(input)), english_cleaners_v2)
FASTPITCH_CASES = [
    # numbers
    ("I have 42 apples.", "i have forty two apples."),
    ("1,000,000 people", "one million people"),
    ("123", "one hundred and twenty three"),
    ("It is 3.14 wide.", "it is three point fourteen wide."),
    ("the 1920s and the 80's", "the nineteen twenties and the eighties"),
    ("1100 people", "eleven hundred people"),
    ("2021's best", "twenty twenty one's best"),
    ("World War II", "world war two"),
    ("Louis XIV", "louis fourteen"),
    ("Mix VI I", "mix v.i. i"),  # only II/III/IV/IX endings are Roman numerals
    # ordinals
    ("the 21st century", "the twenty-first century"),
    # years read as pairs
    ("in 1984", "in nineteen eighty four"),
    ("in 1905", "in nineteen oh five"),
    ("in 2005", "in two thousand five"),
    ("in 2000", "in two thousand"),
    # currency
    ("$1", "one dollar"),
    ("$0.01", "one cent"),
    ("$3.5", "three dollars, five cents"),
    ("$1,200", "twelve hundred dollars"),
    ("$5 million", "five million dollars"),
    ("$2.5B", "two point five billion dollars"),
    ("£10", "ten pounds"),
    ("€1.50", "one euro, fifty cents"),
    # times
    ("at 7 PM", "at seven p.m."),
    ("9:00pm", "nine p.m."),
    ("10:05am", "ten five a.m."),
    ("10:30 am", "ten:thirty am"),  # each whitespace-free run is cleaned alone
    # units, dimensions, letters with digits
    ("16GB", "sixteen gigabytes"),
    ("3.5GHz", "three point five gigahertz"),
    ("2x3m", "two by three meter"),
    ("A100", "a one hundred"),
    ("mp3", "mp three"),
    # abbreviations
    ("Dr. Smith", "doctor smith"),
    ("Mrs. and Mr. Jones", "misess and mister jones"),
    ("St. Louis", "saint louis"),
    ("Sen. Jones etc.", "senator jones et cetera"),
    ("50% off", "fifty percent off"),
    ("R&D", "r and d"),
    ("x.com", "x dot com"),
    ("No. 5 and No.5", "no. five and no.five"),
    # acronyms
    ("GPUs", "g.p.u.'s"),
    ("NVIDIA", "n.vidia"),
    ("I love the GPU.", "i love the g.p.u."),
    ("HELLO World", "h.e.l.l.o. world"),
    ("email me", "e-mail me"),
    # ASCII folding
    ("Café", "cafe"),
    ("naïve façade", "naive facade"),
    ("Señor Zoë", "senor zoe"),
    ("Müller", "mueller"),
    ("“quoted”", "quoted"),  # '"' is not in english_basic
    ("‘single’", "'single'"),
    ("a — b", "a b"),
    ("wait—what", "wait what"),  # DIFFERS: DLE drops the dash and gives "waitwhat"
    ("25°C", "twenty five c"),
    # case, whitespace, unknown symbols
    ("  lots   of\n\tspace  ", "lots of space"),
    ("a/b", "a b"),
    ("a*b", "ab"),
    ("snake_case", "snake_case"),  # a literal "_" is kept as id 0, as in DLE
    ("?!...", "?!..."),
    # ARPAbet spans
    ("{HH AH0 L OW1} world", "{HH AH0 L OW1} world"),
    ("say{HH AH0} now", "say now"),  # a brace must start a run to be read as ARPAbet
]


@pytest.mark.parametrize(("text", "expected"), FASTPITCH_CASES)
def test_fastpitch_matches_dle(fastpitch: TextProcessor, text: str, expected: str) -> None:
    assert fastpitch.decode(fastpitch.text_to_ids(text)) == expected


TACOTRON2_CASES = [
    (
        "It costs $3.50 on Jan. 5th, 2021 at 10:30am.",
        "it costs three dollars, fifty cents on jan. fifth, twenty twenty-one at ten:thirtyam.",
    ),
    ("Dr. Smith paid $1.", "doctor smith paid one dollar."),
    ("Turn left on {HH AW1 S T AH0 N} Street.", "turn left on {HH AW1 S T AH0 N} street."),
    ("123", "one hundred twenty-three"),
    ("Mr. X's 1,000,000 cats", "mister x's one million cats"),
    (
        "1984 and 2021 and 2000 and 2005 and 1100.",
        "nineteen eighty-four and twenty twenty-one and two thousand and two thousand five "
        "and eleven hundred.",
    ),
]


@pytest.mark.parametrize(("text", "expected"), TACOTRON2_CASES)
def test_tacotron2_matches_dle(tacotron2: TextProcessor, text: str, expected: str) -> None:
    assert tacotron2.frontend == "tacotron2"
    assert tacotron2.decode(tacotron2.text_to_ids(text)) == expected


def test_documented_example_and_ids(fastpitch: TextProcessor) -> None:
    text = "It costs $3.50 on Jan. 5th, 2021 at 10:30am."
    expected = (
        "it costs three dollars, fifty cents on jan. fifth, twenty twenty one at ten thirty a.m.."
    )
    assert fastpitch.normalize(text) == expected
    assert (
        clean_text("Jan. 5th, 2021 at 10:30am.")
        == "jan. fifth, twenty twenty one at ten thirty a.m.."
    )
    assert fastpitch.encode("hello world.") == [45, 42, 49, 49, 52, 11, 60, 52, 55, 49, 41, 7]
    assert fastpitch.encode("{HH AH0 L OW1}") == [106, 73, 117, 123]


def test_symbol_sets() -> None:
    basic = get_symbols("english_basic")
    assert len(basic) == 148
    assert basic[:12] == ["_", "-", "!", "'", "(", ")", ",", ".", ":", ";", "?", " "]
    assert basic[12] == "A" and basic[37] == "Z" and basic[38] == "a" and basic[63] == "z"
    assert basic[64] == "@AA" and basic[73] == "@AH0" and basic[147] == "@ZH"
    assert len(get_symbols("english_basic_lowercase")) == 123
    assert len(get_symbols("english_expanded")) == 175
    with pytest.raises(SpeechRTError, match="unknown symbol set"):
        get_symbols("klingon")


def test_lowercase_symbol_set() -> None:
    tp = TextProcessor("english_basic_lowercase")
    assert tp.encode('say "hi"') == [31, 13, 37, 12, 4, 20, 21, 4]


def test_underscore_and_tilde(fastpitch: TextProcessor, tacotron2: TextProcessor) -> None:
    assert fastpitch.text_to_ids("a_b") == [38, 0, 39]  # DLE FastPitch keeps "_" (pad id)
    assert tacotron2.text_to_ids("a_b~") == [38, 39]  # Tacotron2 drops "_" and "~"


def test_nothing_speakable(fastpitch: TextProcessor) -> None:
    assert fastpitch.text_to_ids("?!...") == [10, 2, 7, 7, 7]  # DLE's ids, kept
    assert not fastpitch.has_speech("?!...")
    assert fastpitch.has_speech("ok?")
    for text in ["", "   \n", "?!...", "—", "***"]:
        with pytest.raises(SpeechRTError):
            fastpitch.encode(text)
    with pytest.raises(SpeechRTError, match="empty"):
        fastpitch.encode(" ")
    with pytest.raises(SpeechRTError, match="string"):
        fastpitch.encode(42)  # type: ignore[arg-type]


def test_unreadable_numbers_do_not_crash(
    fastpitch: TextProcessor, tacotron2: TextProcessor
) -> None:
    # DLE raises on these (inflect range, "$,5" in Tacotron2); digits are read one by one instead
    assert fastpitch.normalize("9" * 40) == " ".join(["nine"] * 40)
    assert fastpitch.normalize("$1.2.3 million") == "one point two.three million dollars"
    assert tacotron2.normalize("$,5") == "five dollars"
    assert tacotron2.normalize("7" * 5000).startswith("seven seven")


def test_number_words_are_inflects() -> None:
    """speechrt's speller writes what DLE's (inflect's number_to_words) writes, for every form
    the number rules ask of it. inflect is a test dependency only (the `dev` extra)."""
    import random

    inflect = pytest.importorskip("inflect")
    engine, rng = inflect.engine(), random.Random(0)

    def same(value: int | str, **options: object) -> None:
        want = engine.number_to_words(value, **options)
        assert number_words(value, **options) == want, (value, options)  # type: ignore[arg-type]

    for n in [*range(3000), *rng.sample(range(3000, 10**7), 2000)]:
        same(n)
        same(n, andword="")
        same(f"{n}{rng.choice(['st', 'nd', 'rd', 'th'])}")
    for n in range(1000, 3000):  # years, in pairs
        same(n, andword="", zero="oh", group=2)
    for _ in range(2000):  # up to 36 digits (decillions), runs of zeros, leading zeros
        digits = "".join(rng.choice("0000123456789") for _ in range(rng.randint(1, 36)))
        fraction = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 5)))
        for value in (digits, int(digits), f"{digits}th", f"{digits}.{fraction}", f".{fraction}"):
            same(value)


def test_settings_and_meta() -> None:
    tp = TextProcessor.from_meta(
        {"text": {"symbol_set": "english_basic", "cleaners": ["english_cleaners"]}}
    )
    assert tp.frontend == "tacotron2" and tp.cleaners == ("english_cleaners",) and tp.p_arpabet == 0
    again = TextProcessor.from_meta(tp.to_meta())
    assert again.to_meta() == tp.to_meta()
    assert TextProcessor.from_meta({}).to_meta()["cleaners"] == ["english_cleaners_v2"]
    for bad in [
        {"cleaners": "english_cleaners_v3"},
        {"symbol_set": "greek"},
        {"p_arpabet": 1.5},
        {"cleaners": "english_cleaners", "p_arpabet": 1.0},
        {"frontend": "espeak"},
    ]:
        with pytest.raises(SpeechRTError):
            TextProcessor.from_meta(bad)


# --- ARPAbet / CMUdict --------------------------------------------------------------------------

ARPABET_CASES = [  # DLE with the same dictionary and p_arpabet = 1
    ("world", "{W ER1 L D}"),
    ("Hello world!", "hello {W ER1 L D}!"),  # two pronunciations: letters
    ("I live", "{AY1} live"),  # heteronym: letters even with one pronunciation
    ("cats", "{K AE1 T Z}"),  # stem + Z
    ("John's cat's", "{JH AA1 N Z} {K AE1 T Z}"),
    ("catss", "{K AE1 T Z Z}"),
    ("dogs", "dogs"),  # unknown
    ("don't", "{D OW1 N T}"),
    ("Cat.", "{K AE1 T}."),
    ("bad", "bad"),  # its only pronunciation has an invalid phone
    ("The CATs", "the c.a.t.'s"),
    ("{W ER1 L D} cat", "{W ER1 L D} {K AE1 T}"),
]


@pytest.mark.parametrize(("text", "expected"), ARPABET_CASES)
def test_arpabet_rules(tiny: CMUDict, text: str, expected: str) -> None:
    tp = TextProcessor(p_arpabet=1.0, dictionary=tiny)
    assert tp.normalize(text) == expected
    assert tp.decode(tp.encode(text)) == expected


def test_dictionary_parsing(tiny: CMUDict, tmp_path: Path) -> None:
    assert tiny.lookup("Hello") == ["HH AH0 L OW1", "HH EH0 L OW1"]
    assert tiny.lookup("bad") is None and tiny.lookup("nope") is None
    assert word_to_arpabet("worlds", tiny) == "W ER1 L D Z"
    assert len(heteronyms()) == 391 and {"read", "live", "record"} <= heteronyms()
    # cmudict.dict format (lower case, single spaces, "#" comments) parses the same
    modern = tmp_path / "cmudict.dict"
    modern.write_text("hello HH AH0 L OW1\nhello(2) HH EH0 L OW1 # alt\nworld W ER1 L D\n")
    assert load_dictionary(modern).entries == {
        "hello": ["HH AH0 L OW1", "HH EH0 L OW1"],
        "world": ["W ER1 L D"],
    }
    # pocketsphinx's dictionary has no stress digits: refused, with the fix in the message
    flat = tmp_path / "cmudict-en-us.dict"
    flat.write_text("hello HH AH L OW\nworld W ER L D\n")
    with pytest.raises(SpeechRTError, match="stress"):
        load_dictionary(flat)
    with pytest.raises(SpeechRTError, match="cannot read"):
        load_dictionary(tmp_path / "missing.dict")


def test_missing_dictionary_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPEECHRT_CMUDICT", str(tmp_path / "absent"))
    with pytest.raises(SpeechRTError, match="cannot read CMU dictionary"):
        TextProcessor(p_arpabet=1.0)


def test_partial_arpabet_is_deterministic(tiny: CMUDict) -> None:
    text = " ".join(["world cat"] * 20)
    a = TextProcessor(p_arpabet=0.5, dictionary=tiny, seed=1)
    assert a.normalize(text) == a.normalize(text)
    out = a.normalize(text)
    assert "{W ER1 L D}" in out and " world" in out  # some converted, some not
    assert TextProcessor(p_arpabet=0.5, dictionary=tiny, seed=2).normalize(text) != out


def test_real_cmudict() -> None:
    tp = TextProcessor(p_arpabet=1.0)
    assert tp.normalize("Hello world, the quick brown fox reads records.") == (
        "hello {W ER1 L D}, the {K W IH1 K} {B R AW1 N} {F AA1 K S} {R IY1 D Z} records."
    )


# --- sentence splitting -------------------------------------------------------------------------

SPLIT_CASES = [
    ("Hello there. How are you? Fine!", ["Hello there.", "How are you?", "Fine!"]),
    ("Dr. Smith came on Jan. 5th. He left.", ["Dr. Smith came on Jan. 5th.", "He left."]),
    ("J. R. R. Tolkien wrote; it sold.", ["J. R. R. Tolkien wrote;", "it sold."]),
    ("It costs $3.50 today. Yes.", ["It costs $3.50 today.", "Yes."]),
    ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
    ("line one\nline two\n\n", ["line one", "line two"]),
    ("Hello. ... World", ["Hello. ...", "World"]),
    ("?! Hi.", ["?! Hi."]),
    ("?!...", ["?!..."]),
    ("", []),
    ("  \n\t ", []),
]


@pytest.mark.parametrize(("text", "expected"), SPLIT_CASES)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_split_long_sentence() -> None:
    text = "one two three four, five six seven eight nine, ten eleven twelve thirteen"
    pieces = split_sentences(text, max_chars=30)
    assert pieces == [
        "one two three four,",
        "five six seven eight nine,",
        "ten eleven twelve thirteen",
    ]
    assert split_sentences("a" * 50, max_chars=20) == ["a" * 20, "a" * 20, "a" * 10]
    run_on = " ".join(["word"] * 124)  # 619 characters, no punctuation: three even pieces
    assert [len(p) for p in split_sentences(run_on, max_chars=300)] == [209, 204, 204]
    # punctuation cut off a full-length sentence has no room next to it: dropped
    assert split_sentences("a" * 20 + " !!!", max_chars=20) == ["a" * 20]
    assert split_sentences("ab cd, " + "e" * 16 + " !!", max_chars=20) == [
        "ab cd,",
        "e" * 16 + " !!",
    ]
    spans = split_sentences("{HH AH0 L OW1} " * 10, max_chars=20)
    assert all(p.count("{") == p.count("}") == 1 for p in spans)
    with pytest.raises(SpeechRTError):
        split_sentences("hi", max_chars=0)


def split_counting_lines(text: str) -> tuple[list[str], int]:
    """split_sentences(text, max_chars=120) and the lines of Python it ran: a count of its work
    that is the same on any CPU."""
    lines = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Callable[..., object]:
        nonlocal lines
        lines += event == "line"
        return tracer

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        pieces = split_sentences(text, max_chars=120)
    finally:
        sys.settrace(before)
    return pieces, lines


def test_split_100k_characters_linear() -> None:
    """Ten times the text costs ten times the work (lines run, ~150,000 here; counted, not
    timed): quadratic work would cost a hundred times."""
    words = ["alpha", "beta,", "gamma", "Dr.", "delta.", "epsilon?", "zeta", "eta;", "theta\n"]
    text = " ".join(words[i % len(words)] for i in range(17000))[:100_000]
    run_on = "word " * 20_000  # no sentence end at all
    for source in (text, run_on):
        pieces, lines = split_counting_lines(source)
        _, tenth = split_counting_lines(source[:10_000])
        assert lines <= 11 * tenth
        assert all(0 < len(p) <= 120 for p in pieces)
        assert " ".join(pieces) == " ".join(source.split())


def test_split_ids_cuts_at_spaces_into_even_pieces() -> None:
    word, space = [1, 2, 3, 4, 5, 6, 7, 8, 9], 0
    ids = ((word + [space]) * 100)[:-1]  # 999 ids, a space after every 9
    pieces = split_ids(ids, 300, space)
    assert [len(p) for p in pieces] == [249] * 4  # four even pieces, no short tail
    assert all(p[0] != space and p[-1] != space for p in pieces)
    assert [x for p in pieces for x in [*p, space]][:-1] == ids  # only the cut spaces dropped
    assert split_ids([5] * 7, 3, space) == [[5] * 3, [5] * 3, [5]]  # no space: cut inside
    assert split_ids([1, 0, 2], 3, space) == [[1, 0, 2]]  # short enough: untouched
    assert split_ids([], 3, space) == []
    with pytest.raises(SpeechRTError):
        split_ids([1], 0, space)


def test_split_ids_bounds_every_piece() -> None:
    import random

    rnd = random.Random(0)
    for _ in range(500):
        max_len = rnd.randint(1, 40)
        p_space = rnd.choice([0.0, 0.05, 0.3])
        ids = [
            0 if rnd.random() < p_space else rnd.randint(1, 9) for _ in range(rnd.randint(0, 300))
        ]
        pieces = split_ids(ids, max_len, 0)
        assert all(1 <= len(p) <= max_len for p in pieces)
        assert [x for p in pieces for x in p if x] == [x for x in ids if x]


def test_encode_pieces_bounds_what_normalisation_lengthens() -> None:
    tp = TextProcessor("english_basic", "english_cleaners_v2")
    digits = "1234567890" * 30  # 300 characters: one piece before normalisation
    assert len(tp.encode(digits)) > 1000
    pieces = tp.encode_pieces(digits, 200)
    assert all(len(p) <= 200 for p in pieces)
    words = [tp.decode(p) for p in pieces]
    assert " ".join(words) == tp.normalize(digits)  # cut between words, nothing lost
    assert tp.encode_pieces("Hello there.", 200) == [tp.encode("Hello there.")]


# --- import boundary ----------------------------------------------------------------------------


def test_text_imports_no_torch() -> None:
    code = (
        "import speechrt.text, sys; speechrt.text.TextProcessor().normalize('$3.50 on the 5th');"
        "assert not {'torch', 'inflect'} & set(sys.modules), 'imported torch or inflect'"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_lazy_lookups_equal_the_whole_parse_of_the_installed_dictionary() -> None:
    """Every word of cmudict.dict looked up through the line index gives what parsing the whole
    file gives (the same pronunciations in file order), and words outside it give None."""
    d = load_dictionary()
    everything = d.entries
    assert len(everything) > 100_000
    assert all(d.lookup(w) == prons for w, prons in everything.items())
    assert all(d.lookup(w) is None for w in d.first if w not in everything)
    assert d.lookup("READ") == d.lookup("read") == ["R EH1 D", "R IY1 D"]
    # alternates away from their word and lines the parser refuses still follow its rules
    odd = CMUDict.from_lines(
        ["b B IY1", "a AH0", "(2)a EY1", "b(2) B IH1 # x", "#a EY1", "a(3) EY1"]
    )
    assert odd.lookup("a") == ["AH0", "EY1"] and odd.lookup("b") == ["B IY1", "B IH1"]
    assert odd.entries == {"b": ["B IY1", "B IH1"], "a": ["AH0", "EY1"]}
