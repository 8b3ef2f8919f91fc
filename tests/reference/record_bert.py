"""Record reference all-MiniLM-L6-v2 sentence embeddings with transformers (PyTorch).

    .venv/bin/python tests/reference/record_bert.py [--out tests/reference/bert_reference.json]

The files are the registry's "all-minilm-l6-v2" (genuine upstream model.safetensors,
config.json, tokenizer.json, from the offline cache). The reference is what sentence-transformers
computes for this model: HF `tokenizers` with the model's tokenizer.json (truncation at 128,
padding off), `transformers.AutoModel` on the same files, mean pooling over the attention mask,
L2 normalisation. Each sentence is embedded alone (no padding), and the whole list once more
as one padded batch with a mask, to record that batching changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "pkg") not in sys.path:
    sys.path.insert(0, str(REPO / "pkg"))

OUT = Path(__file__).with_name("bert_reference.json")
MODEL = "all-minilm-l6-v2"
SIGNIFICANT_DIGITS = 7

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "The new movie is awesome!",
    "Café au lait costs 3,50 € in Zürich; 東京 is far away.",
    # Longer than the 128-token limit: the reference truncates (tokenizer.json) to 128.
    " ".join(["The committee reviewed every clause of the long agreement before voting."] * 14),
]


def reference_embeddings(folder: Path) -> dict:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()  # keep the file's truncation (128), as sentence-transformers does
    model = AutoModel.from_pretrained(str(folder)).eval()

    def pooled(ids_rows, mask_rows):
        ids, mask = torch.tensor(ids_rows), torch.tensor(mask_rows)
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=mask,
                           token_type_ids=torch.zeros_like(ids)).last_hidden_state
        weights = mask.unsqueeze(-1).float()
        mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(mean, p=2, dim=1).numpy()

    encodings = [tokenizer.encode(text) for text in SENTENCES]
    single = np.concatenate([pooled([e.ids], [[1] * len(e.ids)]) for e in encodings])
    width = max(len(e.ids) for e in encodings)
    batch = pooled([e.ids + [0] * (width - len(e.ids)) for e in encodings],
                   [[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encodings])
    return {"ids": [e.ids for e in encodings], "single": single, "batch": batch}


def _rounded(array) -> list:
    return [[float(f"{x:.{SIGNIFICANT_DIGITS}g}") for x in row] for row in np.asarray(array)]


def main() -> None:
    import tokenizers
    import torch
    import transformers

    from candle_web import hub

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    folder = hub.fetch(MODEL, "model.safetensors").parent
    for name in ("config.json", "tokenizer.json"):
        hub.fetch(MODEL, name)
    result = reference_embeddings(folder)
    record = {"about": "all-MiniLM-L6-v2 reference embeddings from transformers; see record_bert.py",
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "tokenizers": tokenizers.__version__},
              "model": MODEL, "sentences": SENTENCES, "ids": result["ids"],
              "embeddings": _rounded(result["single"]),
              "batch_vs_single_max_abs": float(np.abs(result["batch"] - result["single"]).max())}
    args.out.write_text(json.dumps(record) + "\n")
    print(f"wrote {args.out}; token counts {[len(i) for i in result['ids']]}")


if __name__ == "__main__":
    main()
