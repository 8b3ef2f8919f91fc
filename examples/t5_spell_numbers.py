"""Train a small T5 to spell out numbers ("spell out: 4821" -> "four thousand eight hundred
twenty-one") with candle_web's own autograd and AdamW, and save it as a Hugging Face model
folder: config.json, model.safetensors, tokenizer.json and a README.md model card.

    python examples/t5_spell_numbers.py --out DIR [--steps 800] [--if-missing] [--progress FILE]

A demo model for the Text-to-text view, which has no real T5 offline: a synthetic task, not a
language model. Everything is deterministic (fixed seeds): the numbers 0..9999 are split once
into a training set and a held-out test set never trained on; the script prints progress
(step, loss, elapsed) and the held-out exact-match accuracy of greedy decoding. With
--progress it also keeps FILE up to date as JSON (phase, step, steps, loss, ...) and removes it
at the end: `make demo` serves the demo page while this runs, and the page shows that progress.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import candle_web as cw
from candle_web import nn
from candle_web.generation import GenerationOptions
from candle_web.models.t5 import T5Config
from candle_web.models.t5_training import sequence_cross_entropy, trainable_t5
from candle_web.tokenizers import Tokenizer

TASK_PREFIX = "spell out: "
MAX_NUMBER = 9999
HELD_OUT = 1000  # numbers never trained on, drawn once from 0..MAX_NUMBER with SPLIT_SEED
SPLIT_SEED = 2024
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "README.md")
MAX_NEW_TOKENS = 16  # the longest spelling ("seven thousand seven hundred seventy-seven") is 8

# -- the task -------------------------------------------------------------------------------
UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def spell_out(number: int) -> str:
    """American English words for 0 <= number <= 999_999, hyphenating 21..99 ("twenty-one")."""
    if not 0 <= number < 1_000_000:
        raise cw.CandleError(f"spell_out: number must be in 0..999999, got {number}")
    if number < 20:
        return UNITS[number]
    if number < 100:
        tens, unit = divmod(number, 10)
        return TENS[tens] + (f"-{UNITS[unit]}" if unit else "")
    big, rest, word = (number // 100, number % 100, "hundred") if number < 1000 else (
        number // 1000, number % 1000, "thousand")
    return f"{spell_out(big)} {word}" + (f" {spell_out(rest)}" if rest else "")


def split_numbers(seed: int = SPLIT_SEED) -> tuple:
    """(train, held_out): sorted arrays partitioning 0..MAX_NUMBER."""
    order = np.random.default_rng(seed).permutation(MAX_NUMBER + 1)
    return np.sort(order[HELD_OUT:]), np.sort(order[:HELD_OUT])


# -- the tokenizer --------------------------------------------------------------------------
# T5's pipeline (NFKC, WhitespaceSplit + Metaspace "▁", "$A </s>", <pad>=0 </s>=1 <unk>=2)
# over a hand-made Unigram vocabulary: whole words score higher than any spelling of them in
# letters, so each number word is one piece; digits are single pieces so every number splits
# into its digits; "-" joins "twenty" and "one" ("▁twenty", "-", "one"). Lowercased, so
# "Spell out: 12" works too. Letters keep other words out of <unk>.
SPECIAL_PIECES = ["<pad>", "</s>", "<unk>"]
WORD_SCORE, SYMBOL_SCORE, LETTER_SCORE = -3.0, -4.0, -8.0
METASPACE = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
             "split": True}


def vocabulary() -> list:
    words = ["spell", "out"] + UNITS + TENS[2:] + ["hundred", "thousand"]
    pieces = [[piece, 0.0] for piece in SPECIAL_PIECES]
    pieces += [["\u2581" + word, WORD_SCORE] for word in words]
    pieces += [[word, WORD_SCORE] for word in UNITS[1:10]]  # after a hyphen
    pieces += [[symbol, SYMBOL_SCORE] for symbol in ["\u2581", "-", ":"] + list("0123456789")]
    pieces += [[letter, LETTER_SCORE] for letter in "abcdefghijklmnopqrstuvwxyz"]
    return pieces


def tokenizer_json() -> dict:
    added = [{"id": index, "content": piece, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for index, piece in enumerate(SPECIAL_PIECES)]
    eos = {"SpecialToken": {"id": "</s>", "type_id": 0}}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKC"}, {"type": "Lowercase"},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
        "pre_tokenizer": {"type": "Sequence",
                          "pretokenizers": [{"type": "WhitespaceSplit"}, METASPACE]},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}, eos],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, eos,
                     {"Sequence": {"id": "B", "type_id": 0}}, eos],
            "special_tokens": {"</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}},
        "decoder": METASPACE,
        "model": {"type": "Unigram", "unk_id": 2, "byte_fallback": False, "vocab": vocabulary()},
    }


# -- the model ------------------------------------------------------------------------------
def model_config(vocab_size: int) -> dict:
    """HF T5 config.json: t5-small's layout (ReLU FF, tied head), 2 + 2 layers of width 64."""
    return {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
        "vocab_size": vocab_size, "d_model": 64, "d_kv": 16, "num_heads": 4, "d_ff": 128,
        "num_layers": 2, "num_decoder_layers": 2, "feed_forward_proj": "relu",
        "tie_word_embeddings": True, "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-6,
        "dropout_rate": 0.0, "initializer_factor": 1.0, "n_positions": 512,
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
    }


