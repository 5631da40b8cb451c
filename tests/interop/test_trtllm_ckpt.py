"""`qforge convert DIR --quant w4a16 --format trtllm-ckpt [--tp N] -o OUT/` writes TensorRT-LLM's
legacy engine-build checkpoint (config.json + rank{r}.safetensors), proven against the sources
that define it rather than against qforge's own reader:
- forward: qforge's compressed-tensors export of the same model with the same flags (its
  integers and scales, read with the compressed-tensors unpacker of
  test_compressed_tensors_export.py) split per rank as TensorRT-LLM's Llama converter splits
  (tensorrt_llm/models/llama/convert.py: q, k and v split by heads and fused per rank,
  gate_proj -> mlp.fc and up_proj -> mlp.gate along N, o_proj and down_proj along K, lm_head
  zero-padded to a multiple of tp and split, the embedding whole) and packed by ModelOpt's own
  `pack_int4_in_uint8` (nvidia-modelopt, modelopt/torch/export/quant_utils.py) equals each rank
  file's bytes;
- backward: a reference unpacker written from those sources rebuilds every Hugging Face weight
  from the rank files (qkv un-fused, the tp split undone) and its integers, scales and
  dequantized values equal the compressed-tensors export's bit for bit; float tensors equal the
  source model's, the tied lm_head the embedding;
- config.json keys; refusals (INT8 per channel, a tp that splits a group or the heads, group
  sizes the engine does not run, --tp with another format, a non-Llama model) leave nothing.
Tiny random Llamas with GQA: fp16 untied and bf16 tied (vocabulary 251, padded at tp 2), RTN
and AWQ, tp 1 and 2."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")

from test_compressed_tensors_export import read_weights, unpack  # noqa: E402

EXIT_USAGE, EXIT_UNSUPPORTED = 2, 4
HIDDEN, INTER, HEADS, KV_HEADS, LAYERS = 128, 256, 4, 2, 2
HEAD = HIDDEN // HEADS


def make_model(dtype: torch.dtype, tied: bool, vocab: int, seed: int):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER,
                                   num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                   num_key_value_heads=KV_HEADS, vocab_size=vocab,
                                   max_position_embeddings=64, tie_word_embeddings=tied)
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("trtllm_src")
    out = {}
    for name, dtype, tied, vocab in (("untied", torch.float16, False, 256),
                                     ("tied", torch.bfloat16, True, 251)):
        model = make_model(dtype, tied, vocab, seed=len(name))
        model.save_pretrained(root / name)
        out[name] = (model, root / name)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 251, (8, 16))
    np.savez(root / "ids.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    out["calib"] = root / "ids.npz"
    return out


CASES = [  # (model, method, block, tp)
    ("untied", "rtn", 64, 1),
    ("untied", "rtn", 64, 2),
    ("untied", "awq", 128, 1),
    ("tied", "rtn", 128, 1),
    ("tied", "rtn", 64, 2),
    ("tied", "awq", 64, 2),
]


def case_id(case):
    return "-".join(map(str, case))


@pytest.fixture(scope="module")
def converted(folders, run_qforge, tmp_path_factory):
    root = tmp_path_factory.mktemp("trtllm_out")
    out = {}
    for name, method, block, tp in CASES:
        model, src = folders[name]
        flags = ["--quant", "w4a16", "--block-size", str(block)]
        if method != "rtn":
            flags += ["--w4-method", method, "--calib", folders["calib"]]
        ct = root / f"{name}_{method}_{block}_ct"
        if not ct.exists():
            rc, _, stderr = run_qforge("convert", src, *flags, "-o", str(ct) + "/")
            assert rc == 0, stderr
        dst = root / f"{name}_{method}_{block}_tp{tp}"
        rc, _, stderr = run_qforge("convert", src, *flags, "--format", "trtllm-ckpt", "--tp",
                                   str(tp), "-o", str(dst) + "/")
        assert rc == 0, stderr
        out[(name, method, block, tp)] = (model, dst, ct)
    return out


# --- the reference, from TensorRT-LLM's and ModelOpt's sources ---------------------------------

def unpack_adjacent_rows(packed: torch.Tensor) -> np.ndarray:
    """int8 [N/2, K] -> q [N, K]: byte (i, k) holds row 2i in its low nibble, row 2i+1 in its
    high nibble, both signed int4 (ModelOpt pack_int4_in_uint8; TensorRT-LLM reads the
    transpose as quint4x2 along N)."""
    u = packed.view(torch.uint8).numpy().astype(np.int16)
    lo, hi = u & 0xF, u >> 4
    lo, hi = np.where(lo >= 8, lo - 16, lo), np.where(hi >= 8, hi - 16, hi)
    q = np.empty((2 * u.shape[0], u.shape[1]), dtype=np.int16)
    q[0::2], q[1::2] = lo, hi
    return q


def ranks(folder) -> list[dict[str, torch.Tensor]]:
    cfg = json.loads((folder / "config.json").read_text())
    n = cfg["mapping"]["world_size"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["config.json"] + [f"rank{r}.safetensors" for r in range(n)])
    return [load_file(str(folder / f"rank{r}.safetensors")) for r in range(n)]


TRT_OF = {  # HF module -> (TensorRT-LLM module, split axis); qkv handled apart
    "self_attn.o_proj": ("attention.dense", 1),
    "mlp.gate_proj": ("mlp.fc", 0),
    "mlp.up_proj": ("mlp.gate", 0),
    "mlp.down_proj": ("mlp.proj", 1),
}


def rebuild(rank_files: list[dict[str, torch.Tensor]]) -> dict[str, tuple]:
    """HF module -> (q [N, K], scale [N, K/g]) from the rank files, the split undone."""
    tp = len(rank_files)
    out = {}
    for i in range(LAYERS):
        pre = f"transformer.layers.{i}."
        qs, ss = [], []
        for rf in rank_files:
            qs.append(unpack_adjacent_rows(rf[pre + "attention.qkv.weight"]))
            ss.append(rf[pre + "attention.qkv.weights_scaling_factor"])
        sizes = [HEADS * HEAD // tp, KV_HEADS * HEAD // tp, KV_HEADS * HEAD // tp]
        for j, part in enumerate(("q_proj", "k_proj", "v_proj")):
            lo, hi = sum(sizes[:j]), sum(sizes[:j + 1])
            out[f"model.layers.{i}.self_attn.{part}"] = (
                np.concatenate([q[lo:hi] for q in qs]), torch.cat([s[lo:hi] for s in ss]))
        for hf, (trt, axis) in TRT_OF.items():
            q = np.concatenate([unpack_adjacent_rows(rf[pre + trt + ".weight"])
                                for rf in rank_files], axis=axis)
            s = torch.cat([rf[pre + trt + ".weights_scaling_factor"] for rf in rank_files],
                          dim=axis)
            out[f"model.layers.{i}.{hf}"] = (q, s)
    return out


def dequant(q: np.ndarray, scale: torch.Tensor) -> torch.Tensor:
    group = q.shape[1] // scale.shape[1]
    s = np.repeat(scale.float().numpy(), group, axis=1)
    return torch.from_numpy((q * s).astype(np.float32)).to(scale.dtype)


def bits(t: torch.Tensor) -> bytes:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy().tobytes()


def ct_linears(ct_folder) -> dict[str, tuple]:
    t = read_weights(ct_folder)
    out = {}
    for name in t:
        if name.endswith(".weight_packed"):
            module = name[: -len(".weight_packed")]
            k = int(t[module + ".weight_shape"][1])
            out[module] = (unpack(t[name].numpy(), 4, k), t[module + ".weight_scale"])
    return out


def converter_split(module: str, q: np.ndarray, s: torch.Tensor, tp: int, r: int):
    """TensorRT-LLM convert.py's split of one HF Linear for rank r (q, k, v apart)."""
    axis = 1 if module.endswith(("o_proj", "down_proj")) else 0
    qs = np.split(q, tp, axis=axis)[r]
    ss = torch.chunk(s, tp, dim=axis)[r]
    return qs, ss


