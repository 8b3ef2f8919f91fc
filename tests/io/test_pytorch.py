"""The PyTorch checkpoint reader (io/pytorch.py) against torch itself: files written by
torch.save in both layouts, every dtype, views with offsets and strides, and the real
registry test inputs (rxnfp's BERT, rxnmapper's ALBERT, whisperx's segmentation checkpoint,
Silero's TorchScript archive), each compared with torch.load(weights_only=True).

Hostile and lying files are in test_pytorch_hostile.py."""

from __future__ import annotations

import collections
import io
import json
import pickle
import struct
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from candle_web import cli  # noqa: E402
from candle_web.core import dtype as cdt  # noqa: E402
from candle_web.core.errors import FormatError, UnsupportedError  # noqa: E402
from candle_web.io.pytorch import TorchCheckpoint, load  # noqa: E402
from candle_web.io.weights import PytorchWeights, folder_weights, open_weights  # noqa: E402
from candle_web.models.bert import BertModel  # noqa: E402

LAYOUTS = {"zip": True, "legacy": False}  # layout -> _use_new_zipfile_serialization
RXNFP = "rxnfp-bert-pretrained"
RXNMAPPER = "rxnmapper-albert"


def torch_numpy(tensor) -> np.ndarray:
    """A torch tensor's values as numpy, bf16 as its uint16 bits (the project's convention)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def saved(objects, layout: str) -> bytes:
    out = io.BytesIO()
    torch.save(objects, out, _use_new_zipfile_serialization=LAYOUTS[layout])
    return out.getvalue()


def every_dtype_and_view() -> dict:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=gen)
    tied = torch.randn(5, 3, generator=gen)
    return collections.OrderedDict(
        f32=base,
        f16=torch.randn(4, 5, generator=gen).half(),
        bf16=torch.randn(4, 5, generator=gen).bfloat16(),
        f64=torch.randn(3, generator=gen).double(),
        i64=torch.arange(-5, 7),
        i32=torch.tensor([-2**31, 2**31 - 1, 0], dtype=torch.int32),
        i16=torch.tensor([-32768, 7, 32767], dtype=torch.int16),
        i8=torch.tensor([-128, 0, 127], dtype=torch.int8),
        u8=torch.tensor([0, 200, 255], dtype=torch.uint8),
        bool=torch.tensor([True, False, True]),
        # Views of `base`: storage offsets, steps, a transpose, a broadcast (stride 0).
        strided=base[1:5, 1:8:3],
        transposed=base.t(),
        row=base[4],
        expanded=base[2, :3].unsqueeze(0).expand(4, 3),
        scalar=torch.tensor(2.5),
        empty=torch.zeros(0, 3),
        tied_a=tied,
        tied_b=tied,  # the same tensor under two names: one storage
        parameter=torch.nn.Parameter(torch.ones(2, 2)),
        nested={"inner": torch.arange(4.0).reshape(2, 2)[:, 1]},
    )


def flat(objects, prefix="") -> dict:
    out = {}
    for name, value in objects.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{name}."))
        else:
            out[prefix + name] = value
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_dtype_and_view_equals_torch_load(layout, tmp_path):
    data = saved(every_dtype_and_view(), layout)
    path = tmp_path / "model.pt"
    path.write_bytes(data)
    reference = flat(torch.load(io.BytesIO(data), weights_only=True))
    for source in (path, data):  # mmap natively, bytes as in the browser
        checkpoint = TorchCheckpoint(source)
        assert checkpoint.format == layout
        assert checkpoint.keys() == list(reference)
        for name, expected in reference.items():
            got = checkpoint.get_numpy(name)
            want = torch_numpy(expected)
            assert got.shape == tuple(expected.shape), name
            assert got.dtype == want.dtype, name
            np.testing.assert_array_equal(got, want, err_msg=name)
            assert got.flags.c_contiguous and got.flags.aligned
    checkpoint = TorchCheckpoint(path)
    assert checkpoint.info("strided").stride == (8, 3)
    assert checkpoint.info("strided").storage_offset == 9
    assert checkpoint.info("expanded").stride == (0, 1)
    assert checkpoint.info("tied_a").storage is checkpoint.info("tied_b").storage


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("protocol", [1, 2, 3, 4, 5])
def test_every_pickle_protocol_torch_writes_is_read(layout, protocol):
    """torch.save(pickle_protocol=...): text opcodes (1), FRAME, MEMOIZE, STACK_GLOBAL (4, 5).
    Compared with the saved tensors: torch.load(weights_only=True) itself refuses protocol 1.
    Protocol 0 cannot hold torch's persistent ids (it writes them as text) and is refused."""
    objects = every_dtype_and_view()
    out = io.BytesIO()
    torch.save(objects, out, pickle_protocol=protocol,
               _use_new_zipfile_serialization=LAYOUTS[layout])
    checkpoint = TorchCheckpoint(out.getvalue())
    for name, expected in flat(objects).items():
        np.testing.assert_array_equal(checkpoint.get_numpy(name), torch_numpy(expected),
                                      err_msg=name)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_candle_tensors_follow_the_safetensors_dtype_rules(layout):
    checkpoint = TorchCheckpoint(saved(every_dtype_and_view(), layout))
    expected = {"f32": cdt.f32, "f16": cdt.f16, "bf16": cdt.bf16, "f64": cdt.f64,
                "i64": cdt.i64, "i32": cdt.i64, "i16": cdt.i64, "i8": cdt.i64, "u8": cdt.u8,
                "bool": cdt.u8}
    for name, candle_dtype in expected.items():
        assert checkpoint.get(name).dtype is candle_dtype, name
    bf16 = checkpoint.get("bf16").to_dtype(cdt.f32).to_numpy()
    reference = every_dtype_and_view()["bf16"].float().numpy()
    np.testing.assert_array_equal(bf16, reference)  # bf16 -> f32 is exact
    np.testing.assert_array_equal(checkpoint.get("bool").to_numpy(), [1, 0, 1])
    np.testing.assert_array_equal(checkpoint.get("i32").to_numpy(), [-2**31, 2**31 - 1, 0])


