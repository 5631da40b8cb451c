"""A model folder quantized layer by layer on token ids (`convert DIR --quant w4a16 --w4-method
awq|gptq --calib ids.npz`): a PEFT LoRA adapter given with --lora is merged before calibration
(the output equals quantizing the merged folder), npz and jsonl ids give the same result, --json
reports every layer, and --w4-method awq|gptq without --calib is a usage error."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

EXIT_USAGE = 2
VOCAB = 128


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("layerwise")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=VOCAB, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(d / "model")
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                           init_lora_weights=False)
    peft.get_peft_model(model, lora).save_pretrained(d / "adapter")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (8, 16))
    mask = np.ones_like(ids)
    mask[1, :5] = 0  # left padding
    mask[2, 11:] = 0  # right padding
    np.savez(d / "ids.npz", input_ids=ids, attention_mask=mask)
    with open(d / "ids.jsonl", "w") as f:
        for row, m in zip(ids, mask):
            f.write(json.dumps({"input_ids": [int(v) for v in row[m == 1]]}) + "\n")
    return d


def tensors(out) -> dict[str, np.ndarray]:
    got = {}
    for shard in sorted(out.glob("*.safetensors")):
        got.update(safetensors_numpy.load_file(str(shard)))
    return got


def quantize(run_qforge, src, out, *extra, method="gptq"):
    code, stdout, stderr = run_qforge("convert", src, "--quant", "w4a16", "--w4-method", method,
                                      "--block-size", "32", *extra, "-o", out)
    assert code == 0, stderr
    return stdout, stderr


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_lora_is_merged_before_calibration(folder, run_qforge, tmp_path, method):
    calib = ("--calib", folder / "ids.npz")
    quantize(run_qforge, folder / "model", tmp_path / "direct", "--lora", folder / "adapter",
             *calib, method=method)
    code, _, stderr = run_qforge("convert", folder / "model", "--lora", folder / "adapter",
                                 "-o", tmp_path / "merged")
    assert code == 0, stderr
    quantize(run_qforge, tmp_path / "merged", tmp_path / "two_steps", *calib, method=method)
    quantize(run_qforge, folder / "model", tmp_path / "no_lora", *calib, method=method)
    direct, two_steps, no_lora = (tensors(tmp_path / n) for n in ("direct", "two_steps",
                                                                  "no_lora"))
    assert sorted(direct) == sorted(two_steps)
    for name in direct:
        np.testing.assert_array_equal(direct[name], two_steps[name], err_msg=name)
    # The adapter changed what was quantized: q_proj, v_proj and down_proj differ.
    changed = {n for n in direct if not np.array_equal(direct[n], no_lora[n])}
    for module in ("q_proj", "v_proj", "down_proj"):
        assert any(module in n and n.endswith("weight_packed") for n in changed), (module, changed)


def test_npz_and_jsonl_ids_give_the_same_output(folder, run_qforge, tmp_path):
    quantize(run_qforge, folder / "model", tmp_path / "npz", "--calib", folder / "ids.npz")
    quantize(run_qforge, folder / "model", tmp_path / "jsonl", "--calib", folder / "ids.jsonl")
    a, b = tensors(tmp_path / "npz"), tensors(tmp_path / "jsonl")
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_json_reports_every_layer_and_stderr_a_line_per_layer(folder, run_qforge, tmp_path):
    code, stdout, stderr = run_qforge("--json", "convert", folder / "model", "--quant", "w4a16",
                                      "--w4-method", "gptq", "--block-size", "32", "--calib",
                                      folder / "ids.npz", "--seq-len", "12",
                                      "-o", tmp_path / "out")
    assert code == 0, stderr
    result = json.loads(stdout)
    layerwise = next(p for p in result["passes"] if p["pass"] == "layerwise")["stats"]
    assert layerwise["method"] == "gptq" and layerwise["seq_len"] == 12
    assert [layer["index"] for layer in layerwise["layers"]] == [0, 1]
    for layer in layerwise["layers"]:
        assert 0.0 < layer["output_error"] < 0.5, layer
        assert layer["seconds"] > 0.0
        assert len(layer["linears"]) == 7
        for linear in layer["linears"]:
            assert 0.0 < linear["output_error"] < 0.5, linear
    assert "layer 1/2" in stderr and "layer 2/2" in stderr, stderr


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_calibrated_method_without_calib_is_a_usage_error(folder, run_qforge, tmp_path, method):
    out = tmp_path / "out"
    code, _, stderr = run_qforge("convert", folder / "model", "--quant", "w4a16", "--w4-method",
                                 method, "-o", out)
    assert code == EXIT_USAGE, stderr
    assert "--calib" in stderr, stderr
    assert not out.exists()


@pytest.mark.parametrize("quant", ["int8-weights", "w4a16"])
def test_round_to_nearest_with_calib_goes_layer_by_layer(folder, run_qforge, tmp_path, quant):
    """INT8 weight-only per channel (and W4A16 RTN) with --calib on a folder run through the
    layer-by-layer engine: per-layer output errors on the token ids, and the same weights as the
    one-tensor-at-a-time path (rounding to nearest does not depend on the activations)."""
    block = ("--block-size", "32") if quant == "w4a16" else ()
    code, stdout, stderr = run_qforge("--json", "convert", folder / "model", "--quant", quant,
                                      *block, "--calib", folder / "ids.npz",
                                      "-o", tmp_path / "layers")
    assert code == 0, stderr
    layerwise = next(p for p in json.loads(stdout)["passes"] if p["pass"] == "layerwise")["stats"]
    assert layerwise["scheme"] == quant and layerwise["method"] == "rtn"
    assert [layer["index"] for layer in layerwise["layers"]] == [0, 1]
    for layer in layerwise["layers"]:
        assert len(layer["linears"]) == 7
        for linear in layer["linears"]:
            assert 0.0 < linear["output_error"] < 0.5, linear
    code, _, stderr = run_qforge("convert", folder / "model", "--quant", quant, *block,
                                 "-o", tmp_path / "tensorwise")
    assert code == 0, stderr
    a, b = tensors(tmp_path / "layers"), tensors(tmp_path / "tensorwise")
    assert sorted(a) == sorted(b)
    packed = [n for n in a if n.endswith("weight_packed")]
    assert len(packed) == 14, packed
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    config = json.loads((tmp_path / "layers" / "config.json").read_text())
    bits = config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"]
    assert bits == (8 if quant == "int8-weights" else 4)


def test_int8_only_flags_with_a_folder_calib_are_usage_errors(folder, run_qforge, tmp_path):
    out = tmp_path / "out"
    code, _, stderr = run_qforge("convert", folder / "model", "--quant", "int8-weights",
                                 "--calib", folder / "ids.npz", "--method", "entropy", "-o", out)
    assert code == EXIT_USAGE, stderr
    assert "--method" in stderr and "layer-by-layer" in stderr, stderr
    assert not out.exists()