# --- tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_config(case, converted, folders):
    name, method, block, tp = case
    model, dst, _ = converted[case]
    cfg = json.loads((dst / "config.json").read_text())
    hf = model.config
    assert cfg["architecture"] == "LlamaForCausalLM"
    assert cfg["dtype"] == {"untied": "float16", "tied": "bfloat16"}[name]
    assert cfg["logits_dtype"] == "float32"
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "max_position_embeddings",
                "hidden_act"):
        assert cfg[key] == getattr(hf, key), key
    assert cfg["norm_epsilon"] == hf.rms_norm_eps
    assert cfg["position_embedding_type"] == "rope_gpt_neox"
    assert cfg["rotary_base"] == 10000.0 and cfg["rotary_scaling"] is None
    assert cfg["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1}
    assert cfg["quantization"] == {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None,
                                   "group_size": block, "has_zero_point": False,
                                   "pre_quant_scale": False, "exclude_modules": ["lm_head"]}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_rank_files_equal_converter_split_packed_by_modelopt(case, converted):
    quant_utils = pytest.importorskip("modelopt.torch.export.quant_utils")
    name, method, block, tp = case
    _, dst, ct = converted[case]
    rank_files = ranks(dst)
    lin = ct_linears(ct)
    for r, rf in enumerate(rank_files):
        for i in range(LAYERS):
            pre, hf = f"transformer.layers.{i}.", f"model.layers.{i}."
            parts = [converter_split(hf + "self_attn." + p, *lin[hf + "self_attn." + p], tp, r)
                     for p in ("q_proj", "k_proj", "v_proj")]
            expect = {"attention.qkv": (np.concatenate([p[0] for p in parts]),
                                        torch.cat([p[1] for p in parts]))}
            for hf_mod, (trt, _) in TRT_OF.items():
                expect[trt] = converter_split(hf + hf_mod, *lin[hf + hf_mod], tp, r)
            for trt, (q, s) in expect.items():
                s32 = s.float()
                w = torch.from_numpy(q.astype(np.float32)) * s32.repeat_interleave(block, dim=1)
                packed = quant_utils.pack_int4_in_uint8(w, s32, block)
                got = rf[pre + trt + ".weight"]
                assert got.dtype == torch.int8 and got.shape == packed.shape, trt
                assert torch.equal(got.view(torch.uint8), packed), (r, pre + trt)
                assert torch.equal(rf[pre + trt + ".weights_scaling_factor"], s), (r, pre + trt)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_reference_unpacker_rebuilds_compressed_tensors_weights(case, converted):
    name, method, block, tp = case
    model, dst, ct = converted[case]
    rank_files = ranks(dst)
    rebuilt = rebuild(rank_files)
    lin = ct_linears(ct)
    assert sorted(rebuilt) == sorted(lin)
    for module, (q, s) in lin.items():
        rq, rs = rebuilt[module]
        assert np.array_equal(rq, q), module
        assert torch.equal(rs, s), module
        assert bits(dequant(rq, rs)) == bits(dequant(q, s)), module
    # Float tensors: norms and the embedding whole on every rank, lm_head padded and split; as
    # the compressed-tensors export holds them (AWQ folds its scales into the norms).
    sd = read_weights(ct)
    if name == "tied":
        assert "lm_head.weight" not in sd
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    if method == "rtn":
        for k, v in model.state_dict().items():
            if k in sd:
                assert torch.equal(sd[k], v), k
    for rf in rank_files:
        assert torch.equal(rf["transformer.vocab_embedding.weight"],
                           sd["model.embed_tokens.weight"])
        assert torch.equal(rf["transformer.ln_f.weight"], sd["model.norm.weight"])
        for i in range(LAYERS):
            assert torch.equal(rf[f"transformer.layers.{i}.input_layernorm.weight"],
                               sd[f"model.layers.{i}.input_layernorm.weight"])
            assert torch.equal(rf[f"transformer.layers.{i}.post_layernorm.weight"],
                               sd[f"model.layers.{i}.post_attention_layernorm.weight"])
    head = torch.cat([rf["lm_head.weight"] for rf in rank_files])
    vocab = model.config.vocab_size
    padded = -(-vocab // tp) * tp
    assert head.shape == (padded, HIDDEN)
    assert torch.equal(head[:vocab], sd["lm_head.weight"])  # the embedding when tied
    assert not head[vocab:].any()


def test_output_is_deterministic(folders, run_qforge, converted, tmp_path):
    _, dst, _ = converted[("tied", "rtn", 64, 2)]
    rc, _, stderr = run_qforge("convert", folders["tied"][1], "--quant", "w4a16", "--block-size",
                               "64", "--format", "trtllm-ckpt", "--tp", "2", "--threads", "1",
                               "-o", str(tmp_path / "again") + "/")
    assert rc == 0, stderr
    for f in ("config.json", "rank0.safetensors", "rank1.safetensors"):
        assert (tmp_path / "again" / f).read_bytes() == (dst / f).read_bytes(), f


REFUSALS = [  # (extra flags, exit code, words in the message)
    (["--quant", "int8-weights", "--format", "trtllm-ckpt"], EXIT_UNSUPPORTED,
     ["preprocess_weights_for_mixed_gemm", "compressed-tensors"]),
    (["--quant", "w4a16", "--block-size", "128", "--format", "trtllm-ckpt", "--tp", "2"],
     EXIT_UNSUPPORTED, ["not whole groups of 128", "o_proj (attention.dense)"]),
    (["--quant", "w4a16", "--block-size", "64", "--format", "trtllm-ckpt", "--tp", "4"],
     EXIT_USAGE, ["--tp 4", "key/value heads"]),
    (["--quant", "w4a16", "--block-size", "32", "--format", "trtllm-ckpt"], EXIT_UNSUPPORTED,
     ["64 or 128"]),
    (["--quant", "w4a16", "--block-size", "64", "--tp", "2"], EXIT_USAGE,
     ["--tp 2", "--format trtllm-ckpt"]),
]


@pytest.mark.parametrize("flags,code,words", REFUSALS, ids=lambda v: str(v)[:40])
def test_refusals_leave_nothing(folders, run_qforge, tmp_path, flags, code, words):
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("convert", folders["untied"][1], *flags, "-o", str(out) + "/")
    assert rc == code, stderr
    for w in words:
        assert w in stderr, stderr
    assert list(tmp_path.iterdir()) == []


def test_file_output_and_other_architectures_are_refused(folders, run_qforge, tmp_path):
    src = folders["untied"][1]
    rc, _, stderr = run_qforge("convert", src, "--quant", "w4a16", "--block-size", "64",
                               "--format", "trtllm-ckpt", "-o", tmp_path / "w.safetensors")
    assert rc == EXIT_USAGE and "writes a folder" in stderr, stderr
    other = tmp_path / "qwen"
    shutil.copytree(src, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["architectures"] = ["Qwen2ForCausalLM"]
    (other / "config.json").write_text(json.dumps(cfg))
    rc, _, stderr = run_qforge("convert", other, "--quant", "w4a16", "--block-size", "64",
                               "--format", "trtllm-ckpt", "-o", str(tmp_path / "out") + "/")
    assert rc == EXIT_UNSUPPORTED and "Qwen2ForCausalLM" in stderr, stderr
    assert not (tmp_path / "out").exists()
