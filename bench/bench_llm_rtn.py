"""W4A16 RTN of a whole Llama-shaped model folder (issue 18 section 6): writes a synthetic bf16
folder in shards (random weights, Llama tensor names and config.json), times reading its shards
once (`cat shards > /dev/null`), then `qforge convert DIR --quant w4a16 -o OUT/` under
/usr/bin/time -v (peak RSS), prints seconds, seconds per layer, the ratio to the cat and the peak
RSS, and removes everything it wrote.

    .venv/bin/python bench/bench_llm_rtn.py --shape tinyllama-1.1b [--qforge build/qforge]
    .venv/bin/python bench/bench_llm_rtn.py --shape llama2-7b --workdir /big/disk

The files are read right after they are written, so both the cat and qforge read them mostly
from the page cache when they fit in memory (say so beside the figures)."""
from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = {
    "tinyllama-1.1b": dict(hidden=2048, layers=22, intermediate=5632, heads=32, kv_heads=4,
                           vocab=32000),
    "llama2-7b": dict(hidden=4096, layers=32, intermediate=11008, heads=32, kv_heads=32,
                      vocab=32000),
    "tiny": dict(hidden=256, layers=2, intermediate=512, heads=4, kv_heads=2, vocab=1000),
}


def tensor_shapes(s: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, i, v = s["hidden"], s["intermediate"], s["vocab"]
    kv = h // s["heads"] * s["kv_heads"]
    out = [("model.embed_tokens.weight", (v, h))]
    for layer in range(s["layers"]):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, h)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return out


def random_bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(int(np.prod(shape)), dtype=np.float32) * np.float32(0.02)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def write_shard(path: Path, tensors: list[tuple[str, tuple[int, ...]]], rng) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, shape in tensors:
            f.write(random_bf16(rng, shape).tobytes())


def write_folder(d: Path, s: dict, shard_bytes: int) -> list[Path]:
    rng = np.random.default_rng(0)
    shards, cur, size = [], [], 0
    for name, shape in tensor_shapes(s):
        nbytes = 2 * int(np.prod(shape))
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += nbytes
    shards.append(cur)
    weight_map, files = {}, []
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(d / fname, tensors, rng)
        files.append(d / fname)
        weight_map.update({n: fname for n, _ in tensors})
    total = sum(2 * int(np.prod(sh)) for _, sh in tensor_shapes(s))
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s["hidden"],
        "intermediate_size": s["intermediate"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
        "vocab_size": s["vocab"], "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "hidden_act": "silu"}, indent=2))
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama-1.1b")
    ap.add_argument("--qforge", default="build/qforge")
    ap.add_argument("--workdir", default=None, help="where to write (default: a temp folder)")
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--w4-scale", default=None, help="mse (default, as --quant w4a16) or amax")
    ap.add_argument("--shard-gb", type=float, default=2.0)
    args = ap.parse_args()
    s = SHAPES[args.shape]
    root = Path(tempfile.mkdtemp(prefix="qforge_llm_rtn_", dir=args.workdir))
    try:
        src, out = root / "model", root / "out"
        src.mkdir()
        t0 = time.perf_counter()
        files = write_folder(src, s, int(args.shard_gb * 1e9))
        gb = sum(f.stat().st_size for f in files) / 1e9
        print(f"{args.shape}: wrote {len(files)} shards, {gb:.2f} GB in "
              f"{time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        subprocess.run(f"cat {' '.join(str(f) for f in files)} > /dev/null", shell=True, check=True)
        cat_s = time.perf_counter() - t0
        cmd = ["/usr/bin/time", "-v", args.qforge, "convert", str(src), "--quant", "w4a16",
               "--block-size", str(args.block_size), "-o", str(out) + "/"]
        if args.w4_scale:
            cmd += ["--w4-scale", args.w4_scale]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"qforge failed:\n{proc.stderr[-3000:]}")
        rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)[1])
        out_gb = sum(f.stat().st_size for f in out.glob("*.safetensors")) / 1e9
        print(f"command: {' '.join(cmd[2:])}")
        print(f"cat of the shards: {cat_s:.1f} s ({gb / cat_s:.2f} GB/s)")
        print(f"qforge w4a16 RTN: {seconds:.1f} s, {seconds / s['layers']:.2f} s per layer, "
              f"{seconds / cat_s:.1f}x the cat, peak RSS {rss_kb / 1024 / 1024:.2f} GiB, "
              f"output {out_gb:.2f} GB")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
