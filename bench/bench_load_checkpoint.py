#!/usr/bin/env python3
"""Time loading a ~1 GB checkpoint: qforge side by side with safetensors and torch.

Makes a transformer-like checkpoint (bf16 matrices, f32 norms) as model.safetensors (with
safetensors.torch.save_file) and as model.bin (torch.save), then loads each in a fresh process,
one process per run, with a warm page cache:

  qforge bench        build/bench/bench_load_checkpoint: import_safetensors + read one byte per
                      4 KiB page of every tensor (what using the weights costs at least)
  qforge inspect      `qforge inspect FILE --json`: import and list the tensors, no page touched
  safetensors         safe_open(framework="pt") + get_tensor for every tensor + the same touch
  torch.load mmap     torch.load(mmap=True, weights_only=True) + the same touch

For each: the load+touch time measured inside the process (best of --repeat; Python's own start-up
and imports excluded), the whole process's wall time, and its peak RSS (os.wait4). RSS counts
the file pages a memory map has touched, so mapped loaders show about the file size.

Usage (from the repository root, with the venv that has torch and safetensors):
  .venv/bin/python bench/bench_load_checkpoint.py [--size-mb 1024] [--repeat 3] [--dir DIR]
Environment: QFORGE_BIN (default build/qforge), QFORGE_BENCH_BIN (default
build/bench/bench_load_checkpoint). A qforge piece that is missing, or that does not read a
format yet, is skipped with a note.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

# One byte per 4 KiB page of every tensor, as bench_load_checkpoint.cpp touches.
PY_TOUCH = """
def touch(t):
    flat = t.reshape(-1)
    return int(flat.view(torch.uint8)[::4096].sum()) if flat.numel() else 0
"""

PY_SAFETENSORS = """
import json, resource, sys, time
import torch
from safetensors import safe_open
""" + PY_TOUCH + """
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
total = 0
with safe_open(sys.argv[1], framework="pt") as f:
    for name in f.keys():
        total += touch(f.get_tensor(name))
