"""The text models' slots: a `TextScheduler` per LLaMA-family model (model_pool.py holds the
pool of models, serial_worker.py the one-at-a-time workers, fair_lock.py the lock all model
computation takes).

`parallel` slots, each a sequence with its own KV cache, and a bounded queue of waiting
requests beyond them (full: 429 with Retry-After; a request whose client left while it waited
does not count). One scheduler thread advances every active sequence by one token per round
(llama-server's slots: a request that arrives joins at the next round, one that ends or whose
client went away frees its slot at once). A round is one batched
decode step over every sequence that has a token to feed (`backend.batched_steps.
start_batched_causal_decoding`: each at its own position with its own cache, each weight read
once for all of them on the numba backend); the prompts of the requests admitted in a round run
first, together as the rows of shared steps where the steps split prompts exactly (else each
alone through `CausalLM.start`), each starting from the longest prefix the finished requests
left in the prefix pool (prefixes.py, one for the whole server). The batched steps give each row
the logits, bit for bit, that the single-sequence step gives it alone, and `sample_steps`
samples as for `candle-web generate`, so a request's greedy ids are those of `candle-web
generate`, whatever runs beside it.

The thread survives its failures: an error while one request starts or advances fails that
request alone (out of memory for its sampler, say); one anywhere else in a round (a bug) fails
every request of the round not yet answered; each gets OpenAI's error shape (507
`out_of_memory` for a MemoryError, 500 `internal_error` for anything else: errors.
internal_error, as the routes answer), and the next round goes on. A slot that leaves, however
it leaves, takes its KV caches with it (SlotLM swaps them into the model only for its calls).
Offering a finished request's caches to the prefix pool is best effort: the answer is out
already, so a failure there (out of memory while copying) only leaves them unkept.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..generation import (STOP_CONTEXT, STOP_EOS, STOP_MAX_TOKENS, STOP_STRING, CausalLM,
                          StopStringMatcher, TokenOutputStream, sample_steps)
from ..generation.grammar import grammar_row
from .errors import internal_error, rate_limited, server_stopping
from .fair_lock import FairLock
from .prefixes import PrefixPool
from .sampling_fields import token_logprobs

DEFAULT_PARALLEL = 4
DEFAULT_QUEUE = 16


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
    # None: no log-probabilities; else each "token" event carries "logprob" (api/
    # sampling_fields.token_logprobs of the logits it was sampled from, with this many top
    # alternatives).
    top_logprobs: int = None
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
    _answered: bool = False  # "done" or "error" emitted: nothing more goes to its client


class TextScheduler:
    def __init__(self, name: str, loaded, compute: FairLock, parallel: int = DEFAULT_PARALLEL,
                 queue_size: int = DEFAULT_QUEUE, warm_up=None, prefixes: PrefixPool = None):
        self.name, self.model, self.tokenizer = name, loaded.model, loaded.tokenizer
        self.compute, self.parallel, self.queue_size = compute, parallel, queue_size
        self.context_length = self.model.config.max_position_embeddings
        # One step function (the fused part or the model's forward) shared by every slot (a
        # slot swaps its own caches into the model before each call), and the batched step
        # (one token for every running sequence per round, each on its own caches): built,
        # and `warm_up(self)` run, by the scheduler thread before it serves (see _set_up).
        self.steps = self.batched = None
        # Finished requests' caches, reused by prompts that start with the same tokens, where
        # the steps split a prompt exactly (set in _set_up; see prefixes.py): the server's one
        # pool, shared with its other text models, when the ModelPool passes it.
        self.prefixes = prefixes if prefixes is not None else PrefixPool()
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
        self.started_together = 0  # requests whose prompts ran in a shared pass
        self.finished = 0
        self.cancelled = 0
        self.tokens = 0
        self.reused_tokens = 0  # prompt tokens the prefix pool supplied
        self.failed_rounds = 0  # rounds that failed outside any one request's guard
        self.unkept_prefixes = 0  # finished requests whose caches could not be kept (_retire)
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
                raise server_stopping(self.name)
            # Requests whose clients left while they waited hold no place in the queue.
            gone = [waiting for waiting in self.waiting if waiting.cancelled]
            if gone:
                self.waiting = collections.deque(waiting for waiting in self.waiting
                                                 if not waiting.cancelled)
                self.cancelled += len(gone)
            if len(self.active) + len(self.waiting) >= self.parallel + self.queue_size:
                raise rate_limited(self.name)
            self.waiting.append(request)
            self._condition.notify()

    def load(self) -> dict:
        with self._condition:
            return {"active": len(self.active), "waiting": len(self.waiting),
                    "parallel": self.parallel, "queue": self.queue_size,
                    "finished": self.finished, "cancelled": self.cancelled,
                    "tokens": self.tokens, "reused_prompt_tokens": self.reused_tokens,
                    "failed_rounds": self.failed_rounds,
                    "unkept_prefixes": self.unkept_prefixes}

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
        from ..backend import batched_steps, parts  # noqa: PLC0415

        try:
            with self.compute:
                self.steps = parts.start_causal_decoding(self.model)
                self.batched = batched_steps.start_batched_causal_decoding(self.model)
                splits_exactly = getattr(self.steps, "splits_exactly", None)
                self._reuse_prefixes = bool(splits_exactly and splits_exactly())
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
            members = self._admit()
            if members is None:
                return
            try:
                self._round(members)
            except Exception as error:  # noqa: BLE001  (the thread must outlive any round)
                self._fail_round(members, error)
            self.rounds += 1

    def _admit(self):
        """The members of the next round (waiting requests moved into free slots), once
        there is work; None when stopping (every request then gets a 503)."""
        with self._condition:
            while not self._stopped and not self.active and not self.waiting:
                self._condition.wait()
            if self._stopped:
                for request in list(self.active) + list(self.waiting):
                    request.emit("error", server_stopping(self.name))
                return None
            while self.waiting and len(self.active) < self.parallel:
                request = self.waiting.popleft()
                if request.cancelled:
                    self.cancelled += 1
                else:
                    self.active.append(request)
            self.max_active_seen = max(self.max_active_seen, len(self.active))
            return list(self.active)

    def _round(self, members: list) -> None:
        self._step_batch(members)
        self._start_together(members)
        for request in members:
            finished = True
            try:
                if request._answered:  # failed earlier in this round
                    pass
                elif request.cancelled:
                    with self._condition:
                        self.cancelled += 1
                elif request._steps is None:
                    with self.compute:  # its prompt, alone; it joins the next batch
                        finished = self._advance(request)
                    self.finished += finished
                else:
                    finished = self._advance(request)
                    self.finished += finished
            except Exception as error:  # noqa: BLE001  (reported to that request only)
                self._fail(request, error)
            if finished:
                self._retire(request)
                with self._condition:
                    self.active.remove(request)

    def _fail(self, request: TextRequest, error: Exception) -> None:
        """Answer one request with the error (507 out of memory, 500 otherwise, unless it is
        an API refusal); its caches may be half-written, so they are not kept, and dropping
        its SlotLM gives their memory back."""
        if not request._answered:
            request._answered = True
            request.emit("error", internal_error(error))
        request._steps = request._lm = None

    def _fail_round(self, members: list, error: Exception) -> None:
        """A round failed outside any one request's guard: every member still in a slot is
        answered with the error and leaves it, so no client waits on a round that will not
        come."""
        self.failed_rounds += 1
        for request in members:
            with self._condition:
                if request not in self.active:
                    continue
                self.active.remove(request)
            self._fail(request, error)

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
        pool first: they hold its prompt, then the generated tokens fed back. The pool is a
        cache and the request is answered already: a failure to keep them (out of memory for
        the copy) leaves them unkept and fails nothing."""
        lm, request._steps, request._lm = request._lm, None, None
        if self._reuse_prefixes and lm is not None:
            try:
                self.prefixes.keep(self.name, list(request.prompt_ids) + request.generated,
                                   lm.caches)
            except Exception:  # noqa: BLE001  (best effort, see above)
                self.unkept_prefixes += 1

    def _prepare(self, request: TextRequest) -> int:
        """Its slot (a SlotLM on caches of its own, a kept prefix copied in) and text state;
        returns how many prompt positions the prefix pool supplied."""
        options, prompt_ids = request.options, request.prompt_ids
        lm = request._lm = SlotLM(self.model, self.steps, len(prompt_ids) + request.budget)
        request._eos = frozenset(options.eos_token_ids if options.eos_token_ids is not None
                                 else lm.eos_token_ids)
        request.reason = (STOP_MAX_TOKENS if request.budget == options.max_new_tokens
                          else STOP_CONTEXT)
        request._stream = TokenOutputStream(self.tokenizer)
        request._stops = StopStringMatcher(options.stop_strings)
        request._cached = (self.prefixes.restore(self.name, prompt_ids, lm.caches)
                           if self._reuse_prefixes and request.budget else 0)
        return request._cached

    def _begin(self, request: TextRequest, logits, seconds: float) -> None:
        request.emit("prompt", {"n_tokens": len(request.prompt_ids), "seconds": seconds})
        request._lm.sampled = logits
        # A request under a grammar (response_format, tools) samples from its own mask, row
        # by row, beside rows without one; the route compiled the grammar already.
        constraint = request.options.constraint
        grammars = None
        if constraint is not None and logits is not None:
            grammars = [grammar_row(self.tokenizer, constraint, logits.shape[-1], request._eos)]
        request._steps = sample_steps(request._lm, logits, request.options, request._eos,
                                      request.budget,
                                      [request._lm.penalty_context(request.prompt_ids)], grammars)
        self.reused_tokens += request._cached

    def _start(self, request: TextRequest) -> None:
        started = time.perf_counter()
        reused = self._prepare(request)
        logits = request._lm.start([request.prompt_ids], reused) if request.budget else None
        self._begin(request, logits, time.perf_counter() - started)

    def _start_together(self, requests: list) -> None:
        """The prompts of requests admitted in the same round as the rows of shared steps
        (the batched steps' `prompts`: each weight read once for all of them, each prompt's
        logits bit for bit its own alone), where the steps split prompts exactly. On any
        failure they are left unstarted, and each starts alone in the round's loop (which
        reports its own error)."""
        requests = [r for r in requests if r.budget and not r.cancelled and r._steps is None]
        if len(requests) < 2 or not self._reuse_prefixes \
                or not hasattr(self.batched, "prompts"):
            return
        started = time.perf_counter()
        try:
            with self.compute:
                rests, caches = [], []
                for request in requests:
                    reused = self._prepare(request)
                    rests.append(list(request.prompt_ids)[reused:])
                    caches.append(request._lm.caches)
                    request._lm.position = len(request.prompt_ids)
                logits = self.batched.prompts(rests, caches)
        except Exception:  # noqa: BLE001  (each request retries alone and reports its error)
            for request in requests:
                request._lm, request._cached = None, 0
            return
        seconds = time.perf_counter() - started
        self.started_together += len(requests)
        for row, request in enumerate(requests):
            try:
                self._begin(request, logits[row:row + 1], seconds)
            except Exception as error:  # noqa: BLE001  (that request fails, the others go on)
                self._fail(request, error)

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
        event = {"id": token, "text": text}
        if request.top_logprobs is not None:
            event["logprob"] = token_logprobs(request._lm.sampled[0], token,
                                              request.top_logprobs)
        request.emit("token", event)
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
        request._answered = True
        request.emit("done", {"reason": request.reason, "token_ids": list(request.generated),
                              "prompt_tokens": len(request.prompt_ids),
                              "cached_tokens": request._cached})
        return True


