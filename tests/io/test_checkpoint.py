"""io/checkpoint.py: one opener for a folder, a file, a registry name, a Hub "org/name@revision"
and the bytes a worker received; weights, naming, config, tokenizer, chat template and
generation config out, each read when asked. The references are the independent readers
(`safetensors`, `gguf`, HF `tokenizers`, json) on the same files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from candle_web import hub
from candle_web.core.errors import FormatError, ModelNotFound
from candle_web.hub import HubSpec
from candle_web.io.checkpoint import Checkpoint, open_checkpoint
from candle_web.io.weights import weights_files

BERT = "all-minilm-l6-v2"
BERT_FILES = ("config.json", "model.safetensors", "tokenizer.json")
SMOLLM2 = ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEXT = "A man is eating food, naïvely: 3.14!"


def received(folder: Path, names) -> dict:
    """{name: uint8 array}: what the browser worker hands Python after a download."""
    return {name: np.frombuffer((folder / name).read_bytes(), dtype=np.uint8) for name in names}


@pytest.fixture(scope="module")
def bert_folder(model_file):
    for name in BERT_FILES:
        model_file(BERT, name)
    return model_file(BERT, "model.safetensors").parent


# -- the same checkpoint, however it is named ------------------------------------------------
def test_a_folder_its_received_bytes_and_its_registry_name_open_alike(bert_folder):
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer as HfTokenizer

    reference = load_file(bert_folder / "model.safetensors")
    config = json.loads((bert_folder / "config.json").read_text(encoding="utf-8"))
    hf_ids = HfTokenizer.from_file(str(bert_folder / "tokenizer.json")).encode(TEXT).ids
    for checkpoint in (open_checkpoint(bert_folder, "bert"),
                       open_checkpoint(received(bert_folder, BERT_FILES), "bert"),
                       open_checkpoint(BERT, "bert")):
        assert (checkpoint.format, checkpoint.naming) == ("safetensors", "hf")
        assert checkpoint.config == config
        assert checkpoint.metadata is None and checkpoint.gguf is None
        assert sorted(checkpoint.weights.names()) == sorted(reference)
        for name in ("embeddings.word_embeddings.weight", "encoder.layer.5.output.dense.bias"):
            np.testing.assert_array_equal(checkpoint.weights.tensor(name).to_numpy(),
                                          reference[name])
        assert checkpoint.tokenizer.encode(TEXT).ids == hf_ids
    assert open_checkpoint(bert_folder).label == str(bert_folder)
    assert open_checkpoint(received(bert_folder, BERT_FILES)).label == "the received files"


def test_a_gguf_file_carries_its_config_tokenizer_and_chat_template(model_file):
    import gguf

    path = model_file(*SMOLLM2)
    fields = gguf.GGUFReader(path).fields
    by_path = open_checkpoint(path, "llama")
    by_bytes = open_checkpoint(received(path.parent, [path.name]), "llama")
    by_name = open_checkpoint(SMOLLM2[0], "llama")
    for checkpoint in (by_path, by_bytes, by_name):
        assert (checkpoint.format, checkpoint.naming) == ("gguf", "gguf")
        assert checkpoint.weight_files == [path.name]
        assert checkpoint.config is None and checkpoint.generation_config is None
        assert checkpoint.metadata["general.architecture"] == fields[
            "general.architecture"].contents()
        assert checkpoint.chat_template == fields["tokenizer.chat_template"].contents()
        assert len(checkpoint.weights.names()) == len(gguf.GGUFReader(path).tensors)
    ids = by_path.tokenizer.encode(TEXT).ids
    assert by_bytes.tokenizer.encode(TEXT).ids == by_name.tokenizer.encode(TEXT).ids == ids
    assert by_path.tokenizer.token_to_id("<|im_end|>") == fields["tokenizer.ggml.eos_token_id"] \
        .contents()


def test_the_worker_builds_from_bytes_the_model_load_llama_loads_from_the_file(model_file):
    """The page's LlamaSession.build goes through the same loader: same weights, same logits."""
    from candle_web import Tensor
    from candle_web.pipelines import Loaded, load_llama
    from candle_web.worker import LlamaSession

    path = model_file(*SMOLLM2)
    native = load_llama(path)
    model, tokenizer = LlamaSession().build(received(path.parent, [path.name]))
    assert isinstance(native, Loaded) and native.checkpoint.kind == "llama"
    assert model.chat_template == native.model.chat_template == native.checkpoint.chat_template
    ids = Tensor(np.array([tokenizer.encode(TEXT).ids], dtype=np.int64))
    assert tokenizer.encode(TEXT).ids == native.tokenizer.encode(TEXT).ids
    np.testing.assert_array_equal(model.forward(ids, 0).to_numpy(),
                                  native.model.forward(ids, 0).to_numpy())