def padded(rows: list, pad_id: int) -> tuple:
    """(ids [b, longest], mask [b, longest]) for ragged rows of ids."""
    longest = max(len(row) for row in rows)
    ids = np.full((len(rows), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), longest), dtype=np.int64)
    for index, row in enumerate(rows):
        ids[index, :len(row)] = row
        mask[index, :len(row)] = 1
    return ids, mask


class SpellingData:
    """Token ids of every prompt and target, encoded once."""

    def __init__(self, tokenizer: Tokenizer, config: T5Config):
        self.config = config
        numbers = range(MAX_NUMBER + 1)
        self.prompts = [tokenizer.encode(TASK_PREFIX + str(n)).ids for n in numbers]
        self.targets = [tokenizer.encode(spell_out(n)).ids for n in numbers]  # end in </s>

    def batch(self, numbers) -> tuple:
        """(input ids, input mask, decoder ids, labels, label mask): the decoder reads the
        start token then the target shifted right, and must predict the target."""
        pad, start = self.config.pad_token_id, self.config.decoder_start_token_id
        inputs, input_mask = padded([self.prompts[n] for n in numbers], pad)
        labels, label_mask = padded([self.targets[n] for n in numbers], pad)
        decoder_ids = np.concatenate([np.full((len(labels), 1), start), labels[:, :-1]], axis=1)
        return inputs, input_mask, decoder_ids, labels, label_mask


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then linear decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (1.0 - 0.9 * progress)


