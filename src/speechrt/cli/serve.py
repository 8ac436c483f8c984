"""`speechrt serve [--acoustic DIR --vocoder DIR] [--asr DIR]`: the HTTP server (no model
given: the bundled defaults, speechrt.defaults).

OpenAI audio API under /v1, KServe v2 (Triton) under /v2, Prometheus metrics at /metrics;
with --grpc-port, Riva's and Triton's gRPC services too (speechrt.cli.serve_access).
SIGTERM or Ctrl-C stops accepting connections, finishes what is in flight, then exits; requests
still running after --graceful-timeout seconds are answered 503 with Retry-After.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from speechrt.cli import serve_access
from speechrt.cli.flags import add_runtime_options
from speechrt.cli.transcribe import add_decoder_arguments, decoder_options
from speechrt.errors import SpeechRTError
from speechrt.limits import add_flags as add_limit_flags
from speechrt.limits import from_flags as limits_from_flags

if TYPE_CHECKING:
    import socket

    import uvicorn
    from fastapi import FastAPI

    from speechrt.serving import ServeConfig, Server


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 = any free)")
    p.add_argument(
        "--acoustic", help="acoustic model directory (FastPitch, ...; no model: the bundled ones)"
    )
    p.add_argument("--vocoder", help="vocoder model directory (HiFi-GAN, ...)")
    p.add_argument("--asr", help="speech recognition model directory (QuartzNet, Jasper)")
    add_runtime_options(p)
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads per operator of the eager and cuda backends (default: torch's choice; "
        "the onnx backend uses one per core)",
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="eager backend, CPU, fp32 only: every response is bitwise the same as the request "
        "sent alone, whatever it is batched with (oneDNN off, MKL strict reproducibility, "
        "per-item attention; about 2x slower HiFi-GAN on CPU). Without it, batched audio may "
        "differ from the same request alone by an int16 step in a few samples",
    )
    g = p.add_argument_group("batching")
    g.add_argument("--max-batch-size", type=int, default=8, help="items per batch (default: 8)")
    g.add_argument(
        "--max-queue-delay-ms",
        type=float,
        default=5.0,
        help="longest wait for batch-mates (default: 5)",
    )
    g.add_argument(
        "--max-queue-size", type=int, default=256, help="queued items before 503 (default: 256)"
    )
    g.add_argument(
        "--max-batch-ms",
        type=float,
        default=500.0,
        help="bound on a batch's predicted compute time (learnt from the batches run), so that "
        "no request holds the device for long; one item always runs alone whatever its time; "
        "0: no bound (default: 500)",
    )
    g.add_argument(
        "--pipeline-batches",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="speech: start the next batch while the last one's audio comes back to the host, "
        "so that a GPU has it queued (default: on; --no-pipeline-batches: one batch after the "
        "other)",
    )
    g.add_argument(
        "--switch-interval-ms",
        type=float,
        default=1.0,
        metavar="MS",
        help="how long a Python thread may hold the interpreter while another waits for it "
        "(sys.setswitchinterval; default: 1, Python's own: 5). The device thread gives it up "
        "at every torch call, and under load waits up to this long behind the HTTP thread "
        "(this process's server; --ray's replicas keep Python's)",
    )
    g.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="server processes sharing the port, each with its own models, batcher and device "
        "thread; on one GPU they take turns on it (Triton's instance_group count), so one's "
        "kernels can run while another's Python works. Not with --ray, --grpc-port or "
        "--wyoming-port (default: 1, this process)",
    )
    g = p.add_argument_group("limits")
    add_limit_flags(g)  # speechrt.limits.Limits: one flag per field that has one
    g.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a request's line and headers may take to arrive; a slower client's "
        "connection is closed (default: 10)",
    )
    g.add_argument(
        "--body-timeout",
        type=float,
        default=120.0,
        help="seconds a request's body may take to arrive after its headers; a slower "
        "client's connection is closed (default: 120: 25 MB at 1.7 Mbit/s)",
    )
    g.add_argument(
        "--graceful-timeout",
        type=int,
        default=30,
        help="seconds to finish in-flight requests on shutdown (default: 30)",
    )
    add_decoder_arguments(p)
    p.add_argument("--no-components", action="store_true", help="serve only the pipelines")
    p.add_argument(
        "--warmup",
        nargs="*",
        metavar="TEXT",
        help="before reporting ready, run every batch size once: TTS on each TEXT (default: a "
        "128-character sentence; texts of other lengths warm their length buckets too), ASR on "
        "7 s of audio; the cuda backend compiles its graphs then, not in the first requests",
    )
    p.add_argument(
        "--decode-workers",
        type=int,
        metavar="N",
        help="decode transcriptions (the beam search) in N processes, off the device thread "
        "and over N cores; 0: one decoding thread (default: on a GPU one per spare core, up to "
        "8; on a CPU 0)",
    )
    g = p.add_argument_group("other protocols (docs/streaming-protocols.md)")
    g.add_argument(
        "--wyoming-port",
        type=int,
        metavar="PORT",
        help="also serve Wyoming (Home Assistant's voice protocol; the `wyoming` extra) on this "
        "TCP port (default: off; 0 = any free)",
    )
    g.add_argument(
        "--wyoming-host",
        default="127.0.0.1",
        help="address Wyoming binds (default: 127.0.0.1; it has no authentication)",
    )
    add_ray_arguments(p)
    serve_access.add_arguments(p)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


RAY_FLAGS = (
    "replicas", "autoscale", "split_tts", "gpus_per_replica", "cpus_per_replica", "address"
)  # fmt: skip


def add_ray_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Ray Serve (the `ray` extra; docs/ray.md)")
    g.add_argument(
        "--ray",
        action="store_true",
        help="serve through Ray Serve: every replica runs this whole server behind Ray's HTTP "
        "proxy at --host:--port",
    )
    g.add_argument("--replicas", type=int, help="replicas of the server (default: 1)")
    g.add_argument(
        "--autoscale",
        metavar="MIN,MAX",
        help="let Ray scale the replicas between MIN and MAX by ongoing requests",
    )
    g.add_argument(
        "--split-tts",
        metavar="A,V",
        help="serve speech only, split: the text front end in the ingress, A replicas of the "
        "acoustic model and V of the vocoder, each batching on its own (POST /v1/audio/speech)",
    )
    g.add_argument("--gpus-per-replica", type=float, help="GPUs each replica reserves (default: 0)")
    g.add_argument("--cpus-per-replica", type=float, help="CPUs each replica reserves (default: 1)")
    g.add_argument(
        "--address",
        help="join this Ray cluster (e.g. auto, or HOST:6379) instead of starting a local one",
    )


def check_ray_flags(args: argparse.Namespace) -> None:
    """Ray's flags without --ray are a mistake, not something to ignore."""
    given = [f"--{n.replace('_', '-')}" for n in RAY_FLAGS if getattr(args, n) is not None]
    if given and not args.ray:
        raise SpeechRTError(f"{', '.join(given)} need --ray")