def test_contiguous_tensors_stay_views_of_the_mapping_and_storages_are_read_lazily(tmp_path):
    """A zip storage is not touched until one of its tensors is asked for: a corrupted
    storage (its CRC no longer matches) opens fine and fails only when read."""
    objects = collections.OrderedDict(a=torch.randn(64, 64), b=torch.randn(32))
    data = bytearray(saved(objects, "zip"))
    archive = zipfile.ZipFile(io.BytesIO(bytes(data)))
    checkpoint = TorchCheckpoint(bytes(data))
    key = checkpoint.info("a").storage.key
    info = archive.getinfo(f"archive/data/{key}")
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26:
                                                          info.header_offset + 30])
    start = info.header_offset + 30 + name_length + extra_length
    data[start + 100] ^= 0xFF
    path = tmp_path / "corrupt.pt"
    path.write_bytes(bytes(data))
    checkpoint = TorchCheckpoint(path)
    assert checkpoint._mapped is not None  # natively, the file is mapped
    b = checkpoint.get_numpy("b")
    np.testing.assert_array_equal(b, objects["b"].numpy())
    assert not b.flags.owndata and not b.flags.writeable  # a view of the read-only mapping
    with pytest.raises(FormatError, match=rf"storage '{key}': CRC-32 mismatch"):
        checkpoint.get_numpy("a")


def test_a_big_endian_zip_checkpoint_reads_like_torch_reads_it():
    """torch writes the host's byte order and records it in `byteorder`; a big-endian file,
    made here by swapping every storage, must give the same values (torch.load is the
    reference: it reads such files too)."""
    objects = collections.OrderedDict(f32=torch.randn(3, 4), i64=torch.arange(5),
                                      bf16=torch.randn(4).bfloat16(), f16=torch.randn(2).half(),
                                      view=torch.randn(4, 4)[1:, ::2])
    little = saved(objects, "zip")
    checkpoint = TorchCheckpoint(little)
    sizes = {checkpoint.info(name).storage.key: checkpoint.info(name).storage.type.itemsize
             for name in checkpoint.keys()}
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(little)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            payload = source.read(info)
            key = info.filename.rsplit("/", 1)[-1]
            if info.filename.endswith("/byteorder"):
                payload = b"big"
            elif "/data/" in info.filename and sizes.get(key, 1) > 1:
                payload = np.frombuffer(payload, f"u{sizes[key]}").byteswap().tobytes()
            target.writestr(info.filename, payload)
    big = out.getvalue()
    reference = torch.load(io.BytesIO(big), weights_only=True)
    checkpoint = TorchCheckpoint(big)
    assert not checkpoint.little_endian
    for name, expected in reference.items():
        np.testing.assert_array_equal(checkpoint.get_numpy(name), torch_numpy(expected))
        np.testing.assert_array_equal(checkpoint.get_numpy(name), torch_numpy(objects[name]))


