"""GGUF export of a model folder whose vocabulary is SentencePiece (`tokenizer.model`, as
Llama 2, Mistral and many fine-tunes ship it): a tiny Llama with a byte-fallback BPE trained by
the `sentencepiece` package on Python docstrings, its tokenizer.json made by transformers from
that model, and tokenizer_config.json's added_tokens_decoder as save_pretrained writes it. The
vocabulary in the file is what llama.cpp's converter (`_create_vocab_sentencepiece`) puts there:
tokenizer.ggml.model "llama", every piece with its score and type (unknown, control, unused and
byte pieces by their SentencePiece type; added_tokens.json and added_tokens_decoder over them
with score -1000), no merges, the special ids. The expected values are computed here from the
`sentencepiece` package's own reading of the file, not from qforge's. When llama-cpp-python is
installed (scripts/setup_peers.sh builds it), llama.cpp itself loads the file's vocabulary and
tokenizes held-out text to the same ids as transformers."""
from __future__ import annotations

import builtins
import json
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece", reason="sentencepiece (tests/requirements.txt) "
                          "trains the tokenizer.model")
gguf = pytest.importorskip("gguf", reason="the gguf package (tests/requirements.txt) reads GGUF")

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
VOCAB_PAD = 4  # config.json's vocab_size is the model's 400 pieces plus these


def training_text() -> list[str]:
    docs = [getattr(builtins, n).__doc__ for n in dir(builtins)]
    return [line for d in docs if d for line in d.splitlines() if line.strip()][:600]


HELD_OUT = [
    "Return a new sorted list from the items in iterable.",
    # Not leading or repeated spaces: there sentencepiece, transformers and llama.cpp each
    # tokenize differently, whatever the file holds.
    "unicode é, byte fallback ☃ and digits 12345",
    "<tool> called with a user-defined piece",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf_spm") / "llama_spm"
    d.mkdir()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text()), model_prefix=str(d / "sp"), vocab_size=400,
        model_type="bpe", byte_fallback=True, character_coverage=0.995, num_threads=1,
        user_defined_symbols=["<tool>"], minloglevel=2)
    (d / "sp.model").rename(d / "tokenizer.model")
    (d / "sp.vocab").unlink()
    special = {"0": "<unk>", "1": "<s>", "2": "</s>"}
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
        "add_prefix_space": True,
        "added_tokens_decoder": {k: {"content": v, "special": True, "lstrip": False,
                                     "rstrip": False, "normalized": False}
                                 for k, v in special.items()}}))
    tok = transformers.AutoTokenizer.from_pretrained(d)  # converts tokenizer.model
    tok.backend_tokenizer.save(str(d / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=400 + VOCAB_PAD, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def exported(folder, run_qforge, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf_spm_out") / "llama_spm_f32.gguf"
    rc, _, stderr = run_qforge("convert", folder, "--format", "gguf", "--quant", "f32", "-o", out)
    assert rc == 0, stderr
    return out


def expected_vocab(folder):
    """llama.cpp's _create_vocab_sentencepiece, from the sentencepiece package's reading."""
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    n = json.loads((folder / "config.json").read_text())["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(n)]
    scores = [-10000.0] * n
    types = [UNUSED] * n
    for i in range(sp.vocab_size()):
        tokens[i] = sp.id_to_piece(i)
        scores[i] = sp.get_score(i)
        types[i] = (UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i)
                    else UNUSED if sp.is_unused(i) else BYTE if sp.is_byte(i) else NORMAL)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    for key, entry in cfg["added_tokens_decoder"].items():
        tokens[int(key)] = entry["content"]
        types[int(key)] = CONTROL
        scores[int(key)] = -1000.0
    return tokens, scores, types


def field(reader, key):
    return reader.fields[key].contents()


def test_vocabulary_is_what_llama_cpp_converter_writes(folder, exported):
    reader = gguf.GGUFReader(str(exported))
    tokens, scores, types = expected_vocab(folder)
    assert field(reader, "tokenizer.ggml.model") == "llama"
    assert field(reader, "tokenizer.ggml.pre") == "default"
    assert field(reader, "tokenizer.ggml.tokens") == tokens
    np.testing.assert_array_equal(np.asarray(field(reader, "tokenizer.ggml.scores"), np.float32),
                                  np.asarray(scores, np.float32))
    assert field(reader, "tokenizer.ggml.token_type") == types
    assert "tokenizer.ggml.merges" not in reader.fields
    assert types.count(BYTE) == 256 and types[400:] == [UNUSED] * VOCAB_PAD
    assert tokens[3] == "<tool>" and types[3] == NORMAL  # a user-defined piece, as the converter
    for key, value in {"bos": 1, "eos": 2, "unk": 0}.items():
        assert field(reader, f"tokenizer.ggml.{key}_token_id") == value, key
    assert field(reader, "tokenizer.ggml.add_bos_token") is True
    assert field(reader, "tokenizer.ggml.add_eos_token") is False
    assert field(reader, "tokenizer.ggml.add_space_prefix") is True


def test_added_tokens_json_overrides_pieces(folder, run_qforge, tmp_path):
    d = tmp_path / "with_added"
    d.mkdir()
    for f in folder.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    (d / "added_tokens.json").write_text(json.dumps({"<extra_a>": 400, "<extra_b>": 401}))
    out = tmp_path / "added.gguf"
    rc, _, stderr = run_qforge("convert", d, "--format", "gguf", "--quant", "f32", "-o", out)
    assert rc == 0, stderr
    reader = gguf.GGUFReader(str(out))
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    scores = field(reader, "tokenizer.ggml.scores")
    assert tokens[400:] == ["<extra_a>", "<extra_b>", "[PAD402]", "[PAD403]"]
    assert types[400:] == [USER_DEFINED, USER_DEFINED, UNUSED, UNUSED]
    assert scores[400:402] == [-1000.0, -1000.0]


@pytest.mark.parametrize("damage", ["truncated", "not_protobuf"])
def test_a_corrupt_tokenizer_model_is_refused(folder, run_qforge, tmp_path, damage):
    d = tmp_path / damage
    d.mkdir()
    for f in folder.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    data = (folder / "tokenizer.model").read_bytes()
    (d / "tokenizer.model").write_bytes(data[: len(data) // 3] if damage == "truncated"
                                        else b"\xff" * 64)
    out = tmp_path / "bad.gguf"
    rc, _, stderr = run_qforge("convert", d, "--format", "gguf", "--quant", "f32", "-o", out)
    assert rc == 3, stderr  # invalid input
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "tokenizer.model" in lines[0], lines
    assert not out.exists()


def test_llama_cpp_tokenizes_like_transformers(folder, exported):
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is built by scripts/setup_peers.sh")
    llm = llama_cpp.Llama(model_path=str(exported), vocab_only=True, verbose=False)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    for text in HELD_OUT:
        want = tok(text).input_ids
        got = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        assert got == want, textwrap.shorten(text, 40)
        # The text comes back, less the space prefix SentencePiece adds (add_space_prefix).
        assert llm.detokenize(got[1:]).decode("utf-8").removeprefix(" ") == text
