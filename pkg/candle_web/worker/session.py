"""What the four sessions of the browser worker share: which files to fetch for a model, the
buffers the worker streams them into, building the model once per load, and running it.

web/worker.js drives one Session per model kind (`candle_web.worker.session_for`). A page's
`load` becomes, in order:
  manifest_json(...)   which files to fetch, from where, with which sizes and sha256
  allocate_file(...)   per file: a uint8 array the worker writes the download into
  build_model(key)     the model built from those arrays and kept for the runs that follow
and a run command (transcribe, embed, generate, text2text) becomes run(key, request, on_event).

A model is named one of three ways:
  * a registry name (e.g. "all-minilm-l6-v2"): served by `candle-web serve` under
    /models/<name>/<file>, with the registry's sizes and sha256 (checked, then cached);
  * a Hub repo and revision: fetched from huggingface.co (online only); a revision the registry
    pins is checked against its hashes, any other must be a full commit hash;
  * a folder URL on the serving origin (e.g. "models/local/t5-demo/", what
    `candle-web serve --local-model DIR` serves): sizes from Content-Length, no sha256 (so
    nothing is cached), for models outside the registry.

Bytes reach Python without extra copies: the worker writes each downloaded chunk straight into
the array `allocate_file` returned (the one copy from the JS heap into the wasm heap that
cannot be avoided), checks the sha256 on that same memory, and `build` parses it through a
memoryview. Cancelling is Pyodide's: the page raises KeyboardInterrupt in whatever Python runs
(web/worker.js explains the shared slots); build_model then keeps neither the staged bytes nor a
half-built model, and a run leaves the loaded model as it was, so the session stays usable.

Importable natively too: the UI tests' twin checks build models from the same file bytes
(`files_from_folder`) through the same `build` and `compute` as the browser.
"""
from __future__ import annotations

import json
import re
import time

import numpy as np

from candle_web.core.errors import (CandleError, FormatError, ModelNotFound,
                                    UnsupportedError, check_text)

HF_ENDPOINT = "https://huggingface.co"
# One wasm32 array must stay under 2 GiB; a file announced larger is refused before allocating.
FILE_LIMIT_BYTES = 1 << 31
# What the worker's wasm32 heap holds at most (4 GiB of addresses, less Pyodide's own code,
# stack and tables), and what the runtime itself already takes of it (Python, numpy, the
# wheel, measured ~300 MB after a load): a model whose files need more is refused before its
# download (Session.memory_factor).
PAGE_HEAP_BYTES = int(3.8 * (1 << 30))
RUNTIME_HEAP_BYTES = 320 << 20
COMMIT_HASH_LENGTH = 40
# A folder URL: a relative path on the serving origin, made of plain segments and ending in /.
FOLDER_URL_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9._-]*/)+$")
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"


