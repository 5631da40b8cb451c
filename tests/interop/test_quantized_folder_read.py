"""qforge reads compressed-tensors pack-quantized folders back (importers/quantized_checkpoint):
- `qforge inspect QDIR` shows the scheme (format, bits, group size, symmetric, Linears quantized,
  modules left float), as text and --json;
- `qforge convert QDIR -o OUT/` re-emits the same integers and scales: every tensor of OUT is
  bit-identical to QDIR's and the compressed-tensors package decompresses both to the same
  weights; asking for the folder's own scheme re-emits too; another scheme is refused naming
  both unless --requantize, which dequantizes, quantizes again and says so in one info line;
- `qforge convert QDIR -o m.onnx` builds the decoder graph with each Linear dequantized; it passes
  onnx's full check, and its logits on qforge's runtime and on ONNX Runtime match transformers
  loading QDIR itself (weights kept packed) within 1e-3 relative;
- a folder whose config.json disagrees with its tensors is refused (exit 3) naming the tensor.
Tiny random Llamas (tests/interop/test_hf_decoder.py's randomize), written by qforge's own
compressed-tensors exporter: fp32 int4 group 128 (hidden 128, intermediate 256), bf16 int4 group
32 and fp32 int8 per channel (hidden 64, intermediate 96)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import safetensors.numpy
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

from test_compressed_tensors_export import dequantized_by_qforge, read_weights  # noqa: E402
from test_hf_decoder import IDS, MASK, positions, randomize, relative_error  # noqa: E402

EXIT_USAGE, EXIT_INVALID = 2, 3
REL_TOL = 1e-3
VOCAB = 256

# name -> (hidden, intermediate, dtype, --quant flags)
CASES = {
    "w4g128-f32": (128, 256, torch.float32, ["--quant", "w4a16", "--block-size", "128"]),
    "w4g32-bf16": (64, 96, torch.bfloat16, ["--quant", "w4a16", "--block-size", "32"]),
    "w8ch-f32": (64, 96, torch.float32, ["--quant", "int8-weights"]),
}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in (torch.bfloat16, torch.float16):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a, b)


@pytest.fixture(scope="module")
def qdirs(run_qforge, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantized_folders")
    out = {}
    for seed, (name, (hidden, inter, dtype, flags)) in enumerate(CASES.items()):
        torch.manual_seed(seed)
        cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=inter,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=VOCAB,
                                       max_position_embeddings=128, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg).eval()
        randomize(model, seed)
        src = root / f"{name}-float"
        model.to(dtype).save_pretrained(src)
        (src / "tokenizer_config.json").write_text('{"model_max_length": 128}')
        rc, _, stderr = run_qforge("convert", src, "-o", str(root / name) + "/", *flags)
        assert rc == 0, stderr
        out[name] = root / name
    return out


def test_inspect_shows_the_scheme(qdirs, run_qforge):
    rc, stdout, stderr = run_qforge("inspect", qdirs["w4g128-f32"], "--json")
    assert rc == 0, stderr
    q = json.loads(stdout)["hf"]["quantization"]
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "pack-quantized"
    assert q["schemes"] == [{"bits": 4, "group_size": 128, "strategy": "group",
                             "symmetric": True, "linears": 14}]
    assert q["quantized_linears"] == 14
    assert q["ignore"] == ["lm_head"] and q["float_linears"] == ["lm_head"]
    rc, stdout, stderr = run_qforge("inspect", qdirs["w8ch-f32"])
    assert rc == 0, stderr
    assert "quantized: compressed-tensors pack-quantized, 14 Linears" in stdout, stdout
    assert "int8 per channel, symmetric yes: 14 Linears" in stdout, stdout
    assert "ignore (left float): lm_head" in stdout, stdout


def test_inspect_of_a_float_folder_has_no_scheme(qdirs, run_qforge):
    rc, stdout, stderr = run_qforge("inspect", qdirs["w8ch-f32"].with_name("w8ch-f32-float"),
                                    "--json")
    assert rc == 0, stderr
    assert json.loads(stdout)["hf"]["quantization"] is None


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("same_scheme", [False, True], ids=["no-quant", "same-quant"])
def test_convert_back_is_bit_identical(name, same_scheme, qdirs, run_qforge, tmp_path):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    src = qdirs[name]
    out = tmp_path / "back"
    flags = CASES[name][3] if same_scheme else []
    rc, _, stderr = run_qforge("convert", src, "-o", str(out) + "/", *flags)
    assert rc == 0, stderr
    scheme = {"w4g128-f32": "int4 group 128", "w4g32-bf16": "int4 group 32",
              "w8ch-f32": "int8 per channel"}[name]
    assert "reemit-quantized: " in stderr and f"from compressed-tensors {scheme}, to compressed-tensors, quantized 14" \
        in stderr and "requantize" not in stderr, stderr
    a, b = read_weights(src), read_weights(out)
    assert sorted(a) == sorted(b)
    for k in a:
        assert bits_equal(a[k], b[k]), k
    qa = json.loads((src / "config.json").read_text())["quantization_config"]
    qb = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qa == qb
    side = "tokenizer_config.json"
    assert (out / side).read_bytes() == (src / side).read_bytes()
    group = QuantizationConfig.model_validate(qb).config_groups["group_0"]
    modules = [k[: -len(".weight_packed")] for k in a if k.endswith(".weight_packed")]
    assert len(modules) == 14
    for m in modules:
        parts = ("weight_packed", "weight_scale", "weight_shape")
        da = PackedQuantizationCompressor.decompress({p: a[f"{m}.{p}"] for p in parts}, group)
        db = PackedQuantizationCompressor.decompress({p: b[f"{m}.{p}"] for p in parts}, group)
        assert bits_equal(da["weight"], db["weight"]), m
        assert bits_equal(db["weight"], dequantized_by_qforge(b, m)), m


def test_another_scheme_is_refused_without_requantize(qdirs, run_qforge, tmp_path):
    out = tmp_path / "g64"
    rc, _, stderr = run_qforge("convert", qdirs["w4g128-f32"], "-o", str(out) + "/",
                               "--quant", "w4a16", "--block-size", "64")
    assert rc == EXIT_USAGE, stderr
    assert "int4 group 128" in stderr and "int4 group 64" in stderr, stderr
    assert "--requantize" in stderr, stderr
    assert not out.exists()
    rc, _, stderr = run_qforge("convert", qdirs["w4g128-f32"], "-o", tmp_path / "m.onnx",
                               "--quant", "w4a16")
    assert rc == EXIT_USAGE and "quantize them again" in stderr, stderr


def test_requantize_dequantizes_and_quantizes_again(qdirs, run_qforge, tmp_path):
    src = qdirs["w4g128-f32"]
    out = tmp_path / "g64"
    rc, _, stderr = run_qforge("-v", "convert", src, "-o", str(out) + "/", "--quant", "w4a16",
                               "--block-size", "64", "--requantize")
    assert rc == 0, stderr
    info = [line for line in stderr.splitlines() if "--requantize: dequantized" in line]
    assert len(info) == 1, stderr
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["config_groups"]["group_0"]["weights"]["group_size"] == 64
    a, b = read_weights(src), read_weights(out)
    m = "model.layers.0.mlp.down_proj"
    assert tuple(b[m + ".weight_scale"].shape) == (128, 256 // 64)
    before, after = dequantized_by_qforge(a, m), dequantized_by_qforge(b, m)
    # A second rounding on finer groups: within a group-64 step of the first weights.
    step = (a[m + ".weight_scale"].abs().max()).item()
    assert (before - after).abs().max().item() <= step


def reference_logits(folder: Path) -> np.ndarray:
    """transformers loading the compressed-tensors folder itself on the CPU, float32, eager
    attention, the position ids the graph computes."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", device_map="cpu").eval()
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK),
                    position_ids=torch.from_numpy(positions(MASK)))
    return out.logits.float().numpy()


