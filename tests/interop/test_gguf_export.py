"""GGUF export (llama.cpp) held to the `gguf` package: tiny random Llamas (tied and untied
embeddings, GQA) made by transformers with a fixed seed, with a byte-level BPE tokenizer.json
trained offline by `tokenizers` on Python docstrings. For each output type the file is read by
gguf.GGUFReader; every tensor's bytes equal gguf.quants.quantize of the same float weights
(after convert_hf_to_gguf's Q/K permutation), its dequantized values equal gguf.quants'
dequantization of those bytes, the metadata and vocabulary are what llama.cpp's converter
writes, and no tensor is lost. Qwen2 (Q/K/V biases) and Qwen3 (head_dim != hidden / heads,
Q/K norms) keep their row order, as llama.cpp's converter leaves them."""
from __future__ import annotations

import builtins
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf", reason="the gguf package (tests/requirements.txt) reads GGUF")
from safetensors.torch import load_file  # noqa: E402

GT = gguf.GGMLQuantizationType
TYPES = {"f32": GT.F32, "f16": GT.F16, "q8_0": GT.Q8_0, "q4_0": GT.Q4_0, "q4_1": GT.Q4_1}
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7}
HEADS, KV_HEADS = 4, 2
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def training_text() -> list[str]:
    docs = [getattr(builtins, n).__doc__ for n in dir(builtins)]
    docs += [json.__doc__, np.__doc__ or ""]
    return [line for d in docs if d for line in d.splitlines() if line.strip()][:600]


def make_tokenizer(folder):
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "add_bos_token": True,
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    return tok


def make_folder(root, tied: bool, family: str = "llama", dtype=None):
    folder = root / (family if family != "llama" else "tied" if tied else "untied")
    if dtype is not None:
        folder = folder.with_name(folder.name + "_" + str(dtype).split(".")[-1])
    folder.mkdir()
    tok = make_tokenizer(folder)
    torch.manual_seed(0)
    common = dict(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=tied,
        bos_token_id=0, eos_token_id=1)
    if family == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    elif family == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=32))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    with torch.no_grad():  # norms and biases away from 1 and 0 so that their values are checked
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            if name.endswith(".bias"):
                p.uniform_(-0.1, 0.1)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_src")
    out = {tied: make_folder(root, tied) for tied in (True, False)}
    out["qwen2"] = make_folder(root, True, "qwen2")
    out["qwen3"] = make_folder(root, True, "qwen3")
    out["bf16"] = make_folder(root, False, dtype=torch.bfloat16)
    return out


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


QWEN_EXTRA = {"self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
              "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
              "self_attn.k_norm.weight": "attn_k_norm.weight"}


def expected_tensors(folder, rope_permute: bool = True) -> dict[str, np.ndarray]:
    sd = {k: v.float().numpy() for k, v in load_file(str(folder / "model.safetensors")).items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"],
           "output_norm.weight": sd["model.norm.weight"]}
    if "lm_head.weight" in sd:
        out["output.weight"] = sd["lm_head.weight"]
    for i in range(2):
        for hf, gg in {**LAYER_MAP, **QWEN_EXTRA}.items():
            if f"model.layers.{i}.{hf}" not in sd:
                continue
            w = sd[f"model.layers.{i}.{hf}"]
            if rope_permute and hf.startswith("self_attn.q_proj"):
                w = permute(w, HEADS)
            if rope_permute and hf.startswith("self_attn.k_proj"):
                w = permute(w, KV_HEADS)
            out[f"blk.{i}.{gg}"] = w
    assert len(out) == len(sd), "the expected map covers every checkpoint tensor"
    return {k: v.astype(np.float32) for k, v in out.items()}


def expected_type(name: str, w: np.ndarray, quant: str, tied: bool) -> GT:
    if w.ndim == 1 or name.endswith("_norm.weight"):
        return GT.F32
    is_output = name == "output.weight" or (tied and name == "token_embd.weight")
    if quant in ("q4_0", "q4_1") and is_output:
        return GT.Q8_0
    return TYPES[quant]