# -- the weights source --------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_open_weights_takes_bin_pt_pth_paths_and_bytes(layout, tmp_path):
    objects = collections.OrderedDict(w=torch.randn(3, 2), b=torch.randn(3).bfloat16())
    data = saved(objects, layout)
    for name in ("pytorch_model.bin", "model.pt", "model.pth"):
        (tmp_path / name).write_bytes(data)
        weights = open_weights(tmp_path / name)
        assert isinstance(weights, PytorchWeights)
        assert weights.shape("w") == (3, 2)
        np.testing.assert_array_equal(weights.tensor("w").to_numpy(), objects["w"].numpy())
    from_bytes = open_weights(data)
    assert isinstance(from_bytes, PytorchWeights)
    np.testing.assert_array_equal(from_bytes.tensor("b").to_numpy(),
                                  objects["b"].float().numpy())
    assert set(load(data)) == {"w", "b"}


# -- real files ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rxnfp_folder(model_file):
    for name in ("config.json", "vocab.txt"):
        model_file(RXNFP, name)
    return model_file(RXNFP, "pytorch_model.bin").parent


def test_rxnfp_bert_every_tensor_equals_torch_load(rxnfp_folder):
    path = rxnfp_folder / "pytorch_model.bin"
    checkpoint = TorchCheckpoint(path)
    assert checkpoint.format == "legacy"
    reference = torch.load(path, weights_only=True)
    assert checkpoint.keys() == list(reference)
    assert len(reference) == 207
    for name, expected in reference.items():
        np.testing.assert_array_equal(checkpoint.get_numpy(name), torch_numpy(expected),
                                      err_msg=name)


def smiles_batch(tokenizer) -> tuple:
    texts = ["CC(=O)O.OCC>>CC(=O)OCC.O", "c1ccccc1Br.OB(O)c1ccccc1>>c1ccc(-c2ccccc2)cc1",
             "CCO"]
    encodings = [tokenizer.encode(text).ids for text in texts]
    width = max(len(ids) for ids in encodings)
    ids = np.zeros((len(texts), width), dtype=np.int64)
    mask = np.zeros((len(texts), width), dtype=np.int64)
    for row, encoded in enumerate(encodings):
        ids[row, :len(encoded)] = encoded
        mask[row, :len(encoded)] = 1
    return ids, mask


