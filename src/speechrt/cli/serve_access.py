"""`speechrt serve`'s gRPC and access flags: --grpc-port, --api-key(-file), --rate-limit.

Keys come from --api-key (repeatable), the SPEECHRT_API_KEYS environment variable (comma
separated) and --api-key-file (one per line; blank lines and lines starting with # skipped), all
of them together. A key on the command line is visible to other users of the machine (ps): the
variable or the file keeps it out of sight.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from speechrt.errors import SpeechRTError

KEYS_VARIABLE = "SPEECHRT_API_KEYS"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gRPC and access (the `grpc` extra for gRPC; docs/protocols.md)")
    g.add_argument(
        "--grpc-port",
        type=int,
        metavar="PORT",
        help="also serve Riva's speech services (RivaSpeechRecognition, RivaSpeechSynthesis) and "
        "Triton's GRPCInferenceService over gRPC on --host:PORT, in the same process and with "
        "the same models, batchers and limits (default: no gRPC; 0: any free port)",
    )
    g.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="every request needs `Authorization: Bearer KEY` (gRPC: that metadata) except the "
        "health checks; repeatable; also from $SPEECHRT_API_KEYS (comma-separated) and "
        "--api-key-file",
    )
    g.add_argument("--api-key-file", metavar="PATH", help="API keys, one per line")
    g.add_argument(
        "--rate-limit",
        metavar="N/s",
        help="requests (HTTP requests, WebSocket sessions, gRPC calls) per second per API key; "
        "past it: HTTP 429 with Retry-After, gRPC RESOURCE_EXHAUSTED (default: no limit)",
    )


def api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    """The keys from the flags, the environment and the key file (SpeechRTError if unreadable
    or malformed; the message never shows a key)."""
    from speechrt.serving.auth import check_keys

    keys = list(args.api_key or [])
    keys += [k.strip() for k in os.environ.get(KEYS_VARIABLE, "").split(",") if k.strip()]
    if args.api_key_file is not None:
        try:
            lines = Path(args.api_key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise SpeechRTError(
                f"--api-key-file {args.api_key_file}: cannot read it ({e})"
            ) from None
        found = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not found:
            raise SpeechRTError(f"--api-key-file {args.api_key_file} holds no key")
        keys += found
    return check_keys(keys)


def rate_of(text: str) -> float:
    """'N/s' or 'N' -> N requests per second (positive)."""
    number = text.strip().removesuffix("/s")
    try:
        rate = float(number)
    except ValueError:
        raise SpeechRTError(f"--rate-limit {text!r}: give requests per second, e.g. 10/s") from None
    if not 0 < rate < float("inf"):
        raise SpeechRTError(f"--rate-limit must be positive, got {text!r}")
    return rate


def check_free(host: str, port: int) -> None:
    """A port another process listens on is one line now, not a traceback once the models are
    loaded (the gRPC server binds it again when it starts)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise SpeechRTError(f"--host {host}: {e.strerror or e}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: TIME_WAIT is no owner
        try:
            s.bind(address)
        except OSError as e:
            raise SpeechRTError(f"--grpc-port {port}: {e.strerror or e}") from None


def access_config(args: argparse.Namespace) -> dict[str, Any]:
    """ServeConfig's grpc_address, api_keys and rate_limit from the flags (checked). `args`
    keeps the keys read (--api-key, the file read once): a Ray replica, which reads the flags
    again on its own node, needs neither the file nor the variable there."""
    keys = api_keys(args)
    args.api_key, args.api_key_file = list(keys), None
    rate = rate_of(args.rate_limit) if args.rate_limit is not None else None
    if rate is not None and not keys:
        raise SpeechRTError("--rate-limit is per API key: give --api-key (or a key file)")
    address = None
    if args.grpc_port is not None:
        if not 0 <= args.grpc_port <= 65535:
            raise SpeechRTError(f"--grpc-port must be within 0-65535, got {args.grpc_port}")
        if getattr(args, "ray", False):
            raise SpeechRTError("--grpc-port is not served under --ray (Ray's proxy is HTTP)")
        try:
            import grpc  # noqa: F401
            import riva.client.proto  # noqa: F401
            import tritonclient.grpc  # noqa: F401
        except ImportError as e:
            raise SpeechRTError(
                f"--grpc-port needs the `grpc` extra: pip install 'speechrt[grpc]' ({e})"
            ) from None
        if args.grpc_port:
            check_free(args.host, args.grpc_port)
        host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address
        address = f"{host}:{args.grpc_port}"
    return {"grpc_address": address, "api_keys": keys, "rate_limit": rate}
