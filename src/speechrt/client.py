"""Clients for a running `speechrt serve`: `Client` (blocking) and `AsyncClient` (asyncio).

    from speechrt.client import Client
    with Client("http://127.0.0.1:8000") as c:
        wav = c.synthesize("Hello world.")                # bytes of a WAV file
        audio, sr = c.synthesize_array("Hello world.")    # float32 (N,), sampling rate
        c.transcribe("speech.wav")["text"]
        for event in c.transcribe_stream("speech.wav"):   # TranscriptEvent: delta..., done
            print(event.kind, event.text)

They speak the server's OpenAI audio API (/v1) and health routes; any failure is a SpeechRTError
(`ServerError` with the HTTP status and the server's message for error responses).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from speechrt.errors import ServerError, SpeechRTError
from speechrt.realtime_client import TranscriptEvent, realtime_events, sse_events

DEFAULT_URL = "http://127.0.0.1:8000"
# keyword arguments of synthesize*: the /v1/audio/speech fields besides input and response_format
SPEECH_FIELDS = {
    "model",
    "voice",
    "speed",
    "seed",
    "pitch_shift",
    "pitch_scale",
    "pitch_flatten",
    "denoise",
}
Audio = bytes | str | Path | np.ndarray
__all__ = [
    "AsyncClient",
    "Client",
    "ServerError",
    "TranscriptEvent",
    "parse_metrics",
    "synthesize_files",
    "transcribe_files",
]


def _raise_for(resp: httpx.Response) -> None:
    if resp.is_success:
        return
    try:
        err = resp.json().get("error")
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except Exception:
        message = resp.text[:200] or resp.reason_phrase
    raise ServerError(resp.status_code, message)


def _speech_body(text: str, fmt: str, kw: dict[str, Any]) -> dict[str, Any]:
    """kw: model, voice, speed, seed and the other SynthesisOptions (pitch_shift, ...)."""
    unknown = set(kw) - SPEECH_FIELDS
    if unknown:
        raise TypeError(f"unknown synthesis arguments: {', '.join(sorted(unknown))}")
    return {"model": "tts", "voice": "0", **kw, "input": text, "response_format": fmt}


def _pcm_to_array(resp: httpx.Response, data: bytes) -> tuple[np.ndarray, int]:
    audio = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0
    return audio, int(resp.headers["x-sample-rate"])


def _upload(audio: Audio, sampling_rate: int | None) -> tuple[str, bytes]:
    """(file name, bytes) for the multipart upload."""
    if isinstance(audio, np.ndarray):
        if sampling_rate is None:
            raise SpeechRTError("transcribing an array needs its sampling_rate")
        from speechrt.audio.io import encode_audio

        return "audio.wav", encode_audio(audio.astype(np.float32), sampling_rate, "wav")
    if isinstance(audio, bytes):
        return "audio", audio
    path = Path(audio)
    try:
        return path.name, path.read_bytes()
    except OSError as e:
        raise SpeechRTError(f"cannot read {path}: {e.strerror or e}") from None


def _transcription_form(model: str, fmt: str, granularities: list[str] | None) -> dict[str, Any]:
    form: dict[str, Any] = {"model": model, "response_format": fmt}
    if granularities:
        form["timestamp_granularities[]"] = list(granularities)
    return form


def _transcription(resp: httpx.Response, fmt: str) -> dict[str, Any]:
    return resp.json() if fmt in ("json", "verbose_json") else {"text": resp.text}


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _unreachable(url: str, e: Exception) -> SpeechRTError:
    return SpeechRTError(f"cannot reach the server at {url}: {e}")


class Client:
    """Blocking client; use as a context manager or call close()."""

    def __init__(self, url: str = DEFAULT_URL, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise _unreachable(self.url, e) from None
        _raise_for(resp)
        return resp

    def synthesize(self, text: str, response_format: str = "wav", **kw: Any) -> bytes:
        """Text -> the bytes of a wav / flac file or of raw 16-bit pcm at the voice's rate.

        kw: model ("tts"), voice ("0" = speaker 0), speed (1.0), seed (0), pitch_shift,
        pitch_scale, pitch_flatten, denoise.
        """
        body = _speech_body(text, response_format, kw)
        return self._request("POST", "/v1/audio/speech", json=body).content

    def synthesize_array(self, text: str, **kw: Any) -> tuple[np.ndarray, int]:
        """Text -> float32 audio (N,) in [-1, 1] and its sampling rate."""
        body = _speech_body(text, "pcm", kw)
        resp = self._request("POST", "/v1/audio/speech", json=body)
        return _pcm_to_array(resp, resp.content)

    def stream(self, text: str, response_format: str = "pcm", **kw: Any) -> Iterator[bytes]:
        """Audio bytes as the server sends them: the first sentence's first ~0.4 s, then the
        rest sentence by sentence (wav: a header of unknown length, then PCM)."""
        body = _speech_body(text, response_format, kw)
        body["stream_format"] = "audio"
        try:
            with self._http.stream("POST", "/v1/audio/speech", json=body) as resp:
                if not resp.is_success:
                    resp.read()
                    _raise_for(resp)
                yield from resp.iter_bytes()
        except httpx.HTTPError as e:
            raise _unreachable(self.url, e) from None

    def transcribe(
        self,
        audio: Audio,
        sampling_rate: int | None = None,
        model: str = "asr",
        response_format: str = "json",
        timestamp_granularities: list[str] | None = None,
    ) -> dict[str, Any]:
        """A file path, encoded bytes or a float array (with its rate) -> {"text": ...} etc."""
        files = {"file": _upload(audio, sampling_rate)}
        form = _transcription_form(model, response_format, timestamp_granularities)
        resp = self._request("POST", "/v1/audio/transcriptions", data=form, files=files)
        return _transcription(resp, response_format)

    def transcribe_stream(
        self, audio: Audio, sampling_rate: int | None = None, model: str = "asr"
    ) -> Iterator[TranscriptEvent]:
        """stream=true: the file at once; TranscriptEvent("delta", new text) as the server's
        streaming recogniser finds words, then TranscriptEvent("done", the offline text)."""
        files = {"file": _upload(audio, sampling_rate)}
        form = {**_transcription_form(model, "json", None), "stream": "true"}
        try:
            with self._http.stream(
                "POST", "/v1/audio/transcriptions", data=form, files=files
            ) as resp:
                if not resp.is_success:
                    resp.read()
                    _raise_for(resp)
                yield from sse_events(resp.iter_lines())
        except httpx.HTTPError as e:
            raise _unreachable(self.url, e) from None

    def transcribe_realtime(
        self,
        chunks: Iterable[np.ndarray],
        sampling_rate: int,
        model: str = "asr",
        realtime: bool = False,
    ) -> Iterator[TranscriptEvent]:
        """Audio chunks (float32 at `sampling_rate`, e.g. a microphone's) over the realtime
        WebSocket; deltas while they are sent, then "done" with the final text."""
        return realtime_events(self.url, chunks, sampling_rate, model, realtime)

    def health(self) -> bool:
        """True when the server is up and ready to serve."""
        try:
            return self._http.get("/v2/health/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def models(self) -> list[str]:
        return [m["id"] for m in self._request("GET", "/v1/models").json()["data"]]

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self._request("GET", "/metrics").text)


class AsyncClient:
    """The same calls as `Client`, awaitable; use `async with` or await aclose()."""

    def __init__(self, url: str = DEFAULT_URL, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            resp = await self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise _unreachable(self.url, e) from None
        _raise_for(resp)
        return resp

    async def synthesize(self, text: str, response_format: str = "wav", **kw: Any) -> bytes:
        body = _speech_body(text, response_format, kw)
        return (await self._request("POST", "/v1/audio/speech", json=body)).content

    async def synthesize_array(self, text: str, **kw: Any) -> tuple[np.ndarray, int]:
        body = _speech_body(text, "pcm", kw)
        resp = await self._request("POST", "/v1/audio/speech", json=body)
        return _pcm_to_array(resp, resp.content)

    async def stream(
        self, text: str, response_format: str = "pcm", **kw: Any
    ) -> AsyncIterator[bytes]:
        body = _speech_body(text, response_format, kw)
        body["stream_format"] = "audio"
        try:
            async with self._http.stream("POST", "/v1/audio/speech", json=body) as resp:
                if not resp.is_success:
                    await resp.aread()
                    _raise_for(resp)
                async for chunk in resp.aiter_bytes():
                    yield chunk
        except httpx.HTTPError as e:
            raise _unreachable(self.url, e) from None

    async def transcribe(
        self,
        audio: Audio,
        sampling_rate: int | None = None,
        model: str = "asr",
        response_format: str = "json",
        timestamp_granularities: list[str] | None = None,
    ) -> dict[str, Any]:
        files = {"file": _upload(audio, sampling_rate)}
        form = _transcription_form(model, response_format, timestamp_granularities)
        resp = await self._request("POST", "/v1/audio/transcriptions", data=form, files=files)
        return _transcription(resp, response_format)

    async def health(self) -> bool:
        try:
            return (await self._http.get("/v2/health/ready")).status_code == 200
        except httpx.HTTPError:
            return False

    async def models(self) -> list[str]:
        return [m["id"] for m in (await self._request("GET", "/v1/models")).json()["data"]]

    async def metrics(self) -> dict[str, float]:
        return parse_metrics((await self._request("GET", "/metrics")).text)


def synthesize_files(
    url: str,
    texts: list[str],
    paths: list[Path],
    fmt: str | None,
    options: Any,
    concurrency: int = 8,
) -> None:
    """`speechrt synthesize --url`: text i -> file paths[i] through the server, `concurrency`
    requests at a time (so the server can batch them). Text i uses seed options.seed + i, as the
    local pipeline does; the format comes from `fmt` or each path's suffix."""
    import asyncio

    from speechrt.audio.codecs import FORMATS

    def format_of(path: Path) -> str:
        suffix = path.suffix.lower().lstrip(".")
        f = fmt or {"raw": "pcm"}.get(suffix, suffix) or "wav"
        if f not in FORMATS:
            raise SpeechRTError(f"unknown audio format {f!r}; choose one of {', '.join(FORMATS)}")
        return f

    formats = [format_of(p) for p in paths]
    kw = {
        "speed": options.pace,
        "voice": str(options.speaker),
        "pitch_shift": options.pitch_shift,
        "pitch_scale": options.pitch_scale,
        "pitch_flatten": options.pitch_flatten,
        "denoise": options.denoise,
    }

    async def main() -> None:
        gate = asyncio.Semaphore(max(1, concurrency))
        async with AsyncClient(url) as client:

            async def one(i: int) -> None:
                async with gate:
                    data = await client.synthesize(
                        texts[i], formats[i], seed=options.seed + i, **kw
                    )
                try:
                    paths[i].write_bytes(data)
                except OSError as e:
                    raise SpeechRTError(f"cannot write {paths[i]}: {e.strerror or e}") from None

            await asyncio.gather(*(one(i) for i in range(len(texts))))

    asyncio.run(main())


def transcribe_files(url: str, paths: list[str], as_json: bool, concurrency: int = 8) -> int:
    """`speechrt transcribe --url`: print `FILE<TAB>text` (or JSON lines: file, text, words,
    duration) per file, in order, `concurrency` requests at a time. A file that cannot be read or
    that the server refuses (4xx) gets an error line on stderr; the exit status is then 2."""
    import asyncio
    import json
    import sys

    fmt = "verbose_json" if as_json else "json"
    grains = ["word"] if as_json else None

    async def main() -> list[dict[str, Any] | SpeechRTError]:
        gate = asyncio.Semaphore(max(1, concurrency))
        async with AsyncClient(url) as client:

            async def one(path: str) -> dict[str, Any] | SpeechRTError:
                try:
                    data = _upload(path, None)[1]
                    async with gate:
                        return await client.transcribe(data, None, "asr", fmt, grains)
                except ServerError as e:
                    if e.status >= 500:
                        raise
                    return SpeechRTError(f"{path}: {e}")
                except SpeechRTError as e:
                    if not Path(path).is_file():
                        return e
                    raise

            return list(await asyncio.gather(*(one(p) for p in paths)))

    failed = 0
    for path, result in zip(paths, asyncio.run(main()), strict=True):
        if isinstance(result, SpeechRTError):
            print(f"speechrt transcribe: error: {result}", file=sys.stderr)
            failed += 1
        elif as_json:
            keep = {k: result[k] for k in ("text", "words", "duration") if k in result}
            print(json.dumps({"file": path, **keep}, ensure_ascii=False), flush=True)
        else:
            print(f"{path}\t{result['text']}", flush=True)
    return 2 if failed else 0