def test_rxnfp_bert_hidden_states_equal_transformers(rxnfp_folder):
    """BertModel.from_pretrained on the folder (no safetensors: its pytorch_model.bin)
    against transformers' BertModel on the same folder, same token ids and padding mask.

    Tolerance: both compute in float32 and differ only in summation order (BLAS blocking,
    fused vs separate QKV). One dot product over K terms moves by about sqrt(K) * 2**-24
    relative (K <= 512 here: ~1.4e-6); twelve layers compound this while each LayerNorm
    renormalises, so 1e-5 of the largest activation bounds it with room (measured: 7e-7 on
    these three reactions, 20 tokens)."""
    transformers = pytest.importorskip("transformers")
    from candle_web import Tensor
    from candle_web.pipelines import bert_tokenizer_from_vocab

    model = BertModel.from_pretrained(rxnfp_folder)
    tokenizer = bert_tokenizer_from_vocab(rxnfp_folder)
    ids, mask = smiles_batch(tokenizer)
    ours = model.forward(Tensor(ids), attention_mask=Tensor(mask)).to_numpy()
    reference = transformers.BertModel.from_pretrained(str(rxnfp_folder)).eval()
    with torch.no_grad():
        theirs = reference(input_ids=torch.from_numpy(ids),
                           attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    valid = mask.astype(bool)  # padded positions are not defined outputs
    error = np.abs(ours[valid] - theirs[valid]).max() / np.abs(theirs[valid]).max()
    assert error < 1e-5, error


def test_the_vocab_txt_tokenizer_equals_hf_bert_wordpiece(rxnfp_folder):
    from tokenizers.implementations import BertWordPieceTokenizer

    from candle_web.pipelines import bert_tokenizer_from_vocab

    ours = bert_tokenizer_from_vocab(rxnfp_folder)
    theirs = BertWordPieceTokenizer(str(rxnfp_folder / "vocab.txt"))
    for text in ("CC(=O)O.OCC>>CC(=O)OCC", "c1ccccc1Br.OB(O)c1ccccc1", "Hello, World! naïve",
                 "[Na+].[Cl-]>>[Na+]"):
        assert ours.encode(text).ids == theirs.encode(text).ids, text


def test_embed_cli_runs_on_a_bert_folder_with_only_pytorch_model_bin(rxnfp_folder, capsys):
    assert not list(rxnfp_folder.glob("*.safetensors"))
    texts = ["CC(=O)O.OCC>>CC(=O)OCC.O", "c1ccccc1Br.OB(O)c1ccccc1>>c1ccc(-c2ccccc2)cc1"]
    assert cli.main(["embed", *texts, "--model", str(rxnfp_folder)]) == 0
    rows = json.loads(capsys.readouterr().out)
    vectors = np.array([row["embedding"] for row in rows])
    assert vectors.shape == (2, 256)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_safetensors_are_preferred_when_a_folder_has_both(rxnfp_folder, tmp_path):
    from candle_web.io.safetensors import save

    for name in ("config.json", "vocab.txt", "pytorch_model.bin"):
        (tmp_path / name).symlink_to(rxnfp_folder / name)
    assert isinstance(folder_weights(tmp_path), PytorchWeights)
    reference = torch.load(rxnfp_folder / "pytorch_model.bin", weights_only=True)
    changed = {name: torch_numpy(value) for name, value in reference.items()}
    changed["bert.embeddings.word_embeddings.weight"] = (
        changed["bert.embeddings.word_embeddings.weight"] * 2)
    save(changed, tmp_path / "model.safetensors")
    assert folder_weights(tmp_path) == [str(tmp_path / "model.safetensors")]
    model = BertModel.from_pretrained(tmp_path)
    np.testing.assert_array_equal(model.embeddings.word.to_numpy(),
                                  changed["bert.embeddings.word_embeddings.weight"])


def test_rxnmapper_albert_saved_on_cuda_reads_on_the_cpu(model_file):
    path = model_file(RXNMAPPER, "pytorch_model.bin")
    checkpoint = TorchCheckpoint(path)
    assert checkpoint.format == "legacy"
    assert {checkpoint.info(name).storage.location for name in checkpoint.keys()} == {"cuda:0"}
    reference = torch.load(path, weights_only=True, map_location="cpu")
    assert checkpoint.keys() == list(reference)
    for name, expected in reference.items():
        np.testing.assert_array_equal(checkpoint.get_numpy(name), torch_numpy(expected),
                                      err_msg=name)


def test_rxnmapper_training_args_is_refused_naming_its_class(model_file):
    path = model_file(RXNMAPPER, "training_args.bin")
    with pytest.raises(FormatError, match=r"refused: .*argparse\.Namespace"):
        TorchCheckpoint(path)
    with pytest.raises(FormatError, match=r"argparse\.Namespace"):
        open_weights(path)
    with pytest.raises(pickle.UnpicklingError):  # torch's own safe mode refuses it too
        torch.load(path, weights_only=True)


def test_whisperx_checkpoint_is_refused_naming_the_classes_next_to_its_tensors(model_file):
    """Decision (io/pytorch.py): a pickle naming classes outside the allowlist is refused as a
    whole, with every name, rather than read around; torch.load(weights_only=True) refuses
    the same file."""
    path = model_file("whisperx-segmentation", "pytorch_model.bin")
    with pytest.raises(FormatError) as caught:
        TorchCheckpoint(path)
    message = str(caught.value)
    for name in ("pyannote.audio.core.task.Specifications", "pyannote.audio.core.model"
                 ".Introspection", "omegaconf.listconfig.ListConfig",
                 "torch.torch_version.TorchVersion"):
        assert name in message
    assert "torch._utils._rebuild_tensor_v2" not in message  # allowed names are not listed
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True, map_location="cpu")


