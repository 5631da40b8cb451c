"""Accuracy of W4A16 round-to-nearest scale rules on the trained tiny Llama (issue 19): the mean
per-token KL divergence from the float model on held-out text (tests/interop/llm_metrics.py,
as tests/interop/test_tiny_llama.py measures it), for

- qforge `--w4-scale mse` (the default: 23 candidate scales and two least-squares steps per
  group) and `--w4-scale amax` (amax / 7), each written by `qforge convert DIR --quant w4a16`
  and read back from the pack-quantized folder;
- amax / 7.5 (compressed-tensors' own minmax observer: scale = amax / ((qmax - qmin) / 2),
  q = clamp(round(w / scale), -8, 7), in the weight's dtype, here f32), in numpy.

    QFORGE_FIXTURE_CACHE=build/fixture-cache \\
        .venv/bin/python bench/w4_scale_kl.py --qforge build/qforge

The tiny Llama comes from the fixture cache (tests/interop/fixtures/tiny_llama.py builds it).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "interop"))
import llm_metrics  # noqa: E402


def minmax_state_dict(state: dict[str, np.ndarray], block: int) -> dict[str, np.ndarray]:
    """`state` with each decoder Linear weight dequantized from amax / 7.5 RTN (f32)."""
    out = dict(state)
    for name, w in state.items():
        if name.endswith(".weight") and llm_metrics.DECODER_LINEARS.match(name[:-len(".weight")]):
            n, k = w.shape
            blocks = w.astype(np.float32).reshape(n, k // block, block)
            scale = (np.abs(blocks).max(axis=-1) / np.float32(7.5)).astype(np.float32)
            scale = np.where(scale == 0, np.float32(1.0), scale)
            q = np.clip(np.rint(blocks / scale[..., None]), -8, 7)
            out[name] = (q * scale[..., None]).astype(np.float32).reshape(n, k)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qforge", default="build/qforge")
    ap.add_argument("--model", default=None, help="the tiny Llama folder (default: the cache's)")
    ap.add_argument("--blocks", default="128,32")
    args = ap.parse_args()
    if args.model:
        model_dir = Path(args.model)
    else:
        cache = Path(os.environ.get("QFORGE_FIXTURE_CACHE", REPO / "build" / "fixture-cache"))
        found = sorted(p for p in cache.glob("tiny_llama-*") if (p / "heldout.npz").exists())
        if not found:
            raise SystemExit(f"no tiny_llama-* folder in {cache}: run tests/interop first")
        model_dir = found[0]
    heldout = llm_metrics.load_eval_set(model_dir / "heldout.npz")
    state = llm_metrics._read_safetensors(model_dir)
    float_logits = llm_metrics.model_logits(llm_metrics.load_float(model_dir), *heldout)
    print(f"model: {model_dir.name}; float perplexity "
          f"{llm_metrics.perplexity(float_logits, *heldout):.3f}")
    print(f"{'rule':<40} {'block':>5} {'KL (nats/token)':>16} {'ppl':>8}")
    with tempfile.TemporaryDirectory(prefix="qforge_w4_scale_kl_") as tmp:
        for block in (int(b) for b in args.blocks.split(",")):
            rows = []
            for rule in ("mse", "amax"):
                out = Path(tmp) / f"{rule}-{block}"
                subprocess.run([args.qforge, "convert", str(model_dir), "--quant", "w4a16",
                                "--w4-scale", rule, "--block-size", str(block), "-o",
                                str(out) + "/", "-q"], check=True)
                logits = llm_metrics.model_logits(llm_metrics.load_pack_quantized(out), *heldout)
                rows.append((f"qforge --w4-scale {rule}", logits))
            model = llm_metrics.model_from_state_dict(model_dir, minmax_state_dict(state, block))
            rows.append(("amax / 7.5 (compressed-tensors minmax)",
                         llm_metrics.model_logits(model, *heldout)))
            model = llm_metrics.model_from_state_dict(
                model_dir, llm_metrics.rtn_state_dict(state, block))
            rows.append(("amax / 7 (numpy reference)", llm_metrics.model_logits(model, *heldout)))
            for name, logits in rows:
                m = llm_metrics.kl_and_perplexity(float_logits, logits, *heldout)
                print(f"{name:<40} {block:>5} {m['kl']:>16.5f} {m['ppl']:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
