"""What the worker's `load` command shares between the text models (BERT, LLaMA, T5): which
files to fetch for a model, and the buffers the worker streams them into.

A model is named one of three ways:
  * a registry name (e.g. "all-minilm-l6-v2"): served by `candle-web serve` under
    /models/<name>/<file>, with the registry's sizes and sha256 (checked, then cached);
  * a Hub repo and revision: fetched from huggingface.co (online only); a revision the registry
    pins is checked against its hashes, any other must be a full commit hash;
  * a folder URL on the serving origin (e.g. "models/local/t5-demo/", what
    `candle-web serve --local-model DIR` serves): sizes from Content-Length, no sha256 (so
    nothing is cached), for models outside the registry.

Bytes arrive the way web/py/whisper_session.py describes: `allocate_file` hands the worker a
numpy uint8 array of the announced size, the worker writes the downloaded chunks straight
into it and checks its sha256, and the session builds the model from those buffers.
"""
from __future__ import annotations

import re

import numpy as np

HF_ENDPOINT = "https://huggingface.co"
# One wasm32 array must stay under 2 GiB; a file announced larger is refused before allocating.
FILE_LIMIT_BYTES = 1 << 31
COMMIT_HASH_LENGTH = 40
# A folder URL: a relative path on the serving origin, made of plain segments and ending in /.
FOLDER_URL_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9._-]*/)+$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
REVISION_RE = re.compile(r"^[A-Za-z0-9._-]+$")

# Buffers the worker is filling: (model key, file name) -> uint8 array.
_incoming: dict = {}


def registry():
    from candle_web import hub

    return hub.default_registry()


def browser_models(kind: str) -> list:
    """The registry's models of `kind` that may run in the browser: [{name, description,
    size, license}]."""
    from candle_web import hub

    return [{"name": entry.name, "description": entry.description, "size": entry.size,
             "license": entry.license}
            for entry in hub.list_models(registry(), kind=kind) if entry.browser]


def _hf_source(entry) -> dict | None:
    for source in entry.sources:
        if "hf" in source:
            return source["hf"]
    return None


def _unpinned(names, base: str) -> list:
    return [{"name": name, "size": None, "sha256": None, "url": base + name} for name in names]


def manifest(kind: str, required_files: tuple, model=None, hf_repo=None, revision=None,
             url=None) -> dict:
    """{key, source, files: [{name, size, sha256, url}]} for one of the three ways of naming a
    model (see the module doc); `required_files` are fetched for a Hub repo or folder URL."""
    from candle_web.errors import ModelNotFound

    if sum(value is not None for value in (model, hf_repo, url)) != 1:
        raise ModelNotFound(f"load ({kind}): name exactly one of a registry model, a Hub repo "
                            f"(with its revision) or a folder URL")
    if model is not None:
        return _registry_manifest(kind, model)
    if url is not None:
        if not isinstance(url, str) or not FOLDER_URL_RE.match(url):
            raise ModelNotFound(f"load ({kind}): the folder URL must be a path on this server "
                                f"ending in '/', e.g. models/local/my-model/, got {url!r}")
        return {"key": f"url:{url}", "source": "url", "files": _unpinned(required_files, url)}
    return _hub_manifest(kind, required_files, hf_repo, revision)


def _registry_manifest(kind: str, model: str) -> dict:
    from candle_web.errors import ModelNotFound

    known = registry()
    usable = [entry.name for entry in known if entry.kind == kind and entry.browser]
    if model not in known:
        raise ModelNotFound(f"load: no registry model {model!r}; browser {kind} models: "
                            f"{', '.join(usable) or 'none'}")
    entry = known[model]
    if entry.kind != kind or not entry.browser:
        what = f"a {entry.kind} model" if entry.kind != kind else "not shipped to browsers"
        raise ModelNotFound(f"load: registry model {model!r} is {what}; browser {kind} models: "
                            f"{', '.join(usable) or 'none'}")
    files = [{"name": f.name, "size": f.size, "sha256": f.sha256,
              "url": f"models/{entry.name}/{f.name}"} for f in entry.files]
    return {"key": entry.name, "source": "server", "files": files}


def _hub_manifest(kind: str, required_files: tuple, hf_repo, revision) -> dict:
    from candle_web.errors import ModelNotFound

    if not isinstance(hf_repo, str) or not REPO_RE.match(hf_repo):
        raise ModelNotFound(f"load ({kind}): the Hub repo must look like 'owner/name', "
                            f"got {hf_repo!r}")
    if not isinstance(revision, str) or not REVISION_RE.match(revision):
        raise ModelNotFound(f"load ({kind}): the revision must be a branch, tag or commit, "
                            f"got {revision!r}")
    base = f"{HF_ENDPOINT}/{hf_repo}/resolve/{revision}/"
    key = f"{hf_repo}@{revision}"
    for entry in registry():
        if entry.kind == kind and _hf_source(entry) == {"repo": hf_repo, "revision": revision}:
            files = [{"name": f.name, "size": f.size, "sha256": f.sha256, "url": base + f.name}
                     for f in entry.files]
            return {"key": key, "source": "hub", "files": files}
    if len(revision) != COMMIT_HASH_LENGTH or any(c not in "0123456789abcdef" for c in revision):
        raise ModelNotFound(f"load ({kind}): {key} is not in the registry; pin a full "
                            f"{COMMIT_HASH_LENGTH}-character commit hash so the files cannot "
                            "change under the same name")
    return {"key": key, "source": "hub", "files": _unpinned(required_files, base)}


# --- bytes in -------------------------------------------------------------------------------

def allocate_file(key: str, file_name: str, size) -> np.ndarray:
    """A uint8 buffer of exactly `size` bytes for the worker to fill (validated first)."""
    from candle_web.errors import FormatError

    if isinstance(size, bool) or not isinstance(size, (int, float)) or size != int(size) \
            or not 0 < int(size) < FILE_LIMIT_BYTES:
        raise FormatError(f"load: {key}/{file_name}: size {size!r} is not a positive byte "
                          f"count below {FILE_LIMIT_BYTES}")
    buffer = np.empty(int(size), dtype=np.uint8)
    _incoming[(key, file_name)] = buffer
    return buffer


def discard_incoming(key: str) -> None:
    for staged in [k for k in _incoming if k[0] == key]:
        del _incoming[staged]


def take_staged(key: str, required_files: tuple) -> dict:
    """{file name: uint8 buffer} of model `key`, removed from the staging area; every
    required file must have arrived."""
    from candle_web.errors import FormatError

    staged = {name: buffer for (k, name), buffer in _incoming.items() if k == key}
    discard_incoming(key)
    missing = [name for name in required_files if name not in staged]
    if missing:
        raise FormatError(f"load: {key}: files never received: {', '.join(missing)}")
    return staged


def file_bytes_from_folder(folder, names) -> dict:
    """{name: uint8 array} read from a local folder: the native side of the twin checks builds
    models from the same bytes the browser receives, through the same session code."""
    from pathlib import Path

    return {name: np.frombuffer((Path(folder) / name).read_bytes(), dtype=np.uint8)
            for name in names}


def numeric_options(options, option_fields: dict, integer_options, what: str) -> dict:
    """The page's plain dict of sampling options as GenerationOptions field values: names
    mapped through `option_fields`, unknown names refused, numbers checked (whole numbers
    where listed in `integer_options`), None meaning "use the default"."""
    from candle_web.errors import CandleError

    options = dict(options or {})
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
