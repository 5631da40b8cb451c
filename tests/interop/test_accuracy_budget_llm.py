"""The accuracy budget on a Hugging Face model folder (`qforge convert DIR --quant w4a16 |
int8-weights --target-cosine C -o OUT/`, cli/budget_job.h's run_folder_budget): the search runs
qforge's decoder graph with each Linear's weight dequantized as the checkpoint will hold it, then
the checkpoint is written with the chosen per-module precisions.

Proof by the checkpoint's loader, not qforge's runtime: transformers loads OUT on the CPU
(compressed-tensors for the default layout), and its logits on the search's token ids reach the
target with the cosine the search reported (the trial graph is what was written); on the held-out
ids, which the search never saw, the cosine is printed and checked within the target's slack.
The trained tiny Llama (tests/interop/fixtures/tiny_llama.py): 4 layers, 16 search layers (q/k/v
and gate/up of one layer fused into one, as engines run them)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import llm_metrics

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

EXIT_USAGE = 2


def real_token_metric(want: np.ndarray, got: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """The budget's metrics: one cosine and one SQNR (dB) over every real token's logits."""
    keep = mask.astype(bool)
    r = want[keep].astype(np.float64)
    q = got[keep].astype(np.float64)
    return {"cosine": float((r * q).sum() / np.sqrt((r * r).sum() * (q * q).sum())),
            "sqnr_db": float(10 * np.log10((r * r).sum() / ((r - q) ** 2).sum()))}


def logits_of(folder, ids, mask) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), device_map="cpu", dtype=torch.float32).eval()
    return llm_metrics.model_logits(model, ids, mask)


@pytest.fixture(scope="module")
def float_logits(tiny_llama):
    out = {}
    for name in ("calib", "heldout"):
        ids, mask = llm_metrics.load_eval_set(tiny_llama / f"{name}.npz")
        out[name] = (ids, mask, logits_of(tiny_llama, ids, mask))
    return out


def modules_of(layer: str) -> list[str]:
    """The modules of a search layer: "model.layers.0.self_attn.{q_proj|k_proj|v_proj}" is three."""
    prefix, _, parts = layer.partition(".{")
    return [f"{prefix}.{m}" for m in parts.rstrip("}").split("|")] if parts else [layer]


def budget_of(stdout: str) -> tuple[dict, dict]:
    passes = {p["pass"]: p["stats"] for p in json.loads(stdout)["passes"]}
    return passes["budget"], passes


# (scheme, flag, target, the metric's key, its slack on unseen ids, the agreement asked of the
# search's figure and transformers'; the ladder's bottom rung)
CASES = [
    ("w4a16", "--target-cosine", 0.999, "cosine", 0.001, 1e-5, "int4"),
    ("int8-weights", "--target-sqnr", 55.0, "sqnr_db", 3.0, 0.05, "int8"),
]


@pytest.mark.parametrize("quant,flag,target,key,slack,agree,bottom", CASES,
                         ids=[c[0] for c in CASES])
def test_folder_budget_written_checkpoint_meets_it_in_transformers(
        quant, flag, target, key, slack, agree, bottom, tiny_llama, float_logits, run_qforge,
        tmp_path, report_figure):
    out = tmp_path / f"budget_{quant}"
    rc, stdout, stderr = run_qforge("--json", "convert", tiny_llama, "-o", out, "--quant", quant,
                                    "--calib", tiny_llama / "calib.npz", flag, str(target),
                                    timeout=1200)
    assert rc == 0, stderr
    budget, passes = budget_of(stdout)
    assert budget["eval"]["samples"] == 64 and budget["sensitivity_samples"] == 16
    layers = budget["layers"]
    assert len(layers) == 16, [r["name"] for r in layers]  # 4 x (qkv, o, gate/up, down)
    assert sum(r["name"].endswith("{q_proj|k_proj|v_proj}") for r in layers) == 4
    search = {t["trial"]: t for t in budget["search"]}
    assert not search["bottom"]["meets"], "the test needs a target that all-low misses"
    kept = [r["name"] for r in layers if r["precision"] != bottom]
    assert 0 < len(kept) < len(layers), kept
    assert budget["final"][key] >= target

    # The checkpoint as written: the chosen modules at their precision, fused parts alike.
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    bits_of = {}
    for group in config["config_groups"].values():
        for t in group["targets"]:
            bits_of[t] = group["weights"]["num_bits"]
    linear = passes["w4a16-linear" if quant == "w4a16" else "int8-weights-linear"]
    rules = linear.get("precision", [])
    for row in layers:
        for m in modules_of(row["name"]):
            chosen = [r.rpartition("=")[2] for r in rules
                      if re.search(r.rpartition("=")[0], m)]
            assert (chosen[0] if chosen else bottom) == row["precision"], (m, row, rules)
    if quant == "w4a16":
        assert set(bits_of.values()) <= {4, 8}

    # transformers runs it: the search's figure on the search's ids, the target kept on unseen.
    ids, mask, want = float_logits["calib"]
    got = logits_of(out, ids, mask)
    on_search = real_token_metric(want, got, mask)[key]
    ids_h, mask_h, want_h = float_logits["heldout"]
    unseen = real_token_metric(want_h, logits_of(out, ids_h, mask_h), mask_h)[key]
    report_figure(f"tiny Llama folder {quant} {flag} {target}: {budget['precision']} "
                  f"({len(kept)} of 16 layers kept above {bottom}); all {bottom}: "
                  f"{search['bottom'][key]:.6f}; qforge's search {budget['final'][key]:.6f}, "
                  f"transformers on the written checkpoint {on_search:.6f} (same 64 sequences), "
                  f"{unseen:.6f} on the 64 held-out ones; {budget['trials']} trials")
    assert abs(on_search - budget["final"][key]) <= agree, (on_search, budget["final"])
    assert unseen >= target - slack, unseen


def test_folder_budget_single_scheme_layout_climbs_to_float(tiny_llama, run_qforge, tmp_path):
    """GPTQ holds one quantized scheme per checkpoint: the ladder is int4 -> float, and the
    modules kept float are GPTQModel `dynamic` exclusions."""
    out = tmp_path / "budget_gptq"
    rc, stdout, stderr = run_qforge("--json", "convert", tiny_llama, "-o", out, "--quant",
                                    "w4a16", "--format", "gptq", "--eval",
                                    tiny_llama / "heldout.npz", "--target-cosine", "0.999",
                                    timeout=1200)
    assert rc == 0, stderr
    budget, _ = budget_of(stdout)
    kept = [r["name"] for r in budget["layers"] if r["precision"] != "int4"]
    assert kept and {r["precision"] for r in budget["layers"]} == {"int4", "float"}
    dynamic = json.loads((out / "config.json").read_text())["quantization_config"]["dynamic"]
    excluded = {k[len("-:"):] for k in dynamic}
    for name in kept:
        for m in modules_of(name):
            assert any(re.fullmatch(rx, m) for rx in excluded), (m, excluded)


@pytest.mark.parametrize("args,needle", [
    (["--quant", "w4a16", "--w4-method", "gptq", "--calib", "{dir}/calib.npz",
      "--target-cosine", "0.99"], "round-to-nearest"),
    (["--quant", "w4a16", "--calib", "{dir}/calib.npz", "--target-cosine", "0.99",
      "--precision", "down_proj=int8"], "--precision"),
    (["--quant", "int8-weights", "--target-cosine", "0.99"], "--eval DATA"),
])
def test_folder_budget_usage_errors(args, needle, tiny_llama, run_qforge, tmp_path):
    out = tmp_path / "never"
    rc, _, stderr = run_qforge("convert", tiny_llama, "-o", out,
                               *[a.replace("{dir}", str(tiny_llama)) for a in args])
    assert rc == EXIT_USAGE and needle in stderr, stderr
    assert not out.exists()