def field_value(reader, key):
    f = reader.fields[key]
    return f.contents()


@pytest.fixture(scope="module")
def exported(folders, run_qforge, tmp_path_factory):
    """{(tied, quant): path of the .gguf qforge wrote}."""
    out_dir = tmp_path_factory.mktemp("gguf_out")
    out = {}
    for tied, folder in folders.items():
        for quant in (TYPES if isinstance(tied, bool) else ("q8_0", "q4_0")):
            path = out_dir / f"{folder.name}_{quant}.gguf"
            rc, _, stderr = run_qforge("convert", folder, "--format", "gguf", "--quant", quant,
                                       "-o", path)
            assert rc == 0, stderr
            out[(tied, quant)] = path
    return out


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("quant", list(TYPES))
def test_tensors_equal_the_gguf_reference(tied, quant, folders, exported):
    reader = gguf.GGUFReader(str(exported[(tied, quant)]))
    want = expected_tensors(folders[tied])
    got = {t.name: t for t in reader.tensors}
    assert sorted(got) == sorted(want), "tensors written are the model's, none lost or added"
    assert ("output.weight" in got) == (not tied)
    for name, w in want.items():
        t = got[name]
        qtype = expected_type(name, w, quant, tied)
        assert t.tensor_type == qtype, name
        assert [int(n) for n in t.shape] == list(reversed(w.shape)), name
        raw = np.asarray(t.data)
        if qtype == GT.F32:
            np.testing.assert_array_equal(raw.reshape(w.shape), w, err_msg=name)
            continue
        ref = gguf.quants.quantize(w, qtype)
        assert raw.view(np.uint8).tobytes() == ref.view(np.uint8).tobytes(), name
        deq = gguf.quants.dequantize(raw, qtype).reshape(w.shape)
        np.testing.assert_array_equal(deq, gguf.quants.dequantize(ref, qtype).reshape(w.shape))
        # what the file holds is close to the weights (the permutation applied, not lost)
        tol = {GT.F16: 1e-3, GT.Q8_0: 2e-3, GT.Q4_0: 3e-2, GT.Q4_1: 3e-2}[qtype]
        assert np.max(np.abs(deq - w)) < tol, name


@pytest.mark.parametrize("quant", list(TYPES))
def test_metadata_is_what_llama_cpp_reads(quant, folders, exported):
    reader = gguf.GGUFReader(str(exported[(True, quant)]))
    cfg = json.loads((folders[True] / "config.json").read_text())
    uint32 = {
        "llama.block_count": 2, "llama.context_length": 256, "llama.embedding_length": 64,
        "llama.feed_forward_length": 128, "llama.attention.head_count": HEADS,
        "llama.attention.head_count_kv": KV_HEADS, "llama.rope.dimension_count": 16,
        "llama.vocab_size": cfg["vocab_size"], "general.file_type": FILE_TYPES[quant],
        "general.quantization_version": 2,
        "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1,
    }
    for key, value in uint32.items():
        assert reader.fields[key].types == [gguf.GGUFValueType.UINT32], key
        assert field_value(reader, key) == value, key
    assert field_value(reader, "general.architecture") == "llama"
    assert field_value(reader, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert field_value(reader, "llama.rope.freq_base") == pytest.approx(10000.0)
    assert field_value(reader, "tokenizer.ggml.model") == "gpt2"
    assert field_value(reader, "tokenizer.ggml.pre") == "gpt-2"  # llama.cpp's name for it
    assert field_value(reader, "tokenizer.ggml.add_bos_token") is True

    tok = json.loads((folders[True] / "tokenizer.json").read_text())
    vocab = {**tok["model"]["vocab"], **{a["content"]: a["id"] for a in tok["added_tokens"]}}
    by_id = sorted(vocab, key=vocab.get)
    assert field_value(reader, "tokenizer.ggml.tokens") == by_id
    types = field_value(reader, "tokenizer.ggml.token_type")
    assert types[:2] == [3, 3] and set(types[2:]) == {1}  # specials CONTROL, the rest NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    assert field_value(reader, "tokenizer.ggml.merges") == merges
    assert len(merges) > 0


def test_inspect_reads_the_file(exported, run_qforge):
    rc, stdout, stderr = run_qforge("inspect", exported[(False, "q4_0")], "--json")
    assert rc == 0, stderr
    j = json.loads(stdout)
    assert j["format"] == "gguf" and j["architecture"] == "llama"
    assert j["tensor_count"] == 2 * 9 + 3
    assert j["types"]["Q4_0"]["tensors"] == 2 * 7 + 1  # layer matrices and token_embd
    assert j["types"]["Q8_0"]["tensors"] == 1          # output.weight
    assert j["metadata"]["tokenizer.ggml.tokens"]["length"] == 300


def test_inspect_refuses_a_truncated_file(exported, run_qforge, tmp_path):
    data = exported[(True, "q8_0")].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])  # header intact, tensor data cut
    rc, _, stderr = run_qforge("inspect", cut)
    assert rc == 3, stderr
    assert "outside" in stderr and "cut.gguf" in stderr