print(json.dumps({"seconds": time.perf_counter() - t0, "baseline_kb": base}))
"""

PY_TORCH_MMAP = """
import json, resource, sys, time
import torch
""" + PY_TOUCH + """
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
state = torch.load(sys.argv[1], mmap=True, weights_only=True, map_location="cpu")
total = sum(touch(t) for t in state.values())
print(json.dumps({"seconds": time.perf_counter() - t0, "baseline_kb": base}))
"""


def make_checkpoint(folder, size_mb):
    import torch
    from safetensors.torch import save_file

    hidden, inter = 2048, 8192
    per_layer = (3 * hidden * hidden + 2 * hidden * inter) * 2 + hidden * 4
    layers = max(1, round(size_mb * 2**20 / per_layer))
    gen = torch.Generator().manual_seed(0)
    state = {}
    for i in range(layers):
        p = f"model.layers.{i}."
        state[p + "attn.qkv.weight"] = torch.randn(3 * hidden, hidden, generator=gen).bfloat16()
        state[p + "mlp.up.weight"] = torch.randn(inter, hidden, generator=gen).bfloat16()
        state[p + "mlp.down.weight"] = torch.randn(hidden, inter, generator=gen).bfloat16()
        state[p + "norm.weight"] = torch.ones(hidden)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    torch.save(state, folder / "model.bin")
    print(json.dumps({"tensors": len(state), "layers": layers}))


def make_checkpoint_in_child(python, folder, size_mb):
    """Runs make_checkpoint in another process. On Linux a child's peak RSS starts from its
    parent's (kept across fork and exec), so the parent must never hold the weights."""
    run = subprocess.run([python, __file__, "--make-checkpoint", str(folder), str(size_mb)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"making the checkpoint failed: {run.stderr.strip()}")
    made = json.loads(run.stdout.strip().splitlines()[-1])
    paths = {"safetensors": folder / "model.safetensors", "torch": folder / "model.bin"}
    return paths, made["tensors"], made["layers"]


def warm(path):
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def run_measured(cmd, env=None):
    """Runs cmd in a fresh process; returns (rc, stdout, stderr, wall seconds, peak RSS KiB)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read().decode(errors="replace"),
                err.read().decode(errors="replace"), wall, usage.ru_maxrss)


class Loader:
    def __init__(self, name, fmt, what, command, inner_seconds=None, env=None, baseline_kb=None):
        self.name, self.fmt, self.what = name, fmt, what
        self.command, self.inner_seconds, self.env = command, inner_seconds, env
        self.baseline_kb = baseline_kb  # peak RSS before loading (the interpreter and imports)


def python_loader(name, fmt, what, python, code, path):
    def result(out):
        return json.loads(out.strip().splitlines()[-1])
    return Loader(name, fmt, what, [python, "-c", code, str(path)],
                  inner_seconds=lambda out: result(out)["seconds"],
                  baseline_kb=lambda out: result(out)["baseline_kb"])


def qforge_loaders(paths, qforge_bin, bench_bin):
    loaders, notes = [], []
    if bench_bin.is_file():
        env = {**os.environ, "QFORGE_BENCH_CHECKPOINT": str(paths["safetensors"]),
               "QFORGE_BENCH_ITERATIONS": "1"}
        loaders.append(Loader(
            "qforge bench", "safetensors", "import + touch pages",
            [str(bench_bin), "--benchmark_filter=import_safetensors\\+touch",
             "--benchmark_format=json"],
            inner_seconds=lambda out: json.loads(out)["benchmarks"][0]["real_time"] / 1e3,
            env=env))
    else:
        notes.append(f"qforge bench skipped: {bench_bin} not built (ninja -C build "
                     "bench_load_checkpoint, or set QFORGE_BENCH_BIN)")
    if not qforge_bin.is_file():
        notes.append(f"qforge inspect skipped: {qforge_bin} not built (or set QFORGE_BIN)")
        return loaders, notes
    for fmt in ("safetensors", "torch"):
        cmd = [str(qforge_bin), "inspect", str(paths[fmt]), "--json"]
        rc, out, err, _, _ = run_measured(cmd)
        if rc != 0:
            reason = (err.strip().splitlines() or ["?"])[0]
            notes.append(f"qforge inspect {fmt} skipped: exit {rc}: {reason}")
            continue
        if not out.lstrip().startswith("{"):
            notes.append(f"qforge inspect {fmt} skipped: no JSON on stdout (this qforge has no "
                         f"inspect command yet?): {out.strip()[:60]}")
            continue
        loaders.append(Loader("qforge inspect", fmt, "import + list, no touch", cmd))
    return loaders, notes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=pathlib.Path, help="where to write the checkpoint (kept)")
    ap.add_argument("--python", default=sys.executable,
                    help="Python with torch and safetensors for the peers")
    ap.add_argument("--make-checkpoint", nargs=2, metavar=("DIR", "SIZE_MB"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make_checkpoint:
        make_checkpoint(pathlib.Path(args.make_checkpoint[0]), int(args.make_checkpoint[1]))
        return

    folder = args.dir or pathlib.Path(tempfile.mkdtemp(prefix="qforge_bench_load_"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        paths, count, layers = make_checkpoint_in_child(args.python, folder, args.size_mb)
        size = paths["safetensors"].stat().st_size
        print(f"checkpoint: {count} tensors ({layers} layers), {size / 2**20:.0f} MiB, "
              f"written in {time.perf_counter() - t0:.1f} s to {folder}")
        for p in paths.values():
            warm(p)

        loaders, notes = qforge_loaders(
            paths, pathlib.Path(os.environ.get("QFORGE_BIN", ROOT / "build" / "qforge")),
            pathlib.Path(os.environ.get("QFORGE_BENCH_BIN",
                                        ROOT / "build" / "bench" / "bench_load_checkpoint")))
        loaders += [
            python_loader("safetensors", "safetensors", "safe_open + get_tensor + touch",
                          args.python, PY_SAFETENSORS, paths["safetensors"]),
            python_loader("torch.load mmap", "torch", "torch.load(mmap) + touch", args.python,
                          PY_TORCH_MMAP, paths["torch"]),
        ]

        rows = []
        for loader in loaders:
            inner, wall, rss, base, failed = [], [], [], [], None
            for _ in range(args.repeat):
                rc, out, err, w, r = run_measured(loader.command, loader.env)
                if rc != 0:
                    failed = f"exit {rc}: {(err.strip().splitlines() or ['?'])[-1]}"
                    break
                wall.append(w)
                rss.append(r)
                if loader.inner_seconds:
                    inner.append(loader.inner_seconds(out))
                if loader.baseline_kb:
                    base.append(loader.baseline_kb(out))
            if failed:
                notes.append(f"{loader.name} ({loader.fmt}) failed: {failed}")
                continue
            rows.append((loader.name, loader.fmt, loader.what,
                         f"{min(inner):.3f}" if inner else "-", f"{min(wall):.3f}",
                         f"{max(rss) / 1024:.0f}", f"{max(base) / 1024:.0f}" if base else "-"))

        header = ("loader", "file", "what", "load+touch s", "process s", "peak RSS MiB",
                  "of which before load")
        widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
        print()
        for r in [header] + rows:
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
        print(f"\nbest of {args.repeat} fresh processes each, warm page cache; "
              "process s includes interpreter start-up and imports")
        for n in notes:
            print(f"note: {n}")
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
