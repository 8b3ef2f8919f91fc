"""bench/browser.py --tasks faces: candle-web's Faces view next to face-api 1.7.15 on
TensorFlow.js's wasm backend (SIMD, 1 and 2 threads), in the same headless Chromium, on
face-api's own demo photos.

Per photo, the same work on both sides: the tiny face detector at 416, the 68-point landmarks
and the 128-d descriptor of every face found. candle-web: the page's `faces` worker command on
the photo's file (the worker decodes it, the package resizes it in numpy, then the networks;
the decode is counted and also printed apart), timed in the page around the command. face-api
(bench/peer/face_api.js): detectAllFaces(...).withFaceLandmarks().withFaceDescriptors() on a
canvas already holding the decoded photo (face-api resizes it on its own canvas). One warm-up
run each, then --faces-repeats timed runs; the median is compared. Ratios above 1: candle-web faster.
Then the camera: the Faces view's camera on Chromium's fake camera (its 640x480 test pattern,
--use-fake-device-for-media-stream) for --camera-seconds, frames back to back as the view runs
them: frames per second as the page reports them.
Nothing leaves 127.0.0.1. Timings under load rank nothing: the load average is printed.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NODE_MODULES = REPO / "node_modules"
FACE_API_DIST = NODE_MODULES / "@vladmandic" / "face-api" / "dist"
TFJS_WASM_DIST = NODE_MODULES / "@tensorflow" / "tfjs-backend-wasm" / "dist"
PHOTOS = tuple(f"sample{index}.jpg" for index in range(1, 7))
PEER_THREADS = (1, 2)
READY_TIMEOUT_MS = 300_000
CAMERA_FLAGS = ("--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream")

# The page's faces job on one photo, timed around the worker command: [{ms, faces, timingsMs}].
CANDLE_RUN_JS = """async ([url, repeats]) => {
    const client = window.candleWeb.client;
    await window.candleWeb.ready;
    await client.request("load", { kind: "faces", model: "face-api" });
    const blob = await (await fetch(url)).blob();
    const once = async () => {
        const started = performance.now();
        const reply = await client.request("faces", {
            model: "face-api", image: blob, options: { landmarks: true, descriptor: true } });
        return { ms: performance.now() - started, faces: reply.faces.length,
                 timingsMs: reply.timingsMs };
    };
    await once();  // warm-up
    const runs = [];
    for (let i = 0; i < repeats; i += 1) runs.push(await once());
    return runs;
}"""


# One more run of the first photo under cProfile in the worker (--faces-profile): the Python
# functions with the most own time, where the page spends its time.
CANDLE_PROFILE_JS = """async (url) => {
    const blob = await (await fetch(url)).blob();
    const reply = await window.candleWeb.client.request("faces", {
        model: "face-api", image: blob, options: { landmarks: true, descriptor: true },
        profile: true });
    return reply.profile;
}"""


def served_folders() -> dict:
    """/models/local/<name>/ folders: the peer page, face-api's bundle, TensorFlow.js's wasm
    binaries, the face-api weights and the demo photos (the registry's cached files)."""
    from candle_web import hub

    model = hub.fetch("face-api", "tiny_face_detector_model.bin", cache_only=True).parent
    hub.fetch("face-api", "face_landmark_68_model.bin", cache_only=True)
    hub.fetch("face-api", "face_recognition_model.bin", cache_only=True)
    photos = hub.fetch("face-api-demo-photos", PHOTOS[0], cache_only=True).parent
    for name in PHOTOS[1:]:
        hub.fetch("face-api-demo-photos", name, cache_only=True)
    return {"peer": REPO / "bench" / "peer", "face-api-dist": FACE_API_DIST,
            "tfjs-wasm": TFJS_WASM_DIST, "face-api-model": model, "face-photos": photos}


def run_candle(session, repeats: int, camera_seconds: float, profile: bool = False) -> dict:
    """The page's per-photo runs and its camera frame rate, in one fresh profile."""
    profile = tempfile.mkdtemp(prefix="candle-web-bench-faces-")
    options = dict(session.config.LAUNCH_OPTIONS)
    options["args"] = [*options["args"], *CAMERA_FLAGS]
    try:
        context = session.playwright.chromium.launch_persistent_context(profile, **options)
        try:
            context.route("**/*", session.guard)
            page = context.new_page()
            page.set_default_timeout(READY_TIMEOUT_MS)
            page.goto(f"{session.origin}/#faces")
            summary = page.evaluate("() => window.candleWeb.ready")
            out = {"backend": summary.get("backend", {}).get("label")
                   or summary.get("backend", {}).get("name"), "photos": {}}
            for name in PHOTOS:
                out["photos"][name] = page.evaluate(
                    CANDLE_RUN_JS, [f"/models/local/face-photos/{name}", repeats])
                print_photo("candle-web", name, out["photos"][name])
            if profile:
                print_profile(page.evaluate(CANDLE_PROFILE_JS,
                                            f"/models/local/face-photos/{PHOTOS[0]}"))
            page.wait_for_function("() => window.candleWeb.faces.runtimeReady")
            page.click("#faces-camera")
            page.wait_for_function("() => window.candleWeb.faces.camera.frames >= 1")
            time.sleep(camera_seconds)
            out["camera"] = page.evaluate("() => ({...window.candleWeb.faces.camera})")
            page.click("#faces-stop-camera")
            page.wait_for_function("() => !window.candleWeb.faces.busy")
            return out
        finally:
            context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def run_peer(session, threads: int, repeats: int) -> dict:
    def work(page, opened):
        page.wait_for_function("() => window.peer !== undefined")
        out = {"ready": page.evaluate("() => window.peer.ready"), "photos": {}}
        for name in PHOTOS:
            out["photos"][name] = page.evaluate(
                "([url, n]) => window.peer.run(url, n)",
                [f"/models/local/face-photos/{name}", repeats])
            print_photo(f"face-api wasm {threads}t", name, out["photos"][name])
        return out

    return session.run_page(f"models/local/peer/face_api.html?threads={threads}", work)


def print_photo(engine: str, name: str, result) -> None:
    import sys

    ms = [run["ms"] for run in result] if isinstance(result, list) else result["ms"]
    print(f"[faces] {engine} {name}: median {statistics.median(ms):.0f} ms of {len(ms)}; load "
          f"average {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)


def print_profile(rows: list) -> None:
    print(f"\ncandle-web page, {PHOTOS[0]} under cProfile (slower than the timed runs): the "
          f"functions with the most own time")
    print(f"{'own ms':>8} {'cum ms':>8} {'calls':>6}  function")
    for row in rows:
        print(f"{row['ownMs']:8.1f} {row['cumulativeMs']:8.1f} {row['calls']:6}  {row['function']}")


def candle_median(runs: list, exclude_decode: bool = False) -> float:
    return statistics.median(run["ms"] - (run["timingsMs"].get("decode", 0.0)
                                          if exclude_decode else 0.0) for run in runs)


def run_faces(browser_session_cls, repeats: int = 3, camera_seconds: float = 20.0,
              profile: bool = False) -> dict:
    session = browser_session_cls(served_folders())
    try:
        candle = run_candle(session, repeats, camera_seconds, profile)
        peers = {threads: run_peer(session, threads, repeats) for threads in PEER_THREADS}
    finally:
        session.close()
    print_table(candle, peers, repeats)
    return {"candle": candle, "peers": peers}


def print_table(candle: dict, peers: dict, repeats: int) -> None:
    load = os.getloadavg()
    print(f"\nFaces in the browser: tiny detector (416) + 68 landmarks + descriptor per photo, "
          f"candle-web page "
          f"({candle['backend']}) vs face-api 1.7.15 on TensorFlow.js wasm; median of {repeats} "
          f"after a warm-up; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
          f"(1 / 5 / 15 min) after the run")
    for threads, peer in peers.items():
        print(f"face-api {threads}t: {peer['ready']}")
    header = (f"{'photo':12} | faces | {'candle ms':>9} | {'w/o decode':>10} | "
              + " | ".join(f"{f'face-api {t}t ms':>15} | {f'ratio {t}t':>8} | {'w/o dec.':>8}"
                           for t in peers))
    print(header)
    print("-" * len(header))
    ratios = {threads: [] for threads in peers}
    ratios_without_decode = {threads: [] for threads in peers}
    for name, runs in candle["photos"].items():
        ours, ours_without_decode = candle_median(runs), candle_median(runs, True)
        row = f"{name:12} | {runs[-1]['faces']:5} | {ours:9.0f} | {ours_without_decode:10.0f}"
        for threads, peer in peers.items():
            theirs = statistics.median(peer["photos"][name]["ms"])
            ratios[threads].append(theirs / ours)
            ratios_without_decode[threads].append(theirs / ours_without_decode)
            row += (f" | {theirs:15.0f} | {theirs / ours:7.2f}x | "
                    f"{theirs / ours_without_decode:7.2f}x")
        print(row)
    stages = {}
    for runs in candle["photos"].values():
        for run in runs:
            for stage, ms in run["timingsMs"].items():
                stages.setdefault(stage, []).append(ms)
    print("candle-web's stages, median over every run (ms): " + ", ".join(
        f"{stage} {statistics.median(values):.0f}" for stage, values in stages.items()))
    for threads, values in ratios.items():
        print(f"geometric mean, candle-web speed / face-api wasm {threads}t: "
              f"{statistics.geometric_mean(values):.2f}x with the JPEG decode, "
              f"{statistics.geometric_mean(ratios_without_decode[threads]):.2f}x without it "
              f"(face-api's runs start from a canvas already holding the decoded photo; above "
              f"1: candle-web faster)")
    camera = candle.get("camera") or {}
    if camera.get("fps") is not None:
        print(f"camera (Chromium's fake 640x480 camera, landmarks, expressions, age/gender on): "
              f"{camera['fps']:.2f} frames a second over {camera['frames']} frames")
