"""`speechrt serve --ray`: the server as Ray Serve replicas (the `ray` extra; docs/ray.md).

Without --address a local Ray cluster is started for the command and stopped with it; Ray (2.60+)
turns on token authentication for such a cluster and, as Ray documents, creates its token itself
(~/.ray/auth_token, unless RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH names one) and uses it; the token
guards Ray's control plane (GCS, dashboard, jobs), not the HTTP routes served through its proxy.
With --address the cluster's token must be there already (`ray get-auth-token`).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import signal
import tempfile
import threading

from speechrt.cli.serve import load_server, log_to_stderr, serve_config
from speechrt.errors import SpeechRTError


def parse_autoscale(text: str) -> tuple[int, int]:
    """'MIN,MAX' -> (MIN, MAX), 0 <= MIN <= MAX, MAX >= 1."""
    try:
        low, high = (int(x) for x in text.split(","))
    except ValueError:
        raise SpeechRTError(f"--autoscale takes MIN,MAX (e.g. 1,4), not {text!r}") from None
    if not 0 <= low <= high or high < 1:
        raise SpeechRTError(f"--autoscale {text}: need 0 <= MIN <= MAX and MAX >= 1")
    return low, high


def ray_options(args: argparse.Namespace) -> dict[str, object]:
    """replica_options' keywords from the flags, checked."""
    if args.replicas is not None and args.autoscale is not None:
        raise SpeechRTError("give --replicas N or --autoscale MIN,MAX, not both")
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
    }


def run_ray(args: argparse.Namespace) -> int:
    options = ray_options(args)
    serve_config(args)  # bad flags fail here, not in every replica
    try:
        import ray
        from ray import serve

        from speechrt.serving.ray_app import APP_NAME, server_app
    except ImportError as e:
        raise SpeechRTError(
            f"--ray needs the `ray` extra: pip install 'speechrt[ray]' ({e})"
        ) from None
    log_to_stderr(args.log_level)
    try:
        if args.address is not None:
            ray.init(address=args.address)
        else:
            # "local": a new cluster even where `ray start` runs one; loopback only, no dashboard
            ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1")
    except (ConnectionError, ray.exceptions.AuthenticationError) as e:
        raise SpeechRTError(f"cannot join the Ray cluster: {str(e).splitlines()[0]}") from None
    metrics_dir = tempfile.mkdtemp(prefix="speechrt-metrics-")
    stop = threading.Event()
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        load = functools.partial(load_server, args)
        app = server_app(load, metrics_dir, **options)
        serve.run(app, name=APP_NAME, route_prefix="/")
        how = (
            f"{options['autoscale'][0]}-{options['autoscale'][1]} replicas"  # type: ignore[index]
            if options["autoscale"]
            else f"{options['replicas']} replica(s)"
        )
        print(f"speechrt on Ray Serve: {how} at http://{args.host}:{args.port} (Ctrl-C stops)")
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(APP_NAME)  # the replicas drain their engines (the app's lifespan)
        if args.address is None:
            serve.shutdown()
            ray.shutdown()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0
