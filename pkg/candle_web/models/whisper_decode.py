"""Whisper decoding of one 30 s window: the tokenizer's special tokens, decoding options,
prompts, logit filters (blank and token suppression, timestamp rules), greedy and beam search,
and language detection. Long-form transcription (seeking through a recording's windows,
temperature fallback, segments, VAD) is pipelines/transcribe.py, which calls `WindowDecoder`.

The algorithm follows openai-whisper's published behaviour (the reference the tests record
token ids from): the same initial tokens, suppression rules, timestamp rules, fallback
thresholds and segment splitting, so greedy output is token-identical.

One callback hook serves progress, streaming and cancellation: `on_event(kind, payload)`
receives ("token", {...}) here, and ("window", {...}), ("segment", {...}) from the long-form
loop; raising `Cancelled` (or returning False from `should_continue`) stops between steps.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from ..generation import option_limits as limits
from ..core.errors import CandleError, InvalidOption, UnsupportedError
from ..core.tensor import Tensor

TIME_PRECISION = 0.02  # seconds per timestamp token: 30 s / 1500 encoder positions
INPUT_STRIDE = 2  # mel frames per encoder position
TASKS = ("transcribe", "translate")
F32_BYTES = 4


def beam_state_bytes(config) -> int:
    """Decoder state one beam (or best_of sample) holds, in bytes: its copy of the audio
    features [1500, d], every block's cross-attention keys and values (2 x [1500, d]) and its
    self-attention cache at the full text context (2 x [448, d]), all float32."""
    d, layers = config.d_model, config.n_text_layer
    features = config.n_audio_ctx * d
    cross = layers * 2 * config.n_audio_ctx * d
    cache = layers * 2 * config.n_text_ctx * d
    return F32_BYTES * (features + cross + cache)


def check_decoder_rows(config, rows: int, name: str = "beam_size") -> None:
    """Refuse `rows` parallel decoder rows (beams or samples) whose state would not fit in the
    memory budget (option_limits.memory_budget_bytes), before any of it is allocated."""
    per_row = beam_state_bytes(config)
    budget = limits.memory_budget_bytes()
    if rows * per_row > budget:
        raise InvalidOption(f"{name} {rows} needs ~{rows * per_row / 1e9:.1f} GB of decoder state "
                            f"({per_row / 1e6:.0f} MB per row for this model); at most "
                            f"{max(budget // per_row, 1)} fit in the {budget / 1e9:.1f} GB this "
                            f"machine allows for it")


class WhisperTokenizer:
    """Special-token ids of a Whisper tokenizer.json, looked up by name (never hard-coded)."""

    def __init__(self, tokenizer, multilingual: bool, language: str = None, task: str = "transcribe"):
        self.tokenizer = tokenizer
        self.multilingual = multilingual

        def special(name, required=True):
            token_id = tokenizer.token_to_id(name)
            if token_id is None and required:
                raise CandleError(f"whisper tokenizer has no {name} token")
            return token_id

        self.eot = special("<|endoftext|>")
        self.sot = special("<|startoftranscript|>")
        self.translate = special("<|translate|>")
        self.transcribe = special("<|transcribe|>")
        self.sot_lm = special("<|startoflm|>")
        self.sot_prev = special("<|startofprev|>")
        self.no_timestamps = special("<|notimestamps|>")
        self.no_speech = special("<|nospeech|>", False)
        if self.no_speech is None:
            self.no_speech = special("<|nocaptions|>", False)
        self.timestamp_begin = self.no_timestamps + 1
        # Language tokens sit between <|startoftranscript|> and <|translate|>.
        self.language_tokens = {}
        for token_id in range(self.sot + 1, self.translate):
            token = tokenizer.id_to_token(token_id)
            if token and token.startswith("<|") and token.endswith("|>"):
                self.language_tokens[token[2:-2]] = token_id
        if language is not None and multilingual and language not in self.language_tokens:
            raise CandleError(f"unknown language {language!r}; known: {sorted(self.language_tokens)}")
        if task not in ("transcribe", "translate"):
            raise CandleError(f"task must be 'transcribe' or 'translate', got {task!r}")
        self.language = language
        self.task = task

    def with_language(self, language: str) -> "WhisperTokenizer":
        return WhisperTokenizer(self.tokenizer, self.multilingual, language, self.task)

    @property
    def sot_sequence(self) -> list:
        sequence = [self.sot]
        if self.multilingual:
            sequence.append(self.language_tokens[self.language or "en"])
            sequence.append(self.transcribe if self.task == "transcribe" else self.translate)
        return sequence

    def encode(self, text: str) -> list:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids if int(i) < self.eot], skip_special_tokens=True)

    def non_speech_tokens(self) -> list:
        """Tokens for symbols that are not speech (brackets, music notes...), which Whisper
        suppresses so that it does not transcribe them; single-token spellings only, plus the
        leading-space variants, keeping the dash and quote prefixes that start words."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
        miscellaneous = set("♩♪♫♬♭♮♯")
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + sorted(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in miscellaneous:
                    result.add(tokens[0])
        return sorted(result)


@dataclass(frozen=True)
class DecodingOptions:
    task: str = "transcribe"
    language: str = None
    temperature: float = 0.0
    sample_len: int = None  # default: half the text context
    best_of: int = None  # independent samples when temperature > 0
    beam_size: int = None  # None = greedy
    patience: float = None
    length_penalty: float = None
    prompt: object = None  # str or token ids of previous text
    prefix: object = None
    suppress_tokens: object = "-1"  # "-1" = non-speech symbols + the model config's list
    suppress_blank: bool = True
    without_timestamps: bool = False
    max_initial_timestamp: float = 1.0
    seed: int = 0  # for sampling at temperature > 0

    def __post_init__(self):
        limits.BEAM_SIZE.check(self.beam_size, "beam_size", optional=True)
        limits.BEST_OF.check(self.best_of, "best_of", optional=True)
        limits.PATIENCE.check(self.patience, "patience", optional=True)
        limits.TEMPERATURE.check(self.temperature, "temperature")
        limits.SEED.check(self.seed, "seed")


@dataclass
class DecodingResult:
    tokens: list
    text: str
    language: str
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    sum_logprob: float = 0.0


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


# -- logit filters (numpy, on [n, vocab] float32 logits; modified in place) ----------------
class SuppressBlank:
    def __init__(self, tokenizer: WhisperTokenizer, sample_begin: int):
        self.ids = tokenizer.encode(" ") + [tokenizer.eot]
        self.sample_begin = sample_begin

    def apply(self, logits, tokens):
        if tokens.shape[1] == self.sample_begin:
            logits[:, self.ids] = -np.inf


class SuppressTokens:
    def __init__(self, ids):
        self.ids = list(ids)

    def apply(self, logits, tokens):
        logits[:, self.ids] = -np.inf


class ApplyTimestampRules:
    """Timestamps come in pairs (end, next start) and never go backwards; the first token is
    a timestamp no later than `max_initial_timestamp`; when the total probability of all
    timestamps beats every single text token, a timestamp must come next."""

    def __init__(self, tokenizer: WhisperTokenizer, sample_begin: int, max_initial_index):
        self.tk = tokenizer
        self.sample_begin = sample_begin
        self.max_initial_index = max_initial_index

    def apply(self, logits, tokens):
        begin = self.tk.timestamp_begin
        logits[:, self.tk.no_timestamps] = -np.inf
        for k in range(tokens.shape[0]):
            sampled = tokens[k, self.sample_begin:]
            seq = [int(t) for t in sampled]
            last_was_ts = len(seq) >= 1 and seq[-1] >= begin
            penultimate_was_ts = len(seq) < 2 or seq[-2] >= begin
            if last_was_ts:
                if penultimate_was_ts:  # a pair just closed: text must follow
                    logits[k, begin:] = -np.inf
                else:  # a lone timestamp closes with another timestamp or ends with EOT
                    logits[k, :self.tk.eot] = -np.inf
            stamps = sampled[sampled >= begin]
            if stamps.size:
                # timestamps never decrease; after a lone one, it may repeat to close a pair
                last = int(stamps[-1]) if (last_was_ts and not penultimate_was_ts) else int(stamps[-1]) + 1
                logits[k, begin:last] = -np.inf
        if tokens.shape[1] == self.sample_begin:
            logits[:, :begin] = -np.inf
            if self.max_initial_index is not None:
                logits[:, begin + self.max_initial_index + 1:] = -np.inf
        logprobs = _log_softmax(logits)
        for k in range(tokens.shape[0]):
            timestamp_logprob = _logsumexp(logprobs[k, begin:])
            max_text_logprob = np.max(logprobs[k, :begin])
            if timestamp_logprob > max_text_logprob:
                logits[k, :begin] = -np.inf


def _log_softmax(logits):
    finite_max = np.max(logits, axis=-1, keepdims=True)
    shifted = logits - finite_max
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def _logsumexp(values):
    peak = np.max(values)
    if not np.isfinite(peak):
        return peak
    return peak + np.log(np.sum(np.exp(values - peak)))


# -- decoders --------------------------------------------------------------------------------
class GreedyDecoder:
    def __init__(self, temperature: float, eot: int, rng):
        self.temperature, self.eot, self.rng = temperature, eot, rng

    def update(self, tokens, logits, sum_logprobs):
        if self.temperature == 0:
            next_tokens = np.argmax(logits, axis=-1)
        else:
            probs = np.exp(_log_softmax(logits / self.temperature))
            next_tokens = np.array([self.rng.choice(len(p), p=p / p.sum()) for p in probs])
        logprobs = _log_softmax(logits)
        current = logprobs[np.arange(len(next_tokens)), next_tokens]
        finished = tokens[:, -1] == self.eot
        sum_logprobs += np.where(finished, 0.0, current)
        next_tokens = np.where(finished, self.eot, next_tokens)
        tokens = np.concatenate([tokens, next_tokens[:, None]], axis=1)
        return tokens, bool(np.all(tokens[:, -1] == self.eot)), None

    def finalize(self, tokens, sum_logprobs):
        tokens = np.concatenate([tokens, np.full((tokens.shape[0], 1), self.eot)], axis=1)
        return [[list(row)] for row in tokens], [[float(s)] for s in sum_logprobs]


class BeamSearchDecoder:
    """Beam search with patience over `beam_size` beams per audio; rows are reordered (and
    the KV caches with them) through the returned source indices."""

    def __init__(self, beam_size: int, eot: int, patience: float = None):
        self.beam_size = beam_size
        self.eot = eot
        self.patience = patience or 1.0
        self.max_candidates = round(beam_size * self.patience)
        self.finished = None
        if self.max_candidates <= 0:
            raise CandleError(f"beam search: patience {patience} gives no candidates")

    def update(self, tokens, logits, sum_logprobs):
        n_audio = tokens.shape[0] // self.beam_size
        if self.finished is None:
            self.finished = [{} for _ in range(n_audio)]
        logprobs = _log_softmax(logits)
        next_tokens, sources, newly_finished = [], [], []
        new_sums = np.zeros_like(sum_logprobs)
        for i in range(n_audio):
            scores, origin = {}, {}
            for j in range(self.beam_size):
                row = i * self.beam_size + j
                prefix = [int(t) for t in tokens[row]]
                top = np.argsort(-logprobs[row], kind="stable")[:self.beam_size + 1]
                for token in top:
                    sequence = tuple(prefix + [int(token)])
                    scores[sequence] = float(sum_logprobs[row] + logprobs[row, token])
                    origin[sequence] = row
            saved = 0
            finished = {}
            for sequence in sorted(scores, key=scores.get, reverse=True):
                if sequence[-1] == self.eot:
                    finished[sequence] = scores[sequence]
                else:
                    new_sums[len(next_tokens)] = scores[sequence]
                    next_tokens.append(sequence)
                    sources.append(origin[sequence])
                    saved += 1
                    if saved == self.beam_size:
                        break
            newly_finished.append(finished)
        sum_logprobs[:] = new_sums
        for previous, new in zip(self.finished, newly_finished):
            for sequence in sorted(new, key=new.get, reverse=True):
                if len(previous) >= self.max_candidates:
                    break
                previous[sequence] = new[sequence]
        completed = all(len(found) >= self.max_candidates for found in self.finished)
        return np.array(next_tokens), completed, sources

    def finalize(self, tokens, sum_logprobs):
        n_audio = tokens.shape[0] // self.beam_size
        if self.finished is None:
            self.finished = [{} for _ in range(n_audio)]
        sums = sum_logprobs.reshape(n_audio, self.beam_size)
        rows = tokens.reshape(n_audio, self.beam_size, -1)
        for i, found in enumerate(self.finished):
            if len(found) < self.beam_size:  # not enough finished: take the best unfinished
                for j in np.argsort(-sums[i], kind="stable"):
                    found[tuple(int(t) for t in rows[i, j]) + (self.eot,)] = float(sums[i, j])
                    if len(found) >= self.beam_size:
                        break
        return ([[list(s) for s in found] for found in self.finished],
                [list(found.values()) for found in self.finished])


def _rank(sequences, sum_logprobs, length_penalty):
    """Index of the best sequence by length-normalised log probability."""
    best, best_score = 0, -np.inf
    for i, (tokens, logprob) in enumerate(zip(sequences, sum_logprobs)):
        length = len(tokens)
        penalty = length if length_penalty is None else ((5 + length) / 6) ** length_penalty
        score = logprob / penalty
        if score > best_score:
            best, best_score = i, score
    return best


# -- one 30 s window ---------------------------------------------------------------------
class WindowDecoder:
    def __init__(self, model, tokenizer: WhisperTokenizer, options: DecodingOptions,
                 on_event=None):
        self.model = model
        self.tk = tokenizer
        self.options = options
        self.on_event = on_event
        n_ctx = model.config.n_text_ctx
        self.sample_len = options.sample_len or n_ctx // 2
        self.initial_tokens = self._initial_tokens(n_ctx)
        self.sample_begin = len(self.initial_tokens)
        self.sot_index = self.initial_tokens.index(tokenizer.sot)
        self.filters = self._filters()
        check_decoder_rows(model.config, options.beam_size or options.best_of or 1,
                           "beam_size" if options.beam_size else "best_of")
        if options.beam_size is not None and options.best_of is not None:
            raise UnsupportedError("beam_size and best_of cannot be combined")
        if options.temperature == 0 and options.best_of is not None:
            raise UnsupportedError("best_of applies to sampling (temperature > 0) only")

    def _initial_tokens(self, n_ctx):
        tokens = list(self.tk.sot_sequence)
        if self.options.without_timestamps:
            tokens.append(self.tk.no_timestamps)
        if self.options.prefix:
            prefix = self.options.prefix
            prefix_tokens = self.tk.encode(" " + prefix.strip()) if isinstance(prefix, str) else list(prefix)
            max_prefix_len = n_ctx // 2 - self.sample_len
            if max_prefix_len > 0:  # with the default sample_len the whole prefix is kept
                prefix_tokens = prefix_tokens[-max_prefix_len:]
            tokens = tokens + prefix_tokens
        if self.options.prompt:
            prompt = self.options.prompt
            prompt_tokens = self.tk.encode(" " + prompt.strip()) if isinstance(prompt, str) else list(prompt)
            tokens = [self.tk.sot_prev] + prompt_tokens[-(n_ctx // 2 - 1):] + tokens
        return tokens

    def _suppress_ids(self):
        spec = self.options.suppress_tokens
        if spec is None or spec == "":
            return []
        ids = _suppress_list(spec, self.model.config.n_vocab)
        if -1 in ids:
            ids = [t for t in ids if t >= 0]
            ids.extend(self.tk.non_speech_tokens())
            ids.extend(self.model.config.suppress_tokens)
        ids.extend([self.tk.transcribe, self.tk.translate, self.tk.sot, self.tk.sot_prev, self.tk.sot_lm])
        if self.tk.no_speech is not None:
            ids.append(self.tk.no_speech)
        return sorted(set(ids))

    def _filters(self):
        filters = []
        if self.options.suppress_blank:
            filters.append(SuppressBlank(self.tk, self.sample_begin))
        suppress = self._suppress_ids()
        if suppress:
            filters.append(SuppressTokens(suppress))
        if not self.options.without_timestamps:
            max_initial = None
            if self.options.max_initial_timestamp:
                max_initial = round(self.options.max_initial_timestamp / TIME_PRECISION)
            filters.append(ApplyTimestampRules(self.tk, self.sample_begin, max_initial))
        return filters

    def run(self, audio_features: Tensor) -> DecodingResult:
        """Decode one window's audio features [1, 1500, d] to the best token sequence."""
        opts = self.options
        if opts.beam_size is not None:
            n_group = opts.beam_size
        elif opts.temperature > 0 and opts.best_of:
            n_group = opts.best_of
        else:
            n_group = 1
        if n_group > 1:
            audio_features = audio_features.broadcast_as((n_group,) + audio_features.dims()[1:]).contiguous()
        rng = np.random.default_rng(opts.seed)
        if opts.beam_size is not None:
            decoder = BeamSearchDecoder(opts.beam_size, self.tk.eot, opts.patience)
        else:
            decoder = GreedyDecoder(opts.temperature, self.tk.eot, rng)
        state = self.model.start_decoding(audio_features)
        tokens = np.tile(np.array(self.initial_tokens, dtype=np.int64), (n_group, 1))
        sum_logprobs = np.zeros(n_group)
        no_speech_prob = float("nan")
        new_tokens = tokens
        for step in range(self.sample_len):
            # Only the rows read below: the last position and, at the first step, the one
            # after <|startoftranscript|> (no-speech probability).
            positions = None
            if new_tokens.shape[1] > 1:
                positions = sorted({self.sot_index, new_tokens.shape[1] - 1})
            logits = self.model.logits(Tensor.from_numpy(new_tokens, device=self.model.device), state,
                                       positions).to_numpy()
            if step == 0 and self.tk.no_speech is not None:
                sot_row = self.sot_index if positions is None else positions.index(self.sot_index)
                at_sot = logits[0, sot_row].astype(np.float64)
                probs = np.exp(at_sot - at_sot.max())
                no_speech_prob = float(probs[self.tk.no_speech] / probs.sum())
            logits = np.array(logits[:, -1], dtype=np.float32)
            for f in self.filters:
                f.apply(logits, tokens)
            tokens, completed, sources = decoder.update(tokens, logits, sum_logprobs)
            if sources is not None and list(sources) != list(range(len(sources))):
                state.reorder(sources)
            if self.on_event is not None:
                self.on_event("token", {"step": step, "token": int(tokens[0, -1])})
            if completed or tokens.shape[-1] > self.model.config.n_text_ctx:
                break
            new_tokens = tokens[:, -1:]
        candidates, scores = decoder.finalize(tokens, sum_logprobs)
        sequences = [list(s[self.sample_begin:]) for s in candidates[0]]
        sequences = [s[:s.index(self.tk.eot)] if self.tk.eot in s else s for s in sequences]
        best = _rank(sequences, scores[0], opts.length_penalty)
        chosen = [int(t) for t in sequences[best]]
        text = self.tk.decode(chosen)
        return DecodingResult(
            tokens=chosen, text=text, language=self.tk.language or "en",
            avg_logprob=scores[0][best] / (len(chosen) + 1), no_speech_prob=no_speech_prob,
            temperature=opts.temperature, compression_ratio=compression_ratio(text),
            sum_logprob=scores[0][best])


def _suppress_list(spec, n_vocab: int) -> list:
    """suppress_tokens as ids: "-1" (the defaults), "1,2,3" or a list; ids outside the
    vocabulary raise InvalidOption (numpy would raise IndexError in the filter)."""
    try:
        ids = [int(t) for t in spec.split(",")] if isinstance(spec, str) else [int(t) for t in spec]
    except (TypeError, ValueError):
        raise InvalidOption(f"suppress_tokens must be -1 or token ids in 0..{n_vocab - 1} "
                            f"(a list or a comma-separated string), got {spec!r}") from None
    bad = [t for t in ids if t != -1 and not 0 <= t < n_vocab]
    if bad:
        raise InvalidOption(f"suppress_tokens must be -1 or token ids in 0..{n_vocab - 1}, "
                            f"got {bad[0]}")
    return ids


def detect_language(model, tokenizer: WhisperTokenizer, audio_features: Tensor) -> dict:
    """Probabilities of each language from the logits after <|startoftranscript|>."""
    if not tokenizer.language_tokens:
        raise UnsupportedError("this Whisper model is English-only: no language tokens")
    state = model.start_decoding(audio_features)
    logits = model.logits(Tensor.from_numpy(np.array([[tokenizer.sot]], dtype=np.int64), device=model.device), state).to_numpy()[0, 0]
    codes = list(tokenizer.language_tokens)
    ids = [tokenizer.language_tokens[c] for c in codes]
    chosen = logits[ids].astype(np.float64)
    probs = np.exp(chosen - chosen.max())
    probs /= probs.sum()
    return dict(zip(codes, probs.tolist()))
