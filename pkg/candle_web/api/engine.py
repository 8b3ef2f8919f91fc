"""The models behind the API: loaded once by registry name (or a local path given at start),
and the work queues in front of them.

Text models (the LLaMA family) run in a `TextScheduler`: `parallel` slots, each a sequence with
its own KV cache, and a bounded queue of waiting requests beyond them (full: 429 with
Retry-After). One scheduler thread advances every active sequence by one token per round
(llama-server's slots: a request that arrives joins at the next round, one that ends or whose
client went away frees its slot at once). A round is one batched decode step over every
sequence that has a token to feed (`backend.parts.start_batched_causal_decoding`: each at its
own position with its own cache, each weight read once for all of them on the numba backend);
a new request's prompt runs alone through `CausalLM.start` first, then it joins the batch.
The batched step gives each row the logits, bit for bit, that the single-sequence step gives it
alone, and `sample_steps` samples as for `candle-web generate`, so a request's greedy ids are
those of `candle-web generate`, whatever runs beside it.

Whisper and BERT run one request at a time per model (a single worker thread each, with a
bounded number waiting). All model computation in the process takes one fair lock
(`FairLock`): the numba kernels and the BLAS thread settings are process-wide, so two models
never compute at once; a transcription gives its turn back after each window and segment, so
chats keep streaming while audio is transcribed.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import CandleError, ModelNotFound
from ..generation import (STOP_CONTEXT, STOP_EOS, STOP_MAX_TOKENS, STOP_STRING, CausalLM,
                          StopStringMatcher, TokenOutputStream, sample_steps)
from .errors import NOT_FOUND, RATE_LIMIT, ApiError
from .prefixes import PrefixPool

# Kinds of registry model the API serves, and the endpoints each answers.
TEXT_KIND, WHISPER_KIND, BERT_KIND = "llama", "whisper", "bert"
SERVED_KINDS = (TEXT_KIND, WHISPER_KIND, BERT_KIND)
DEFAULT_PARALLEL = 4
DEFAULT_QUEUE = 16
# Seconds a client that got 429 is told to wait before trying again.
RETRY_AFTER_S = 1
# The warm-up's prompt: 6 tokens, so that a prompt pass takes the products' four-row tiles
# (numba qrows.py) and a batched step over the two slots their one-row form.
WARM_UP_PROMPT_TOKENS = 6


class FairLock:
    """A mutex handed over in arrival order (threading.Lock is not fair: a thread that
    releases and re-acquires in a loop could starve the others). `yield_turn()` lets every
    thread already waiting go first."""

    def __init__(self):
        self._condition = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def acquire(self) -> None:
        with self._condition:
            ticket = self._next_ticket
            self._next_ticket += 1
            while ticket != self._serving:
                self._condition.wait()

    def release(self) -> None:
        with self._condition:
            self._serving += 1
            self._condition.notify_all()

    def yield_turn(self) -> None:
        self.release()
        self.acquire()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def rate_limited(what: str) -> ApiError:
    return ApiError(429, f"{what}: every slot is busy and the queue is full; retry in "
                         f"{RETRY_AFTER_S} s", type=RATE_LIMIT, code="rate_limit_exceeded",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


# -- text generation ------------------------------------------------------------------------

@dataclass
class TextRequest:
    """One generation: prompt ids, options, and `emit(kind, payload)` called from the
    scheduler thread with ("token", {"id", "text"}), ("done", {...}) or ("error", exception).
    Setting `cancelled` (the client went away) frees its slot at the next round."""

    prompt_ids: list
    options: object  # generation.GenerationOptions
    emit: object
    cancelled: bool = False
    # scheduler state
    budget: int = 0
    reason: str = None
    generated: list = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    _steps: object = None
    _lm: object = None  # its SlotLM (its KV caches)
    _yields: int = 0  # tokens sample_steps has given it so far
    _stream: object = None
    _stops: object = None
    _eos: frozenset = frozenset()
    _cached: int = 0  # prompt tokens whose keys and values came from the prefix pool


class TextScheduler:
    def __init__(self, name: str, loaded, compute: FairLock, parallel: int = DEFAULT_PARALLEL,
                 queue_size: int = DEFAULT_QUEUE, warm_up=None):
        self.name, self.model, self.tokenizer = name, loaded.model, loaded.tokenizer
        self.compute, self.parallel, self.queue_size = compute, parallel, queue_size
        self.context_length = self.model.config.max_position_embeddings
        # One step function (the fused part or the model's forward) shared by every slot (a
        # slot swaps its own caches into the model before each call), and the batched step
        # (one token for every running sequence per round, each on its own caches): built,
        # and `warm_up(self)` run, by the scheduler thread before it serves (see _set_up).
        self.steps = self.batched = None
        # Finished requests' caches, reused by prompts that start with the same tokens, where
        # the steps split a prompt exactly (set in _set_up; see prefixes.py).
        self.prefixes = PrefixPool()
        self._reuse_prefixes = False
        self._warm_up = warm_up
        self._set_up_error = None
        self._ready = threading.Event()
        self.waiting: collections.deque = collections.deque()
        self.active: list = []
        self._condition = threading.Condition()
        self._stopped = False
        # What tests and the bench read: rounds run, the most sequences one round advanced,
        # requests finished, requests dropped because their client went away, tokens made;
        # the most rows one batched decode step ran.
        self.rounds = 0
        self.max_active_seen = 0
        self.max_batch_seen = 0
        self.finished = 0
        self.cancelled = 0
        self.tokens = 0
        self._thread = threading.Thread(target=self._run, name=f"candle-web-slots-{name}",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._set_up_error is not None:
            raise self._set_up_error

    # -- the public side (event loop thread) --
    def submit(self, request: TextRequest) -> None:
        with self._condition:
            if self._stopped:
                raise ApiError(503, f"{self.name}: the server is stopping", type="server_error",
                               code="unavailable")
            busy = len(self.active) + len(self.waiting)
            if busy >= self.parallel + self.queue_size:
                raise rate_limited(self.name)
            self.waiting.append(request)
            self._condition.notify()

    def load(self) -> dict:
        with self._condition:
            return {"active": len(self.active), "waiting": len(self.waiting),
                    "parallel": self.parallel, "queue": self.queue_size,
                    "finished": self.finished, "cancelled": self.cancelled,
                    "tokens": self.tokens, "reused_prompt_tokens": self.prefixes.reused_tokens}

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify()

    # -- the scheduler thread --
    def _set_up(self) -> None:
        """The steps and the warm-up, on this thread: every numba kernel of this model then
        runs on it, so the process keeps one OpenMP team. A second thread that had launched
        parallel kernels (the loader's warm-up) would keep a second team: with more OpenMP
        threads than CPUs, libgomp's workers stop spinning between parallel regions and
        sleep, and a decode step's ~150 regions each paid a futex wake-up (SmolLM2 Q4_1 on
        2 threads and 2 CPUs: 16-17 against 10-11 ms a token, the same step)."""
        from ..backend import parts  # noqa: PLC0415

        try:
            with self.compute:
                self.steps = parts.start_causal_decoding(self.model)
                self.batched = parts.start_batched_causal_decoding(self.model)
                self._reuse_prefixes = bool(getattr(self.steps, "splits_exactly", bool)())
                if self._warm_up is not None:
                    self._warm_up(self)
        except Exception as error:  # noqa: BLE001  (raised by __init__, in the caller)
            self._set_up_error = error
        finally:
            self._ready.set()

    def _run(self) -> None:
        self._set_up()
        if self._set_up_error is not None:
            return
        while True:
            with self._condition:
                while not self._stopped and not self.active and not self.waiting:
                    self._condition.wait()
                if self._stopped:
                    for request in list(self.active) + list(self.waiting):
                        request.emit("error", ApiError(503, "the server is stopping",
                                                       type="server_error", code="unavailable"))
                    return
                while self.waiting and len(self.active) < self.parallel:
                    request = self.waiting.popleft()
                    if request.cancelled:
                        self.cancelled += 1
                    else:
                        self.active.append(request)
                self.max_active_seen = max(self.max_active_seen, len(self.active))
                round_members = list(self.active)
            self._step_batch(round_members)
            for request in round_members:
                finished = True
                try:
                    if request.cancelled:
                        self.cancelled += 1
                        self._retire(request)  # drops its KV cache now
                    elif request._steps is None:
                        with self.compute:  # its prompt, alone; it joins the next batch
                            finished = self._advance(request)
                        self.finished += finished
                    else:
                        finished = self._advance(request)
                        self.finished += finished
                except Exception as error:  # noqa: BLE001  (reported to that request only)
                    request.emit("error", error)
                    request._lm = None  # its caches may be half-written: not kept
                if finished:
                    self._retire(request)
                    with self._condition:
                        self.active.remove(request)
            self.rounds += 1

    def _step_batch(self, members: list) -> None:
        """One batched decode step for every running member whose sampler will ask for the
        next logits (not cancelled, and under its token budget): each one's logits are left
        in its SlotLM for `sample_steps`' next `lm.step`. A failure is raised there, so it is
        reported to each of those members (and frees their slots)."""
        rows = [request for request in members if not request.cancelled
                and request._steps is not None and request._yields < request.budget]
        if not rows:
            return
        self.max_batch_seen = max(self.max_batch_seen, len(rows))
        try:
            with self.compute:
                logits = self.batched([request._lm.last_token for request in rows],
                                      [request._lm.caches for request in rows])
        except Exception as error:  # noqa: BLE001  (each row's sampler raises it, below)
            logits = [error] * len(rows)
        for row, request in enumerate(rows):
            request._lm.pending = logits[row:row + 1] if isinstance(logits, np.ndarray) \
                else logits[row]

    def _retire(self, request: TextRequest) -> None:
        """Drop a finished or cancelled request's sequence, offering its caches to the prefix
        pool first: they hold its prompt, then the generated tokens fed back."""
        if self._reuse_prefixes and request._lm is not None:
            self.prefixes.keep(list(request.prompt_ids) + request.generated,
                               request._lm.caches)
        request._steps = request._lm = None

    def _start(self, request: TextRequest) -> None:
        options, prompt_ids = request.options, request.prompt_ids
        lm = request._lm = SlotLM(self.model, self.steps, len(prompt_ids) + request.budget)
        request._eos = frozenset(options.eos_token_ids if options.eos_token_ids is not None
                                 else lm.eos_token_ids)
        request.reason = (STOP_MAX_TOKENS if request.budget == options.max_new_tokens
                          else STOP_CONTEXT)
        request._stream = TokenOutputStream(self.tokenizer)
        request._stops = StopStringMatcher(options.stop_strings)
        started = time.perf_counter()
        reused = (self.prefixes.restore(prompt_ids, lm.caches)
                  if self._reuse_prefixes and request.budget else 0)
        request._cached = reused
        logits = lm.start([prompt_ids], reused) if request.budget else None
        request.emit("prompt", {"n_tokens": len(prompt_ids),
                                "seconds": time.perf_counter() - started})
        request._steps = sample_steps(lm, logits, options, request._eos, request.budget,
                                      [lm.penalty_context(prompt_ids)])

    def _advance(self, request: TextRequest) -> bool:
        """One token for this request (its prompt first, on its first turn); True when it
        is finished. The text handling is generate()'s (generation/decode_loop.py)."""
        if request._steps is None:
            self._start(request)
        try:
            next_ids, _ = next(request._steps)
        except StopIteration:
            return self._finish(request)
        request._yields += 1
        token = request._lm.last_token = int(next_ids[0])
        if token in request._eos:
            request.reason = STOP_EOS
            return self._finish(request)
        request.generated.append(token)
        self.tokens += 1
        text = request._stops.feed(request._stream.next_token(token))
        request.emit("token", {"id": token, "text": text})
        if request._stops.stopped:
            request.reason = STOP_STRING
            return self._finish(request)
        return False

    def _finish(self, request: TextRequest) -> bool:
        tail = request._stops.feed(request._stream.finish())
        tail += request._stops.flush()
        if tail:
            request.emit("token", {"id": None, "text": tail})
        if request._stops.stopped:
            request.reason = STOP_STRING
        request._steps = None  # drops the sequence's KV cache
        request.emit("done", {"reason": request.reason, "token_ids": list(request.generated),
                              "prompt_tokens": len(request.prompt_ids),
                              "cached_tokens": request._cached})
        return True


