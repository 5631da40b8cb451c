"""--device and --threads. The thread count never changes the output. Without a GPU, auto writes
the CPU's bytes and --device cuda fails clearly (exit 4, no output). With one, --device cpu and
--device cuda must write identical bytes for every quantization whose kernels run on the device
(int8-weights, int8 with calibration, w4a16 with RTN, AWQ and GPTQ), and the report must say the
device ran them. Auto takes the CPU, saying why, when cuBLAS cannot be loaded.

A GPU is present when `nvidia-smi -L` lists one, or when QFORGE_REQUIRE_CUDA=1 (scripts/test.sh
sets it on such a machine): then a binary that cannot use the GPU fails here instead of
comparing the CPU with itself."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

EXIT_UNSUPPORTED = 4
CALIB = "<calib>"  # replaced by the sample calibration set

# Flags after `convert MODEL -o OUT`, by case. Block 32 fits the sample CNN's classifier.
CASES = {
    "int8-weights": ("--quant", "int8-weights"),
    "int8-entropy": ("--quant", "int8", "--calib", CALIB, "--method", "entropy"),
    "int8-minmax": ("--quant", "int8", "--calib", CALIB, "--method", "minmax"),
    "w4a16-rtn": ("--quant", "w4a16", "--block-size", "32"),
    "w4a16-rtn-mse": ("--quant", "w4a16", "--block-size", "32", "--w4-scale", "mse"),
    "w4a16-awq": ("--quant", "w4a16", "--block-size", "32", "--w4-method", "awq",
                  "--calib", CALIB),
    "w4a16-gptq": ("--quant", "w4a16", "--block-size", "32", "--w4-method", "gptq",
                   "--calib", CALIB),
}


def gpu_present() -> bool:
    if os.environ.get("QFORGE_REQUIRE_CUDA") == "1":
        return True
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return listed.returncode == 0 and any(line.startswith("GPU ")
                                          for line in listed.stdout.splitlines())


def convert(run_qforge, sample_model, out, *flags):
    return run_qforge("convert", sample_model, "-o", out, "--quant", "int8-weights", *flags)


def pass_devices(stdout: str) -> dict[str, str]:
    """The device each pass of a `--json convert` reports, by pass name."""
    return {p["pass"]: p["stats"]["device"] for p in json.loads(stdout)["passes"]
            if "device" in p.get("stats", {})}


def test_thread_counts_give_identical_bytes(run_qforge, sample_model, tmp_path):
    outputs = {}
    for threads in ("1", "2"):
        out = tmp_path / f"cpu{threads}.onnx"
        rc, _, stderr = convert(run_qforge, sample_model, out, "--device", "cpu",
                                "--threads", threads)
        assert rc == 0, stderr
        outputs[threads] = out.read_bytes()
    assert outputs["1"] == outputs["2"], "--threads 1 and 2 wrote different models"


@pytest.mark.parametrize("case", sorted(CASES))
def test_devices_write_identical_bytes(case, run_qforge, sample_model, sample_dir, tmp_path):
    """cpu against cuda on a GPU machine; cpu against auto (which must pick the CPU) without."""
    flags = [str(sample_dir / "calib.npz") if f == CALIB else f for f in CASES[case]]
    other = "cuda" if gpu_present() else "auto"
    outputs, devices = {}, {}
    for device in ("cpu", other):
        out = tmp_path / f"{device}.onnx"
        rc, stdout, stderr = run_qforge("--json", "convert", sample_model, "-o", out, *flags,
                                        "--device", device)
        assert rc == 0, f"{case} --device {device}: {stderr}"
        outputs[device] = out.read_bytes()
        devices[device] = pass_devices(stdout)
    assert devices["cpu"] and set(devices["cpu"].values()) == {"cpu"}, devices
    expected = "cuda" if other == "cuda" else "cpu"
    assert set(devices[other].values()) == {expected}, \
        f"{case} --device {other}: passes report {devices[other]}, not {expected}"
    assert outputs["cpu"] == outputs[other], \
        f"{case}: --device {other} wrote other bytes than --device cpu"


def test_auto_logs_the_backend_it_chose(run_qforge, sample_model, tmp_path):
    rc, _, stderr = convert(run_qforge, sample_model, tmp_path / "a.onnx", "--device", "auto", "-v")
    assert rc == 0, stderr
    assert "CUDA" in stderr or "CPU" in stderr or "cpu" in stderr, stderr


def test_auto_takes_the_cpu_when_cublas_cannot_load(run_qforge, sample_model, tmp_path,
                                                    monkeypatch):
    monkeypatch.setenv("QFORGE_CUBLAS_LIB", "/nonexistent/libcublas.so.13")
    out = tmp_path / "a.onnx"
    rc, stdout, stderr = run_qforge("--json", "-v", "convert", sample_model, "-o", out,
                                    "--quant", "int8-weights", "--device", "auto")
    assert rc == 0, stderr
    assert set(pass_devices(stdout).values()) == {"cpu"}, stdout
    chose = [line for line in stderr.splitlines() if "device auto:" in line]
    assert len(chose) == 1 and "using CPU" in chose[0], stderr
    if gpu_present():  # the device answers: the reason is the library
        assert "cuBLAS" in chose[0] and "/nonexistent/libcublas.so.13" in chose[0], chose[0]


def test_device_cuda_without_gpu_fails_clearly(run_qforge, sample_model, tmp_path):
    out = tmp_path / "c.onnx"
    rc, _, stderr = convert(run_qforge, sample_model, out, "--device", "cuda")
    if gpu_present():
        assert rc == 0, stderr  # test_devices_write_identical_bytes compares the bytes
        return
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc == EXIT_UNSUPPORTED, (rc, stderr)
    assert len(lines) == 1 and "--device cuda" in lines[0], stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
