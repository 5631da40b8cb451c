#!/usr/bin/env python3
"""Builds qforge's embedded sample: a small CNN trained on scikit-learn's digits.

Writes, next to this script:
  sample_cnn.onnx  ONNX opset 17, input `input` [batch,1,8,8] float32, output `logits` [batch,10],
                   with Conv -> BatchNormalization -> Relu kept (static INT8 folds BatchNorm later)
  calib.npz        `input` float32 [200,1,8,8], `labels` int64 [200]
  eval.npz         `input` float32 [397,1,8,8], `labels` int64 [397]

The 1797 images are split once with a fixed seed into 1200 training, 200 calibration and 397
evaluation images; the three sets are disjoint.

Deterministic: fixed seeds, deterministic algorithms, one thread; re-running gives
byte-identical files. Run with the repo's venv:  .venv/bin/python calib_data/make_sample.py
"""
import io
import os
import sys
import warnings
import zipfile
from pathlib import Path

# Before torch is imported, so no thread pool is ever created with more threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from torch import nn  # noqa: E402

HERE = Path(__file__).resolve().parent
SEED = 20240611
N_TRAIN = 1200
N_CALIB = 200
EPOCHS = 30
BATCH = 64
LR = 2e-3
OPSET = 17


class SampleCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 64),
            nn.ReLU(),
            nn.Linear(64, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def load_splits():
    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)  # pixel values 0..16
    y = digits.target.astype(np.int64)
    perm = np.random.default_rng(SEED).permutation(len(x))
    train_idx = perm[:N_TRAIN]
    calib_idx = perm[N_TRAIN : N_TRAIN + N_CALIB]
    eval_idx = perm[N_TRAIN + N_CALIB :]
    return (x[train_idx], y[train_idx]), (x[calib_idx], y[calib_idx]), (x[eval_idx], y[eval_idx])


def train(model: nn.Module, x: np.ndarray, y: np.ndarray) -> None:
    gen = torch.Generator().manual_seed(SEED)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(EPOCHS):
        order = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), BATCH):
            idx = order[i : i + BATCH]
            opt.zero_grad()
            loss_fn(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(axis=1) == labels).mean())


def export_onnx(model: nn.Module, path: Path) -> None:
    buf = io.BytesIO()
    # The TorchScript exporter is asked for on purpose (dynamo=False): it keeps BatchNorm.
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
    torch.onnx.export(
        model,
        (torch.zeros(1, 1, 8, 8),),
        buf,
        dynamo=False,
        opset_version=OPSET,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        do_constant_folding=False,
        training=torch.onnx.TrainingMode.EVAL,
    )
    proto = onnx.load_from_string(buf.getvalue())
    ops = [n.op_type for n in proto.graph.node]
    # The sample exists to exercise BatchNorm folding: refuse an export that fused it away.
    if ops.count("BatchNormalization") != 2:
        sys.exit(f"export lost BatchNormalization nodes (got ops {ops}); fix the export")
    proto.producer_name = "qforge calib_data/make_sample.py"
    proto.producer_version = ""
    proto.doc_string = ""
    onnx.checker.check_model(proto, full_check=True)
    path.write_bytes(proto.SerializeToString(deterministic=True))


def save_npz(path: Path, **arrays: np.ndarray) -> None:
    # np.savez stamps zip entries with the current time; write the archive by hand with a
    # fixed timestamp so the file is byte-identical on every run.
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, arr in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())


def main() -> None:
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    (x_train, y_train), (x_calib, y_calib), (x_eval, y_eval) = load_splits()
    model = SampleCNN()
    train(model, x_train, y_train)

    with torch.no_grad():
        torch_eval = model(torch.from_numpy(x_eval)).numpy()
        torch_train = model(torch.from_numpy(x_train)).numpy()
        torch_calib = model(torch.from_numpy(x_calib)).numpy()

    onnx_path = HERE / "sample_cnn.onnx"
    export_onnx(model, onnx_path)
    save_npz(HERE / "calib.npz", input=x_calib, labels=y_calib)
    save_npz(HERE / "eval.npz", input=x_eval, labels=y_eval)

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    ort_eval = sess.run(["logits"], {"input": x_eval})[0]
    max_diff = float(np.abs(ort_eval - torch_eval).max())

    print(f"splits: train {len(x_train)}, calibration {len(x_calib)}, eval {len(x_eval)} (disjoint)")
    print(f"float top-1 train (torch):   {top1(torch_train, y_train) * 100:.2f}%")
    print(f"float top-1 calib (torch):   {top1(torch_calib, y_calib) * 100:.2f}%")
    print(f"float top-1 eval  (torch):   {top1(torch_eval, y_eval) * 100:.2f}%")
    print(f"float top-1 eval  (ORT):     {top1(ort_eval, y_eval) * 100:.2f}%")
    print(f"max |ORT - torch| on eval logits: {max_diff:.2e}")
    ops = {}
    for n in onnx.load(str(onnx_path)).graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    print("ops: " + ", ".join(f"{k} x{v}" for k, v in sorted(ops.items())))
    for name in ("sample_cnn.onnx", "calib.npz", "eval.npz"):
        print(f"{name}: {(HERE / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()