class SlotLM(CausalLM):
    """generation.CausalLM over one slot's own KV cache: the model's caches are swapped in
    before each call (only the scheduler thread, holding the compute lock, calls it). A step
    whose logits the scheduler's batched step already computed (`pending`, for `last_token`)
    returns them."""

    def __init__(self, model, steps, capacity: int):  # noqa: super().__init__ would build steps
        self.model = model
        self.eos_token_ids = tuple(model.config.eos_token_ids)
        self.context_length = model.config.max_position_embeddings
        self.position = 0
        self.steps = steps
        self.pending = None  # logits [1, vocab] of the batched step for last_token
        self.last_token = None
        model.clear_kv_cache(capacity)
        self.caches = model.caches

    def start(self, prompts, reused: int = 0):
        """The prompt's logits; its first `reused` positions are already in the caches."""
        self.model.caches = self.caches
        if not reused:
            return super().start(prompts)
        self.position = len(prompts[0])
        rest = np.asarray([list(prompts[0])[reused:]], dtype=np.int64)
        return self.steps(rest, reused).to_numpy()

    def step(self, ids):
        if self.pending is not None:
            logits, self.pending = self.pending, None
            if isinstance(logits, Exception):
                raise logits
            self.position += 1
            return logits
        self.model.caches = self.caches
        return super().step(ids)


