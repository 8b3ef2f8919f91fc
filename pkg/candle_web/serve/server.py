"""Running `candle-web serve`: uvicorn on its own asyncio loop with the bounded protocol
(hosts.py), the site's application (app.py) and the SIGTERM drain (drain.py), the helpers that
build and start a server (tests and notebooks start one in a thread), the API's start-up
(candle_web.api, with --api), and the command line."""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from .app import SiteApp
from .drain import DEFAULT_DRAIN_S, draining_server_class
from .hosts import DEFAULT_HOST, LOOPBACK_HOST_NAMES, _protocol_base, allowed_host_name
from .site import (CACHE_ENV_VAR, DEMO_MODELS_FOLDER, DEMO_PROGRESS_SUFFIX, WEB_ROOT_ENV_VAR,
                   RegistryModelFiles, SiteConfig, default_web_root)

DEFAULT_PORT = 8000
# Pending connections the kernel queues before accept.
LISTEN_BACKLOG = 128
# On stop, requests still running (a long generation) get this long to finish, then are cut.
GRACEFUL_SHUTDOWN_S = 3
# `--max-audio-seconds` when the flag is not given; without either, the API's default
# (ApiLimits.max_audio_seconds: 30 minutes).
MAX_AUDIO_ENV_VAR = "CANDLE_WEB_MAX_AUDIO_SECONDS"
# start_in_thread waits at most this long for the loop to start listening.
STARTUP_WAIT_S = 30.0


SERVE_EXTRA_HINT = "pip install 'candle-web[serve]'"


def import_server_stack():
    """uvicorn (and, through it, httptools), or an ImportError saying what to install."""
    try:
        import httptools  # noqa: F401, PLC0415
        import uvicorn  # noqa: PLC0415
    except ImportError as error:
        raise ImportError(f"candle-web serve needs uvicorn and httptools ({SERVE_EXTRA_HINT}): "
                          f"{error}") from None
    return uvicorn


class Server:
    """A bound server: uvicorn on its own asyncio loop, serving the site (and the API).
    `serve_forever()` runs it in the calling thread (in the main thread, Ctrl-C stops it
    gracefully and SIGTERM drains it: drain.py); `shutdown()` asks it to stop from another
    thread and waits; `server_close()` releases the socket. `server_address` is (host, port)
    as bound; `drain` counts the requests in flight (its `cut`: how many a drain timed out on)."""

    def __init__(self, sock: socket.socket, app: SiteApp, site: SiteConfig):
        uvicorn = import_server_stack()

        self.socket, self.app, self.site, self.drain = sock, app, site, app.drain
        self.server_address = sock.getsockname()[:2]
        protocol = type("SiteProtocol", (_protocol_base(),), {
            "max_connections": site.max_connections, "idle_timeout_s": site.idle_timeout_s,
            "extra_headers": dict(site.extra_headers)})
        config = uvicorn.Config(
            app, http=protocol, lifespan="off", log_config=None, access_log=False,
            log_level="warning" if site.verbose else "error",
            timeout_keep_alive=max(1, int(math.ceil(site.idle_timeout_s))),
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, proxy_headers=False,
            server_header=False, ws="none")
        self._uvicorn = draining_server_class()(config)
        self._uvicorn.drain = self.drain
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def serve_forever(self) -> None:
        try:
            asyncio.run(self._uvicorn.serve(sockets=[self.socket]))
        finally:
            self._stopped.set()

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="candle-web-serve",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + STARTUP_WAIT_S
        while not self._uvicorn.started and not self._stopped.is_set():
            if time.monotonic() > deadline:
                raise RuntimeError("candle-web serve: the server did not start")
            time.sleep(0.005)

    def shutdown(self) -> None:
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(GRACEFUL_SHUTDOWN_S + 5)

    def server_close(self) -> None:
        self.socket.close()


# --- building and running a server ----------------------------------------------------------

def local_model_map(folders) -> dict:
    """{name: folder} for --local-model folders: each served as /models/local/<its name>/."""
    mapping = {}
    for folder in folders or ():
        folder = Path(folder).expanduser().resolve()
        if not folder.is_dir():
            raise ValueError(f"--local-model {folder}: not a folder")
        if folder.name in mapping:
            raise ValueError(f"--local-model: two folders named {folder.name!r} "
                             f"({mapping[folder.name]} and {folder})")
        mapping[folder.name] = folder
    return mapping