class Session:
    """One model kind's side of the worker protocol. A subclass names its kind and command,
    lists the files a model needs, and implements build (file bytes -> model), describe
    (model -> the summary the page shows) and compute (model + request -> result payload)."""

    kind = ""  # the registry's model kind
    command = ""  # the worker command that runs the model (named in error messages)
    required_files = ()  # fetched for a Hub repo or a folder URL (a registry entry lists its own)
    hint = None  # how to get a model when none is at hand: the `models` reply's hint
    # Heap bytes a model takes per byte of its files, load and a run included: the received
    # bytes plus what the model builds from them (Qwen2.5-Coder-0.5B Q4_K_M on the wasm
    # backend, natively: 1.54x after the build, 1.84x after a short generation).
    memory_factor = 2.0

    def __init__(self):
        # Buffers the worker is filling: (model key, file name) -> uint8 array.
        self._incoming = {}
        # The one model kept: key -> model. A second one could double the wasm heap, so a new
        # load replaces it; each kind has its own, so the views do not evict each other's.
        self._loaded = {}

    # --- the models command -----------------------------------------------------------------

    def browser_models(self, all_models: bool = False) -> list:
        """The registry's models of this kind that may run in the browser: those offered in
        the page's pickers, and with `all_models` also those loaded only when asked for."""
        from candle_web import hub

        return [{"name": entry.name, "description": entry.description, "size": entry.size,
                 "license": entry.license, "offered": entry.offered}
                for entry in hub.list_models(_registry(), kind=self.kind)
                if entry.browser and (entry.offered or all_models)]

    def models_json(self, all_models=False) -> str:
        """The `models` reply: {models, hint?}."""
        reply = {"models": self.browser_models(all_models is True)}
        if self.hint is not None:
            reply["hint"] = self.hint
        return json.dumps(reply)

    # --- which files to fetch -----------------------------------------------------------------

    def manifest(self, model=None, hf_repo=None, revision=None, url=None) -> dict:
        """{key, source, files: [{name, size, sha256, url}]} for one of the three ways of naming
        a model (see the module doc)."""
        if sum(value is not None for value in (model, hf_repo, url)) != 1:
            raise ModelNotFound(f"load ({self.kind}): name exactly one of a registry model, a "
                                "Hub repo (with its revision) or a folder URL")
        if model is not None:
            return self._registry_manifest(model)
        if url is not None:
            if not isinstance(url, str) or not FOLDER_URL_RE.match(url):
                raise ModelNotFound(f"load ({self.kind}): the folder URL must be a path on this "
                                    "server ending in '/', e.g. models/local/my-model/, got "
                                    f"{url!r}")
            return {"key": f"url:{url}", "source": "url",
                    "files": _unpinned(self.required_files, url)}
        return self._hub_manifest(hf_repo, revision)

    def manifest_json(self, model=None, hf_repo=None, revision=None, url=None) -> str:
        return json.dumps(self.manifest(model, hf_repo, revision, url))

    def _registry_manifest(self, model: str) -> dict:
        known = _registry()
        usable = [entry.name for entry in known if entry.kind == self.kind and entry.browser]
        offer = f"browser {self.kind} models: {', '.join(usable) or 'none'}"
        if model not in known:
            raise ModelNotFound(f"load: no registry model {model!r}; {offer}")
        entry = known[model]
        if entry.kind != self.kind or not entry.browser:
            what = f"a {entry.kind} model" if entry.kind != self.kind else "not shipped to browsers"
            raise ModelNotFound(f"load: registry model {model!r} is {what}; {offer}")
        files = [{"name": f.name, "size": f.size, "sha256": f.sha256,
                  "url": f"models/{entry.name}/{f.name}"} for f in entry.files]
        self.check_page_memory(entry.name, files)
        return {"key": entry.name, "source": "server", "files": files}

    def check_page_memory(self, name: str, files: list) -> None:
        """Refuses, before any download, a model the page's memory cannot hold: a file of 2 GiB
        or more (one wasm32 array), or files whose load would need more of the heap than there
        is (memory_factor times their bytes, past what the runtime takes)."""
        sizes = [f["size"] for f in files if f.get("size")]
        total = sum(sizes)
        big = [f for f in files if (f.get("size") or 0) >= FILE_LIMIT_BYTES]
        if big:
            raise UnsupportedError(
                f"load: {name}: {big[0]['name']} is {big[0]['size']:,} bytes; one array in the "
                f"page's 32-bit WebAssembly memory must stay under {FILE_LIMIT_BYTES:,} bytes "
                "(run it natively: candle-web generate --model ...)")
        need = int(total * self.memory_factor)
        if need > PAGE_HEAP_BYTES - RUNTIME_HEAP_BYTES:
            raise UnsupportedError(
                f"load: {name}: its {total:,} bytes of files need about {need / 2**30:.1f} GiB "
                f"of the page's memory at load ({self.memory_factor:g}x), more than the "
                f"{(PAGE_HEAP_BYTES - RUNTIME_HEAP_BYTES) / 2**30:.1f} GiB a 32-bit "
                "WebAssembly worker has left after its runtime (run it natively)")

    def _hub_manifest(self, hf_repo, revision) -> dict:
        from candle_web.hub import HubSpec  # the one "org/name@revision" grammar

        if not HubSpec.valid_repo(hf_repo):
            raise ModelNotFound(f"load ({self.kind}): the Hub repo must look like 'owner/name', "
                                f"got {hf_repo!r}")
        if not HubSpec.valid_revision(revision):
            raise ModelNotFound(f"load ({self.kind}): the revision must be a branch, tag or "
                                f"commit, got {revision!r}")
        base = f"{HF_ENDPOINT}/{hf_repo}/resolve/{revision}/"
        key = str(HubSpec(hf_repo, revision))
        for entry in _registry():
            if entry.kind == self.kind and _hf_source(entry) == {"repo": hf_repo,
                                                                 "revision": revision}:
                files = [{"name": f.name, "size": f.size, "sha256": f.sha256,
                          "url": base + f.name} for f in entry.files]
                return {"key": key, "source": "hub", "files": files}
        if len(revision) != COMMIT_HASH_LENGTH or any(c not in "0123456789abcdef"
                                                      for c in revision):
            raise ModelNotFound(f"load ({self.kind}): {key} is not in the registry; pin a full "
                                f"{COMMIT_HASH_LENGTH}-character commit hash so the files "
                                "cannot change under the same name")
        return {"key": key, "source": "hub", "files": _unpinned(self.required_files, base)}

    # --- bytes in -----------------------------------------------------------------------------

    def allocate_file(self, key: str, file_name: str, size) -> np.ndarray:
        """A uint8 buffer of exactly `size` bytes for the worker to fill (validated first)."""
        if isinstance(size, bool) or not isinstance(size, (int, float)) or size != int(size) \
                or not 0 < int(size) < FILE_LIMIT_BYTES:
            raise FormatError(f"load: {key}/{file_name}: size {size!r} is not a positive byte "
                              f"count below {FILE_LIMIT_BYTES}")
        buffer = np.empty(int(size), dtype=np.uint8)
        self._incoming[(key, file_name)] = buffer
        return buffer

    def discard_incoming(self, key: str) -> None:
        for staged in [k for k in self._incoming if k[0] == key]:
            del self._incoming[staged]

    def take_staged(self, key: str) -> dict:
        """{file name: uint8 buffer} of model `key`, removed from the staging area; every
        required file must have arrived."""
        staged = {name: buffer for (k, name), buffer in self._incoming.items() if k == key}
        self.discard_incoming(key)
        missing = [name for name in self.required_files if name not in staged]
        if missing:
            raise FormatError(f"load: {key}: files never received: {', '.join(missing)}")
        return staged

    # --- the model --------------------------------------------------------------------------

    def build_model(self, key: str) -> str:
        """Build the model from the staged buffers and keep it under `key`; the JSON summary."""
        files = self.take_staged(key)
        self._loaded.clear()  # free the previous model before building the next one
        started = time.perf_counter()
        try:
            model = self.build(files)
        finally:
            files.clear()  # the model holds what it needs: the raw bytes can go
        build_ms = (time.perf_counter() - started) * 1000.0
        self._loaded[key] = model
        return json.dumps({"key": key, "buildMs": build_ms, **self.describe(model)})

    def loaded(self, key: str):
        if key not in self._loaded:
            have = ", ".join(self._loaded) or "none"
            raise ModelNotFound(f"{self.command}: model {key!r} is not loaded (loaded: {have}); "
                                f"send `load` with kind {self.kind!r} first")
        return self._loaded[key]

    def run(self, key: str, request=None, on_event=None) -> tuple:
        """The worker's run command with the loaded model `key`: (result JSON, {name: numpy
        array}), the arrays kept apart for the worker to transfer as ArrayBuffers.
        `request` holds compute's keyword arguments; on_event(kind, json_text) streams events."""
        model = self.loaded(key)
        return split_reply(self.compute(model, on_event=json_events(on_event),
                                        **(python_value(request) or {})))

    # --- what a subclass provides -----------------------------------------------------------

    def build(self, files: dict):
        """The model from {file name: bytes-like}."""
        raise NotImplementedError

    def describe(self, model) -> dict:
        """The model's fields in the load reply (besides key and buildMs)."""
        raise NotImplementedError

    def compute(self, model, on_event=None, **request) -> dict:
        """The run command's result payload; on_event(kind, payload dict) sees its events."""
        raise NotImplementedError