# -- one-at-a-time workers (Whisper, BERT) --------------------------------------------------

class SerialWorker:
    """One thread running this model's requests in order, with at most `queue_size` waiting."""

    def __init__(self, name: str, queue_size: int = DEFAULT_QUEUE):
        self.name, self.queue_size = name, queue_size
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"candle-web-{name}")
        self._pending = 0
        self._lock = threading.Lock()

    async def run(self, function, *args):
        import asyncio  # noqa: PLC0415

        with self._lock:
            if self._pending >= self.queue_size + 1:
                raise rate_limited(self.name)
            self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, function,
                                                                    *args)
        finally:
            with self._lock:
                self._pending -= 1

    def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


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
        self._load_lock = threading.Lock()
        self.models: dict = {}
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

    def lookup(self, name, kinds, param: str = "model") -> ServedModel:
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
        """Load a model once (blocking: call it in a thread from the event loop)."""
        from .. import pipelines  # noqa: PLC0415

        served = self.models[name]
        with self._load_lock:
            if served.loaded is not None:
                return served
            with self.compute:
                if served.kind == TEXT_KIND:
                    from ..generation.chat_templates import chat_template_for  # noqa: PLC0415

                    loaded = pipelines.load_llama(served.source)
                    try:
                        served.chat_template = chat_template_for(loaded.model, loaded.tokenizer)
                    except CandleError as error:
                        served.chat_template = error  # chat refused, completions still served
                elif served.kind == WHISPER_KIND:
                    loaded = pipelines.load_whisper(served.source)
                    served.worker = SerialWorker(name, self.queue_size)
                else:
                    from ..pipelines.embed import SentenceEmbedder  # noqa: PLC0415

                    loaded = pipelines.load_bert(served.source)
                    served.embedder = SentenceEmbedder(loaded.model, loaded.tokenizer)
                    served.worker = SerialWorker(name, self.queue_size)
            if served.kind == TEXT_KIND:
                served.scheduler = TextScheduler(name, loaded, self.compute, self.parallel,
                                                 self.queue_size, warm_up=self._warm_up_text)
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
