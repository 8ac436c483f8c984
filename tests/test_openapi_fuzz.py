"""Schemathesis against a real `speechrt serve` on the bundled default models: requests generated
from /openapi.json (valid and invalid: its coverage and fuzzing phases) never get a 5xx, and every
response has a status, content type, headers and body that the schema documents.

Bounded: deterministic generation, a few examples per operation (about 800 requests, seconds on
two cores), each request with a timeout; the component limits are small so that a generated tensor
that happens to be valid stays cheap. Schemathesis runs as its CLI (its pytest plugin does not
load under this pytest)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model

CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
]
EXAMPLES = 10  # per operation (18 operations), besides the coverage phase's cases

pytest.importorskip("schemathesis")
pytestmark = pytest.mark.skipif(
    default_model(VOICE_ACOUSTIC) is None or default_model(ASR_MODEL) is None,
    reason="needs the bundled default models",
)


def test_no_5xx_and_every_response_as_documented(start_server, tmp_path) -> None:
    url, proc = start_server(
        *("--device", "cpu", "--threads", "1", "--backend", "eager"),
        *("--max-upload-mb", "1", "--max-text-chars", "200", "--max-audio-seconds", "5"),
        *("--max-symbols", "64", "--max-component-seconds", "1", "--request-timeout", "30"),
    )
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json"]
    cmd += ["--checks", ",".join(CHECKS), "--max-examples", str(EXAMPLES)]
    cmd += ["--generation-deterministic", "--request-timeout", "60", "--no-color"]
    cmd += ["--phases", "coverage,fuzzing", "--report-dir", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failures" not in run.stdout, run.stdout[-3000:]
    assert proc.poll() is None and "Traceback" not in proc.log.read_text()
