"""The ONNX exports of scripts/export_onnx.py (the transformers.js peer of bench/browser.py) hold
what transformers.js 4.x loads, made from the very files candle-web runs.

Skipped when no export is cached (`scripts/export_onnx.py`, run by `make bench`): exporting
takes a minute and needs the bench extra. Reads export.json, the small side files and the graphs'
input/output lists only (walking the protobuf past the weights), so it costs well under a
second per model.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_exporter():
    path = REPO / "scripts" / "export_onnx.py"
    spec = importlib.util.spec_from_file_location("export_onnx", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


exporter = load_exporter()


def cached(model: str) -> dict:
    info = exporter.cached_export(model)
    if info is None:
        pytest.skip(f"no cached ONNX export of {model} (run scripts/export_onnx.py)")
    return info


def _varint(data, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data, start: int, end: int):
    """(field number, payload start, payload end) of the length-delimited fields in
    data[start:end]; other wire types are stepped over."""
    at = start
    while at < end:
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 2:
            length, at = _varint(data, at)
            yield number, at, at + length
            at += length
        elif wire == 0:
            _, at = _varint(data, at)
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")


MODEL_GRAPH, GRAPH_INPUT, GRAPH_OUTPUT = 7, 11, 12  # onnx.proto field numbers


def graph_io(path: Path):
    """{name: dims} of a graph's inputs and outputs, read without parsing its weights (the
    wire format is walked and only the ValueInfo fields decoded: 540 MB files stay cheap)."""
    onnx = pytest.importorskip("onnx")
    import mmap

    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        graph = next((s, e) for n, s, e in _fields(data, 0, len(data)) if n == MODEL_GRAPH)
        found = {GRAPH_INPUT: {}, GRAPH_OUTPUT: {}}
        for number, start, end in _fields(data, *graph):
            if number in found:
                value = onnx.ValueInfoProto.FromString(data[start:end])
                found[number][value.name] = [d.dim_param or d.dim_value
                                             for d in value.type.tensor_type.shape.dim]
    return found[GRAPH_INPUT], found[GRAPH_OUTPUT]


@pytest.mark.parametrize("model", exporter.MODELS)
def test_export_has_the_files_transformers_js_loads(model):
    info = cached(model)
    folder = Path(info["folder"])
    for name in exporter.FILES_NEEDED[exporter.kind_of(model)]:
        assert (folder / name).is_file(), f"{model}: {name} missing from {folder}"
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        json.loads((folder / name).read_text())  # parses
    # Made from the registry's own file (the weights candle-web runs), recorded at export.
    source_name, source_sha256 = exporter.source_file(model)
    assert info["source"]["file"] == source_name
    assert info["source"]["sha256"] == source_sha256
    # The side files are the ones exported (not edited since): their sha256 as recorded.
    for name, digest in info["files"].items():
        if not name.endswith(".onnx"):
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name


def cache_dims_ok(dims, heads, d_head):
    # transformers.js builds the first step's empty past from these dims: it resolves the
    # symbol "batch_size" and sets every other symbol to 0 (zero-length past).
    return dims[0] == "batch_size" and dims[1] == heads and isinstance(dims[2], str) \
        and dims[2] != "batch_size" and dims[3] == d_head


def test_whisper_graphs_follow_the_transformers_js_contract():
    info = cached("whisper-tiny.en")
    folder = Path(info["folder"])
    config = json.loads((folder / "config.json").read_text())
    layers, heads = config["decoder_layers"], config["decoder_attention_heads"]
    d_head = config["d_model"] // heads
    inputs, outputs = graph_io(folder / "onnx" / "encoder_model.onnx")
    assert list(inputs) == ["input_features"] and inputs["input_features"][1:] == [80, 3000]
    assert list(outputs) == ["last_hidden_state"]
    inputs, outputs = graph_io(folder / "onnx" / "decoder_model_merged.onnx")
    past = {f"past_key_values.{i}.{side}.{part}" for i in range(layers)
            for side in ("decoder", "encoder") for part in ("key", "value")}
    assert set(inputs) == {"input_ids", "encoder_hidden_states"} | past
    assert set(outputs) == {"logits"} | {name.replace("past_key_values", "present")
                                         for name in past}
    for name in past:
        assert cache_dims_ok(inputs[name], heads, d_head), (name, inputs[name])
    assert outputs["logits"][2] == config["vocab_size"]


def test_llama_graph_follows_the_transformers_js_contract():
    info = cached("smollm2-135m-instruct")
    folder = Path(info["folder"])
    config = json.loads((folder / "config.json").read_text())
    kv_heads = config["num_key_value_heads"]
    d_head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    inputs, outputs = graph_io(folder / "onnx" / "model.onnx")
    past = {f"past_key_values.{i}.{part}" for i in range(config["num_hidden_layers"])
            for part in ("key", "value")}
    assert set(inputs) == {"input_ids", "attention_mask", "position_ids"} | past
    assert set(outputs) == {"logits"} | {name.replace("past_key_values", "present")
                                         for name in past}
    for name in past:
        assert cache_dims_ok(inputs[name], kv_heads, d_head), (name, inputs[name])
    assert outputs["logits"][2] == config["vocab_size"]
