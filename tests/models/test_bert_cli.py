"""`candle-web embed`: vectors as JSON and the similarity matrix, on the registry's real
all-MiniLM-L6-v2 files."""

from __future__ import annotations

import json

import numpy as np

from candle_web import cli

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse."]


def test_embed_json_gives_normalised_vectors(model_file, capsys):
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        model_file("all-minilm-l6-v2", name)
    assert cli.main(["embed", *SENTENCES[:2]]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["text"] for row in rows] == SENTENCES[:2]
    vectors = np.array([row["embedding"] for row in rows])
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_embed_matrix_ranks_the_paraphrase_first(model_file, capsys):
    model_file("all-minilm-l6-v2", "model.safetensors")
    assert cli.main(["embed", *SENTENCES, "--format", "matrix"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[1] A man is eating food."
    first_row = [float(value) for value in lines[4].split()[1:]]
    assert first_row[0] == 1.0 and first_row[1] > first_row[2]