@pytest.mark.parametrize("name", ["w4g128-f32", "w8ch-f32"])
def test_onnx_logits_match_transformers_on_the_quantized_folder(name, qdirs, run_qforge,
                                                                ort_run, check_full,
                                                                report_figure, tmp_path):
    model = tmp_path / "m.onnx"
    rc, _, stderr = run_qforge("convert", qdirs[name], "-o", model)
    assert rc == 0, stderr
    assert "not read by" not in stderr, stderr  # every scale read with its weight
    check_full(model)
    want = reference_logits(qdirs[name])
    assert np.abs(want).max() > 1.0
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, input_ids=IDS, attention_mask=MASK)
    rc, _, stderr = run_qforge("run", model, "--inputs", feeds, "-o", tmp_path / "out.npz")
    assert rc == 0, stderr
    with np.load(tmp_path / "out.npz") as data:
        ours = data["logits"]
    ort = ort_run(model, {"input_ids": IDS, "attention_mask": MASK})[0]
    err_ours, err_ort = relative_error(ours, want, MASK), relative_error(ort, want, MASK)
    report_figure(f"quantized folder {name} -> onnx: logits vs transformers on the folder, max "
                  f"rel error qforge {err_ours:.2e}, onnxruntime {err_ort:.2e}")
    assert err_ours <= REL_TOL and err_ort <= REL_TOL