def log_to_stderr(level: str) -> None:
    """Show speechrt's own log lines (loaded backends, served models) as uvicorn shows its own."""
    import logging

    logger = logging.getLogger("speechrt")
    logger.setLevel(level.upper())
    if not any(getattr(h, "speechrt_serve", False) for h in logger.handlers):  # once a process
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        handler.speechrt_serve = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def warmup_texts(flag: list[str] | None) -> tuple[str, ...] | None:
    """--warmup's texts: None (no warm-up), the benchmark sentence (no TEXT given), or TEXTs."""
    if flag is None:
        return None
    if not flag:
        from speechrt.bench.inputs import TTS_TEXT

        return (TTS_TEXT,)
    if not all(t.strip() for t in flag):
        raise SpeechRTError("--warmup TEXT is empty")
    return tuple(flag)


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The flags' batching and limits, checked (SpeechRTError); with no model given, `args`
    gets the bundled defaults' directories. Loads nothing."""
    try:
        from speechrt.serving import BatchConfig, ServeConfig
    except ImportError as e:
        raise SpeechRTError(
            f"serving needs the `serve` extra: pip install 'speechrt[serve]' ({e})"
        ) from None
    limits = limits_from_flags(args)  # (checked: every limit is positive)
    for name in ("header_timeout", "body_timeout"):
        if getattr(args, name) <= 0:
            raise SpeechRTError(f"--{name.replace('_', '-')} must be positive")
    if args.threads is not None and args.threads < 1:
        raise SpeechRTError("--threads must be >= 1")
    if args.decode_workers is not None and args.decode_workers < 0:
        raise SpeechRTError("--decode-workers must be >= 0")
    config = ServeConfig(
        batch=BatchConfig(
            args.max_batch_size,
            args.max_queue_delay_ms,
            args.max_queue_size,
            max_batch_ms=args.max_batch_ms or None,
            pipeline=args.pipeline_batches,
        ),
        limits=limits,
        components=not args.no_components,
        decode_workers=args.decode_workers,
        warmup=warmup_texts(args.warmup),
        **serve_access.access_config(args),
    )
    if args.acoustic is None and args.vocoder is None and args.asr is None:
        from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, VOICE_VOCODER, default_model

        args.acoustic, args.vocoder = default_model(VOICE_ACOUSTIC), default_model(VOICE_VOCODER)
        args.asr = default_model(ASR_MODEL)
        if args.acoustic is None and args.asr is None:
            raise SpeechRTError("no model given and none bundled: pass --acoustic DIR "
                                "--vocoder DIR and/or --asr DIR")  # fmt: skip
    flags = (
        args.decoder
        or args.vad is not None
        or any(v is not None for k, v in decoder_options(args).items() if k != "decoder")
    )
    if args.asr is None and flags:
        raise SpeechRTError("decoding flags need a recogniser (--asr DIR)")
    return config


