"""TensorFlow.js weights: the real face-api files decode to what an independent by-hand decode
of the manifest gives, and hostile manifests are refused with a FormatError naming the field."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from candle_web import hub
from candle_web.core.errors import FormatError, ModelNotFound, UnsupportedError
from candle_web.io.tfjs import TfjsWeights

# face-api's seven models, from the registry's npm source (models/fetch.py --default).
FACE_API_FILES = [file.name for file in hub.default_registry()["face-api"].files]
MANIFESTS = sorted(name for name in FACE_API_FILES if name.endswith("-weights_manifest.json"))
TINY = "tiny_face_detector_model-weights_manifest.json"


@pytest.fixture(scope="module")
def face_api(model_file):
    """name -> cached path of every face-api file (the shards sit next to their manifests)."""
    return {name: model_file("face-api", name) for name in FACE_API_FILES}


def decode_by_hand(manifest_path: Path) -> dict:
    """Each weight with struct, value by value, straight from the format's description (the
    group's shards concatenated, weights back to back, q * scale + min for uint8/uint16)."""
    groups = json.loads(manifest_path.read_text())
    out = {}
    for group in groups:
        data = b"".join((manifest_path.parent / path).read_bytes() for path in group["paths"])
        offset = 0
        for weight in group["weights"]:
            count = int(np.prod(weight["shape"], dtype=np.int64))
            quantization = weight.get("quantization")
            code, size = {"uint8": ("B", 1), "uint16": ("H", 2)}[quantization["dtype"]] \
                if quantization else {"float32": ("f", 4), "int32": ("i", 4)}[weight["dtype"]]
            values = struct.unpack_from(f"<{count}{code}", data, offset)
            offset += count * size
            if quantization:
                values = [v * quantization["scale"] + quantization["min"] for v in values]
                if weight["dtype"] == "int32":
                    values = [int(np.floor(v + 0.5)) for v in values]
            dtype = np.int32 if weight["dtype"] == "int32" else np.float32
            out[weight["name"]] = np.array(values, dtype=dtype).reshape(weight["shape"])
        assert offset == len(data)
    return out


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda name: name.split("-")[0])
def test_real_face_api_weights_match_a_by_hand_decode(face_api, manifest):
    weights = TfjsWeights.load(face_api[manifest])
    expected = decode_by_hand(face_api[manifest])
    assert weights.names == list(expected)
    for name, value in expected.items():
        got = weights.get_numpy(name)
        assert got.dtype == value.dtype and got.shape == value.shape, name
        # Exact: both compute q * scale + min in double precision and round once to float32.
        np.testing.assert_array_equal(got, value, err_msg=name)


def test_uint8_quantized_values_are_on_the_grid(face_api):
    weights = TfjsWeights.load(face_api[TINY])
    info = weights.info("conv0/filters")
    assert info.quantization.dtype == "uint8" and info.shape == (3, 3, 3, 16)
    steps = (weights.get_numpy("conv0/filters").astype(np.float64) - info.quantization.min) \
        / info.quantization.scale
    # float32 rounding of q * scale + min moves a value by < 1e-4 of a step at these scales.
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-4)
    assert weights.get("conv0/bias").dims() == (16,)


def write_model(folder: Path, weights: list, shard: bytes, paths=("shard.bin",)) -> Path:
    manifest = folder / "m-weights_manifest.json"
    manifest.write_text(json.dumps([{"paths": list(paths), "weights": weights}]))
    (folder / "shard.bin").write_bytes(shard)
    return manifest


def test_int32_and_uint16_and_float16(tmp_path):
    weights = [
        {"name": "a", "shape": [2], "dtype": "int32", "quantization":
            {"dtype": "uint8", "scale": 0.5, "min": -1.0}},
        {"name": "b", "shape": [2], "dtype": "float32", "quantization":
            {"dtype": "uint16", "scale": 0.25, "min": 2.0}},
        {"name": "c", "shape": [1], "dtype": "float32", "quantization": {"dtype": "float16"}},
        {"name": "d", "shape": [1, 1], "dtype": "int32"},
    ]
    shard = (bytes([1, 7]) + struct.pack("<2H", 3, 65535) + np.float16(1.5).tobytes()
             + struct.pack("<i", -5))
    loaded = TfjsWeights.load(write_model(tmp_path, weights, shard))
    # 1 * 0.5 - 1 = -0.5 rounds up to 0 as JavaScript's Math.round does; 7 * 0.5 - 1 = 2.5 -> 3.
    assert loaded.get_numpy("a").tolist() == [0, 3]
    assert loaded.get_numpy("b").tolist() == [2.75, 65535 * 0.25 + 2.0]
    assert loaded.get_numpy("c").tolist() == [1.5]
    assert loaded.get_numpy("d").tolist() == [[-5]]


