#!/usr/bin/env python3
"""LoRA merge, side by side: PEFT merge_and_unload() vs `qforge convert --lora`.

    bench_lora_merge.py [--workdir DIR] [--threads N] [--repeat K] [--layers L] [--json OUT]

Builds a Llama-style model of about 134M parameters (about 540 MB in f32; --layers scales it)
with an r=16 LoRA on every Linear (q, k, v, o, gate, up, down; non-zero lora_B), saves
base.safetensors and the adapter folder, then runs each tool K times in a fresh subprocess with
the same thread count, recording wall time and peak RSS (ru_maxrss of the child):

  PEFT:   load base.safetensors + PeftModel.from_pretrained, merge_and_unload(), save_file()
          (torch.set_num_threads(N)); the child also reports its load / merge / save split
  qforge: $QFORGE_BIN convert base.safetensors --lora ADAPTER -o merged.safetensors --threads N
          (OMP_NUM_THREADS and OPENBLAS_NUM_THREADS = N as well)

qforge is skipped, with a note, when QFORGE_BIN is unset or its convert has no --lora flag.
When both ran, the script also prints the max abs difference between their outputs.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def llama_config(layers):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=layers, num_attention_heads=12,
                       num_key_value_heads=12, vocab_size=32000, tie_word_embeddings=False)


def build(workdir, layers):
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = llama_config(layers)
    config.save_pretrained(workdir)
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(workdir, "base.safetensors"))
    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=LINEARS, init_lora_weights=False))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.02)
    peft_model.save_pretrained(os.path.join(workdir, "adapter"))
    return params


def child_peft(workdir, out, threads):
    """Runs in the measured subprocess."""
    t0 = time.perf_counter()
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    config = LlamaConfig.from_pretrained(workdir)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(load_file(os.path.join(workdir, "base.safetensors")), assign=True)
    model = PeftModel.from_pretrained(model, os.path.join(workdir, "adapter"))
    t1 = time.perf_counter()
    merged = model.merge_and_unload()
    t2 = time.perf_counter()
    save_file({k: v.contiguous() for k, v in merged.state_dict().items()}, out)
    t3 = time.perf_counter()
    print(json.dumps({"load_s": t1 - t0, "merge_s": t2 - t1, "save_s": t3 - t2}))


def measure(cmd, env):
    """Wall seconds, peak RSS (MiB) and stdout of one fresh subprocess."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # see note in run_tool
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}):\n{err[-2000:]}")
    return wall, usage.ru_maxrss, out


def run_tool(name, cmd, env, repeat):
    # RUSAGE_CHILDREN's ru_maxrss is the largest of all children so far, so each run goes through
    # a fresh intermediate Python that measures exactly one child.
    rows = []
    for _ in range(repeat):
        probe = [sys.executable, __file__, "--measure-one", json.dumps(cmd)]
        res = subprocess.run(probe, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{res.stderr[-2000:]}")
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    best = min(rows, key=lambda r: r["wall_s"])
    best["runs"] = [r["wall_s"] for r in rows]
    return best


def qforge_supports_lora(qforge_bin):
    try:
        res = subprocess.run([qforge_bin, "convert", "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run {qforge_bin}: {e}"
    if "--lora" not in res.stdout + res.stderr:
        return f"{qforge_bin} convert has no --lora flag yet"
    return None


def max_abs_diff(a_path, b_path):
    from safetensors.torch import load_file

    a, b = load_file(a_path), load_file(b_path)
    if a.keys() != b.keys():
        return f"different tensor names ({len(a)} vs {len(b)})"
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", help="keep the model and outputs here (default: a temporary folder)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--child-peft", nargs=3, metavar=("WORKDIR", "OUT", "THREADS"), help=argparse.SUPPRESS)
    ap.add_argument("--measure-one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_peft:
        return child_peft(args.child_peft[0], args.child_peft[1], int(args.child_peft[2]))
    if args.measure_one:
        wall, rss_kib, out = measure(json.loads(args.measure_one), os.environ.copy())
        last = out.strip().splitlines()[-1] if out.strip() else "{}"
        detail = json.loads(last) if last.startswith("{") else {}
        print(json.dumps({"wall_s": wall, "peak_rss_mib": rss_kib / 1024.0, **detail}))
        return 0

    workdir = args.workdir or tempfile.mkdtemp(prefix="qforge_bench_lora_")
    os.makedirs(workdir, exist_ok=True)
    try:
        t = time.perf_counter()
        params = build(workdir, args.layers)
        print(f"model: {params / 1e6:.1f}M params ({params * 4 / 2**20:.0f} MiB f32), r=16 LoRA on {len(LINEARS)} "
              f"Linears x {args.layers} layers; built in {time.perf_counter() - t:.1f} s; threads {args.threads}")
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
                   MKL_NUM_THREADS=str(args.threads))
        results = {"params": params, "threads": args.threads}
        peft_out = os.path.join(workdir, "merged_peft.safetensors")
        results["peft"] = run_tool("PEFT", [sys.executable, __file__, "--child-peft", workdir, peft_out,
                                            str(args.threads)], env, args.repeat)
        qforge_bin = os.environ.get("QFORGE_BIN")
        note = "QFORGE_BIN is not set" if not qforge_bin else qforge_supports_lora(qforge_bin)
        if note is None:
            qforge_out = os.path.join(workdir, "merged_qforge.safetensors")
            cmd = [qforge_bin, "convert", os.path.join(workdir, "base.safetensors"), "--lora",
                   os.path.join(workdir, "adapter"), "-o", qforge_out, "--threads", str(args.threads)]
            results["qforge"] = run_tool("qforge", cmd, env, args.repeat)
            results["max_abs_diff"] = max_abs_diff(peft_out, qforge_out)
        else:
            results["qforge_skipped"] = note
        p = results["peft"]
        print(f"PEFT    wall {p['wall_s']:7.2f} s  peak RSS {p['peak_rss_mib']:7.0f} MiB  (load {p['load_s']:.2f} s, "
              f"merge_and_unload {p['merge_s']:.2f} s, save {p['save_s']:.2f} s)")
        if "qforge" in results:
            q = results["qforge"]
            print(f"qforge  wall {q['wall_s']:7.2f} s  peak RSS {q['peak_rss_mib']:7.0f} MiB")
            print(f"max abs difference between the merged files: {results['max_abs_diff']}")
        else:
            print(f"qforge  skipped: {note}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
