"""llmcompressor, the peer that qforge's GPTQ and AWQ are held to, on a model folder.

Two halves:
- run as a script inside the peers' venv (scripts/setup_peers.sh: llmcompressor pins a
  transformers older than the one in .venv), it runs `oneshot` for each asked configuration on
  the folder with the calibration ids of calib.npz and writes each result as a compressed-tensors
  pack-quantized folder, with its wall time and peak RSS (each configuration in a forked child,
  so the peak is its own) in results.json;
- imported by the tests (in .venv), `run` calls that script and `evaluate` measures each
  folder with llm_metrics (KL to float and perplexity on the held-out ids), so the peer's
  figures and qforge's come from the same loader and the same transformers.

Configurations: GPTQ W4A16 symmetric, and AWQ both as llmcompressor's asymmetric preset
(W4A16_ASYM) and symmetric, each at group size 128 and 32. The calibration rows are the
fixture's, unshuffled; the lm_head stays float. Runs on CPU: llmcompressor's AWQ calls
Tensor.pin_memory, which fails without an accelerator, so the script makes it a no-op (in its
own process only).

    .venv-peers/bin/python tests/interop/peer_llmcompressor.py MODEL_DIR CALIB_NPZ OUT_DIR \
        [--configs gptq-sym-128,awq-asym-32,...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# name: (method, symmetric, group size)
CONFIGS = {
    "gptq-sym-128": ("gptq", True, 128),
    "gptq-sym-32": ("gptq", True, 32),
    "awq-asym-128": ("awq", False, 128),
    "awq-sym-128": ("awq", True, 128),
    "awq-asym-32": ("awq", False, 32),
    "awq-sym-32": ("awq", True, 32),
}
TIMEOUT_S = 900


def peers_python() -> Path:
    """The peers' venv interpreter: $QFORGE_PEERS_PYTHON, or .venv-peers/bin/python."""
    env = os.environ.get("QFORGE_PEERS_PYTHON")
    return Path(env) if env else REPO_ROOT / ".venv-peers" / "bin" / "python"


def peers_missing() -> str | None:
    """Why the peer cannot run here, or None when it can."""
    python = peers_python()
    if not python.is_file():
        return f"no peers venv at {python}: run scripts/setup_peers.sh"
    probe = subprocess.run([str(python), "-c", "import llmcompressor"], capture_output=True,
                           text=True, timeout=300)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"llmcompressor does not import in {python}: {last}"
    return None


def run(model_dir, calib, out_dir, configs=tuple(CONFIGS)) -> dict[str, dict]:
    """Runs the peer in its venv; returns {config: {wall_s, peak_rss_mib, folder}}."""
    out_dir = Path(out_dir)
    proc = subprocess.run(
        [str(peers_python()), __file__, str(model_dir), str(calib), str(out_dir),
         "--configs", ",".join(configs)],
        capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"llmcompressor peer failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    results = json.loads((out_dir / "results.json").read_text())
    for name, row in results.items():
        row["folder"] = str(out_dir / name)
    return results


def evaluate(folder, heldout, float_logits) -> dict[str, float]:
    """KL to float and perplexity of a pack-quantized folder on the held-out ids."""
    import llm_metrics

    ids, mask = heldout
    model = llm_metrics.load_pack_quantized(folder)
    return llm_metrics.kl_and_perplexity(float_logits, llm_metrics.model_logits(model, ids, mask),
                                         ids, mask)


# --- the script half (peers' venv) --------------------------------------------------------------


def _recipe(method: str, symmetric: bool, group: int):
    from llmcompressor.modifiers.awq import AWQModifier
    from llmcompressor.modifiers.quantization import GPTQModifier

    if method == "awq" and not symmetric and group == 128:
        return AWQModifier(targets=["Linear"], ignore=["lm_head"], scheme="W4A16_ASYM")
    groups = {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group",
                    "group_size": group},
    }}
    if method == "gptq":
        return GPTQModifier(targets=["Linear"], ignore=["lm_head"], config_groups=groups)
    return AWQModifier(targets=["Linear"], ignore=["lm_head"], config_groups=groups)


def _quantize(model_dir: Path, calib: Path, out: Path, config: str) -> dict:
    import resource

    import numpy as np
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    method, symmetric, group = CONFIGS[config]
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with np.load(calib) as data:
        ids, mask = data["input_ids"], data["attention_mask"]
    dataset = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": mask.tolist()})
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    oneshot(model=model, tokenizer=tokenizer, dataset=dataset,
            recipe=_recipe(method, symmetric, group), max_seq_length=ids.shape[1],
            num_calibration_samples=ids.shape[0], shuffle_calibration_samples=False,
            batch_size=16)
    model.save_pretrained(str(out), save_compressed=True)
    tokenizer.save_pretrained(str(out))
    wall = time.perf_counter() - t0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(rss_mib, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("calib", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {list(CONFIGS)}")

    import torch

    # llmcompressor's AWQ pins calibration tensors; on a machine without an accelerator
    # that raises "Cannot access accelerator device when none is available".
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    import llmcompressor  # noqa: F401  (imported once, before the children fork)

    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for config in configs:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            code = 0
            try:
                row = _quantize(args.model_dir, args.calib, args.out / config, config)
            except BaseException as err:  # reported by the parent
                row, code = {"error": f"{type(err).__name__}: {err}"}, 1
                import traceback
                traceback.print_exc()
            with os.fdopen(write_fd, "w") as pipe:
                json.dump(row, pipe)
            os._exit(code)
        os.close(write_fd)
        with os.fdopen(read_fd) as pipe:
            text = pipe.read()
        _, status = os.waitpid(pid, 0)
        row = json.loads(text) if text else {"error": f"child died (status {status})"}
        if "error" in row:
            print(f"{config}: {row['error']}", file=sys.stderr)
            return 1
        results[config] = row
        print(f"{config}: {row}", flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
