"""Record reference T5 outputs with transformers (PyTorch), for tests/models/test_t5*.py.

    .venv/bin/python tests/reference/record_t5.py [--out tests/reference/t5_reference.json]
    .venv/bin/python tests/reference/record_t5.py --tokenizer   # retrain t5_tokenizer.json

No T5 weights can be downloaded here, so the models are small random ones in the two layouts
that matter: "v1_0" (t5-small style: ReLU FF, tied head with the d_model ** -0.5 rescale) and
"v1_1" (flan-t5 style: gated GELU FF, untied lm_head, more decoder than encoder layers). The
weights come from numpy's seeded generator (`random_t5_weights`), so the tests rebuild the
exact same files without torch and without weights in git; transformers loads those files with
`T5ForConditionalGeneration.from_pretrained`, i.e. its own code reads its own format.

The tokenizer (t5_tokenizer.json, committed) is a small Unigram trained with HF `tokenizers`
on the sentences below, with T5's pipeline around it (WhitespaceSplit + Metaspace, "$A </s>",
<pad>=0 </s>=1 <unk>=2) but an NFKC normalizer instead of the real one's precompiled charsmap.

The reference decodes without a cache (use_cache=False: every step recomputes the whole
sequence), an independent check of candle-web's KV cache; it also sidesteps a transformers 5
cache that is sized by the encoder's layer count when the decoder has more layers.

Recorded per config: the prompts' ids (HF tokenizers), encoder outputs, teacher-forced decoder
logits, greedy generations (single and a padded batch) and the top-1/top-2 logit margins of
each greedy step (so a tie can never make the token comparison flaky), plus relative position
buckets for the released checkpoints' setting (32 buckets, max distance 128).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "pkg") not in sys.path:
    sys.path.insert(0, str(REPO / "pkg"))

OUT = Path(__file__).with_name("t5_reference.json")
TOKENIZER = Path(__file__).with_name("t5_tokenizer.json")
TOKENIZER_VOCAB = 200
MODEL_VOCAB = 256  # larger than the tokenizer's, as in the released models (32128 vs 32100)
MAX_NEW_TOKENS = 12
# A greedy step whose two best logits are closer than this could flip on rounding noise.
MIN_GREEDY_MARGIN = 1e-3
SIGNIFICANT_DIGITS = 7  # f32 carries ~7.2 decimal digits

CONFIGS = {
    "v1_0": {"vocab_size": MODEL_VOCAB, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
             "num_heads": 4, "relative_attention_num_buckets": 8,
             "relative_attention_max_distance": 20, "feed_forward_proj": "relu",
             "layer_norm_epsilon": 1e-6, "tie_word_embeddings": True, "seed": 1234},
    "v1_1": {"vocab_size": MODEL_VOCAB, "d_model": 32, "d_kv": 16, "d_ff": 48, "num_layers": 2,
             "num_decoder_layers": 3, "num_heads": 3, "relative_attention_num_buckets": 10,
             "relative_attention_max_distance": 24, "feed_forward_proj": "gated-gelu",
             "layer_norm_epsilon": 1e-6, "tie_word_embeddings": False, "seed": 5678},
}

PROMPTS = [
    "translate English to German: The house is wonderful.",
    "summarize: the quick brown fox jumps over the lazy dog again and again",
    "cola sentence: Numbers like 123 are spelled out.",
]
BATCH = [PROMPTS[0], "question: where is the house?"]  # padded to the longer one
DECODER_IDS_LEN = 7

CORPUS = [
    "translate English to German: The house is wonderful.",
    "translate English to French: The weather is nice today.",
    "summarize: the quick brown fox jumps over the lazy dog",
    "question: where is the house? context: the house is by the river.",
    "cola sentence: The course is jumping well.",
    "stsb sentence1: A man is eating food. sentence2: A man is eating bread.",
    "Numbers like one hundred twenty three are spelled out in words.",
    "Das Haus ist wunderbar. Le temps est beau aujourd'hui.",
    "A dog runs in the park while children play football.",
    "The model reads the input and writes the output, one token at a time.",
]


def config_json(name: str) -> dict:
    """The config.json of a test model (HF field names)."""
    cfg = {key: value for key, value in CONFIGS[name].items() if key != "seed"}
    cfg.update({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
                "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
                "dropout_rate": 0.0, "is_encoder_decoder": True})
    return cfg


def random_t5_weights(name: str) -> dict:
    """HF-named float32 arrays for config `name`, from numpy's seeded generator (the stream
    of `default_rng(seed).standard_normal` is stable across numpy versions and machines).

    Scales follow HF's initialisation (so activations stay O(1)) except where a larger value
    makes a mistake visible: the position bias tables (std 1, so a wrong bucket changes the
    output) and the norm weights (around 1, not exactly 1, so a skipped norm weight shows)."""
    cfg = CONFIGS[name]
    rng = np.random.default_rng(cfg["seed"])
    d, d_kv, heads, d_ff = cfg["d_model"], cfg["d_kv"], cfg["num_heads"], cfg["d_ff"]
    inner = heads * d_kv
    gated = cfg["feed_forward_proj"].startswith("gated-")
    weights = {}

    def normal(key, shape, std):
        weights[key] = (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(key):
        weights[key] = (1.0 + 0.2 * rng.standard_normal(d)).astype(np.float32)

    def attention(prefix, with_bias):
        normal(prefix + ".q.weight", (inner, d), (d * d_kv) ** -0.5)
        normal(prefix + ".k.weight", (inner, d), d ** -0.5)
        normal(prefix + ".v.weight", (inner, d), d ** -0.5)
        normal(prefix + ".o.weight", (d, inner), inner ** -0.5)
        if with_bias:
            normal(prefix + ".relative_attention_bias.weight",
                   (cfg["relative_attention_num_buckets"], heads), 1.0)

    def feed_forward(prefix):
        if gated:
            normal(prefix + ".wi_0.weight", (d_ff, d), d ** -0.5)
            normal(prefix + ".wi_1.weight", (d_ff, d), d ** -0.5)
        else:
            normal(prefix + ".wi.weight", (d_ff, d), d ** -0.5)
        normal(prefix + ".wo.weight", (d, d_ff), d_ff ** -0.5)

    normal("shared.weight", (cfg["vocab_size"], d), 1.0)
    for i in range(cfg["num_layers"]):
        p = f"encoder.block.{i}.layer"
        norm(f"{p}.0.layer_norm.weight")
        attention(f"{p}.0.SelfAttention", i == 0)
        norm(f"{p}.1.layer_norm.weight")
        feed_forward(f"{p}.1.DenseReluDense")
    norm("encoder.final_layer_norm.weight")
    for i in range(cfg.get("num_decoder_layers", cfg["num_layers"])):
        p = f"decoder.block.{i}.layer"
        norm(f"{p}.0.layer_norm.weight")
        attention(f"{p}.0.SelfAttention", i == 0)
        norm(f"{p}.1.layer_norm.weight")
        attention(f"{p}.1.EncDecAttention", False)
        norm(f"{p}.2.layer_norm.weight")
        feed_forward(f"{p}.2.DenseReluDense")
    # Zero-mean weights here: with a tied head the final state otherwise stays so close to the
    # input token's own embedding that a random model just repeats its start token.
    weights["decoder.final_layer_norm.weight"] = rng.standard_normal(d).astype(np.float32)
    if not cfg["tie_word_embeddings"]:
        normal("lm_head.weight", (cfg["vocab_size"], d), 1.0)
    return weights


def write_model(name: str, folder: Path) -> Path:
    """model.safetensors + config.json + tokenizer.json of test model `name` in folder."""
    from candle_web.io.safetensors import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save(random_t5_weights(name), folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config_json(name), indent=2))
    (folder / "tokenizer.json").write_bytes(TOKENIZER.read_bytes())
    return folder


def decoder_ids(name: str) -> list:
    """A fixed teacher-forcing sequence: the start token, then ids from the tokenizer range."""
    rng = np.random.default_rng(CONFIGS[name]["seed"] + 1)
    return [0] + [int(i) for i in rng.integers(3, TOKENIZER_VOCAB, DECODER_IDS_LEN - 1)]


def train_tokenizer(path: Path = TOKENIZER) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(),
                                                 normalizers.Replace(Regex(" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")])
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=TOKENIZER_VOCAB, unk_token="<unk>",
                                      special_tokens=["<pad>", "</s>", "<unk>"], shrinking_factor=0.75)
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    assert tokenizer.token_to_id("<pad>") == 0 and tokenizer.token_to_id("</s>") == 1
    path.write_text(tokenizer.to_str(pretty=True), encoding="utf-8")


def _rounded(array) -> list:
    return np.vectorize(lambda x: float(f"{x:.{SIGNIFICANT_DIGITS}g}"))(
        np.asarray(array, dtype=np.float64)).tolist()


def reference_outputs(name: str, folder: Path) -> dict:
    """Everything the tests compare, computed by transformers from the files in folder."""
    import torch
    from tokenizers import Tokenizer
    from transformers import T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration.from_pretrained(str(folder)).eval()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    out = {"prompts": [], "batch": {}}
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt).ids
            input_ids = torch.tensor([ids])
            encoder = model.get_encoder()(input_ids=input_ids).last_hidden_state[0]
            dec = torch.tensor([decoder_ids(name)])
            logits = model(input_ids=input_ids, decoder_input_ids=dec, use_cache=False).logits[0]
            generated = model.generate(input_ids=input_ids, max_new_tokens=MAX_NEW_TOKENS,
                                       do_sample=False, num_beams=1, output_scores=True,
                                       return_dict_in_generate=True, use_cache=False)
            margins = []
            for scores in generated.scores:
                top2 = torch.topk(scores[0], 2).values
                margins.append(float(top2[0] - top2[1]))
            out["prompts"].append({
                "text": prompt, "ids": ids, "encoder_output": _rounded(encoder),
                "decoder_ids": decoder_ids(name), "decoder_logits": _rounded(logits),
                "greedy": generated.sequences[0, 1:].tolist(), "greedy_margins": margins})
        encodings = [tokenizer.encode(text) for text in BATCH]
        width = max(len(e.ids) for e in encodings)
        ids = [e.ids + [0] * (width - len(e.ids)) for e in encodings]
        mask = [[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encodings]
        generated = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                   max_new_tokens=MAX_NEW_TOKENS, do_sample=False, num_beams=1,
                                   output_scores=True, return_dict_in_generate=True,
                                   use_cache=False)
        margins = [float((lambda t: t[:, 0] - t[:, 1])(torch.topk(s, 2).values).min())
                   for s in generated.scores]
        out["batch"] = {"texts": BATCH, "ids": ids, "attention_mask": mask,
                        "greedy": generated.sequences[:, 1:].tolist(), "greedy_margins": margins}
    return out


def reference_buckets() -> dict:
    """HF's bucket function for the released setting (32 buckets, max distance 128)."""
    import torch
    from transformers.models.t5.modeling_t5 import T5Attention

    positions = list(range(-300, 301))
    relative = torch.tensor(positions)
    return {"relative_positions": positions,
            "bidirectional": T5Attention._relative_position_bucket(relative, True, 32, 128).tolist(),
            "causal": T5Attention._relative_position_bucket(relative, False, 32, 128).tolist()}


def main() -> None:
    import tokenizers
    import torch
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--tokenizer", action="store_true", help="retrain t5_tokenizer.json first")
    args = parser.parse_args()
    if args.tokenizer or not TOKENIZER.exists():
        train_tokenizer()
    record = {"about": "T5 reference outputs from transformers; see record_t5.py",
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "tokenizers": tokenizers.__version__, "numpy": np.__version__},
              "max_new_tokens": MAX_NEW_TOKENS, "buckets": reference_buckets(), "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CONFIGS:
            folder = write_model(name, Path(tmp) / name)
            outputs = reference_outputs(name, folder)
            smallest = min(min(p["greedy_margins"]) for p in outputs["prompts"])
            smallest = min(smallest, min(outputs["batch"]["greedy_margins"]))
            if smallest < MIN_GREEDY_MARGIN:
                raise SystemExit(f"{name}: a greedy step has a top-2 margin of {smallest:.2e}; "
                                 f"change the seed")
            record["models"][name] = {"config": config_json(name), **outputs}
            print(f"{name}: greedy {outputs['prompts'][0]['greedy']} (smallest margin "
                  f"{smallest:.3g})")
    args.out.write_text(json.dumps(record) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
