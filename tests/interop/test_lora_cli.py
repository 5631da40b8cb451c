"""`qforge convert BASE --lora ADAPTER[:W] -o OUT` against PEFT 0.21's merge_and_unload() on
adapters made by tests/interop/fixtures/make_peft_adapters.py (tiny Llama, BERT, GPT-2 and a
Conv/Embedding model; plain LoRA, rsLoRA, patterns, DoRA, fan_in_fan_out, Embedding, bias,
modules_to_save, several adapters). f32 must agree to 1e-6, f16/bf16 to one unit in the last
place of PEFT's merge done in fp32 and rounded once (qforge's contract: one rounding)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from safetensors.numpy import load_file

FIXTURES = Path(__file__).parent / "fixtures" / "make_peft_adapters.py"


@pytest.fixture(scope="module")
def peft_cases(tmp_path_factory):
    out = tmp_path_factory.mktemp("peft")
    subprocess.run([sys.executable, str(FIXTURES), str(out)], check=True, capture_output=True)
    return out, json.loads((out / "manifest.json").read_text())["cases"]


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in representable steps between two f16/bf16 arrays (raw uint16 bits)."""
    def ordered(bits):
        bits = bits.astype(np.int32)
        return np.where(bits & 0x8000, 0x8000 - bits, bits)  # monotone map of sign-magnitude
    return int(np.max(np.abs(ordered(a) - ordered(b)))) if a.size else 0


def as_bits(arr: np.ndarray) -> np.ndarray:
    return arr.view(np.uint16)


def load_raw(path: Path) -> dict[str, np.ndarray]:
    """safetensors.numpy cannot hold bf16; read every tensor through torch and keep raw bits."""
    import torch
    from safetensors.torch import load_file as load_torch
    out = {}
    for k, t in load_torch(str(path)).items():
        if t.dtype == torch.bfloat16:
            out[k] = t.view(torch.int16).numpy().view(np.uint16)
            out[k] = out[k].view(np.uint16)
        else:
            out[k] = t.numpy()
    return out


def test_every_peft_case_merges_like_peft(peft_cases, run_qforge, tmp_path, report_figure):
    root, cases = peft_cases
    worst = {}
    for case in cases:
        if "base" not in case or not case["base"].endswith((".safetensors", ".bin")):
            continue
        args = ["convert", root / case["base"], "-o", tmp_path / f"{case['name']}.safetensors"]
        for adapter in case["adapters"]:
            args += ["--lora", f"{root / adapter['path']}:{adapter['weight']}"]
        rc, _, stderr = run_qforge(*args)
        assert rc == 0, f"{case['name']}: {stderr}"
        ours = load_raw(tmp_path / f"{case['name']}.safetensors")
        ref = load_raw(root / case.get("merged_once", case["merged"]))
        assert set(ours) == set(ref), f"{case['name']}: keys differ"
        if case["dtype"] == "f32":
            diff = max(float(np.max(np.abs(ours[k] - ref[k]))) if ours[k].size else 0.0
                       for k in ref)
            assert diff <= 1e-6, f"{case['name']}: max abs diff {diff:.3g} > 1e-6"
            worst[case["name"]] = f"{diff:.3g} abs"
        else:
            dist = 0
            for k in ref:
                if ref[k].dtype in (np.float16, np.uint16):
                    dist = max(dist, ulp_distance(as_bits(ours[k]), as_bits(ref[k])))
                else:
                    assert np.array_equal(ours[k], ref[k]), f"{case['name']}: {k} differs"
            assert dist <= 1, f"{case['name']}: {dist} ulp from PEFT"
            worst[case["name"]] = f"{dist} ulp"
    assert len(worst) >= 20, f"only {len(worst)} PEFT cases ran"
    f32 = max(float(v.split()[0]) for k, v in worst.items() if k.endswith("f32"))
    half = max(int(v.split()[0]) for k, v in worst.items() if not k.endswith("f32"))
    report_figure(f"LoRA merge vs PEFT merge_and_unload over {len(worst)} cases: "
                  f"worst f32 {f32:.3g} max abs, worst f16/bf16 {half} ulp")