def test_every_load_returns_a_loaded(bert_folder, model_file):
    from candle_web.models.bert import BertModel
    from candle_web.models.whisper import Whisper
    from candle_web.pipelines import Loaded, load_bert, load_whisper

    for name in ("model.bin", "config.json", "tokenizer.json"):
        model_file("whisper-tiny.en", name)
    whisper = load_whisper("whisper-tiny.en")
    bert = load_bert(bert_folder)
    assert isinstance(whisper, Loaded) and isinstance(whisper.model, Whisper)
    assert whisper.checkpoint.format == "ct2" and whisper.checkpoint.naming == "ct2"
    assert whisper.tokenizer.token_to_id("<|endoftext|>") == 50256  # tiny.en's end of text
    assert isinstance(bert, Loaded) and isinstance(bert.model, BertModel)
    assert bert.checkpoint.label == str(bert_folder)


# -- which file holds the weights ------------------------------------------------------------
@pytest.mark.parametrize("names, expected", [
    (["model.safetensors", "pytorch_model.bin", "a.gguf", "config.json"],
     ("safetensors", ["model.safetensors"])),
    (["model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors"],
     ("safetensors", ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"])),
    (["x.gguf", "model.bin", "tokenizer.json"], ("gguf", ["x.gguf"])),
    (["model.bin", "config.json"], ("ct2", ["model.bin"])),
    (["pytorch_model-00002-of-00002.bin", "pytorch_model-00001-of-00002.bin"],
     ("pytorch", ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"])),
    (["weights.pth", "config.json"], ("pytorch", ["weights.pth"])),
])
def test_the_weights_are_chosen_by_preference(names, expected):
    assert weights_files(names, "folder") == expected


@pytest.mark.parametrize("names, fragment", [
    (["a.gguf", "b.gguf"], "expected exactly one .gguf file, found 2: a.gguf, b.gguf"),
    (["config.json", "tokenizer.json"], "no weights: expected *.safetensors, one .gguf"),
    (["a.pt", "b.pt"], "no weights"),
])
def test_no_or_ambiguous_weights_are_named(names, fragment):
    with pytest.raises(ModelNotFound, match=re.escape(fragment)) as info:
        weights_files(names, "/models/x")
    assert str(info.value).startswith("/models/x: ")


def test_a_weights_file_given_alone_brings_its_side_files_only(tmp_path):
    from safetensors.numpy import save_file

    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(tmp_path / "a.safetensors"))
    save_file({"v": np.zeros(2, dtype=np.float32)}, str(tmp_path / "b.safetensors"))
    (tmp_path / "config.json").write_text('{"hidden_size": 3}')
    (tmp_path / "notes.txt").write_text("not a model file")
    checkpoint = open_checkpoint(tmp_path / "a.safetensors")
    assert sorted(checkpoint.files) == ["a.safetensors", "config.json"]
    assert checkpoint.weights.names() == ["w"] and checkpoint.config == {"hidden_size": 3}
    # The folder itself: every shard.
    assert sorted(open_checkpoint(tmp_path).weights.names()) == ["v", "w"]


def test_shards_are_one_namespace_from_a_folder_or_received_bytes(tmp_path):
    """Two torch.save shards (the sharded pytorch_model-0000k-of-00002.bin layout) and two
    safetensors shards, each read back against the arrays that were saved."""
    torch = pytest.importorskip("torch")
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    arrays = {f"layer.{i}.weight": rng.standard_normal((3, 4)).astype(np.float32)
              for i in range(4)}
    names = sorted(arrays)
    pytorch_folder, safetensors_folder = tmp_path / "pt", tmp_path / "st"
    pytorch_folder.mkdir()
    safetensors_folder.mkdir()
    for shard, part in enumerate((names[:2], names[2:]), start=1):
        torch.save({name: torch.from_numpy(arrays[name]) for name in part},
                   pytorch_folder / f"pytorch_model-0000{shard}-of-00002.bin")
        save_file({name: arrays[name] for name in part},
                  str(safetensors_folder / f"model-0000{shard}-of-00002.safetensors"))
    for folder, kind in ((pytorch_folder, "pytorch"), (safetensors_folder, "safetensors")):
        files = sorted(path.name for path in folder.iterdir())
        for checkpoint in (open_checkpoint(folder), open_checkpoint(received(folder, files))):
            assert checkpoint.format == kind and checkpoint.weight_files == files
            assert sorted(checkpoint.weights.names()) == names
            for name in names:
                np.testing.assert_array_equal(checkpoint.weights.tensor(name).to_numpy(),
                                              arrays[name])


# -- side files, read when asked -------------------------------------------------------------
def test_chat_template_and_generation_config_of_an_hf_folder(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read below
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ a }}"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    checkpoint = open_checkpoint(tmp_path, "llama")
    assert checkpoint.chat_template == "{{ a }}"
    assert checkpoint.generation_config == {"eos_token_id": [2, 5]}
    assert checkpoint.config is None
    with pytest.raises(ModelNotFound, match="llama safetensors weights but no config.json"):
        checkpoint.required_config()
    (tmp_path / "chat_template.jinja").write_text("{{ b }}", encoding="utf-8")
    assert open_checkpoint(tmp_path).chat_template == "{{ b }}"  # the .jinja file wins


def test_a_broken_side_file_fails_only_when_it_is_asked_for_naming_it(bert_folder, tmp_path):
    for name in BERT_FILES:
        (tmp_path / name).symlink_to(bert_folder / name)
    (tmp_path / "generation_config.json").write_bytes(b"{nope")
    checkpoint = open_checkpoint(tmp_path, "bert")
    assert checkpoint.config["hidden_size"] == 384 and checkpoint.weights.has(
        "embeddings.word_embeddings.weight")
    with pytest.raises(FormatError) as info:
        checkpoint.generation_config
    assert str(tmp_path / "generation_config.json") in str(info.value)
    broken = received(bert_folder, BERT_FILES)
    broken["config.json"] = np.frombuffer(b"[1, 2]", dtype=np.uint8)
    with pytest.raises(FormatError, match=r"t5 config.json \(the received files\): expected a "
                                          r"JSON object, got list"):
        open_checkpoint(broken, "t5").config


def test_a_missing_tokenizer_is_named(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    checkpoint = open_checkpoint(tmp_path, "whisper")
    assert not checkpoint.has_tokenizer
    with pytest.raises(ModelNotFound, match=r"no tokenizer.json \(or vocab.txt\) next to the "
                                            r"whisper weights \(found model.safetensors\)"):
        checkpoint.tokenizer


@pytest.mark.parametrize("source, fragment", [
    (42, "expected a path, a registry name, a Hub 'org/name@revision' or {file name: bytes}"),
    ({"config.json": 3}, "config.json: expected a path or bytes, got int"),
    ({7: b""}, "file names must be strings"),
])
def test_what_is_not_a_checkpoint_is_refused(source, fragment):
    with pytest.raises(FormatError, match=re.escape(fragment)):
        open_checkpoint(source)


# -- the Hub grammar -------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("org/name", ("org/name", "main")),
    ("google-t5/t5-small@df1b051c49625cf57a3d0d8d3863ed4d13564fe4",
     ("google-t5/t5-small", "df1b051c49625cf57a3d0d8d3863ed4d13564fe4")),
    ("Org_1/na.me-2@v1.0", ("Org_1/na.me-2", "v1.0")),
    ("org/name@", None), ("org/name@a@b", None), ("org/name@a/b", None), ("org/..", None),
    ("org/name@..", None), ("org/name\n", None), ("-org/name", None), ("name", None),
    ("a/b/c", None), ("", None), (None, None),
])
def test_the_one_hub_grammar(text, expected):
    spec = HubSpec.parse(text)
    assert (None if spec is None else (spec.repo, spec.revision)) == expected
    if spec is not None:
        assert str(spec) == (text if "@" in text else f"{text}@main")


def test_a_hub_spec_fetches_the_files_asked_for(tmp_path, monkeypatch):
    fetched = []

    def fetch_hf(repo, revision, name, progress=None):
        fetched.append((repo, revision, name))
        path = tmp_path / name
        path.write_text("{}")
        return path

    monkeypatch.setattr(hub, "fetch_hf", fetch_hf)
    checkpoint = open_checkpoint("someone/t5@abc123", "t5",
                                 hub_files=("config.json", "model.safetensors"))
    assert fetched == [("someone/t5", "abc123", "config.json"),
                       ("someone/t5", "abc123", "model.safetensors")]
    assert isinstance(checkpoint, Checkpoint) and checkpoint.label == "someone/t5@abc123"
    assert checkpoint.config == {} and checkpoint.format == "safetensors"
    # A folder of that name is the folder, not the Hub.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "someone" / "t5").mkdir(parents=True)
    (tmp_path / "someone" / "t5" / "model.bin").write_bytes(b"")
    assert open_checkpoint("someone/t5").format == "ct2"
    assert len(fetched) == 2