def train(steps: int = 800, batch_size: int = 128, peak_lr: float = 3e-3, seed: int = 0,
          log=print, log_every: int = 100, on_step=None):
    """(varmap, model, tokenizer, data, losses): a T5 trained on the training split.
    on_step(steps done, steps, loss, seconds) is called after every step."""
    cw.manual_seed(seed)
    tokenizer = Tokenizer.from_str(json.dumps(tokenizer_json()))
    config = T5Config.from_hf_config(model_config(tokenizer.get_vocab_size()))
    data = SpellingData(tokenizer, config)
    train_numbers, _ = split_numbers()
    varmap = nn.VarMap()
    model = trainable_t5(config, varmap)
    optimizer = nn.AdamW(varmap.all_vars(), nn.ParamsAdamW(lr=peak_lr))
    rng = np.random.default_rng(seed)
    warmup = max(1, min(100, steps // 10))
    losses, started = [], time.perf_counter()
    for step in range(steps):
        optimizer.set_learning_rate(learning_rate(step, steps, peak_lr, warmup))
        inputs, input_mask, decoder_ids, labels, label_mask = data.batch(
            rng.choice(train_numbers, batch_size, replace=False))
        loss = sequence_cross_entropy(model(inputs, decoder_ids, input_mask), labels, label_mask)
        optimizer.backward_step(loss)
        losses.append(loss.to_scalar())
        if on_step:
            on_step(step + 1, steps, losses[-1], time.perf_counter() - started)
        if log and (step % log_every == 0 or step == steps - 1):
            log(f"step {step + 1:5d}/{steps}  loss {losses[-1]:.4f}  "
                f"{time.perf_counter() - started:6.1f} s")
    return varmap, model, tokenizer, data, losses


def greedy_spellings(model, tokenizer, data: SpellingData, numbers, batch_size: int = 250,
                     on_batch=None) -> list:
    """Greedy outputs for `numbers` as (ids without the final </s>, text) pairs;
    on_batch(numbers done, len(numbers)) after each batch."""
    eos = model.config.eos_token_id
    outputs = []
    options = GenerationOptions(max_new_tokens=MAX_NEW_TOKENS)
    with cw.no_grad():
        for first in range(0, len(numbers), batch_size):
            chunk = numbers[first:first + batch_size]
            ids, mask = padded([data.prompts[n] for n in chunk], model.config.pad_token_id)
            for generated in model.generate(ids, mask, options):
                kept = generated[:-1] if generated and generated[-1] == eos else generated
                outputs.append((generated, tokenizer.decode(kept)))
            if on_batch:
                on_batch(len(outputs), len(numbers))
    return outputs


def exact_match(model, tokenizer, data: SpellingData, numbers, on_batch=None) -> float:
    outputs = greedy_spellings(model, tokenizer, data, numbers, on_batch=on_batch)
    return float(np.mean([text == spell_out(int(n)) for n, (_, text) in zip(numbers, outputs)]))


# -- saving ---------------------------------------------------------------------------------
MODEL_CARD = """# t5-spell-numbers (a candle-web demo model)

**A demo model on a synthetic task, not a language model.** It was trained from scratch by
candle-web's own autograd and AdamW (`examples/t5_spell_numbers.py`, fixed seeds) to do one
thing: spell out whole numbers from 0 to {max_number} in English words.

    spell out: 4821  ->  four thousand eight hundred twenty-one

- Architecture: t5-small's layout (ReLU feed-forward, tied head), {layers} + {layers} layers,
  d_model {d_model}, {params:,} parameters; a hand-made Unigram tokenizer of {vocab} pieces.
- Training: {steps} steps of {batch} examples from {n_train} numbers; {n_held_out} numbers
  were held out and never trained on.
- Held-out exact match (greedy decoding, whole output equal): **{accuracy:.1%}**
  ({correct} of {n_held_out}).

Anything but `spell out: <number>` gives meaningless output. Files: config.json,
model.safetensors and tokenizer.json in the Hugging Face T5 format (transformers'
`T5ForConditionalGeneration.from_pretrained` loads them).
"""


def save_model(out: Path, varmap, steps: int, batch_size: int, accuracy: float) -> int:
    """config.json, model.safetensors, tokenizer.json and the model card, written to a
    sibling folder first and renamed into place, so an interrupted run never leaves a folder
    that looks complete. Returns the number of parameters."""
    config = model_config(len(vocabulary()))
    params = sum(int(np.prod(var.dims())) for var in varmap.all_vars())
    card = {"max_number": MAX_NUMBER, "layers": config["num_layers"],
            "d_model": config["d_model"], "params": params, "vocab": config["vocab_size"],
            "steps": steps, "batch": batch_size, "n_train": MAX_NUMBER + 1 - HELD_OUT,
            "n_held_out": HELD_OUT, "accuracy": accuracy, "correct": round(accuracy * HELD_OUT)}
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a model folder is for reading
    try:
        varmap.save(staging / "model.safetensors")
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (staging / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False,
                                                           indent=1) + "\n")
        (staging / "README.md").write_text(MODEL_CARD.format(**card))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return params


class ProgressFile:
    """The run's progress as a small JSON file that another process (`candle-web serve`, for
    the demo page) may read at any moment: each version is written to a temporary file beside
    it and renamed over it, so a reader sees a whole version, never a half-written one."""

    # Often enough for a page that polls every few seconds, seldom enough to cost nothing.
    MIN_INTERVAL_S = 1.0

    def __init__(self, path: Path, model: str):
        self.path = Path(path).expanduser()
        self.model = model
        self.written_at = -float("inf")

    def update(self, force: bool = False, **fields) -> None:
        now = time.monotonic()
        if not force and now - self.written_at < self.MIN_INTERVAL_S:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{self.path.name}-", dir=self.path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump({"model": self.model, **fields}, out)
        os.chmod(temporary, 0o644)  # mkstemp makes it private; the server only reads it
        os.replace(temporary, self.path)
        self.written_at = now

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def is_complete(folder: Path) -> bool:
    return all((Path(folder).expanduser() / name).is_file() for name in MODEL_FILES)


def one_blas_thread():
    """The matmuls here are small: BLAS threads gain nothing, and on a shared machine spinning
    OpenBLAS threads slow each one down many times over. Limited when threadpoolctl exists."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _exit_on_sigterm(signum, frame):
    # SIGTERM (how `make demo` stops this run) would end Python without running `finally`:
    # exit normally instead, so no progress file or half-written staging folder is left behind.
    sys.exit(128 + signum)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="model folder to write")
    parser.add_argument("--steps", type=int, default=800, help="training steps (default 800)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--if-missing", action="store_true",
                        help="do nothing when --out already holds a complete model folder")
    parser.add_argument("--progress", type=Path, default=None, metavar="FILE",
                        help="keep FILE up to date with the run's progress as JSON (for the "
                             "demo page); removed once the model folder is in place")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        parser.error(f"--steps and --batch-size must be positive, got {args.steps} and "
                     f"{args.batch_size}")
    if args.if_missing and is_complete(args.out):
        print(f"{args.out}: already there (remove it to retrain)")
        return 0
    progress = ProgressFile(args.progress, args.out.name) if args.progress else None

    def report(force: bool = False, **fields) -> None:
        if progress:
            progress.update(force, steps=args.steps, seconds=time.perf_counter() - started,
                            **fields)

    started = time.perf_counter()
    try:
        report(True, phase="training", step=0)
        with one_blas_thread():
            varmap, model, tokenizer, data, _ = train(
                args.steps, args.batch_size, log=lambda line: print(line, flush=True),
                on_step=lambda step, steps, loss, seconds: report(
                    step == steps, phase="training", step=step, loss=loss))
            _, held_out = split_numbers()
            print(f"trained in {time.perf_counter() - started:.1f} s; greedy decoding of the "
                  f"{len(held_out)} held-out numbers...", flush=True)

            def evaluated(done: int, total: int) -> None:
                report(True, phase="evaluating", step=args.steps, checked=done, held_out=total)

            evaluated(0, len(held_out))
            accuracy = exact_match(model, tokenizer, data, held_out, on_batch=evaluated)
        params = save_model(args.out, varmap, args.steps, args.batch_size, accuracy)
    finally:
        # Only after save_model has renamed the folder into place: a reader that finds no
        # progress file then finds either the model or a run that failed.
        if progress:
            progress.remove()
    print(f"held-out exact match {accuracy:.4f} ({round(accuracy * HELD_OUT)}/{HELD_OUT}); saved "
          f"{args.out} ({params:,} parameters); {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(main())
