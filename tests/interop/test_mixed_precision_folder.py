"""`qforge convert DIR --quant w4a16 --precision REGEX=int4|int8|float -o OUT/`: a model folder in
mixed precision, written as compressed-tensors config groups with regex targets, proven by:
(a) the `compressed-tensors` package: each module decompressed with the config group whose
    targets match it (compressed_tensors.utils.match.match_name) equals q * scale from qforge's
    own tensors bit for bit, every quantized module is matched by exactly one group, and the
    float Linears by none (they are in `ignore`);
(b) transformers loads OUT on the CPU and its logits match qforge's runtime on OUT converted to
    .onnx within 1e-3 relative;
(c) qforge reads OUT back: `inspect --json` lists every group, `convert OUT -o BACK/` re-emits
    it bit for bit;
(d) bad rules are usage errors (exit 2) and a layout that holds one scheme refuses (exit 4).
Round to nearest and layer-wise GPTQ and AWQ (--calib). A tiny random Llama, hidden 64, intermediate 96,
blocks of 32."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

from test_compressed_tensors_export import dequantized_by_qforge, read_weights  # noqa: E402
from test_hf_decoder import IDS, MASK, positions, randomize, relative_error  # noqa: E402
from test_quantized_folder_read import bits_equal  # noqa: E402

EXIT_USAGE, EXIT_UNSUPPORTED = 2, 4
REL_TOL = 1e-3
RULES = ["--precision", r"mlp\.down_proj$=int8",
         "--precision", r"layers\.1\.self_attn\.o_proj$=float",
         "--precision", r"layers\.1\.self_attn\.[qkv]_proj$=int8"]
INT4 = {f"model.layers.0.{m}" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj")} | {
    f"model.layers.1.mlp.{m}" for m in ("gate_proj", "up_proj")}
INT8 = {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj",
        "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
        "model.layers.1.self_attn.v_proj"}
FLOAT = {"model.layers.1.self_attn.o_proj", "lm_head"}
METHODS = {"rtn": [], "gptq": ["--w4-method", "gptq"], "awq": ["--w4-method", "awq"]}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mixed_src")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    randomize(model, 0)
    model.save_pretrained(root / "src")
    (root / "src" / "tokenizer_config.json").write_text('{"model_max_length": 128}')
    np.savez(root / "ids.npz", input_ids=IDS, attention_mask=MASK)
    return root / "src"


@pytest.fixture(scope="module")
def mixed(source, run_qforge, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mixed_out")
    out = {}
    for name, flags in METHODS.items():
        dst = root / name
        calib = ["--calib", source.parent / "ids.npz"] if flags else []
        rc, _, stderr = run_qforge("convert", source, "--quant", "w4a16", "--block-size", "32",
                                   *RULES, *flags, *calib, "-o", str(dst) + "/")
        assert rc == 0, stderr
        out[name] = dst
    return out


def packed_modules(tensors) -> set[str]:
    return {k[: -len(".weight_packed")] for k in tensors if k.endswith(".weight_packed")}


def test_config_has_one_group_per_scheme(mixed):
    q = json.loads((mixed["rtn"] / "config.json").read_text())["quantization_config"]
    assert q["format"] == "mixed-precision" and q["quant_method"] == "compressed-tensors"
    groups = q["config_groups"]
    assert list(groups) == ["group_0", "group_1"]
    g4, g8 = groups["group_0"], groups["group_1"]
    assert g4["format"] == g8["format"] == "pack-quantized"
    assert (g4["weights"]["num_bits"], g4["weights"]["strategy"], g4["weights"]["group_size"]) \
        == (4, "group", 32)
    assert (g8["weights"]["num_bits"], g8["weights"]["strategy"], g8["weights"]["group_size"]) \
        == (8, "channel", None)
    assert all(t.startswith("re:^") and t.endswith("$") for t in g4["targets"] + g8["targets"])
    assert sorted(q["ignore"]) == sorted(FLOAT)


@pytest.mark.parametrize("method", list(METHODS))
def test_compressed_tensors_matches_and_decompresses_each_group(method, mixed):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.utils.match import match_name

    dst = mixed[method]
    tensors = read_weights(dst)
    qc = QuantizationConfig.model_validate(
        json.loads((dst / "config.json").read_text())["quantization_config"])
    assert packed_modules(tensors) == INT4 | INT8
    every = sorted(INT4 | INT8 | FLOAT)
    for m in every:
        groups = [g for g in qc.config_groups.values()
                  if any(match_name(m, t) for t in g.targets)]
        ignored = any(match_name(m, t) for t in qc.ignore)
        if m in FLOAT:
            assert not groups and ignored, m
            continue
        assert len(groups) == 1 and not ignored, m
        assert groups[0].weights.num_bits == (4 if m in INT4 else 8), m
        local = {p: tensors[f"{m}.{p}"] for p in ("weight_packed", "weight_scale", "weight_shape")}
        got = PackedQuantizationCompressor.decompress(local, groups[0])["weight"]
        assert bits_equal(got, dequantized_by_qforge(tensors, m)), m
    assert "model.layers.1.self_attn.o_proj.weight" in tensors  # float, stored as it was


@pytest.mark.parametrize("method", list(METHODS))
def test_transformers_logits_match_qforge_runtime(method, mixed, run_qforge, report_figure,
                                                  tmp_path):
    dst = mixed[method]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        dst, dtype=torch.float32, attn_implementation="eager", device_map="cpu").eval()
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK),
                     position_ids=torch.from_numpy(positions(MASK))).logits.float().numpy()
    onnx = tmp_path / "m.onnx"
    rc, _, stderr = run_qforge("convert", dst, "-o", onnx)
    assert rc == 0, stderr
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, input_ids=IDS, attention_mask=MASK)
    rc, _, stderr = run_qforge("run", onnx, "--inputs", feeds, "-o", tmp_path / "out.npz")
    assert rc == 0, stderr
    with np.load(tmp_path / "out.npz") as data:
        ours = data["logits"]
    err = relative_error(ours, want, MASK)
    report_figure(f"mixed precision ({method}) folder: qforge runtime vs transformers, max rel "
                  f"error {err:.2e}")
    assert np.abs(want).max() > 1.0 and err <= REL_TOL


def test_gptq_changes_only_the_int4_modules(mixed):
    rtn, gptq = read_weights(mixed["rtn"]), read_weights(mixed["gptq"])
    for m in INT8:  # int8 modules: round to nearest per channel under --w4-method gptq too
        for p in ("weight_packed", "weight_scale"):
            assert bits_equal(rtn[f"{m}.{p}"], gptq[f"{m}.{p}"]), m
    assert any(not torch.equal(rtn[f"{m}.weight_packed"], gptq[f"{m}.weight_packed"])
               for m in INT4)
    for m in FLOAT - {"lm_head"}:
        assert bits_equal(rtn[f"{m}.weight"], gptq[f"{m}.weight"]), m


def test_qforge_reads_every_group_back_and_reemits_bit_for_bit(mixed, run_qforge, tmp_path):
    dst = mixed["rtn"]
    rc, stdout, stderr = run_qforge("inspect", dst, "--json")
    assert rc == 0, stderr
    q = json.loads(stdout)["hf"]["quantization"]
    assert q["format"] == "mixed-precision"
    schemes = {(s["bits"], s["group_size"], s["strategy"]): s["linears"] for s in q["schemes"]}
    assert schemes == {(4, 32, "group"): len(INT4), (8, None, "channel"): len(INT8)}, q["schemes"]
    assert q["quantized_linears"] == len(INT4 | INT8)
    assert sorted(q["float_linears"]) == sorted(FLOAT)
    back = tmp_path / "back"
    rc, _, stderr = run_qforge("convert", dst, "-o", str(back) + "/")
    assert rc == 0, stderr
    a, b = read_weights(dst), read_weights(back)
    assert sorted(a) == sorted(b)
    for k in a:
        assert bits_equal(a[k], b[k]), k
    assert (back / "config.json").read_bytes() == (dst / "config.json").read_bytes()


@pytest.mark.parametrize("rule,needle", [
    (r"down_proj=int3", "'int3' is not a precision"),
    (r"down_proj", "expected REGEX=int4|int8|float"),
    (r"(down_proj=int8", "is not a regular expression"),
    (r"layers\.7\.=int8", "matches no decoder Linear"),
    (r"layers\.0\.self_attn\.q_proj=int8", "parts of one Linear that engines fuse"),
    (r".*=float", "keeps every decoder Linear"),
])
def test_bad_rules_are_usage_errors(rule, needle, source, run_qforge, tmp_path):
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("convert", source, "--quant", "w4a16", "--block-size", "32",
                               "--precision", rule, "-o", str(out) + "/")
    assert rc == EXIT_USAGE, stderr
    assert needle in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists()


def test_precision_on_an_onnx_output_is_a_usage_error(source, run_qforge, tmp_path):
    rc, _, stderr = run_qforge("convert", source, "--quant", "w4a16", "--precision",
                               "down_proj=int8", "-o", tmp_path / "m.onnx")
    assert rc == EXIT_USAGE and "--precision" in stderr, stderr
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("fmt", ["gptq", "awq", "modelopt-hf", "trtllm-ckpt"])
def test_layouts_of_one_scheme_refuse_a_mixed_model(fmt, source, run_qforge, tmp_path):
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("convert", source, "--quant", "w4a16", "--block-size", "32",
                               "--precision", r"down_proj$=int8", "--format", fmt,
                               "-o", str(out) + "/")
    if fmt == "trtllm-ckpt":  # refuses block 32 before anything else
        assert rc in (EXIT_USAGE, EXIT_UNSUPPORTED), stderr
    else:
        assert rc == EXIT_UNSUPPORTED, stderr
        assert f"--format {fmt} holds one scheme" in stderr and "int4 group 32" in stderr \
            and "int8 per channel" in stderr, stderr
    assert not out.exists()


def test_the_same_rules_on_int8_weights_default(source, run_qforge, tmp_path):
    """--quant int8-weights as the default, int4 for the MLP's gate and up."""
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("convert", source, "--quant", "int8-weights", "--block-size", "32",
                               "--precision", r"mlp\.(gate|up)_proj$=int4", "-o", str(out) + "/")
    assert rc == 0, stderr
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    bits = [g["weights"]["num_bits"] for g in q["config_groups"].values()]
    assert bits == [4, 8] and q["format"] == "mixed-precision"
    tensors = read_weights(out)
    assert tensors["model.layers.0.mlp.up_proj.weight_scale"].shape == (96, 2)
    assert tensors["model.layers.0.self_attn.q_proj.weight_scale"].shape == (64, 1)