def demo_models_root() -> Path:
    """<cache>/demo/: where `make demo` keeps the models it trains ($CANDLE_WEB_CACHE)."""
    from .. import hub  # noqa: PLC0415  (stdlib-only; the cache location lives there)

    return hub.cache_dir() / DEMO_MODELS_FOLDER


def demo_progress_path(name: str) -> Path:
    """Where the trainer of demo model `name` keeps its progress for the page to show."""
    return demo_models_root() / f"{name}{DEMO_PROGRESS_SUFFIX}"


def make_site_config(web_root: Optional[Path] = None, serve_models: bool = True,
                     verbose: bool = False, local_models=(),
                     demo_root: Optional[Path] = None, allowed_hosts=(),
                     drain_timeout_s: float = DEFAULT_DRAIN_S) -> SiteConfig:
    web_root = Path(web_root) if web_root is not None else default_web_root()
    model_files = RegistryModelFiles() if serve_models else None
    return SiteConfig(web_root=web_root, model_files=model_files, verbose=verbose,
                      local_models=local_model_map(local_models), demo_root=demo_root,
                      allowed_hosts=tuple(allowed_host_name(name) for name in allowed_hosts),
                      drain_timeout_s=drain_timeout_s)


def make_server(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                site: Optional[SiteConfig] = None, api=None) -> Server:
    """A bound, not yet running server; port 0 picks a free port (see server_address).
    `api`: an ASGI application for /v1 (candle_web.api.build_app), or None for the page only."""
    if site is None:
        site = make_site_config()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # an IPv6 literal such as ::1
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return Server(sock, SiteApp(site, api), site)


