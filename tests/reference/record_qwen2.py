"""Record transformers' greedy chat answers of Qwen2.5-Coder-0.5B-Instruct, for tests/models.

    .venv/bin/python tests/reference/record_qwen2.py [--out tests/reference/qwen2_reference.json]

Needs the bench extra (accelerate: transformers refuses gguf_file= without it); a few minutes
on one core, ~2.5 GB of memory.

The reference is transformers' own GGUF loader on the registry file itself:
`AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)` dequantizes every tensor (Q5_0,
Q8_0, Q4_K, Q6_K; gguf-py's dequantize) into a float32 Qwen2ForCausalLM, and
`AutoTokenizer.from_pretrained(folder, gguf_file=...)` builds the tokenizer and reads the chat
template from the GGUF. Each prompt is one user message rendered by `apply_chat_template` (the
file's Jinja template adds Qwen's default system message), generated greedily with the KV
cache until <|im_end|> or MAX_NEW_TOKENS. The JSON keeps the prompt text and ids, the new ids
and text, the top logits of the last prompt position and, per greedy decision, the chosen
token's logit lead over the runner-up (`margins`; the smallest says how close a tie-break
came). tests/models/test_qwen2.py compares candle-web with it, so `make test` does not run a
0.5B transformers model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: tests.<area> imports
from tests.reference.reference_testlib import REPO, greedy_record  # noqa: E402

sys.path[:0] = [str(REPO / "pkg")]

MODEL = "qwen2.5-coder-0.5b-instruct"
GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
OUT = Path(__file__).with_name("qwen2_reference.json")
MAX_NEW_TOKENS = 32
PROMPTS = [
    ("arithmetic", "What is 2+2?"),
    ("reverse", "Write a Python function that reverses a string."),
    ("hashmap", "Explain in one sentence what a hash map is."),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--work", type=Path, default=Path("/tmp/candle-web-qwen2-reference"))
    args = parser.parse_args(argv)

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from candle_web import hub

    gguf_path = hub.fetch(MODEL, GGUF_NAME)
    args.work.mkdir(parents=True, exist_ok=True)
    link = args.work / GGUF_NAME
    link.unlink(missing_ok=True)
    link.symlink_to(gguf_path)
    started = time.perf_counter()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(args.work), gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(str(args.work), gguf_file=GGUF_NAME,
                                                 dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    print(f"loaded in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    records = []
    for name, text in PROMPTS:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                               tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        margins: list = []
        record = greedy_record(model, tokenizer, prompt, prompt_ids, MAX_NEW_TOKENS, eos_id,
                               margins)
        records.append({"name": name, "kind": "chat", "text": text, **record,
                        "margins": [round(m, 5) for m in margins]})
        print(f"{name}: {record['generated_text']!r} (smallest lead {min(margins):.4f})",
              file=sys.stderr)
    out = {
        "model": MODEL, "file": GGUF_NAME, "max_new_tokens": MAX_NEW_TOKENS,
        "eos_token_id": int(eos_id),
        "reference": (f"transformers {transformers.__version__} {type(model).__name__} (torch "
                      f"{torch.__version__}, f32, eager attention) from the GGUF through "
                      "transformers' GGUF loader (gguf_file=)"),
        "margins": "per greedy decision, the chosen logit minus the runner-up; the last one "
                   "is the decision that stopped (EOS, or the token past max_new_tokens)",
        "prompts": records,
    }
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    link.unlink()
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
