"""A GGUF file read back as a model: `qforge convert model.gguf --format LAYOUT -o OUT/`.

GGUF files of a tiny random Llama (tests/interop/test_gguf_export.py's make_folder, fp16, untied)
written two ways: by qforge (`--format gguf --quant q4_0|q8_0|q4_1`) and by the `gguf` package's
own writer and quantizer (gguf.GGUFWriter + gguf.quants.quantize, named and Q/K-permuted as
llama.cpp's convert_hf_to_gguf.py does), so qforge reads files it did not write.
- Q4_0 Linears become int4 group 32 with the block's fp16 d as the scale, Q8_0 int8 group 32:
  every layout's dequantized Linear equals gguf.quants.dequantize of the GGUF tensor, Q/K rows
  un-permuted, bit for bit; the embeddings and the output projection come out float32, exact.
- transformers loads the compressed-tensors folder converted from GGUF (config.json synthesized
  from the metadata) and its logits equal transformers' on the dequantized weights.
- `convert model.gguf -o model.onnx` builds the decoder graph; ONNX Runtime runs it and its logits
  equal transformers' on the dequantized weights.
- Q4_1 (asymmetric) is refused with exit 4 naming the tensor; --requantize quantizes again and
  says so. A tensor whose shape disagrees with the metadata: exit 3 naming it. An architecture
  qforge does not map: exit 4."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf", reason="the gguf package (tests/requirements.txt) reads GGUF")
from safetensors.torch import load_file, save_file  # noqa: E402

from test_gguf_export import HEADS, KV_HEADS, LAYER_MAP, make_folder, permute  # noqa: E402
from test_compressed_tensors_export import read_weights, unpack  # noqa: E402
from test_gguf_from_quantized import gguf_tensors, stored_linears  # noqa: E402

EXIT_INVALID, EXIT_UNSUPPORTED = 3, 4
GT = gguf.GGMLQuantizationType
LINEARS = [k for k in LAYER_MAP if k.endswith("_proj.weight")]


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of convert_hf_to_gguf.py's permute()."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def hf_expected(path) -> dict[str, np.ndarray]:
    """Every tensor of the GGUF file dequantized by gguf.quants, by Hugging Face name, Q/K rows
    un-permuted."""
    t = gguf_tensors(path)
    out = {"model.embed_tokens.weight": t["token_embd.weight"][1],
           "model.norm.weight": t["output_norm.weight"][1]}
    if "output.weight" in t:
        out["lm_head.weight"] = t["output.weight"][1]
    for i in range(2):
        for hf, g in LAYER_MAP.items():
            w = t[f"blk.{i}.{g}"][1]
            if hf == "self_attn.q_proj.weight":
                w = unpermute(w, HEADS)
            elif hf == "self_attn.k_proj.weight":
                w = unpermute(w, KV_HEADS)
            out[f"model.layers.{i}.{hf}"] = w
    return out


def write_with_gguf_py(folder, path, linear_type: GT) -> None:
    """The float folder as llama.cpp's converter names and permutes it, written and quantized by
    the gguf package alone."""
    cfg = json.loads((folder / "config.json").read_text())
    sd = {k: v.float().numpy() for k, v in load_file(str(folder / "model.safetensors")).items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])

    def add(name, arr, qtype):
        data = gguf.quants.quantize(arr, qtype)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    add("token_embd.weight", sd["model.embed_tokens.weight"].astype(np.float16), GT.F16)
    for i in range(cfg["num_hidden_layers"]):
        for hf, g in LAYER_MAP.items():
            a = sd[f"model.layers.{i}.{hf}"]
            if hf == "self_attn.q_proj.weight":
                a = permute(a, HEADS)
            elif hf == "self_attn.k_proj.weight":
                a = permute(a, KV_HEADS)
            if a.ndim == 1:
                add(f"blk.{i}.{g}", a.astype(np.float32), GT.F32)
            else:
                add(f"blk.{i}.{g}", a, linear_type)
    add("output_norm.weight", sd["model.norm.weight"].astype(np.float32), GT.F32)
    add("output.weight", sd["lm_head.weight"], GT.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def ggufs(run_qforge, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_read_back")
    folder = make_folder(root, tied=False, dtype=torch.float16)
    out = {"float": folder}
    for q in ("q4_0", "q8_0", "q4_1"):
        path = root / f"qforge-{q}.gguf"
        rc, _, stderr = run_qforge("convert", folder, "--format", "gguf", "--quant", q,
                                   "-o", path)
        assert rc == 0, stderr
        out[f"qforge-{q}"] = path
    for q, t in (("q4_0", GT.Q4_0), ("q8_0", GT.Q8_0)):
        path = root / f"gguf-py-{q}.gguf"
        write_with_gguf_py(folder, path, t)
        out[f"gguf-py-{q}"] = path
    return out


SOURCES = ["qforge-q4_0", "qforge-q8_0", "gguf-py-q4_0", "gguf-py-q8_0"]


def gptq_linears(folder, bits: int) -> dict[str, np.ndarray]:
    """A GPTQ folder's q * scale in float32 (exact): qweight [K * bits / 32, N] packed along K,
    q + 2^(bits - 1); scales [K / g, N]."""
    t = read_weights(folder)
    out = {}
    for key in t:
        if key.endswith(".qweight"):
            m = key[: -len(".qweight")]
            packed = t[key].numpy()
            k = packed.shape[0] * 32 // bits
            q = unpack(np.ascontiguousarray(packed.T), bits, k)
            scale = t[m + ".scales"].float().numpy().T
            out[m + ".weight"] = (q * np.repeat(scale, k // scale.shape[1], axis=1)).astype(
                np.float32)
    return out


def check_against_gguf(got: dict[str, np.ndarray], folder, src_path) -> None:
    want = hf_expected(src_path)
    floats = {k: v.float().numpy() for k, v in load_file(str(folder / "model.safetensors")).items()
              } if (folder / "model.safetensors").exists() else {}
    assert len(got) == 2 * len(LINEARS), sorted(got)
    for name, w in want.items():
        if name in got:
            assert got[name].dtype == np.float32 and got[name].shape == w.shape, name
            assert got[name].tobytes() == w.tobytes(), name
        elif floats:
            assert floats[name].astype(np.float32).tobytes() == w.tobytes(), name


@pytest.mark.parametrize("src", SOURCES)
def test_gguf_to_compressed_tensors_and_gptq_is_bit_exact(src, ggufs, run_qforge, tmp_path):
    for fmt in ("compressed-tensors", "gptq"):
        out = tmp_path / fmt
        rc, _, stderr = run_qforge("-v", "convert", ggufs[src], "--format", fmt,
                                   "-o", str(out) + "/")
        assert rc == 0, stderr
        assert "nothing requantized" in stderr, stderr
        assert "no tokenizer files" in stderr, stderr
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLM"]
        assert cfg["tie_word_embeddings"] is False
        assert cfg["num_key_value_heads"] == KV_HEADS
        q = cfg["quantization_config"]
        if fmt == "gptq":
            assert q["bits"] == (8 if "q8_0" in src else 4) and q["group_size"] == 32, q
            check_against_gguf(gptq_linears(out, q["bits"]), out, ggufs[src])
        else:
            check_against_gguf(stored_linears(out), out, ggufs[src])


@pytest.mark.parametrize("fmt", ["gptq-v2", "awq", "modelopt-hf"])
@pytest.mark.parametrize("src", ["qforge-q4_0", "gguf-py-q4_0"])
def test_gguf_q4_0_to_every_other_layout(src, fmt, ggufs, run_qforge, tmp_path):
    """The same integers and scales as the compressed-tensors folder read from the GGUF file
    (re-emitting a folder in every layout is bit-exact: test_quantized_folder_read.py); the
    layouts qforge reads back are read again and checked against gguf.quants."""
    out = tmp_path / fmt
    rc, _, stderr = run_qforge("-v", "convert", ggufs[src], "--format", fmt, "-o", str(out) + "/")
    assert rc == 0, stderr
    assert "nothing requantized" in stderr, stderr
    ct = tmp_path / "ct"
    rc, _, stderr = run_qforge("convert", ggufs[src], "-o", str(ct) + "/")
    assert rc == 0, stderr
    via = tmp_path / "via"
    rc, _, stderr = run_qforge("convert", ct, "--format", fmt, "-o", str(via) + "/")
    assert rc == 0, stderr
    for f in sorted(out.glob("*.safetensors")):
        a, b = load_file(str(f)), load_file(str(via / f.name))
        assert sorted(a) == sorted(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (f.name, k)
    if fmt in ("gptq-v2", "awq"):
        back = tmp_path / "back"
        rc, _, stderr = run_qforge("convert", out, "--format", "compressed-tensors",
                                   "-o", str(back) + "/")
        assert rc == 0, stderr
        check_against_gguf(stored_linears(back), back, ggufs[src])


def test_trtllm_ckpt_refuses_groups_of_32_by_name(ggufs, run_qforge, tmp_path):
    """TensorRT-LLM's group-wise int4 GEMM takes groups of 64 or 128: Q4_0's 32 does not fit."""
    out = tmp_path / "trt"
    rc, _, stderr = run_qforge("convert", ggufs["gguf-py-q4_0"], "--format", "trtllm-ckpt",
                               "-o", str(out) + "/")
    assert rc == EXIT_UNSUPPORTED, stderr
    assert "model.layers.0.self_attn.q_proj.weight" in stderr and "group size 32" in stderr
    assert not out.exists()


def dequantized_reference(gguf_path, folder, ref_dir):
    """transformers' float32 model of the same config as `folder` (the folder qforge wrote from
    the GGUF file, its quantization_config dropped) on the GGUF tensors dequantized by
    gguf.quants."""
    ref_dir.mkdir()
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("quantization_config")
    (ref_dir / "config.json").write_text(json.dumps(cfg))
    save_file({k: torch.from_numpy(np.ascontiguousarray(v))
               for k, v in hf_expected(gguf_path).items()}, str(ref_dir / "model.safetensors"))
    ref = transformers.AutoModelForCausalLM.from_pretrained(ref_dir, torch_dtype=torch.float32)
    return ref.eval()


@pytest.mark.parametrize("src", ["qforge-q4_0", "gguf-py-q8_0"])
def test_transformers_loads_the_folder_and_logits_match(src, ggufs, run_qforge, tmp_path):
    pytest.importorskip("compressed_tensors")
    out = tmp_path / "ct"
    rc, _, stderr = run_qforge("convert", ggufs[src], "-o", str(out) + "/")
    assert rc == 0, stderr
    model = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    model.eval()
    ref = dequantized_reference(ggufs[src], out, tmp_path / "ref")
    ids = torch.tensor([[0, 5, 17, 42, 9, 3, 77, 12]])
    with torch.no_grad():
        got = model(ids).logits.float().numpy()
        want = ref(ids).logits.float().numpy()
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel < 1e-3, rel


@pytest.mark.parametrize("src", ["qforge-q4_0", "gguf-py-q8_0"])
def test_gguf_becomes_a_decoder_graph_that_onnx_runtime_runs(src, ggufs, run_qforge, check_full,
                                                            tmp_path):
    """`qforge convert model.gguf -o model.onnx`: the decoder graph built from the metadata's
    config and the dequantized tensors. onnx.checker (full) accepts it, ONNX Runtime runs it,
    and its logits equal transformers' on the GGUF dequantized by gguf.quants (Q/K rows
    un-permuted) within float rounding, padding masked out; qforge's own runtime agrees too.
    An engine bundle from the same file runs as well."""
    ort = pytest.importorskip("onnxruntime")
    out = tmp_path / "model.onnx"
    rc, _, stderr = run_qforge("convert", ggufs[src], "-o", out)
    assert rc == 0, stderr
    check_full(out)
    folder = tmp_path / "ct"
    rc, _, stderr = run_qforge("convert", ggufs[src], "-o", str(folder) + "/")
    assert rc == 0, stderr
    ref = dequantized_reference(ggufs[src], folder, tmp_path / "ref")
    ids = np.array([[0, 5, 17, 42, 9, 3, 77, 12], [1, 2, 3, 4, 5, 6, 0, 0]], dtype=np.int64)
    mask = np.array([[1] * 8, [1] * 6 + [0] * 2], dtype=np.int64)
    with torch.no_grad():
        want = ref(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    real = mask.astype(bool)
    rel = np.abs(got[real] - want[real]).max() / np.abs(want[real]).max()
    assert rel < 1e-5, rel  # the blocks' q * d kept in f32, as llama.cpp dequantizes them
    inputs = tmp_path / "in.npz"
    np.savez(inputs, input_ids=ids, attention_mask=mask)
    rc, _, stderr = run_qforge("run", out, "--inputs", inputs, "-o", tmp_path / "q.npz")
    assert rc == 0, stderr
    ours = np.load(tmp_path / "q.npz")["logits"]
    assert np.abs(ours[real] - got[real]).max() / np.abs(got[real]).max() < 1e-5
    bundle = tmp_path / "model.qfb"
    rc, _, stderr = run_qforge("convert", ggufs[src], "-o", bundle)
    assert rc == 0, stderr
    rc, _, stderr = run_qforge("run", bundle, "--inputs", inputs, "-o", tmp_path / "b.npz")
    assert rc == 0, stderr
    assert np.array_equal(np.load(tmp_path / "b.npz")["logits"], ours)


def test_q4_1_is_refused_by_name_and_requantize_says_so(ggufs, run_qforge, tmp_path):
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("convert", ggufs["qforge-q4_1"], "-o", str(out) + "/")
    assert rc == EXIT_UNSUPPORTED, stderr
    assert "model.layers.0.self_attn.q_proj.weight (blk.0.attn_q.weight, Q4_1)" in stderr, stderr
    assert not out.exists()
    rc, _, stderr = run_qforge("-v", "convert", ggufs["qforge-q4_1"], "--requantize", "--quant",
                               "w4a16", "--block-size", "32", "-o", str(out) + "/")
    assert rc == 0, stderr
    assert "--requantize" in stderr and "quantize them again" in stderr, stderr
    got = stored_linears(out)
    want = hf_expected(ggufs["qforge-q4_1"])
    assert len(got) == 2 * len(LINEARS)
    for name, w in got.items():  # RTN int4 of the exact Q4_1 values: close, not equal
        err = np.abs(w - want[name]).max() / np.abs(want[name]).max()
        assert 0 < err < 0.2, (name, err)


def corrupt(src, dst, edit) -> None:
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), edit.get("arch", "llama"))
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        arch_key = f.name.replace("llama.", edit.get("arch", "llama") + ".", 1)
        val = f.contents()
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(arch_key, val, vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(arch_key, val, vtype)
    for t in r.tensors:
        data = np.array(t.data)
        shape = [int(d) for d in reversed(t.shape.tolist())]
        if t.name == edit.get("tensor"):
            data = data[: data.shape[0] // 2]
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type,
                     raw_shape=data.shape if t.tensor_type in (GT.F32, GT.F16) else None)
        del shape
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_tensor_that_disagrees_with_the_metadata_is_refused(ggufs, run_qforge, tmp_path):
    bad = tmp_path / "bad.gguf"
    corrupt(ggufs["gguf-py-q8_0"], bad, {"tensor": "blk.1.ffn_up.weight"})
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("convert", bad, "-o", str(out) + "/")
    assert rc == EXIT_INVALID, stderr
    assert "blk.1.ffn_up.weight" in stderr and "metadata" in stderr, stderr
    assert not out.exists()


def test_an_unmapped_architecture_is_refused(ggufs, run_qforge, tmp_path):
    bad = tmp_path / "phi.gguf"
    corrupt(ggufs["gguf-py-q8_0"], bad, {"arch": "phi3"})
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("convert", bad, "-o", str(out) + "/")
    assert rc == EXIT_UNSUPPORTED, stderr
    assert "'phi3'" in stderr, stderr
    assert not out.exists()


@pytest.mark.parametrize("src,types", [("qforge-q4_0", {"Q4_0": (4, True)}),
                                       ("gguf-py-q8_0", {"Q8_0": (8, True)}),
                                       ("qforge-q4_1", {"Q4_1": (4, False)})])
def test_inspect_shows_the_scheme(src, types, ggufs, run_qforge):
    rc, stdout, stderr = run_qforge("inspect", ggufs[src], "--json")
    assert rc == 0, stderr
    q = json.loads(stdout)["quantization"]
    assert q["quant_method"] == "gguf"
    assert q["quantized_linears"] == 2 * len(LINEARS)
    assert {s["type"]: (s["bits"], s["symmetric"]) for s in q["schemes"]} == types
    assert all(s["group_size"] == 32 for s in q["schemes"])
    assert q["float_linears"] == ["output.weight"]
    rc, stdout, _ = run_qforge("inspect", ggufs[src])
    assert rc == 0 and "group 32" in stdout and "float (read as float): output.weight" in stdout