GOOD = {"name": "w", "shape": [2, 2], "dtype": "float32"}


@pytest.mark.parametrize("weights, shard, field", [
    ([GOOD], b"\0" * 15, "need 16 bytes but the shards shard.bin hold 15"),
    ([GOOD], b"\0" * 17, "need 16 bytes"),
    ([dict(GOOD, shape=[2**40, 2**40])], b"", "overflows"),
    ([dict(GOOD, shape=[1] * 65)], b"", "field 'shape'"),
    ([dict(GOOD, shape=[-1])], b"", "field 'shape'"),
    ([dict(GOOD, shape=[True])], b"", "field 'shape'"),
    ([dict(GOOD, shape="2")], b"", "field 'shape'"),
    ([dict(GOOD, dtype="float64")], b"", "field 'dtype'"),
    ([dict(GOOD, dtype={"a": 1})], b"", "field 'dtype'"),  # found by tests/fuzz (unhashable)
    ([dict(GOOD, quantization={"dtype": ["uint8"], "scale": 1, "min": 0})], b"", ".dtype"),
    ([dict(GOOD, quantization={"dtype": "uint8", "scale": "1", "min": 0})], b"", ".scale"),
    ([dict(GOOD, quantization={"dtype": "uint8", "scale": 1})], b"", ".min"),
    ([dict(GOOD, quantization={"dtype": "int4", "scale": 1, "min": 0})], b"", ".dtype"),
    ([dict(GOOD, name="")], b"", "field 'name'"),
    ([GOOD, GOOD], b"\0" * 32, "named twice"),
    (["w"], b"", "field 'weights'"),
])
def test_hostile_manifests_are_refused_before_reading(tmp_path, weights, shard, field):
    with pytest.raises(FormatError, match="tfjs manifest") as error:
        TfjsWeights.load(write_model(tmp_path, weights, shard))
    assert field in str(error.value)


@pytest.mark.parametrize("path", ["../shard.bin", "/etc/passwd", "a/../../b", "c:\\x", "", 5])
def test_shard_paths_cannot_leave_the_folder(tmp_path, path):
    with pytest.raises(FormatError, match="field 'paths'"):
        TfjsWeights.load(write_model(tmp_path, [GOOD], b"\0" * 16, paths=(path,)))


@pytest.mark.parametrize("text, message", [
    (b"{}", "non-empty JSON list"),
    (b"[]", "non-empty JSON list"),
    (b'[{"paths": ["s"], "paths": ["t"], "weights": []}]', "duplicate key"),
    (b'[{"paths": ["s"], "weights": [{"name": "x", "shape": [NaN]}]}]', "NaN"),
    (b"\xff", "not valid JSON"),
    (b"[" * 100_000, "not valid JSON"),
])
def test_malformed_json_is_a_format_error(text, message):
    with pytest.raises(FormatError, match=message):
        TfjsWeights(text, {})


def test_missing_shard_and_unsupported_dtype(tmp_path):
    manifest = write_model(tmp_path, [GOOD], b"\0" * 16, paths=("absent.bin",))
    with pytest.raises(ModelNotFound, match="absent.bin"):
        TfjsWeights.load(manifest)
    with pytest.raises(UnsupportedError, match="'w' has dtype string"):
        TfjsWeights.load(write_model(tmp_path, [dict(GOOD, dtype="string")], b""))
    with pytest.raises(ModelNotFound, match="no weight named 'v'"):
        TfjsWeights.load(write_model(tmp_path, [GOOD], b"\0" * 16)).get_numpy("v")


def test_a_model_names_a_missing_or_misshapen_weight(face_api):
    weights = TfjsWeights.load(face_api[TINY])
    assert weights.conv_kernel("conv0/filters", (3, 3, 3, 16), "detector").shape == (16, 3, 3, 3)
    np.testing.assert_array_equal(weights.conv_kernel("conv0/filters", (3, 3, 3, 16), "d")[5, 2],
                                  weights.get_numpy("conv0/filters")[:, :, 2, 5])
    with pytest.raises(FormatError, match="detector: weight 'conv9/bias' is missing"):
        weights.channel_bias("conv9/bias", 16, "detector")
    with pytest.raises(FormatError, match=r"'conv0/bias' has shape \[16\], expected \[32\]"):
        weights.channel_bias("conv0/bias", 32, "detector")
