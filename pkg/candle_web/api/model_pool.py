"""The models behind the API: loaded once by registry name (or a local path given at start),
each with the work queue in front of it.

Text models (the LLaMA family) run in a `TextScheduler` (scheduler.py: slots, continuous
batching, prompts admitted together), all of them keeping finished requests' caches in the one
prefix pool of the server (prefixes.py: 256 MiB at most in all). Whisper and BERT run one
request at a time per model (serial_worker.py: a thread each, with a bounded number waiting).
All model computation in the process takes one fair lock (fair_lock.py): the numba kernels and
the BLAS thread settings are process-wide, so two models never compute at once; a transcription
gives its turn back after each window, segment and decoded token, so chats keep streaming while
audio is transcribed. Reading a model from disk is not computation: a load takes only the
pool's load lock (one load at a time), so the models already served keep answering meanwhile;
a text model's warm-up, which does compute, runs under the compute lock in its scheduler's
thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import CandleError, ModelNotFound
from .errors import NOT_FOUND, ApiError
from .fair_lock import FairLock
from .prefixes import PrefixPool
from .scheduler import DEFAULT_PARALLEL, DEFAULT_QUEUE, SlotLM, TextScheduler
from .serial_worker import SerialWorker

# Kinds of registry model the API serves, and the endpoints each answers.
TEXT_KIND, WHISPER_KIND, BERT_KIND = "llama", "whisper", "bert"
SERVED_KINDS = (TEXT_KIND, WHISPER_KIND, BERT_KIND)
# The warm-up's prompt: 6 tokens, so that a prompt pass takes the products' four-row tiles
# (numba qrows.py) and a batched step over the two slots their one-row form.
WARM_UP_PROMPT_TOKENS = 6


# -- the pool of served models --------------------------------------------------------------

@dataclass
class ServedModel:
    name: str
    kind: str
    source: str  # registry name or local path
    loaded: object = None
    scheduler: TextScheduler = None
    worker: SerialWorker = None
    chat_template: object = None
    embedder: object = None


def kind_of_path(path: Path) -> str:
    """The kind of a local model (`--model PATH`): a .gguf is a LLaMA-family model; a folder
    says it in config.json (model_type) or by its files (model.bin: a CTranslate2 Whisper)."""
    import json  # noqa: PLC0415

    if path.is_file() and path.suffix.lower() == ".gguf":
        return TEXT_KIND
    if path.is_dir():
        config_path = path / "config.json"
        model_type = ""
        if config_path.is_file():
            try:
                model_type = str(json.loads(config_path.read_text(encoding="utf-8"))
                                 .get("model_type", ""))
            except (OSError, ValueError, AttributeError):
                model_type = ""
        if model_type == "whisper" or (path / "model.bin").is_file():
            return WHISPER_KIND
        if model_type in ("bert", "roberta", "xlm-roberta"):
            return BERT_KIND
        if model_type:
            return TEXT_KIND
    raise ModelNotFound(f"--model {path}: not a .gguf file or a model folder with config.json")


class ModelPool:
    """The models the API may serve: every registry model of a served kind (loaded on first
    use) and the local paths given at start (`--model`, loaded at start like registry names
    given there)."""

    def __init__(self, parallel: int = DEFAULT_PARALLEL, queue_size: int = DEFAULT_QUEUE,
                 registry=None):
        from .. import hub  # noqa: PLC0415

        self.parallel, self.queue_size = parallel, queue_size
        self.compute = FairLock()
        # Finished requests' caches, for every text model (the server's one budget).
        self.prefixes = PrefixPool()
        self._load_lock = threading.Lock()
        self.models: dict = {}
        # Other names a served model answers to (`--alias whisper-1=whisper-base`), for
        # clients that hard-code OpenAI's model names.
        self.aliases: dict = {}
        registry = registry if registry is not None else hub.default_registry()
        for entry in hub.list_models(registry):
            if entry.kind in SERVED_KINDS:
                self.models[entry.name] = ServedModel(entry.name, entry.kind, entry.name)

    def add(self, name_or_path: str) -> ServedModel:
        """A --model argument: a registry name, or a local .gguf / folder (served under its
        file or folder name). Loads it now."""
        if name_or_path in self.models:
            served = self.models[name_or_path]
        else:
            path = Path(name_or_path).expanduser()
            if not path.exists():
                raise ModelNotFound(f"--model {name_or_path}: not a registry model of a served "
                                    f"kind ({', '.join(sorted(self.models))}) nor an existing path")
            name = path.name
            if name in self.models and self.models[name].source != str(path.resolve()):
                raise ModelNotFound(f"--model {name_or_path}: the name {name!r} is taken")
            served = self.models[name] = ServedModel(name, kind_of_path(path),
                                                     str(path.resolve()))
        self.load(served.name)
        return served

    def add_alias(self, alias: str, target: str) -> None:
        """`alias` answers as the served model `target` (a registry name or a --model)."""
        if target not in self.models:
            raise ModelNotFound(f"--alias {alias}={target}: {target!r} is not a served model "
                                f"({', '.join(sorted(self.models))})")
        if alias in self.models:
            raise ModelNotFound(f"--alias {alias}={target}: {alias!r} is a model's own name")
        self.aliases[alias] = target

    def lookup(self, name, kinds, param: str = "model") -> ServedModel:
        if isinstance(name, str):
            name = self.aliases.get(name, name)
        served = self.models.get(name) if isinstance(name, str) else None
        if served is None:
            raise ApiError(404, f"{param}: the model {str(name)[:80]!r} does not exist here "
                                f"(GET /v1/models lists them)", param=param,
                           code="model_not_found", type=NOT_FOUND)
        if served.kind not in kinds:
            raise ApiError(400, f"{param}: {name!r} is a {served.kind} model; this endpoint "
                                f"needs a {' or '.join(kinds)} model", param=param,
                           code="model_not_supported")
        return served

    def load(self, name: str) -> ServedModel:
        """Load a model once (blocking: call it in a thread from the event loop). Outside the
        compute lock: the other models go on answering while this one is read."""
        from .. import pipelines  # noqa: PLC0415

        served = self.models[name]
        with self._load_lock:
            if served.loaded is not None:
                return served
            if served.kind == TEXT_KIND:
                from ..generation.chat_templates import chat_template_for  # noqa: PLC0415

                loaded = pipelines.load_llama(served.source)
                try:
                    served.chat_template = chat_template_for(loaded.model, loaded.tokenizer)
                except CandleError as error:
                    served.chat_template = error  # chat refused, completions still served
                served.scheduler = TextScheduler(name, loaded, self.compute, self.parallel,
                                                 self.queue_size, warm_up=self._warm_up_text,
                                                 prefixes=self.prefixes)
            elif served.kind == WHISPER_KIND:
                loaded = pipelines.load_whisper(served.source)
                served.worker = SerialWorker(name, self.queue_size)
            else:
                from ..pipelines.embed import SentenceEmbedder  # noqa: PLC0415

                loaded = pipelines.load_bert(served.source)
                served.embedder = SentenceEmbedder(loaded.model, loaded.tokenizer)
                served.worker = SerialWorker(name, self.queue_size)
            served.loaded = loaded
        return served

    @staticmethod
    def _warm_up_text(scheduler: TextScheduler) -> None:
        """A two-token prompt and one step through a throwaway slot, so that the kernels'
        first-call costs (numba's cached machine code, the fused part's weight layout) are
        paid at start, not by the first request."""
        model = scheduler.model
        bos = model.config.bos_token_id if getattr(model.config, "bos_token_id", None) is not None \
            else 0
        # Two slots, each a prompt pass and a decode step.
        slots = []
        for length in (2, WARM_UP_PROMPT_TOKENS):
            lm = SlotLM(model, scheduler.steps, length + 2)
            logits = lm.start([[int(bos)] * length])
            lm.step([int(logits[0].argmax())])
            slots.append(lm)
        # and the batched step over both slots (its kernels' first call)
        scheduler.batched([int(bos)] * len(slots), [lm.caches for lm in slots])

    def close(self) -> None:
        for served in self.models.values():
            if served.scheduler is not None:
                served.scheduler.stop()
            if served.worker is not None:
                served.worker.stop()
