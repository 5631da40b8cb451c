"""--device and --threads: CPU and auto give the same bytes, thread count never changes the
output, and --device cuda fails clearly (exit 4, no output) where no GPU can run it."""
from __future__ import annotations

import shutil
import subprocess

EXIT_UNSUPPORTED = 4


def gpu_present() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    return subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def convert(run_qforge, sample_model, out, *flags):
    return run_qforge("convert", sample_model, "-o", out, "--quant", "int8-weights", *flags)


def test_cpu_auto_and_thread_counts_give_identical_bytes(run_qforge, sample_model, tmp_path):
    outputs = {}
    for name, flags in {
        "cpu1": ("--device", "cpu", "--threads", "1"),
        "cpu2": ("--device", "cpu", "--threads", "2"),
        "auto": ("--device", "auto"),
    }.items():
        out = tmp_path / f"{name}.onnx"
        rc, _, stderr = convert(run_qforge, sample_model, out, *flags)
        assert rc == 0, stderr
        outputs[name] = out.read_bytes()
    assert outputs["cpu1"] == outputs["cpu2"], "--threads 1 and 2 wrote different models"
    if not gpu_present():
        assert outputs["cpu1"] == outputs["auto"], "--device auto on CPU differs from --device cpu"


def test_auto_logs_the_backend_it_chose(run_qforge, sample_model, tmp_path):
    rc, _, stderr = convert(run_qforge, sample_model, tmp_path / "a.onnx", "--device", "auto", "-v")
    assert rc == 0, stderr
    assert "CUDA" in stderr or "CPU" in stderr or "cpu" in stderr, stderr


def test_device_cuda_without_gpu_fails_clearly(run_qforge, sample_model, tmp_path):
    out = tmp_path / "c.onnx"
    rc, _, stderr = convert(run_qforge, sample_model, out, "--device", "cuda")
    if gpu_present():
        assert rc == 0, stderr  # the CUDA path itself is checked by the unit tests on a GPU
        return
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc == EXIT_UNSUPPORTED, (rc, stderr)
    assert len(lines) == 1 and "--device cuda" in lines[0], stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