@pytest.mark.parametrize("edit,tensor", [
    ("group_size", "weight_scale"),
    ("num_bits", "weight_packed"),
    ("drop_shape", "weight_shape"),
])
def test_config_that_disagrees_with_the_tensors_is_refused(edit, tensor, qdirs, run_qforge,
                                                           tmp_path):
    from safetensors.torch import save_file

    bad = tmp_path / "bad"
    shutil.copytree(qdirs["w4g128-f32"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    w = cfg["quantization_config"]["config_groups"]["group_0"]["weights"]
    if edit == "group_size":
        w["group_size"] = 64
    elif edit == "num_bits":
        w["num_bits"] = 8
    else:
        tensors = read_weights(bad)
        del tensors["model.layers.1.mlp.up_proj.weight_shape"]
        save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    (bad / "config.json").write_text(json.dumps(cfg))
    for args in (["inspect", bad], ["convert", bad, "-o", str(tmp_path / "o") + "/"]):
        rc, _, stderr = run_qforge(*args)
        assert rc == EXIT_INVALID, stderr
        assert f".{tensor}'" in stderr or f".{tensor} " in stderr, stderr
    assert not (tmp_path / "o").exists()


# --- folders another quantizer wrote: llmcompressor's GPTQ and AWQ on the trained tiny Llama ---


@pytest.fixture(scope="module")
def peer_folders(tiny_llama, tmp_path_factory) -> Path:
    """llmcompressor's compressed-tensors folders of the trained tiny Llama (the fixture
    test_tiny_llama.py makes; made once, or reused from $QFORGE_FIXTURE_CACHE)."""
    import peer_llmcompressor
    from fixture_cache import FIXTURES_DIR, build_once, cache_dir

    why = peer_llmcompressor.peers_missing()
    if why:
        pytest.skip(why)
    folder = cache_dir(
        tmp_path_factory, "tiny_llama_peer", FIXTURES_DIR / "tiny_llama.py",
        peer_llmcompressor.__file__, extra=str(peer_llmcompressor.peers_python()))
    return build_once(folder, lambda out: peer_llmcompressor.run(
        tiny_llama, tiny_llama / "calib.npz", out))


@pytest.mark.parametrize("config", ["gptq-sym-128", "awq-sym-32"])
def test_llmcompressor_folder_reads_back_and_runs(config, peer_folders, run_qforge, ort_run,
                                                  report_figure, tmp_path):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    src = peer_folders / config
    rc, stdout, stderr = run_qforge("inspect", src, "--json")
    assert rc == 0, stderr
    q = json.loads(stdout)["hf"]["quantization"]
    group = int(config.rsplit("-", 1)[1])
    assert [(s["bits"], s["group_size"], s["symmetric"]) for s in q["schemes"]] == \
        [(4, group, True)]
    assert q["quantized_linears"] > 0 and q["float_linears"] == ["lm_head"]
    # Converted back: the same integers and scales, decompressed alike by compressed-tensors.
    out = tmp_path / "back"
    rc, _, stderr = run_qforge("convert", src, "-o", str(out) + "/")
    assert rc == 0, stderr
    a, b = read_weights(src), read_weights(out)
    assert sorted(a) == sorted(b)
    for k in a:
        assert bits_equal(a[k], b[k].to(a[k].dtype) if k.endswith("weight_shape") else b[k]), k
    qa = QuantizationConfig.model_validate(
        json.loads((src / "config.json").read_text())["quantization_config"])
    qb = QuantizationConfig.model_validate(
        json.loads((out / "config.json").read_text())["quantization_config"])
    parts = ("weight_packed", "weight_scale", "weight_shape")
    for m in [k[: -len(".weight_packed")] for k in a if k.endswith(".weight_packed")]:
        da = PackedQuantizationCompressor.decompress({p: a[f"{m}.{p}"] for p in parts},
                                                     qa.config_groups["group_0"])
        db = PackedQuantizationCompressor.decompress({p: b[f"{m}.{p}"] for p in parts},
                                                     qb.config_groups["group_0"])
        assert bits_equal(da["weight"], db["weight"]), m
    # To ONNX: logits against transformers loading llmcompressor's folder.
    model = tmp_path / "m.onnx"
    rc, _, stderr = run_qforge("convert", src, "-o", model)
    assert rc == 0, stderr
    want = transformers.AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager", device_map="cpu").eval()
    with torch.no_grad():
        want = want(input_ids=torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK),
                    position_ids=torch.from_numpy(positions(MASK))).logits.float().numpy()
    got = ort_run(model, {"input_ids": IDS, "attention_mask": MASK})[0]
    err = relative_error(got, want, MASK)
    report_figure(f"llmcompressor {config} folder -> qforge onnx: logits vs transformers on the "
                  f"folder, max rel error onnxruntime {err:.2e}")
    assert err <= REL_TOL


def test_llmcompressor_asymmetric_folder_is_refused_by_name(peer_folders, run_qforge):
    rc, _, stderr = run_qforge("inspect", peer_folders / "awq-asym-128")
    assert rc == 4, stderr  # unsupported: a valid checkpoint qforge does not read
    assert "asymmetric" in stderr and "config_groups.group_0" in stderr, stderr


# trtllm-ckpt takes group sizes 64 and 128 only, so not the group-32 folder.
LAYOUT_CASES = [(name, fmt) for name in ("w4g128-f32", "w4g32-bf16")
                for fmt in ("gptq", "gptq-v2", "awq", "modelopt-hf", "trtllm-ckpt")
                if not (fmt == "trtllm-ckpt" and name == "w4g32-bf16")]


@pytest.mark.parametrize("name,fmt", LAYOUT_CASES)
def test_a_quantized_folder_reemits_in_another_layout_as_if_quantized_there(
        name, fmt, qdirs, run_qforge, tmp_path):
    """compressed-tensors in, another layout out, nothing requantized: the same tensors, bit for
    bit, as quantizing the float folder straight into that layout."""
    flags = CASES[name][3]
    direct, via = tmp_path / "direct", tmp_path / "via"
    rc, _, stderr = run_qforge("convert", qdirs[name].parent / f"{name}-float", *flags,
                               "--format", fmt, "-o", str(direct) + "/")
    assert rc == 0, stderr
    rc, _, stderr = run_qforge("-v", "convert", qdirs[name], "--format", fmt,
                               "-o", str(via) + "/")
    assert rc == 0, stderr
    assert "nothing requantized" in stderr, stderr
    names = sorted(p.name for p in direct.iterdir())
    assert names == sorted(p.name for p in via.iterdir())
    for n in names:
        if n == "config.json" and fmt != "trtllm-ckpt":
            got = json.loads((via / n).read_text())["quantization_config"]
            want = json.loads((direct / n).read_text())["quantization_config"]
            assert got == want, n
            continue
        if n.endswith(".safetensors"):  # the same tensors, bit for bit, in any order
            a = safetensors.numpy.load_file(str(direct / n))
            b = safetensors.numpy.load_file(str(via / n))
            assert sorted(a) == sorted(b), n
            for t in a:
                assert a[t].dtype == b[t].dtype and a[t].shape == b[t].shape, t
                assert a[t].tobytes() == b[t].tobytes(), t
            continue
        assert (direct / n).read_bytes() == (via / n).read_bytes(), n


# --- between layouts: every reader against every writer ------------------------------------------

# "trtllm-ckpt-tp2" is --format trtllm-ckpt --tp 2 (rank0 and rank1.safetensors).
READ_LAYOUTS = ["compressed-tensors", "gptq", "gptq-v2", "awq", "modelopt-hf", "trtllm-ckpt",
                "trtllm-ckpt-tp2"]
WRITE_LAYOUTS = READ_LAYOUTS
LAYOUT_BLOCK = 64  # trtllm-ckpt at tp 2 splits o_proj's 128 inputs into whole groups of 64


def layout_flags(layout: str) -> list[str]:
    if layout == "trtllm-ckpt-tp2":
        return ["--format", "trtllm-ckpt", "--tp", "2"]
    return ["--format", layout]


@pytest.fixture(scope="module")
def layout_folders(run_qforge, tmp_path_factory) -> dict[str, Path]:
    """An fp16 tiny Llama (fp16 scales fit every layout exactly) and its W4A16 group-64
    quantization written straight into each layout: {"float": ..., layout: folder}."""
    root = tmp_path_factory.mktemp("layouts")
    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=VOCAB, max_position_embeddings=128,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    randomize(model, 7)
    out = {"float": root / "float"}
    model.to(torch.float16).save_pretrained(out["float"])
    for fmt in WRITE_LAYOUTS:
        rc, _, stderr = run_qforge("convert", out["float"], "--quant", "w4a16", "--block-size",
                                   str(LAYOUT_BLOCK), *layout_flags(fmt),
                                   "-o", str(root / fmt) + "/")
        assert rc == 0, stderr
        out[fmt] = root / fmt
    return out


def folder_tensors(folder: Path) -> dict[str, np.ndarray]:
    got = {}
    for f in sorted(folder.glob("*.safetensors")):
        got.update(safetensors.numpy.load_file(str(f)))
    return got


def tensors_by_file(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    """{file name: its tensors}: TensorRT-LLM's rank files hold the same names each."""
    return {f.name: safetensors.numpy.load_file(str(f))
            for f in sorted(folder.glob("*.safetensors"))}


@pytest.mark.parametrize("dst", WRITE_LAYOUTS)
@pytest.mark.parametrize("src", READ_LAYOUTS)
def test_every_layout_reads_back_and_converts_to_every_other_bit_for_bit(
        src, dst, layout_folders, run_qforge, tmp_path):
    """A folder in layout `src` re-emitted in layout `dst` (no --quant, nothing requantized)
    holds exactly the tensors of quantizing the float model straight into `dst`, file by file
    (each TensorRT-LLM rank), and the same quantization config (TensorRT-LLM's config.json
    whole: a trtllm-ckpt source's Hugging Face config is synthesized from its own)."""
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("-v", "convert", layout_folders[src], *layout_flags(dst),
                               "-o", str(out) + "/")
    assert rc == 0, stderr
    assert "nothing requantized" in stderr, stderr
    want, got = tensors_by_file(layout_folders[dst]), tensors_by_file(out)
    assert sorted(want) == sorted(got)
    for f in want:
        assert sorted(want[f]) == sorted(got[f]), f
        for name in want[f]:
            a, b = want[f][name], got[f][name]
            assert a.dtype == b.dtype and a.shape == b.shape, (f, name)
            assert a.tobytes() == b.tobytes(), (f, name)
    cw = json.loads((layout_folders[dst] / "config.json").read_text())
    cg = json.loads((out / "config.json").read_text())
    if dst.startswith("trtllm-ckpt"):
        assert cg == cw
    else:
        assert cg["quantization_config"] == cw["quantization_config"]
    if dst == "modelopt-hf":
        assert (out / "hf_quant_config.json").read_bytes() == \
            (layout_folders[dst] / "hf_quant_config.json").read_bytes()


@pytest.mark.parametrize("src", ["gptq", "gptq-v2", "awq"])
def test_gptq_and_awq_folders_inspect_and_run_like_the_float_quantization(
        src, layout_folders, run_qforge, tmp_path):
    code, stdout, stderr = run_qforge("--json", "inspect", layout_folders[src])
    assert code == 0, stderr
    q = json.loads(stdout)["hf"]["quantization"]
    assert q["quant_method"] == ("awq" if src == "awq" else "gptq")
    assert q["quantized_linears"] == 14
    assert [(s["bits"], s["group_size"]) for s in q["schemes"]] == [(4, LAYOUT_BLOCK)]


@pytest.mark.parametrize("edit,needle,code", [
    ("asym", "asymmetric", 4), ("act_order", "act-order", 4), ("shape", "qzeros", 3)])
def test_gptq_folder_that_is_not_symmetric_in_order_is_refused(edit, needle, code,
                                                               layout_folders, run_qforge,
                                                               tmp_path):
    d = tmp_path / "bad"
    shutil.copytree(layout_folders["gptq"], d)
    t = folder_tensors(d)
    # down_proj has K = 256: four groups, so a reordered g_idx is act-order.
    m = "model.layers.0.mlp.down_proj" if edit == "act_order" else "model.layers.0.self_attn.q_proj"
    if edit == "asym":
        t[m + ".qzeros"] = t[m + ".qzeros"].copy()
        t[m + ".qzeros"][0, 0] = np.int32(0x77777776)
    elif edit == "act_order":
        t[m + ".g_idx"] = t[m + ".g_idx"][::-1].copy()
    else:
        t[m + ".qzeros"] = t[m + ".qzeros"][:, :1].copy()
    for f in d.glob("*.safetensors"):
        f.unlink()
    safetensors.numpy.save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    rc, _, stderr = run_qforge("convert", d, "-o", str(tmp_path / "out") + "/")
    assert rc == code, stderr
    assert needle in stderr and m in stderr, stderr
    assert not (tmp_path / "out").exists()
