"""Benchmarks: in-process pipelines (`speechrt bench tts|asr`) and HTTP load (`--url`)."""