# --- helpers for the sessions -----------------------------------------------------------------

def _registry():
    from candle_web import hub

    return hub.default_registry()


def _hf_source(entry) -> dict | None:
    for source in entry.sources:
        if "hf" in source:
            return source["hf"]
    return None


def _unpinned(names, base: str) -> list:
    return [{"name": name, "size": None, "sha256": None, "url": base + name} for name in names]


def files_from_folder(folder, names) -> dict:
    """{name: uint8 array} read from a local folder: what the browser would have staged."""
    from pathlib import Path

    return {name: np.frombuffer((Path(folder) / name).read_bytes(), dtype=np.uint8)
            for name in names}


def python_value(value):
    """A value from the worker as plain Python: JS objects and arrays converted."""
    if value is not None and hasattr(value, "to_py"):
        return value.to_py()
    return value


def json_events(on_event):
    """The worker's on_event(kind, json_text) as on_event(kind, payload dict); None stays None."""
    if on_event is None:
        return None

    def forward(kind, payload):
        on_event(kind, json.dumps(payload))  # returns None: False would stop a decode loop

    return forward


def split_reply(result: dict) -> tuple:
    """(JSON of the result's plain fields, {name: numpy array} of the others)."""
    arrays = {name: value for name, value in result.items() if isinstance(value, np.ndarray)}
    fields = {name: value for name, value in result.items() if name not in arrays}
    return json.dumps(fields), arrays


