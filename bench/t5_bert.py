"""Sentence embeddings (BERT) and T5 generation, candle-web next to PyTorch (transformers), in
one run, printed with ratios.

    .venv/bin/python bench/t5_bert.py [--sentences 64] [--t5 DIR] [--new-tokens 32] [--repeats 3]

* Embeddings: the registry's all-MiniLM-L6-v2 (real weights) on a varied list of sentences;
  candle-web's SentenceEmbedder against transformers AutoModel + mean pooling + normalisation,
  both batched (32) with padding to the longest in the batch. Reported: sentences/s.
* T5: greedy generation of exactly --new-tokens tokens (eos suppressed on both sides) from one
  prompt, with the encoder pass included. Without --t5 the model is a seeded random T5 with
  t5-small's shape (d_model 512, 6+6 layers, 8 heads, d_ff 2048, vocab 32128; the speed of a
  model does not depend on its weight values); --t5 DIR uses a real folder (config.json +
  model.safetensors). Reported: generated tokens/s.
Medians of --repeats runs after one warm-up. Threads: both sides use the same BLAS/torch
thread count (set OPENBLAS_NUM_THREADS and --threads to compare single-threaded).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "pkg")]

BERT_MODEL = "all-minilm-l6-v2"
T5_SMALL_SHAPE = {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6,
                  "num_heads": 8, "relative_attention_num_buckets": 32,
                  "relative_attention_max_distance": 128, "feed_forward_proj": "relu",
                  "layer_norm_epsilon": 1e-6, "tie_word_embeddings": True, "pad_token_id": 0,
                  "eos_token_id": 1, "decoder_start_token_id": 0, "model_type": "t5",
                  "architectures": ["T5ForConditionalGeneration"], "dropout_rate": 0.0}
SENTENCE_PARTS = ["A man is eating food.", "The quick brown fox jumps over the lazy dog.",
                  "Sentence embeddings map text to vectors that can be compared by cosine.",
                  "Il fait beau aujourd'hui.", "Numbers like 3.14159 and 2,718 appear too.",
                  "A long sentence about the committee that reviewed every clause of the agreement "
                  "before the vote, which took place late in the evening after a long debate."]


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def sentences(n: int) -> list:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(SENTENCE_PARTS, size=int(rng.integers(1, 4)))) for _ in range(n)]


def bench_embeddings(n: int, repeats: int) -> dict:
    import torch
    from transformers import AutoModel

    from candle_web.pipelines import load_bert, model_folder
    from candle_web.pipelines.embed import SentenceEmbedder

    texts = sentences(n)
    loaded = load_bert(BERT_MODEL)
    embedder = SentenceEmbedder(loaded.model, loaded.tokenizer)
    ours = median_seconds(lambda: embedder.embed(texts, batch_size=32), repeats)

    folder = model_folder(BERT_MODEL)
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    model = AutoModel.from_pretrained(str(folder)).eval()

    def torch_embed():
        encodings = [tokenizer.encode(text) for text in texts]
        out = []
        for start in range(0, len(encodings), 32):
            batch = encodings[start:start + 32]
            width = max(len(e.ids) for e in batch)
            ids = torch.tensor([e.ids + [0] * (width - len(e.ids)) for e in batch])
            mask = torch.tensor([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in batch])
            with torch.no_grad():
                hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).float()
            mean = (hidden * weights).sum(1) / weights.sum(1)
            out.append(torch.nn.functional.normalize(mean, dim=1))
        return torch.cat(out).numpy()

    theirs = median_seconds(torch_embed, repeats)
    agreement = float(np.min(np.sum(embedder.embed(texts).vectors * torch_embed(), axis=1)))
    return {"sentences": n, "candle_web_per_s": n / ours, "torch_per_s": n / theirs,
            "min_cosine_between_the_two": agreement}


def random_t5_folder(folder: Path) -> Path:
    from candle_web.io.safetensors import save

    cfg = T5_SMALL_SHAPE
    rng = np.random.default_rng(0)
    d, inner, d_ff = cfg["d_model"], cfg["num_heads"] * cfg["d_kv"], cfg["d_ff"]
    weights = {"shared.weight": rng.standard_normal((cfg["vocab_size"], d), np.float32)}

    def normal(name, shape):
        weights[name] = (rng.standard_normal(shape, np.float32) * shape[1] ** -0.5)

    for stack, ff_layer in (("encoder", 1), ("decoder", 2)):
        for i in range(cfg["num_layers"]):
            p = f"{stack}.block.{i}.layer"
            attentions = ["0.SelfAttention"] + (["1.EncDecAttention"] if stack == "decoder" else [])
            for attn in attentions:
                for proj in "qkv":
                    normal(f"{p}.{attn}.{proj}.weight", (inner, d))
                normal(f"{p}.{attn}.o.weight", (d, inner))
            if i == 0:
                weights[f"{p}.0.SelfAttention.relative_attention_bias.weight"] = rng.standard_normal(
                    (cfg["relative_attention_num_buckets"], cfg["num_heads"]), np.float32)
            for layer in range(ff_layer + 1):
                weights[f"{p}.{layer}.layer_norm.weight"] = np.ones(d, np.float32)
            normal(f"{p}.{ff_layer}.DenseReluDense.wi.weight", (d_ff, d))
            normal(f"{p}.{ff_layer}.DenseReluDense.wo.weight", (d, d_ff))
        weights[f"{stack}.final_layer_norm.weight"] = np.ones(d, np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save(weights, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def bench_t5(folder: Path, new_tokens: int, repeats: int) -> dict:
    import torch
    from transformers import T5ForConditionalGeneration

    from candle_web.generation import GenerationOptions
    from candle_web.models import t5

    prompt = [[100 + i for i in range(24)] + [1]]  # a 25-token input
    model = t5.T5ForConditionalGeneration.from_pretrained(folder)
    options = GenerationOptions(max_new_tokens=new_tokens, eos_token_ids=())
    ours_ids = []
    ours = median_seconds(lambda: ours_ids.append(model.generate(prompt, options=options)[0]), repeats)

    hf = T5ForConditionalGeneration.from_pretrained(str(folder)).eval()
    hf_ids = []

    def torch_generate():
        with torch.no_grad():
            out = hf.generate(input_ids=torch.tensor(prompt), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, num_beams=1)
        hf_ids.append(out[0, 1:].tolist())

    theirs = median_seconds(torch_generate, repeats)
    return {"new_tokens": new_tokens, "candle_web_tok_per_s": new_tokens / ours,
            "torch_tok_per_s": new_tokens / theirs, "same_tokens": ours_ids[-1] == hf_ids[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--t5", type=Path, default=None, help="a T5 folder (default: random t5-small shape)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    emb = bench_embeddings(args.sentences, args.repeats)
    print(f"embeddings ({emb['sentences']} sentences, all-MiniLM-L6-v2): candle-web "
          f"{emb['candle_web_per_s']:.1f}/s, torch {emb['torch_per_s']:.1f}/s, ratio "
          f"{emb['candle_web_per_s'] / emb['torch_per_s']:.2f}x "
          f"(min cosine between the two: {emb['min_cosine_between_the_two']:.6f})")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.t5 or random_t5_folder(Path(tmp) / "t5-small-shape")
        gen = bench_t5(folder, args.new_tokens, args.repeats)
    print(f"T5 greedy ({gen['new_tokens']} tokens, {'random t5-small shape' if args.t5 is None else folder}): "
          f"candle-web {gen['candle_web_tok_per_s']:.1f} tok/s, torch {gen['torch_tok_per_s']:.1f} tok/s, "
          f"ratio {gen['candle_web_tok_per_s'] / gen['torch_tok_per_s']:.2f}x "
          f"(same tokens: {gen['same_tokens']})")


if __name__ == "__main__":
    main()