def test_silero_torchscript_archive_is_refused_as_torchscript(model_file):
    path = model_file("silero-vad-jit", "silero_vad.jit")
    with pytest.raises(UnsupportedError, match="TorchScript"):
        TorchCheckpoint(path)
    with pytest.raises(UnsupportedError, match="TorchScript"):
        PytorchWeights(path)


# -- other models' folders ------------------------------------------------------------------
def _module(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _as_pytorch_folder(safetensors_folder, target):
    """The same folder with its model.safetensors replaced by torch.save of the same tensors
    (legacy layout, as the older Hub repositories ship them)."""
    from candle_web.io.safetensors import SafeTensors

    target.mkdir()
    for path in safetensors_folder.iterdir():
        if path.suffix != ".safetensors":
            (target / path.name).write_bytes(path.read_bytes())
    file = SafeTensors(safetensors_folder / "model.safetensors")
    state = collections.OrderedDict(
        (name, torch.from_numpy(np.array(file.get_numpy(name)))) for name in file.keys())
    torch.save(state, target / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    return target


def test_t5_and_llama_folders_with_pytorch_model_bin_equal_their_safetensors_twins(tmp_path):
    """The same weights through either file give bit-identical outputs."""
    from pathlib import Path

    from candle_web import Tensor
    from candle_web.models.llama import Llama
    from candle_web.models.t5 import T5ForConditionalGeneration

    tests = Path(__file__).resolve().parent.parent
    record_t5 = _module(tests / "reference" / "record_t5.py")
    t5_st = record_t5.write_model("v1_1", tmp_path / "t5")
    t5_pt = _as_pytorch_folder(t5_st, tmp_path / "t5-pt")
    ids = Tensor(np.array([[3, 7, 11, 2]], dtype=np.int64))
    outputs = [T5ForConditionalGeneration.from_pretrained(folder).encode(ids).to_numpy()
               for folder in (t5_st, t5_pt)]
    np.testing.assert_array_equal(outputs[0], outputs[1])

    llama_lib = _module(tests / "models" / "llama_testlib.py")
    state = llama_lib.random_state(llama_lib.TINY_CONFIG)
    llama_st = llama_lib.to_hf_folder(state, llama_lib.TINY_CONFIG, tmp_path / "llama")
    llama_pt = _as_pytorch_folder(llama_st, tmp_path / "llama-pt")
    tokens = np.array([[1, 5, 9, 17]], dtype=np.int64)
    logits = [Llama.from_pretrained(folder).forward(tokens, all_logits=True).to_numpy()
              for folder in (llama_st, llama_pt)]
    np.testing.assert_array_equal(logits[0], logits[1])


def test_an_hf_whisper_folder_with_pytorch_model_bin_equals_its_safetensors_twin(
        model_file, tmp_path):
    """whisper-tiny.en's real weights in HF naming (as test_whisper_hf.py builds them), once
    as model.safetensors and once as pytorch_model.bin: the same encoder output."""
    from pathlib import Path

    from candle_web import Tensor
    from candle_web.io import audio
    from candle_web.io.ct2 import read_ct2
    from candle_web.io.safetensors import save
    from candle_web.models.whisper import Whisper

    whisper_hf = _module(Path(__file__).resolve().parent.parent / "models" / "test_whisper_hf.py")
    tensors, config = whisper_hf.ct2_to_hf(read_ct2(str(model_file("whisper-tiny.en",
                                                                   "model.bin"))))
    folder = tmp_path / "hf"
    folder.mkdir()
    save(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    twin = _as_pytorch_folder(folder, tmp_path / "hf-pt")
    assert not list(twin.glob("*.safetensors"))
    tone = np.sin(np.arange(16000, dtype=np.float32) * 0.05)
    mel = audio.pad_or_trim(audio.log_mel_spectrogram(tone), audio.N_FRAMES)[None]
    outputs = [Whisper.from_pretrained(path).encode(Tensor.from_numpy(mel)).to_numpy()
               for path in (folder, twin)]
    np.testing.assert_array_equal(outputs[0], outputs[1])
