"""Fetch registry models into the local cache, with a progress bar.

    python models/fetch.py whisper-tiny.en all-minilm-l6-v2
    python models/fetch.py --default          # what `make test` and the demo need
    python models/fetch.py --all --verify     # re-hash everything cached, re-fetch what is bad
    python models/fetch.py --list

Already cached files are trusted by size and stamp (no re-hash), so a second run is instant.
Sources are tried in the registry's order (Hub, then PyPI mirror); CANDLE_WEB_OFFLINE=1 or
--offline skips the Hub (the pinned PyPI mirrors are still fetched); --cache-only fetches nothing. Exit status: 0 when every requested model is complete (and,
with --verify, nothing cached was found corrupt).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# The script lives in the repository: use the package next to it, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pkg"))

from candle_web import hub  # noqa: E402
from candle_web.core.errors import CandleError  # noqa: E402

DEFAULT_MODELS = (
    "whisper-tiny.en",
    "whisper-base",
    "smollm2-135m-instruct",
    "qwen2.5-coder-0.5b-instruct",
    "all-minilm-l6-v2",
    "gemma3-270m-q4km",
    "multilingual-e5-small",
    "rxnfp-bert-pretrained",
    "rxnmapper-albert",
    "whisperx-segmentation",
    "silero-vad",
    "silero-vad-jit",
    "llama-cpp-test-data",
    # One npm tarball (12.7 MB, already in npm's cache after `npm ci`) holds both.
    "face-api",
    "face-api-demo-photos",
)
BAR_WIDTH = 30
REDRAW_INTERVAL_S = 0.1
MB = 1e6


class ProgressBar:
    """A one-line progress display on stderr, redrawn at most every REDRAW_INTERVAL_S."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.label = None
        self.started = 0.0
        self.last_draw = 0.0

    def __call__(self, done: int, total: int | None, label: str) -> None:
        now = time.monotonic()
        if label != self.label:
            self.label = label
            self.started = now
            self.last_draw = 0.0
        finished = total is not None and done >= total
        if not finished and now - self.last_draw < REDRAW_INTERVAL_S:
            return
        self.last_draw = now
        rate = done / MB / max(now - self.started, 1e-6)
        if total:
            filled = int(BAR_WIDTH * min(done / total, 1.0))
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            line = (f"\r  {label[:40]:<40} |{bar}| {100 * done / total:5.1f}% "
                    f"{done / MB:7.1f}/{total / MB:.1f} MB {rate:6.1f} MB/s")
        else:
            line = f"\r  {label[:40]:<40} {done / MB:7.1f} MB ..."
        self.stream.write(line)
        if finished:
            self.stream.write("\n")
        self.stream.flush()


def describe_origins(registry: hub.Registry, name: str) -> str:
    """Where the cached files came from: the mirror wheels (`candle-web models` lists the
    members), Hub URLs or local paths, each named once."""
    wheels, others = [], []
    for file in registry[name].files:
        origin = hub.cached_origin(name, file.name, registry=registry) or "unrecorded"
        if origin.startswith("pypi "):  # "pypi WHEEL:MEMBER + WHEEL:MEMBER"
            found = [part.split(":")[0] for part in origin[len("pypi "):].split(" + ")]
            wheels += [wheel for wheel in found if wheel not in wheels]
        elif origin not in others:
            others.append(origin)
    return "; ".join((["pypi " + ", ".join(wheels)] if wheels else []) + others)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="registry model names")
    parser.add_argument("--all", action="store_true", help="every registry model")
    parser.add_argument("--default", action="store_true",
                        help="the models tests and demo need: " + ", ".join(DEFAULT_MODELS))
    parser.add_argument("--verify", action="store_true",
                        help="re-hash cached files; corrupt ones are removed and fetched again")
    parser.add_argument("--offline", action="store_true",
                        help="skip the Hub; the pinned PyPI mirrors are still fetched")
    parser.add_argument("--cache-only", action="store_true", help="fetch nothing, check the cache")
    parser.add_argument("--list", action="store_true", help="list registry models and exit")
    parser.add_argument("--registry", type=Path, help="use another registry.json")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    registry = hub.Registry.load(args.registry) if args.registry else hub.default_registry()
    if args.list:
        for model in registry:
            state = "cached" if hub.is_cached(model.name, registry=registry) else "-"
            print(f"{model.name:<24} {model.kind:<10} {model.size / MB:8.1f} MB  {state:<7} "
                  f"{model.description}")
        return 0
    names = list(args.models)
    if args.default:
        names += [name for name in DEFAULT_MODELS if name not in names]
    if args.all:
        names += [name for name in registry.names() if name not in names]
    if not names:
        print("nothing to fetch: name models, or use --default, --all or --list",
              file=sys.stderr)
        return 2
    progress = None if args.quiet else ProgressBar()
    offline = True if args.offline else None
    failed = []
    print(f"cache: {hub.cache_dir()}", file=sys.stderr)
    for name in names:
        try:
            if args.verify:
                report = hub.verify_cached(name, registry=registry)
                bad = [f"{file} {state}" for file, state in report.items() if state != "ok"]
                print(f"{name}: verify: " + (", ".join(bad) if bad else "all files ok"),
                      file=sys.stderr)
                if any(state == "corrupt" for state in report.values()):
                    # Fetched again below, but still a failing status: a damaged cache
                    # must not go unnoticed.
                    failed.append(f"{name}: corrupt files were found and fetched again")
            was_cached = hub.is_cached(name, registry=registry)
            paths = hub.fetch_model(name, progress, offline=offline, cache_only=args.cache_only,
                                    registry=registry)
        except CandleError as exc:
            print(f"{name}: FAILED: {exc}", file=sys.stderr)
            failed.append(name)
            continue
        total = sum(path.stat().st_size for path in paths.values())
        folder = next(iter(paths.values())).parent
        state = "cached" if was_cached else "fetched"
        print(f"{name}: {state}, {len(paths)} files, {total / MB:.1f} MB in {folder}; from "
              f"{describe_origins(registry, name)}", file=sys.stderr)
    if failed:
        print("problems: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