class SlotLM(CausalLM):
    """generation.CausalLM over one slot's own KV cache: the model's caches are swapped in
    for each call and swapped out after it (only the scheduler thread, holding the compute
    lock, calls it). Between calls the model holds its own idle caches, never a slot's: a
    slot that leaves (finished, failed half-way through its prompt, cancelled, never
    started) is referenced by nothing but its request, so its memory goes with it; before,
    the model kept the last slot's caches until the next request replaced them (an 8192-
    position cache that ran out of memory left 294 MiB held by an idle server). A step whose
    logits the scheduler's batched step already computed (`pending`, for `last_token`)
    returns them."""

    def __init__(self, model, steps, capacity: int):  # noqa: super().__init__ would build steps
        self.model = model
        self.eos_token_ids = tuple(model.config.eos_token_ids)
        self.context_length = model.config.max_position_embeddings
        self.position = 0
        self.steps = steps
        self.pending = None  # logits [1, vocab] of the batched step for last_token
        self.last_token = None
        self.sampled = None  # the logits [1, vocab] the latest token was sampled from
        idle = model.caches
        model.clear_kv_cache(capacity)  # the model's own way to make its caches
        self.caches, model.caches = model.caches, idle

    @contextlib.contextmanager
    def _swapped_in(self):
        model = self.model
        idle, model.caches = model.caches, self.caches
        try:
            yield
        finally:
            model.caches = idle

    def start(self, prompts, reused: int = 0):
        """The prompt's logits; its first `reused` positions are already in the caches."""
        with self._swapped_in():
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
            self.sampled = logits
            return logits
        with self._swapped_in():
            self.sampled = super().step(ids)
            return self.sampled