def server_url(server: Server) -> str:
    host, port = server.server_address[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def start_in_thread(host: str = DEFAULT_HOST, port: int = 0,
                    site: Optional[SiteConfig] = None, api=None) -> tuple[Server, str]:
    """Start a server in a daemon thread (tests, notebooks); stop with server.shutdown() and
    server.server_close()."""
    server = make_server(host, port, site, api)
    server.start_thread()
    return server, server_url(server)


def _warn_if_not_vendored(web_root: Path) -> None:
    if not (web_root / "vendor" / "pyodide" / "pyodide.js").is_file():
        print(f"warning: {web_root / 'vendor'} has no Pyodide yet; run "
              "`python scripts/vendor_pyodide.py` first", file=sys.stderr)


def announce(site: SiteConfig, url: str, host: str = DEFAULT_HOST) -> None:
    """What a starting server prints: its URL first (the line people and scripts look for),
    then the model folders it serves."""
    _warn_if_not_vendored(site.web_root)
    print(f"candle-web: serving {site.web_root} at {url}", flush=True)
    for name, folder in site.local_models.items():
        print(f"candle-web: {folder} served as /models/local/{name}/", flush=True)
    if site.demo_root is not None:
        print(f"candle-web: model folders in {site.demo_root} served as /models/local/<name>/ "
              "(those that appear later too)", flush=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {host}, reachable from other machines", file=sys.stderr)


def build_api(models=(), parallel: Optional[int] = None, queue_size: Optional[int] = None,
              api_key: Optional[str] = None, max_audio_seconds: Optional[float] = None,
              aliases=()):
    """(ASGI app for /v1, model pool): the OpenAI-compatible API (candle_web.api) with the
    `models` (registry names or local paths) loaded now; the other registry models load on
    their first request. `max_audio_seconds`: the longest audio a transcription decodes
    (None: ApiLimits' default). `aliases`: (alias, model) pairs (--alias)."""
    from .. import api  # noqa: PLC0415  (Starlette and the models: only with --api)

    limits = api.ApiLimits() if max_audio_seconds is None else api.ApiLimits(
        max_audio_seconds=max_audio_seconds)
    pool = api.ModelPool(parallel=parallel or api.DEFAULT_PARALLEL,
                         queue_size=api.DEFAULT_QUEUE if queue_size is None else queue_size)
    for name in models:
        started = time.perf_counter()
        served = pool.add(str(name))
        print(f"candle-web: loaded {served.name} ({served.kind}) in "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    for alias, target in aliases:
        pool.add_alias(alias, target)
    return api.build_app(pool, api_key=api_key, limits=limits), pool


def serve(port: int = DEFAULT_PORT, open_browser: bool = False, host: str = DEFAULT_HOST,
          web_root: Optional[Path] = None, verbose: bool = True, local_models=(),
          demo_root: Optional[Path] = None, api=None, allowed_hosts=(),
          drain_timeout_s: float = DEFAULT_DRAIN_S):
    """Serve until interrupted (Ctrl-C) or drained (SIGTERM), printing the URL; returns the
    server's Drain. Model files come from the hub's cache ($CANDLE_WEB_CACHE, default
    ~/.cache/candle-web), the local model folders and the model folders in demo_root; `api`
    (build_api's app) adds /v1; `allowed_hosts`: the names it answers to besides its address
    and the loopback names."""
    site = make_site_config(web_root, verbose=verbose, local_models=local_models,
                            demo_root=demo_root, allowed_hosts=allowed_hosts,
                            drain_timeout_s=drain_timeout_s)
    server = make_server(host, port, site, api)
    url = server_url(server)
    announce(site, url, host)
    if api is not None:
        print(f"candle-web: OpenAI-compatible API at {url}v1 (GET {url}v1/models)", flush=True)
    if open_browser:
        import webbrowser  # noqa: PLC0415  (only when asked)
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        print("candle-web: stopped", flush=True)
    return server.drain


API_KEY_ENV_VAR = "CANDLE_WEB_API_KEY"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _allowed_host(text: str) -> str:
    try:
        return allowed_host_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_host_arguments(parser) -> None:
    """--allowed-host, shared by `candle-web serve` and `python -m candle_web.serve`."""
    parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        type=_allowed_host,
                        help="also answer requests whose Host is NAME (any port), e.g. the "
                             "DNS name of a server on --host 0.0.0.0; other names get 421 "
                             "(DNS rebinding); repeatable")


def add_drain_arguments(parser) -> None:
    """--drain-seconds, shared by `candle-web serve` and `python -m candle_web.serve`."""
    parser.add_argument("--drain-seconds", type=_seconds, default=DEFAULT_DRAIN_S, metavar="S",
                        help="on SIGTERM, requests in flight get S seconds to finish while new "
                             "ones get 503, then the process exits with 0 (default "
                             f"{DEFAULT_DRAIN_S:g})")


def add_api_arguments(parser) -> None:
    """The API's flags, shared by `candle-web serve` and `python -m candle_web.serve`."""
    parser.add_argument("--api", action="store_true",
                        help="also serve the OpenAI-compatible API under /v1 (the registry's "
                             "whisper, llama and bert models, loaded on first use)")
    parser.add_argument("--model", action="append", default=[], metavar="NAME_OR_PATH",
                        help="with --api (implied): load this model at start, a registry name "
                             "or a local .gguf / model folder (served under its file or folder "
                             "name); repeatable")
    parser.add_argument("--alias", type=_alias, action="append", default=[],
                        metavar="ALIAS=MODEL",
                        help="with --api: requests naming ALIAS get MODEL, e.g. "
                             "whisper-1=whisper-base for clients that hard-code OpenAI's "
                             "model names; repeatable")
    parser.add_argument("--parallel", type=_positive_int, default=None, metavar="N",
                        help="slots per text model: requests decoded together (default 4)")
    parser.add_argument("--queue", type=_count, default=None, metavar="N",
                        help="requests waiting beyond the slots before 429 (default 16)")
    parser.add_argument("--max-audio-seconds", type=_seconds, default=None, metavar="S",
                        help="with --api: the longest audio a transcription accepts; a longer "
                             "upload gets 400 without being decoded past S (default: "
                             f"${MAX_AUDIO_ENV_VAR} when set, else 1800, 30 minutes)")
    parser.add_argument("--ray-address", default=None, metavar="HEAD:PORT",
                        help="with --api: serve the API from replicas on this Ray cluster "
                             "behind Ray Serve's proxy on --host:--port (the cluster extra; the "
                             "page is not served); 'auto' for $RAY_ADDRESS or a local cluster")
    parser.add_argument("--replicas", type=_positive_int, default=1, metavar="N",
                        help="with --ray-address: replicas of the API, each holding the models "
                             "(default 1)")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on /v1 (default: "
                             f"${API_KEY_ENV_VAR} when set; prefer it, argv is visible to "
                             "other local users)")


def _alias(text: str) -> tuple:
    alias, _, target = text.partition("=")
    if not alias.strip() or not target.strip():
        raise argparse.ArgumentTypeError(f"expected ALIAS=MODEL, got {text!r}")
    return alias.strip(), target.strip()


def api_key_from(args) -> Optional[str]:
    return args.api_key or os.environ.get(API_KEY_ENV_VAR) or None


def max_audio_seconds_from(args, parser) -> Optional[float]:
    """--max-audio-seconds, else $CANDLE_WEB_MAX_AUDIO_SECONDS, else None (the API's default);
    a bad value of the variable stops the command with a message naming it."""
    if args.max_audio_seconds is not None:
        return args.max_audio_seconds
    text = os.environ.get(MAX_AUDIO_ENV_VAR, "").strip()
    if not text:
        return None
    try:
        return _seconds(text)
    except argparse.ArgumentTypeError as error:
        parser.error(f"${MAX_AUDIO_ENV_VAR}: {error}")


def _serve_on_ray(args) -> int:
    """`--ray-address`: the API from replicas on a Ray cluster (candle_web.api.ray_serve)."""
    try:
        from ..api import ray_serve  # noqa: PLC0415
        import ray.serve  # noqa: F401, PLC0415
    except ImportError as error:
        print(f"candle-web serve: --ray-address needs Ray Serve (pip install "
              f"'candle-web[cluster]'): {error}", file=sys.stderr)
        return 1
    from .. import api  # noqa: PLC0415

    ray_serve.run(args.ray_address, args.model, args.replicas,
                  args.parallel or api.DEFAULT_PARALLEL,
                  api.DEFAULT_QUEUE if args.queue is None else args.queue, args.host,
                  args.port, api_key=api_key_from(args),
                  announce=lambda line: print(line, flush=True))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="candle-web serve",
                                     description="Serve the candle-web demo page.")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address (default {DEFAULT_HOST})")
    parser.add_argument("--web-root", type=Path, default=None,
                        help="folder to serve (default: the checkout's web/, "
                             f"or ${WEB_ROOT_ENV_VAR})")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help=f"model cache to serve under /models/ (sets ${CACHE_ENV_VAR}; "
                             "default: the hub's cache)")
    parser.add_argument("--local-model", type=Path, action="append", default=[],
                        metavar="DIR",
                        help="also serve model folder DIR under /models/local/<DIR's name>/ "
                             "(e.g. a T5 for the Text-to-text view); repeatable")
    parser.add_argument("--open", action="store_true", help="open the page in a browser")
    parser.add_argument("--quiet", action="store_true", help="do not log requests")
    add_host_arguments(parser)
    add_drain_arguments(parser)
    add_api_arguments(parser)
    from ..pipelines.arguments import add_compute_type_argument, apply_compute_type  # noqa: PLC0415
    add_compute_type_argument(parser)
    args = parser.parse_args(argv)
    apply_compute_type(args)  # before build_api loads --model: the API's models follow it
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    if args.cache_dir is not None:
        # The hub reads the cache location from the environment on every lookup.
        os.environ[CACHE_ENV_VAR] = str(args.cache_dir)
    try:
        local_model_map(args.local_model)
    except ValueError as error:
        parser.error(str(error))
    if (args.api or args.model or args.ray_address) and not api_key_from(args) \
            and args.host not in LOOPBACK_HOST_NAMES:
        print(f"warning: the API on {args.host} answers anyone who can reach it; set "
              f"${API_KEY_ENV_VAR} (or --api-key) to require a key", file=sys.stderr)
    max_audio_seconds = max_audio_seconds_from(args, parser)
    if args.ray_address:
        if args.alias:  # the replicas build their own pools, which know no aliases yet
            parser.error("--alias is not supported with --ray-address")
        return _serve_on_ray(args)
    api = None
    if args.api or args.model:
        from ..core.errors import CandleError  # noqa: PLC0415

        try:
            api, _ = build_api(args.model, args.parallel, args.queue, api_key_from(args),
                               max_audio_seconds, args.alias)
        except (CandleError, OSError, ImportError) as error:
            print(f"candle-web serve: {error}", file=sys.stderr)
            return 2
    try:
        drain = serve(args.port, open_browser=args.open, host=args.host,
                      web_root=args.web_root, verbose=not args.quiet,
                      local_models=args.local_model, demo_root=demo_models_root(), api=api,
                      allowed_hosts=args.allowed_host, drain_timeout_s=args.drain_seconds)
    except OSError as error:
        print(f"candle-web serve: cannot listen on {args.host}:{args.port}: {error}",
              file=sys.stderr)
        return 1
    except ImportError as error:
        print(f"candle-web serve: {error}", file=sys.stderr)
        return 1
    if drain.cut:
        # A cut transcription still runs in its model's worker thread, which the interpreter
        # would wait for at exit: the drain's bound holds only if the process ends here.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
