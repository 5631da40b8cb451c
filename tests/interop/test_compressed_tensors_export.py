"""`qforge convert DIR --quant w4a16|int8-weights -o OUT/` on a Hugging Face model folder writes
compressed-tensors' pack-quantized layout, proven by the format's own package and by transformers:
- the `compressed-tensors` package decompresses OUT's weights to exactly q * scale computed in
  numpy from qforge's own packed tensors, bit for bit;
- transformers loads OUT on the CPU, and its logits equal those of the float model whose Linear
  weights are replaced by those dequantized values (1e-3 relative);
- tokenizer files are copied and every tensor left float is byte-identical to the input.
Tiny random Llamas made with fixed seeds: fp32 and bf16, one file and sharded; block 32 and 128
(hidden and intermediate sizes that 128 divides) and int8 per channel. A Linear whose input
features the block size does not divide is refused, naming it and a block size that fits."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")
compressed_tensors = pytest.importorskip("compressed_tensors")

EXIT_USAGE = 2
IDS = torch.tensor([[1, 5, 9, 200, 3, 77, 14, 250]])
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_model(dtype: torch.dtype, hidden: int, intermediate: int, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=intermediate,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=256,
                                   tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


def read_weights(folder) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def unpack(packed: np.ndarray, bits: int, k: int) -> np.ndarray:
    """int32 [N, words] -> signed q [N, K]: element j of a word at bits j * bits, stored as
    q + 2^(bits - 1)."""
    words = packed.view(np.uint32)
    per = 32 // bits
    cols = [(words >> np.uint32(bits * j)) & np.uint32((1 << bits) - 1) for j in range(per)]
    q = np.stack(cols, axis=-1).reshape(packed.shape[0], -1)[:, :k].astype(np.int32)
    return q - (1 << (bits - 1))


def dequantized_by_qforge(tensors: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    """q * scale in numpy (float32 products of exact integers and the stored scales), cast to the
    scale's dtype as compressed-tensors computes it."""
    shape = tensors[module + ".weight_shape"].numpy()
    scale_t = tensors[module + ".weight_scale"]
    n, k = int(shape[0]), int(shape[1])
    group = k // scale_t.shape[1] if scale_t.shape[1] > 1 else k
    bits = 32 * tensors[module + ".weight_packed"].shape[1] // k
    q = unpack(tensors[module + ".weight_packed"].numpy(), bits, k)
    scale = np.repeat(scale_t.float().numpy(), group, axis=1)
    return torch.from_numpy((q * scale).astype(np.float32)).to(scale_t.dtype)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct_folders")
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).split(".")[-1]
        model = make_model(dtype, 64, 96)  # K of 64 and 96: block 32 fits, 128 does not
        model.save_pretrained(root / f"{name}_single")
        model.save_pretrained(root / f"{name}_sharded", max_shard_size="60KB")
        out[(dtype, "single")] = (model, root / f"{name}_single")
        out[(dtype, "sharded")] = (model, root / f"{name}_sharded")
        big = make_model(dtype, 128, 256, seed=1)
        big.save_pretrained(root / f"{name}_k128")
        out[(dtype, "k128")] = (big, root / f"{name}_k128")
    side = root / "float32_single"
    (side / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    (side / "tokenizer_config.json").write_text('{"model_max_length": 128}')
    (side / "notes.txt").write_text("not a model file")
    return out


CASES = [  # (dtype, layout, quant, block)
    (torch.float32, "single", "w4a16", 32),
    (torch.bfloat16, "single", "w4a16", 32),
    (torch.bfloat16, "sharded", "w4a16", 32),
    (torch.float32, "k128", "w4a16", 128),
    (torch.bfloat16, "k128", "w4a16", 128),
    (torch.float32, "single", "int8-weights", 0),
    (torch.bfloat16, "sharded", "int8-weights", 0),
]


@pytest.fixture(scope="module")
def converted(folders, run_qforge, tmp_path_factory):
    root = tmp_path_factory.mktemp("ct_out")
    out = {}
    for dtype, layout, quant, block in CASES:
        model, src = folders[(dtype, layout)]
        dst = root / f"{src.name}_{quant}_{block}"
        args = ["convert", src, "--quant", quant, "-o", str(dst) + "/"]
        if block:
            args += ["--block-size", str(block)]
        if layout == "sharded":
            args += ["--max-shard-size", "40KB"]
        rc, _, stderr = run_qforge(*args)
        assert rc == 0, stderr
        out[(dtype, layout, quant, block)] = (model, src, dst, stderr)
    return out


def case_id(case):
    dtype, layout, quant, block = case
    return f"{str(dtype).split('.')[-1]}-{layout}-{quant}-{block}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_layout_and_config(case, converted):
    model, src, dst, _ = converted[case]
    _, layout, quant, block = case
    bits = 4 if quant == "w4a16" else 8
    tensors = read_weights(dst)
    cfg = json.loads((dst / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert qc["quantization_status"] == "compressed" and qc["ignore"] == ["lm_head"]
    w = qc["config_groups"]["group_0"]["weights"]
    assert qc["config_groups"]["group_0"]["targets"] == ["Linear"]
    assert (w["num_bits"], w["symmetric"], w["type"]) == (bits, True, "int")
    assert w["strategy"] == ("group" if block else "channel")
    assert w["group_size"] == (block or None)
    dtype = next(model.parameters()).dtype
    for layer in range(2):
        for lin in LINEARS:
            part = "self_attn" if lin[0] in "qkvo" else "mlp"
            m = f"model.layers.{layer}.{part}.{lin}"
            n, k = model.get_submodule(m).weight.shape
            assert m + ".weight" not in tensors and m + ".weight_zero_point" not in tensors
            assert tensors[m + ".weight_packed"].dtype == torch.int32
            assert tuple(tensors[m + ".weight_packed"].shape) == (n, k * bits // 32)
            assert tuple(tensors[m + ".weight_scale"].shape) == (n, k // block if block else 1)
            assert tensors[m + ".weight_scale"].dtype == dtype
            assert tensors[m + ".weight_shape"].tolist() == [n, k]
    if layout == "sharded":
        assert (dst / "model.safetensors.index.json").exists()
        assert len(list(dst.glob("model-*-of-*.safetensors"))) > 1


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_float_tensors_unchanged_and_side_files_copied(case, converted):
    model, src, dst, _ = converted[case]
    tensors = read_weights(dst)
    original = read_weights(src)
    floats = [k for k in original if not any(f".{lin}." in k for lin in LINEARS)]
    assert "lm_head.weight" in floats and "model.embed_tokens.weight" in floats
    for k in floats:
        assert tensors[k].dtype == original[k].dtype, k
        assert torch.equal(tensors[k].view(torch.uint8) if tensors[k].dtype == torch.bfloat16
                           else tensors[k], original[k].view(torch.uint8)
                           if original[k].dtype == torch.bfloat16 else original[k]), k
    if src.name == "float32_single":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            assert (dst / name).read_bytes() == (src / name).read_bytes()
        assert not (dst / "notes.txt").exists()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_compressed_tensors_decompresses_to_qforge_values(case, converted):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    model, src, dst, _ = converted[case]
    tensors = read_weights(dst)
    qc = QuantizationConfig.model_validate(
        json.loads((dst / "config.json").read_text())["quantization_config"])
    scheme = qc.config_groups["group_0"]
    modules = sorted(k[: -len(".weight_packed")] for k in tensors if k.endswith(".weight_packed"))
    assert len(modules) == 2 * len(LINEARS)
    bits = 4 if case[2] == "w4a16" else 8
    for m in modules:
        local = {p: tensors[f"{m}.{p}"] for p in ("weight_packed", "weight_scale", "weight_shape")}
        got = PackedQuantizationCompressor.decompress(local, scheme)["weight"]
        want = dequantized_by_qforge(tensors, m)
        assert got.dtype == want.dtype and got.shape == want.shape, m
        assert torch.equal(got.view(torch.int16) if got.dtype == torch.bfloat16 else got,
                           want.view(torch.int16) if want.dtype == torch.bfloat16 else want), m
        ref = model.get_submodule(m).weight.float()
        # int4: a block's amax / 7 steps, clipped by the scale search by at most 20% + a step.
        bound = (0.3 if bits == 4 else 0.5 / 127 + 1e-2) * ref.abs().max()
        assert (got.float() - ref).abs().max() <= bound, m


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_transformers_loads_and_matches_dequantized_float_model(case, converted):
    model, src, dst, _ = converted[case]
    tensors = read_weights(dst)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(dst), device_map="cpu").eval()
    reference = make_reference(src, tensors)
    with torch.no_grad():
        got = loaded(IDS).logits.float()
        want = reference(IDS).logits.float()
    err = float((got - want).abs().max() / want.abs().max())
    assert err <= 1e-3, f"logits differ by {err:.2e} relative"


def make_reference(src, tensors):
    """The float model, loaded as transformers loads OUT, with qforge's dequantized values as
    its Linear weights."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(src), device_map="cpu").eval()
    with torch.no_grad():
        for k in tensors:
            if k.endswith(".weight_packed"):
                m = k[: -len(".weight_packed")]
                ref.get_submodule(m).weight.copy_(dequantized_by_qforge(tensors, m))
    return ref


def test_report_names_what_stayed_float(converted):
    _, _, _, stderr = converted[(torch.float32, "single", "w4a16", 32)]
    assert "quantized 14, float 7" in stderr, stderr
    assert "lm_head.weight" in stderr, stderr


def test_block_size_that_does_not_divide_k_is_refused(folders, run_qforge, tmp_path):
    _, src = folders[(torch.float32, "single")]
    out = tmp_path / "q"
    rc, _, stderr = run_qforge("convert", src, "--quant", "w4a16", "--block-size", "64", "-o",
                               str(out) + "/")
    assert rc == EXIT_USAGE, stderr
    assert "input features" in stderr and "--block-size 32" in stderr, stderr
    assert "96" in stderr, stderr
    assert list(tmp_path.iterdir()) == []


def test_safetensors_output_holds_the_packed_tensors(folders, run_qforge, tmp_path):
    model, src = folders[(torch.bfloat16, "single")]
    out = tmp_path / "q.safetensors"
    rc, _, stderr = run_qforge("convert", src / "model.safetensors", "--quant", "w4a16",
                               "--block-size", "32", "-o", out)
    assert rc == 0, stderr
    tensors = load_file(str(out))
    assert tensors["model.layers.0.mlp.down_proj.weight_packed"].shape == (64, 96 // 8)
    assert "lm_head.weight" in tensors and "model.layers.0.mlp.down_proj.weight" not in tensors


def test_nan_in_a_later_weight_is_refused_and_nothing_is_left(folders, run_qforge, tmp_path):
    """The writer runs one part behind the quantizer on its own thread: a weight that fails
    after earlier parts were handed to it still stops the conversion, naming the weight, and
    leaves no output (the failure waits for the write in flight, then drops the temporary)."""
    model, _ = folders[(torch.bfloat16, "single")]
    bad = make_model(torch.bfloat16, 64, 96)
    bad.load_state_dict(model.state_dict())
    with torch.no_grad():
        bad.model.layers[1].mlp.up_proj.weight[3, 5] = float("nan")
    src = tmp_path / "src"
    bad.save_pretrained(src)
    out = tmp_path / "q"
    rc, _, stderr = run_qforge("convert", src, "--quant", "w4a16", "--block-size", "32", "-o",
                               str(out) + "/")
    assert rc == 3, stderr  # invalid input
    assert "model.layers.1.mlp.up_proj.weight" in stderr and "NaN or Inf" in stderr, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