def load_server(args: argparse.Namespace) -> Server:
    """The Server the flags describe (models loaded, not started); SpeechRTError on bad flags.
    Also what each Ray replica calls (speechrt.serving.ray_app)."""
    from speechrt.serving import Server

    config = serve_config(args)
    server = Server.load(
        args.acoustic,
        args.vocoder,
        args.asr,
        device=args.device,
        precision=args.precision,
        backend=args.backend,
        config=config,
        batch_invariant=args.batch_invariant,  # checked against the resolved backend there
        decoding=decoder_options(args),
    )
    if args.threads is not None:  # after load: --batch-invariant must set MKL up first
        on_onnx = sorted(n for n, m in server.v2.items() if m.backend == "onnx")
        if on_onnx:
            raise SpeechRTError(
                f"--threads sets torch's thread pool, which {', '.join(on_onnx)} on the onnx "
                "backend do not use; leave it out, or serve with --backend eager"
            )
        import torch

        torch.set_num_threads(args.threads)  # the device thread's operators use this pool
    return server


def wyoming_socket(args: argparse.Namespace) -> socket.socket | None:
    """--wyoming-port's listening socket, or None; SpeechRTError on bad flags."""
    if args.wyoming_port is None:
        return None
    if args.ray:
        raise SpeechRTError("--wyoming-port is not served with --ray")
    if not 0 <= args.wyoming_port <= 65535:
        raise SpeechRTError("--wyoming-port must be in [0, 65535]")
    try:
        import speechrt.serving.wyoming_server  # noqa: F401  (served after the models load)
    except ImportError as e:
        raise SpeechRTError(
            f"--wyoming-port needs the `wyoming` extra: pip install 'speechrt[wyoming]' ({e})"
        ) from None
    from speechrt.cli.serve_workers import listen

    return listen(args.wyoming_host, args.wyoming_port, "--wyoming-port")


def switch_interval(args: argparse.Namespace) -> float:
    """--switch-interval-ms in seconds, or SpeechRTError. At 32 clients, FastPitch + HiFi-GAN
    on an H200 served 386 requests/s at 1 ms against 357 at Python's 5 ms (docs/bench-server.md)."""
    if not 0 < args.switch_interval_ms <= 1000:
        raise SpeechRTError(
            f"--switch-interval-ms must be in (0, 1000], got {args.switch_interval_ms:g}"
        )
    return float(args.switch_interval_ms) / 1000


def run(args: argparse.Namespace) -> int:
    from speechrt.cli.serve_workers import check_workers

    check_workers(args)
    if args.ray:
        wyoming_socket(args)  # refused with --ray
        import functools

        from speechrt.cli.serve_ray import run_ray  # imports ray: only on this path

        config = serve_config(args)  # bad flags fail here, not in every replica
        log_to_stderr(args.log_level)
        return run_ray(args, functools.partial(load_server, args), config.limits)
    check_ray_flags(args)
    sys.setswitchinterval(switch_interval(args))  # (each worker sets its own too)
    if args.workers > 1:
        from speechrt.cli.serve_workers import run_workers
        from speechrt.repo import read_info

        serve_config(args)  # bad flags and model folders fail here, once, not in every worker
        for folder in (args.acoustic, args.vocoder, args.asr):
            if folder is not None:
                read_info(folder)
        return run_workers(args, worker)
    listen = wyoming_socket(args)  # before the models load: a taken port fails at once
    server = load_server(args)
    import uvicorn

    from speechrt.serving import create_app

    listeners = []
    if listen is not None:
        from speechrt.serving.wyoming_server import WyomingListener

        listeners.append(WyomingListener(server, listen))
    log_to_stderr(args.log_level)  # after load: a failed start prints only its error line
    uvicorn.Server(uvicorn_config(args, create_app(server, listeners))).run()
    return 0


def worker(argv: list[str], sock: socket.socket, parent: int) -> None:
    """One process of `serve --workers N` (speechrt.cli.serve_workers): the flags parsed again,
    the models loaded, uvicorn on the listening socket the supervisor `parent` shares."""
    from speechrt.cli import build_parser
    from speechrt.cli.serve_workers import die_with

    die_with(parent)
    args = build_parser().parse_args(argv)
    args._argv = argv
    sys.setswitchinterval(switch_interval(args))
    try:
        server = load_server(args)
    except SpeechRTError as e:
        print(f"speechrt serve: error: {e}", file=sys.stderr)
        sys.exit(2)
    import uvicorn

    from speechrt.serving import create_app

    log_to_stderr(args.log_level)
    uvicorn.Server(uvicorn_config(args, create_app(server))).run(sockets=[sock])


def uvicorn_config(args: argparse.Namespace, app: FastAPI) -> uvicorn.Config:
    """uvicorn's configuration of `app` from the flags."""
    import uvicorn

    from speechrt.serving.protocol import guarded_protocol
    from speechrt.serving.realtime import MAX_MESSAGE_BYTES

    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.graceful_timeout,
        access_log=args.log_level == "debug",
        ws_max_size=MAX_MESSAGE_BYTES,
        # request heads bounded in time and size, bodies in time
        http=guarded_protocol(args.header_timeout, args.body_timeout),
    )
