"""The whole speechrt server as Ray Serve replicas (`speechrt serve --ray`; the `ray` extra).

Every replica loads the models and runs the FastAPI app of speechrt.serving.app (its own engines,
batcher and device thread) behind Ray's HTTP proxy, so the OpenAI and KServe v2 routes answer as
they do from one process. Each response names the replica that made it (X-Speechrt-Replica).
/metrics adds up every replica on the host: the replicas share a prometheus-client
multi-process directory (speechrt.serving.metrics says why that and not Ray's export).

Importing this module imports ray; nothing on the plain `serve` path imports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

from ray import serve
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from speechrt.errors import SpeechRTError
from speechrt.serving.metrics import MULTIPROC_ENV, shared_dir

if TYPE_CHECKING:
    from ray.serve import Application
    from typing_extensions import Unpack  # (typing's own from Python 3.11)

    from speechrt.serving.server import Server

APP_NAME = "speechrt"
REPLICA_HEADER = "x-speechrt-replica"
# Ray Serve runs a replica's app on a second event loop, in a thread of its own, unless told
# not to. On the replica's one loop a request costs the replica less CPU (0.35 against 0.48 ms
# for /v2/health/ready behind HAProxy, 0.80 -> 0.59 for /openapi.json with the other settings
# of Ray's throughput mode; scripts/replica_cpu.py --ray, 2-core CPU), time its device thread
# would otherwise wait for. The environment given to `speechrt serve --ray` overrides it.
REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}


def replica_env() -> dict[str, str]:
    """REPLICA_ENV, each value as this process's environment sets it, if it does."""
    return {k: os.environ.get(k, v) for k, v in REPLICA_ENV.items()}


class ReplicaHeader:
    """Add the replica's id to every HTTP response (which replica served it, for clients and
    tests; Ray's own request id says nothing about where a request ran)."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.replica = app, replica.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (REPLICA_HEADER.encode(), self.replica)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, tagged)


@serve.ingress()  # the app is built per replica, from the server it loads
class SpeechServer:
    """One replica: a whole speechrt Server; Ray runs the app's lifespan (engines start and
    drain with the replica)."""

    def __init__(self, load: Callable[[], Server], metrics_dir: str | None) -> None:
        self.metrics_dir = metrics_dir  # first: __del__ runs even if loading fails
        if metrics_dir is not None:
            os.makedirs(metrics_dir, exist_ok=True)  # on another node it may not exist yet
            if shared_dir() != metrics_dir:
                raise SpeechRTError(
                    f"{MULTIPROC_ENV} must be set before prometheus_client is imported "
                    f"(got {shared_dir()!r}, want {metrics_dir!r})"
                )
        self.server = load()

    def __del__(self) -> None:
        """Ray calls this when it stops the replica: its pending-items gauge leaves the sum
        (its counters stay: they count what it served)."""
        if self.metrics_dir is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid(), self.metrics_dir)

    def __serve_build_asgi_app__(self) -> ASGIApp:
        from speechrt.serving.app import create_app

        replica = serve.get_replica_context().replica_id.unique_id
        return ReplicaHeader(create_app(self.server), replica)


class ReplicaOptions(TypedDict, total=False):
    """replica_options' keywords but `env` (server_app passes them on)."""

    replicas: int
    autoscale: tuple[int, int] | None
    gpus: float
    cpus: float
    max_batch_size: int
    max_queue_size: int


def replica_options(
    *,
    replicas: int = 1,
    autoscale: tuple[int, int] | None = None,
    gpus: float = 0.0,
    cpus: float = 1.0,
    max_batch_size: int = 8,
    max_queue_size: int = 256,
    env: dict[str, str] | None = None,
) -> dict[str, object]:
    """serve.deployment options for `replicas` (or `autoscale` = (min, max)) copies."""
    options: dict[str, object] = {
        # As many as the replica's engine holds (a batch running, a full queue), which answers
        # 503 itself beyond that. Fewer would leave requests in Ray's router, which retries a
        # full replica with growing back-off: one replica capped at 16 ongoing served 161
        # requests/s to 16 clients and 13 to 64 (H100).
        "max_ongoing_requests": max_batch_size + max_queue_size,
        "ray_actor_options": {
            "num_cpus": cpus,
            "num_gpus": gpus,
            "runtime_env": {"env_vars": replica_env() | (env or {})},
        },
    }
    if autoscale is not None:
        low, high = autoscale
        options["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            # one engine batch in flight per replica before Ray adds another
            "target_ongoing_requests": max_batch_size,
        }
    else:
        options["num_replicas"] = replicas
    return options


def server_app(
    load: Callable[[], Server], metrics_dir: str | None, **options: Unpack[ReplicaOptions]
) -> Application:
    """The Serve application: `load()` runs in every replica (it must pickle: a function of
    the package, or a functools.partial of one); `options`: replica_options' keywords.
    `metrics_dir`: the shared prometheus-client directory (None: each replica counts alone)."""
    env = {MULTIPROC_ENV: metrics_dir} if metrics_dir is not None else {}
    deployment = serve.deployment(SpeechServer, name="SpeechServer")
    return deployment.options(**replica_options(env=env, **options)).bind(load, metrics_dir)
