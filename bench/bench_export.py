"""Export speed against reading the files once (issue 19): writes a synthetic Llama-shaped bf16
Hugging Face folder (random weights, the shapes and names of bench_llm_rtn.py, a byte-level BPE
tokenizer.json so that GGUF export accepts it), times `cat` of its shards, then one qforge export
of it in a fresh process, and prints the seconds, the ratio to the cat and qforge's peak RSS
(getrusage of the child). Removes everything it wrote.

    .venv/bin/python bench/bench_export.py --format compressed-tensors [--quant w4a16]
    .venv/bin/python bench/bench_export.py --format gguf [--quant q4_0]
    .venv/bin/python bench/bench_export.py --format gptq|gptq-v2|awq|modelopt-hf|trtllm-ckpt
    .venv/bin/python bench/bench_export.py --format compressed-tensors --shape llama2-7b \
        --workdir /big/disk

--format picks the output form (compressed-tensors: `convert DIR --quant Q -o OUT/`; gguf:
`convert DIR --format gguf --quant Q -o OUT.gguf`; the other serving layouts: `convert DIR
--quant Q --format NAME -o OUT/`); --extra passes more flags (say
"--w4-scale amax"). --layers N keeps the first N decoder layers (a quicker run, same tensor
shapes). The cat runs right after the files are written and right before qforge, so when the
folder fits in memory both read from the page cache: the cat is then a memory-speed floor.
Each run also times `cp` of the shards into a sibling folder (removed after): copying the
weights once, the reference of issue 19's goal (at most 2x the copy); ratios are to it, and to
the cat. A `sync` precedes the cp and each qforge run, so that none pays for the writeback of
the pages an earlier one left dirty (without it the cp of 2.2 GB took 0.9 to 3.9 s here).
--repeat N runs cat, cp and qforge N times, alternating, and reports each run and the best.
Beside the wall-clock ratio it prints the ratio of CPU seconds (user + sys): on a shared machine
the wall clock of both depends on what else runs, their CPU time much less.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llm_rtn import SHAPES, write_folder  # noqa: E402

FORMATS = {
    # format: (default --quant, output path suffix, extra flags)
    "compressed-tensors": ("w4a16", "/", []),
    "gguf": ("q4_0", ".gguf", ["--format", "gguf"]),
    "gptq": ("w4a16", "/", ["--format", "gptq"]),
    "gptq-v2": ("w4a16", "/", ["--format", "gptq-v2"]),
    "awq": ("w4a16", "/", ["--format", "awq"]),
    "modelopt-hf": ("w4a16", "/", ["--format", "modelopt-hf"]),
    "trtllm-ckpt": ("w4a16", "/", ["--format", "trtllm-ckpt"]),
}


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer.json with `vocab` ids (the 256 byte symbols, then made-up
    multi-byte tokens) and no merges: enough for GGUF export's vocabulary, never for text."""
    # GPT-2's byte-to-unicode table (the ByteLevel alphabet).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    symbols = [chr(c) for c in cs]
    tokens = symbols + [f"tok{i}" for i in range(vocab - len(symbols) - 2)]
    tokens += ["<s>", "</s>"]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "vocab": {t: i for i, t in enumerate(tokens)}, "merges": []}
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": vocab - 2, "content": "<s>", "special": True},
                            {"id": vocab - 1, "content": "</s>", "special": True}],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                             "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                       "use_regex": True},
           "model": model}
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
         "tokenizer_class": "PreTrainedTokenizerFast"}))
    config = json.loads((folder / "config.json").read_text())
    config.update(bos_token_id=vocab - 2, eos_token_id=vocab - 1)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def run_child(cmd: list[str]) -> tuple[float, int, float, str]:
    """Seconds, peak RSS in bytes, CPU seconds (user + sys, its children included) and stderr
    of one process, its stdout dropped. The RSS is /usr/bin/time's (%M): a child forked from this Python process, which has held the generated tensors, would
    report the parent's resident set as its own peak (Linux keeps the high-water mark across
    exec), so getrusage of a direct child is used only without /usr/bin/time."""
    timed = Path("/usr/bin/time").exists()
    full = ["/usr/bin/time", "-f", "QFORGE_BENCH_MAXRSS_KB %M", *cmd] if timed else cmd
    t0 = time.perf_counter()
    proc = subprocess.Popen(full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"failed ({code}): {shlex.join(cmd)}\n{err[-3000:]}")
    rss = usage.ru_maxrss * 1024
    if timed:
        rss = int(re.search(r"QFORGE_BENCH_MAXRSS_KB (\d+)", err)[1]) * 1024
    return seconds, rss, usage.ru_utime + usage.ru_stime, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", choices=sorted(FORMATS), required=True)
    ap.add_argument("--quant", default=None, help="default: w4a16 (compressed-tensors), "
                                                  "q4_0 (gguf)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama-1.1b")
    ap.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers")
    ap.add_argument("--qforge", default="build/qforge",
                    help="the binary; several, comma-separated, run in turn after each cat")
    ap.add_argument("--workdir", default=None, help="where to write (default: a temp folder)")
    ap.add_argument("--extra", default="", help="more qforge flags, one shell-quoted string")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--shard-gb", type=float, default=2.0)
    args = ap.parse_args()
    quant, suffix, fmt_flags = FORMATS[args.format]
    quant = args.quant or quant
    s = dict(SHAPES[args.shape])
    if args.layers is not None:
        s["layers"] = args.layers
    root = Path(tempfile.mkdtemp(prefix="qforge_bench_export_", dir=args.workdir))
    try:
        src = root / "model"
        src.mkdir()
        t0 = time.perf_counter()
        files = write_folder(src, s, int(args.shard_gb * 1e9))
        write_tokenizer(src, s["vocab"])
        gb = sum(f.stat().st_size for f in files) / 1e9
        print(f"{args.shape} ({s['layers']} layers): wrote {len(files)} shards, {gb:.2f} GB bf16 "
              f"in {time.perf_counter() - t0:.1f} s")
        out = root / ("out" + suffix.rstrip("/"))
        binaries = args.qforge.split(",")
        cmds = [[b, "convert", str(src), *fmt_flags, "--quant", quant, *shlex.split(args.extra),
                 "-o", str(out) + ("/" if suffix == "/" else ""), "--overwrite"]
                for b in binaries]
        for cmd in cmds:
            print("command:", shlex.join(cmd).replace(str(root), "$DIR"))
        rows = {b: [] for b in binaries}
        copy = root / "copy"
        for i in range(args.repeat):
            os.sync()
            cat_s, _, cat_cpu, _ = run_child(["cat", *map(str, files)])
            copy.mkdir()
            cp_s, _, _, _ = run_child(["cp", *map(str, files), str(copy)])
            shutil.rmtree(copy)
            print(f"run {i + 1}: cat {cat_s:.2f} s ({gb / cat_s:.2f} GB/s, CPU {cat_cpu:.2f} s), "
                  f"cp {cp_s:.2f} s")
            for b, cmd in zip(binaries, cmds):
                os.sync()  # each timed command starts with no dirty pages left by the last
                seconds, rss, cpu, _ = run_child(cmd)
                out_gb = (sum(f.stat().st_size for f in out.glob("*.safetensors")) if out.is_dir()
                          else out.stat().st_size) / 1e9
                rows[b].append((seconds / cp_s, cp_s, seconds, rss, cpu / cat_cpu, cat_s))
                print(f"  {b}: {seconds:.2f} s (CPU {cpu:.2f} s), ratio to cp "
                      f"{seconds / cp_s:.2f}, to cat {seconds / cat_s:.2f} "
                      f"(CPU {cpu / cat_cpu:.2f}), peak RSS {rss / 2**30:.3f} GiB, "
                      f"output {out_gb:.2f} GB", flush=True)
        load = os.getloadavg()
        for b, r in rows.items():
            best = min(r)
            print(f"best {b}: ratio to cp {best[0]:.2f} (cp {best[1]:.2f} s, cat {best[5]:.2f} s, "
                  f"qforge {best[2]:.2f} s); CPU-time ratio to cat {min(x[4] for x in r):.2f}; "
                  f"peak RSS {max(x[3] for x in r) / 2**30:.3f} GiB; load average {load[0]:.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
