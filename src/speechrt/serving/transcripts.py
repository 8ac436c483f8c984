"""A Transcript in the OpenAI transcription response formats: json, text, verbose_json, srt, vtt.

Segments are runs of words split at pauses longer than SEGMENT_GAP_S or when a segment would
exceed SEGMENT_MAX_S, so subtitles stay readable.
"""

from __future__ import annotations

from typing import TypedDict

from speechrt.asr.decoding import Transcript
from speechrt.captions import timestamp

SEGMENT_GAP_S = 0.8  # a longer silence between two words starts a new segment
SEGMENT_MAX_S = 10.0  # the longest a segment may run
FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
GRANULARITIES = ("word", "segment")


class WordJson(TypedDict):
    word: str
    start: float  # seconds
    end: float


class SegmentJson(TypedDict):
    """OpenAI's verbose_json segment; the fields a CTC model has no value for are zero."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


def words_of(transcript: Transcript) -> list[WordJson]:
    """[{"word", "start", "end"}] with times in seconds, rounded to milliseconds."""
    return [
        {"word": w.word, "start": round(float(w.start), 3), "end": round(float(w.end), 3)}
        for w in transcript.words
    ]


def segments_of(transcript: Transcript) -> list[SegmentJson]:
    words = words_of(transcript)
    groups: list[list[WordJson]] = []
    for w in words:
        if (
            groups
            and w["start"] - groups[-1][-1]["end"] <= SEGMENT_GAP_S
            and w["end"] - groups[-1][0]["start"] <= SEGMENT_MAX_S
        ):
            groups[-1].append(w)
        else:
            groups.append([w])
    if not groups and transcript.text.strip():  # text without word times: one segment
        spans = [(0.0, float(transcript.duration), transcript.text.strip())]
    else:
        spans = [(g[0]["start"], g[-1]["end"], " ".join(w["word"] for w in g)) for g in groups]
    return [
        {
            "id": i,
            "seek": 0,
            "start": start,
            "end": end,
            "text": text,
            "tokens": [],
            "temperature": 0.0,
            "avg_logprob": 0.0,
            "compression_ratio": 0.0,
            "no_speech_prob": 0.0,
        }
        for i, (start, end, text) in enumerate(spans)
    ]


def verbose_json(transcript: Transcript, granularities: list[str]) -> dict[str, object]:
    out: dict[str, object] = {
        "task": "transcribe",
        "language": "english",
        "duration": round(float(transcript.duration), 3),
        "text": transcript.text,
    }
    if "segment" in granularities or not granularities:
        out["segments"] = segments_of(transcript)
    if "word" in granularities:
        out["words"] = words_of(transcript)
    return out


def srt(transcript: Transcript) -> str:
    blocks = [
        f"{i + 1}\n{timestamp(s['start'], ',')} --> {timestamp(s['end'], ',')}\n{s['text']}\n"
        for i, s in enumerate(segments_of(transcript))
    ]
    return "\n".join(blocks)


def vtt(transcript: Transcript) -> str:
    blocks = [
        f"{timestamp(s['start'], '.')} --> {timestamp(s['end'], '.')}\n{s['text']}\n"
        for s in segments_of(transcript)
    ]
    return "WEBVTT\n\n" + "\n".join(blocks)