@pytest.mark.parametrize("model", ["base_named.onnx", "base_anonymous.onnx"])
def test_adapter_merged_into_onnx_matches_peft_outputs(model, peft_cases, run_qforge, tmp_path,
                                                       report_figure):
    root, _ = peft_cases
    case = root / "bert_onnx"
    out = tmp_path / "merged.onnx"
    rc, _, stderr = run_qforge("convert", case / model, "--lora", case / "adapter", "-o", out)
    assert rc == 0, stderr
    onnx.checker.check_model(str(out), full_check=True)
    expected = np.load(case / "expected.npz")
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    feeds = {i.name: expected[i.name] for i in sess.get_inputs()}
    logits = sess.run(None, feeds)[0]
    diff = float(np.max(np.abs(logits - expected["logits"])))
    assert diff <= 1e-5, f"{model}: ORT logits differ from PEFT's by {diff:.3g}"
    report_figure(f"LoRA merged into {model}: ORT vs PEFT-merged torch max |dlogit| {diff:.3g}")


def test_unmatched_adapter_keys_are_an_error(peft_cases, run_qforge, tmp_path):
    root, _ = peft_cases
    # A Llama adapter onto the BERT base: nothing lands, every key is reported.
    out = tmp_path / "x.safetensors"
    rc, _, stderr = run_qforge("convert", root / "bert_bias_mts_f32" / "base.safetensors",
                               "--lora", root / "llama_lora_f32", "-o", out)
    assert rc == 3, stderr
    assert "mlp.down_proj.lora_A" in stderr and "--allow-unmatched" in stderr and len([l for l in stderr.splitlines() if l.strip()]) == 1
    assert not out.exists()


def test_weights_binds_a_finetuned_checkpoint_into_onnx(peft_cases, run_qforge, tmp_path):
    """--weights puts PEFT's merged state dict into the exported base graph; with anonymous
    transposed onnx::MatMul_N copies, --reference (the checkpoint it was exported from) lets
    qforge find them by content. ORT must then reproduce the PEFT-merged model's logits."""
    root, _ = peft_cases
    case = root / "bert_onnx"
    out = tmp_path / "bound.onnx"
    rc, _, stderr = run_qforge("convert", case / "base_anonymous.onnx",
                               "--weights", case / "merged.safetensors",
                               "--reference", case / "base.safetensors", "-o", out)
    assert rc == 0, stderr
    onnx.checker.check_model(str(out), full_check=True)
    expected = np.load(case / "expected.npz")
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits = sess.run(None, {i.name: expected[i.name] for i in sess.get_inputs()})[0]
    diff = float(np.max(np.abs(logits - expected["logits"])))
    assert diff <= 1e-5, f"bound checkpoint: ORT logits differ from PEFT's by {diff:.3g}"


def test_inspect_adapter_reports_ranks_alphas_scaling_and_dora(peft_cases, run_qforge):
    root, _ = peft_cases
    rc, stdout, stderr = run_qforge("inspect", root / "llama_patterns_f32", "--json")
    assert rc == 0, stderr
    info = json.loads(stdout)
    assert info["format"] == "peft-adapter" and info["r"] == 8 and info["lora_alpha"] == 16
    mods = {m["module"]: m for m in info["modules"]}
    # rank_pattern {'model.layers.1.mlp.down_proj': 2, 'q_proj': 4},
    # alpha_pattern {'layers\.0\..*o_proj': 64, 'v_proj': 4}: PEFT's matching rule.
    assert (mods["model.layers.0.self_attn.o_proj"]["alpha"], mods["model.layers.0.self_attn.o_proj"]["scaling"]) == (64, 8)
    assert mods["model.layers.1.self_attn.o_proj"]["alpha"] == 16
    assert mods["model.layers.0.self_attn.q_proj"]["r"] == 4
    assert mods["model.layers.1.mlp.down_proj"]["r"] == 2
    assert mods["model.layers.0.mlp.down_proj"]["r"] == 8
    assert mods["model.layers.0.self_attn.v_proj"]["scaling"] == 0.5
    assert not any(m["dora"] for m in info["modules"])

    rc, stdout, _ = run_qforge("inspect", root / "llama_dora_f32", "--json")
    dora = json.loads(stdout)
    assert rc == 0 and dora["use_dora"] and all(m["dora"] for m in dora["modules"])

    rc, stdout, _ = run_qforge("inspect", root / "llama_rslora_f32", "--json")
    rs = json.loads(stdout)
    assert rc == 0 and rs["use_rslora"]
    for m in rs["modules"]:
        assert abs(m["scaling"] - m["alpha"] / m["r"] ** 0.5) < 1e-12