def test_config_that_disagrees_with_a_tensor_is_refused(folders, run_qforge, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in folders[False].iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (bad / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "bad.gguf"
    rc, _, stderr = run_qforge("convert", bad, "--format", "gguf", "--quant", "q8_0", "-o", out)
    assert rc == 3, stderr
    assert "model.layers.0.mlp.gate_proj.weight" in stderr
    assert not out.exists()


def test_gguf_types_need_format_gguf(folders, run_qforge, tmp_path):
    rc, _, stderr = run_qforge("convert", folders[True], "--quant", "q4_0", "-o",
                               tmp_path / "x.safetensors")
    assert rc == 2 and "--format gguf" in stderr
    rc, _, stderr = run_qforge("convert", folders[True], "--format", "gguf", "--quant", "int8",
                               "-o", tmp_path / "x.gguf")
    assert rc == 2 and "--quant int8" in stderr


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_qwen_keeps_row_order(family, quant, folders, exported):
    reader = gguf.GGUFReader(str(exported[(family, quant)]))
    want = expected_tensors(folders[family], rope_permute=False)
    got = {t.name: t for t in reader.tensors}
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        t = got[name]
        qtype = expected_type(name, w, quant, True)
        assert t.tensor_type == qtype, name
        raw = np.asarray(t.data)
        if qtype == GT.F32:
            np.testing.assert_array_equal(raw.reshape(w.shape), w, err_msg=name)
        else:
            ref = gguf.quants.quantize(w, qtype)
            assert raw.view(np.uint8).tobytes() == ref.view(np.uint8).tobytes(), name
    assert field_value(reader, "general.architecture") == family
    assert field_value(reader, f"{family}.attention.head_count_kv") == KV_HEADS
    assert field_value(reader, f"{family}.block_count") == 2
    assert f"{family}.vocab_size" not in reader.fields  # Qwen2Model/Qwen3Model do not write it
    if family == "qwen3":  # head_dim given explicitly: key/value lengths written
        assert field_value(reader, "qwen3.attention.key_length") == 32
        assert "blk.0.attn_q_norm.weight" in got
    else:
        assert "blk.0.attn_q.bias" in got


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_bf16_checkpoint_quantizes_its_exact_values(quant, folders, exported):
    """A bf16 checkpoint's values, widened exactly to float32, give the reference's bytes."""
    reader = gguf.GGUFReader(str(exported[("bf16", quant)]))
    want = expected_tensors(folders["bf16"])
    got = {t.name: t for t in reader.tensors}
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        qtype = expected_type(name, w, quant, False)
        raw = np.asarray(got[name].data)
        ref = w if qtype == GT.F32 else gguf.quants.quantize(w, qtype)
        assert raw.view(np.uint8).tobytes() == ref.view(np.uint8).tobytes(), name
