"""The API on a Ray cluster: replicas behind Ray Serve (`ray[serve]`, the `cluster` extra).

    candle-web serve --api --ray-address HEAD_IP:6379 --replicas 4 --model smollm2-135m-instruct \
        --host 0.0.0.0 --port 8000

Each replica is one process holding the same models (loaded when it starts) and serving the
same Starlette application as `candle-web serve --api` (routes.build_app: the same answers,
errors, slots and queue); Ray Serve's HTTP proxy on the head node takes the requests on
--host:--port and routes each to a replica with a free slot (at most --parallel requests in a
replica at once; beyond that Ray's router queues them). Every reply names the replica that
answered in an `X-Candle-Web-Replica` header (its Ray node id and process id). The page itself
is not served here (one machine: `candle-web serve`). Every node needs candle-web installed,
with the model files cached or fetchable.
"""

from __future__ import annotations

import os
import time

APP_NAME = "candle-web"
REPLICA_HEADER = b"x-candle-web-replica"


def _replica_tag() -> str:
    try:
        import ray  # noqa: PLC0415

        node = ray.get_runtime_context().get_node_id()[:12]
    except Exception:  # noqa: BLE001  (outside Ray: the host name says enough)
        import socket  # noqa: PLC0415

        node = socket.gethostname()
    return f"{node}/{os.getpid()}"


def tag_replica(app, tag: str):
    """An ASGI app that adds the replica's name to every response's headers."""
    value = tag.encode("latin-1")

    async def tagged(scope, receive, send):
        async def send_tagged(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers", []))
                               + [(REPLICA_HEADER, value)])
            await send(message)

        await app(scope, receive, send_tagged)

    return tagged


def build_replica_app(models, parallel: int, queue_size: int, api_key=None):
    """What each replica serves: its own model pool (the models loaded now) behind the API."""
    from .model_pool import ModelPool  # noqa: PLC0415
    from .routes import build_app  # noqa: PLC0415

    pool = ModelPool(parallel=parallel, queue_size=queue_size)
    for name in models:
        pool.add(name)
    return tag_replica(build_app(pool, api_key=api_key), _replica_tag())


def application(models, replicas: int, parallel: int, queue_size: int, api_key=None,
                cpus_per_replica: float = 1.0):
    """The Ray Serve application (bound, not yet run)."""
    from ray import serve  # noqa: PLC0415

    @serve.ingress()
    class CandleWebReplica:
        def __init__(self, models, parallel, queue_size, api_key):
            self.options = (list(models), parallel, queue_size, api_key)

        def __serve_build_asgi_app__(self):
            return build_replica_app(*self.options)

    deployment = serve.deployment(
        CandleWebReplica, name="candle-web-api", num_replicas=replicas,
        max_ongoing_requests=parallel, ray_actor_options={"num_cpus": cpus_per_replica})
    return deployment.bind(list(models), parallel, queue_size, api_key)


def run(address: str, models, replicas: int, parallel: int, queue_size: int, host: str,
        port: int, api_key=None, cpus_per_replica: float = 1.0, announce=print) -> None:
    """Start the replicas on the cluster at `address`, serve until interrupted, then remove
    the application (the cluster keeps running)."""
    import ray  # noqa: PLC0415
    from ray import serve  # noqa: PLC0415

    ray.init(address=address, log_to_driver=False)
    try:
        serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port})
        serve.run(application(models, replicas, parallel, queue_size, api_key,
                              cpus_per_replica), name=APP_NAME, route_prefix="/",
                  blocking=False)
        shown = f"[{host}]" if ":" in host else host
        announce(f"candle-web: OpenAI-compatible API at http://{shown}:{port}/v1 "
                 f"({replicas} replica(s) on Ray at {address})")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        serve.delete(APP_NAME)
    finally:
        ray.shutdown()
        announce("candle-web: stopped")