def checked_text(text, name: str, limit: int, empty_note: str = "") -> str:
    """`text` when it is a string with something in it, at most `limit` characters and valid
    Unicode (no lone surrogates)."""
    if not isinstance(text, str) or not text.strip():
        raise CandleError(f"{name} is empty{empty_note}")
    if len(text) > limit:
        raise CandleError(f"{name} has {len(text)} characters; at most {limit}")
    # A JS string may hold a lone UTF-16 half (Pyodide keeps it as a lone surrogate): refused
    # with the field's name, the same InvalidText the native tokenizer and CLI give.
    return check_text(text, name)


def numeric_options(options, option_fields: dict, integer_options, what: str) -> dict:
    """The page's plain dict of sampling options as GenerationOptions field values: names
    mapped through `option_fields`, unknown names refused, numbers checked (whole numbers
    where listed in `integer_options`), None meaning "use the default"."""
    options = dict(python_value(options) or {})
    unknown = sorted(set(options) - set(option_fields))
    if unknown:
        raise CandleError(f"{what}: unknown option(s) {', '.join(unknown)}; known: "
                          f"{', '.join(option_fields)}")
    fields = {}
    for name, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise CandleError(f"{what}: option {name} must be a number, got {value!r}")
        if name in integer_options:
            if value != int(value):
                raise CandleError(f"{what}: option {name} must be a whole number, got {value}")
            value = int(value)
        fields[option_fields[name]] = value
    return fields


# Page option name -> GenerationOptions field, for the text generators (LLaMA and T5).
GENERATION_OPTION_FIELDS = {
    "maxTokens": "max_new_tokens",
    "temperature": "temperature",
    "topK": "top_k",
    "topP": "top_p",
    "seed": "seed",
    "repeatPenalty": "repeat_penalty",
    "repeatLastN": "repeat_last_n",
}
GENERATION_INTEGER_OPTIONS = ("maxTokens", "topK", "seed", "repeatLastN")


def generation_options(options, what: str, known: tuple, max_new_limit: int,
                       default_max_new=None, **fixed):
    """GenerationOptions from the page's options (only the `known` page names accepted);
    maxTokens within 1..max_new_limit, `default_max_new` when unset (None: the dataclass's);
    `fixed` fields are set by the session, not the page. GenerationOptions checks the rest."""
    from candle_web.generation import GenerationOptions

    option_fields = {name: GENERATION_OPTION_FIELDS[name] for name in known}
    fields = numeric_options(options, option_fields, GENERATION_INTEGER_OPTIONS, what)
    if default_max_new is not None:
        fields.setdefault("max_new_tokens", default_max_new)
    max_new = fields.get("max_new_tokens")
    if max_new is not None and not 1 <= max_new <= max_new_limit:
        raise CandleError(f"{what}: maxTokens must be 1..{max_new_limit}, got {max_new}")
    return GenerationOptions(**fields, **fixed)


class Profiler:
    """A run under cProfile when asked (`profile=True` on a run command: slower), reported as
    the functions with the most own time; a do-nothing context otherwise."""

    TOP_FUNCTIONS = 25

    def __init__(self, enabled: bool):
        self.enabled = enabled is True
        self._profiler = None

    def __enter__(self):
        if self.enabled:
            import cProfile

            self._profiler = cProfile.Profile()
            self._profiler.enable()
        return self

    def __exit__(self, *exc):
        if self._profiler is not None:
            self._profiler.disable()
        return False

    def report(self) -> list:
        """[{function, calls, ownMs, cumulativeMs}], most own time first."""
        import pstats

        rows = []
        for (file_name, line, name), (_, calls, own, cumulative, _) in pstats.Stats(
                self._profiler).stats.items():
            short_file = file_name.replace("\\", "/").split("/site-packages/")[-1]
            rows.append({"function": f"{short_file}:{line}({name})", "calls": calls,
                         "ownMs": own * 1000.0, "cumulativeMs": cumulative * 1000.0})
        rows.sort(key=lambda row: row["ownMs"], reverse=True)
        return rows[:self.TOP_FUNCTIONS]
