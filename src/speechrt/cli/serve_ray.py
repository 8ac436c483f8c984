"""`speechrt serve --ray`: the server as Ray Serve replicas (the `ray` extra; docs/ray.md).

Without --address a local Ray cluster is started for the command and stopped with it; Ray (2.60+)
turns on token authentication for such a cluster and, as Ray documents, creates its token itself
(~/.ray/auth_token, unless RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH names one) and uses it; the token
guards Ray's control plane (GCS, dashboard, jobs), not the HTTP routes served through its proxy.
With --address the cluster's token must be there already (`ray get-auth-token`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from speechrt.errors import SpeechRTError

SINGLE_HOST_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": a Ray node on loopback only


def _pair(flag: str, text: str, example: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise SpeechRTError(f"{flag} takes two numbers (e.g. {example}), not {text!r}") from None
    return a, b


def parse_autoscale(text: str) -> tuple[int, int]:
    """'MIN,MAX' -> (MIN, MAX), 0 <= MIN <= MAX, MAX >= 1."""
    low, high = _pair("--autoscale", text, "1,4")
    if not 0 <= low <= high or high < 1:
        raise SpeechRTError(f"--autoscale {text}: need 0 <= MIN <= MAX and MAX >= 1")
    return low, high


def parse_split(text: str) -> tuple[int, int]:
    """'A,V' -> replicas of the acoustic model and of the vocoder, each >= 1."""
    a, v = _pair("--split-tts", text, "1,2")
    if a < 1 or v < 1:
        raise SpeechRTError(f"--split-tts {text}: each stage needs >= 1 replica")
    return a, v


def ray_options(args: argparse.Namespace) -> dict[str, Any]:
    """replica_options' keywords from the flags, checked."""
    sizing = [f for f in ("replicas", "autoscale", "split_tts") if getattr(args, f) is not None]
    if len(sizing) > 1:
        raise SpeechRTError("give one of --replicas N, --autoscale MIN,MAX, --split-tts A,V")
    if args.replicas is not None and args.replicas < 1:
        raise SpeechRTError("--replicas must be >= 1")
    gpus = args.gpus_per_replica if args.gpus_per_replica is not None else 0.0
    cpus = args.cpus_per_replica if args.cpus_per_replica is not None else 1.0
    if gpus < 0 or cpus < 0:
        raise SpeechRTError("--gpus-per-replica and --cpus-per-replica must be >= 0")
    return {
        "replicas": args.replicas or 1,
        "autoscale": parse_autoscale(args.autoscale) if args.autoscale is not None else None,
        "gpus": gpus,
        "cpus": cpus,
        "max_batch_size": args.max_batch_size,
        "max_queue_size": args.max_queue_size,
    }


def run_ray(args: argparse.Namespace, load: Callable[[], Any], limits: Any) -> int:
    """Deploy and serve until Ctrl-C or SIGTERM. `args`: checked by cli.serve.serve_config
    (with no model given, the bundled defaults' directories filled in); `load()`: the Server
    of the flags, called in every replica (it must pickle); `limits`: the flags' request limits
    (serving.Limits), which the split pipeline applies."""
    options = ray_options(args)
    split = parse_split(args.split_tts) if args.split_tts is not None else None
    if split is not None and args.acoustic is None:
        raise SpeechRTError("--split-tts serves a voice: give --acoustic DIR --vocoder DIR")
    if split is not None and args.warmup is not None:
        raise SpeechRTError(
            "--warmup warms whole-server replicas; --split-tts stages warm up on load"
        )
    if args.address is None:
        # A cluster of this machine only. Ray binds its own servers (GCS, raylet, the workers'
        # gRPC, its agents) to the node's address, and on Linux resolves even 127.0.0.1 to this
        # host's network address, so they listened on every interface; its single-host mode
        # (the variable is named for the platforms where that mode is the default) keeps the
        # node on loopback. Ray reads it once, on import.
        os.environ[SINGLE_HOST_ENV] = "0"
    try:
        import ray
        from ray import serve

        from speechrt.serving.ray_app import APP_NAME, replica_env, server_app
    except ImportError as e:
        raise SpeechRTError(
            f"--ray needs the `ray` extra: pip install 'speechrt[ray]' ({e})"
        ) from None
    try:
        if args.address is not None:
            ray.init(address=args.address)
        else:
            # its processes (HAProxy's and Ray's proxy, the replicas) inherit this environment
            os.environ.update(replica_env())
            # "local": a new cluster even where `ray start` runs one; loopback only, no dashboard
            ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1")
    except (ConnectionError, ray.exceptions.AuthenticationError) as e:
        raise SpeechRTError(f"cannot join the Ray cluster: {str(e).splitlines()[0]}") from None
    node = ray.util.get_node_ip_address()
    if args.address is None and not ipaddress.ip_address(node).is_loopback:
        ray.shutdown()  # (ray was imported before this command set SINGLE_HOST_ENV)
        raise SpeechRTError(f"the local Ray cluster took the address {node}, not loopback")
    metrics_dir = tempfile.mkdtemp(prefix="speechrt-metrics-")
    # SIGTERM stops the command as Ctrl-C does, also while Ray is still starting the replicas
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        replicas = sum(split) if split else (options["autoscale"] or [options["replicas"]])[0]
        check_fits(ray.cluster_resources(), replicas, options["cpus"], options["gpus"])
        if split is not None:
            app, how = split_app(args, split, options, limits)
        else:
            app = server_app(load, metrics_dir, **options)
            auto = options["autoscale"]
            how = f"{auto[0]}-{auto[1]} replicas" if auto else f"{options['replicas']} replica(s)"
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except Exception as e:  # a replica failed to start: Ray's message names the cause
            first = str(e).splitlines()[0]
            raise SpeechRTError(
                f"the replicas did not start (their error is logged above): {first}"
            ) from None
        print(f"speechrt on Ray Serve: {how} at http://{args.host}:{args.port} (Ctrl-C stops)")
        threading.Event().wait()  # until Ctrl-C or SIGTERM
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(APP_NAME)  # the replicas drain their engines (the app's lifespan)
        if args.address is None:
            serve.shutdown()
            ray.shutdown()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def check_fits(resources: dict[str, float], replicas: int, cpus: float, gpus: float) -> None:
    """Fail now where the cluster cannot hold the replicas (Ray would wait for them forever)."""
    for name, each in (("CPU", cpus), ("GPU", gpus)):
        have = resources.get(name, 0.0)
        if replicas * each > have:
            flag = f"--{name.lower()}s-per-replica"
            raise SpeechRTError(
                f"{replicas} replica(s) x {each:g} {name} need {replicas * each:g} {name}s; the "
                f"Ray cluster has {have:g}: lower {flag} or the replica count"
            )


def split_app(
    args: argparse.Namespace, split: tuple[int, int], options: dict[str, Any], limits: Any
) -> tuple[Any, str]:
    """The split TTS application (speechrt.serving.ray_tts) and how to describe it."""
    from speechrt.serving.ray_tts import split_tts_app

    app = split_tts_app(
        args.acoustic,
        args.vocoder,
        acoustic_replicas=split[0],
        vocoder_replicas=split[1],
        max_batch_size=args.max_batch_size,
        max_queue_size=args.max_queue_size,
        backend=args.backend,
        device=args.device,
        precision=args.precision,
        cpus=options["cpus"],
        gpus=options["gpus"],
        limits=limits,  # the limits `speechrt serve` applies
    )
    return app, f"split TTS, {split[0]} acoustic + {split[1]} vocoder replica(s)"
