"""End-to-end runs of `qforge calibrate`, `convert --quant int8` and `compare` on the embedded
sample: the calibration table and TensorRT cache, --import-calib round trips, accuracy gates
(exit 6), bad calibration data (exit 3), flag misuse (exit 2), determinism across runs and
thread counts, and the progress output with and without a terminal."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

EXIT_USAGE, EXIT_INVALID, EXIT_GATE = 2, 3, 6


PROGRESS_LINE = re.compile(r"^(calibrate|compare): \d+/\d+ samples \(\d+%\)")


def nonempty_lines(text: str) -> list[str]:
    """stderr's lines but the plain progress lines (stderr is not a terminal here)."""
    return [line for line in text.splitlines() if line.strip() and not PROGRESS_LINE.match(line)]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("int8")


@pytest.fixture(scope="module")
def calib(sample_dir) -> Path:
    return sample_dir / "calib.npz"


@pytest.fixture(scope="module")
def quantized(run_qforge, sample_model, calib, work) -> Path:
    """The sample quantized with minmax calibration, made once for the tests that read it."""
    out = work / "sample_int8.onnx"
    rc, _, stderr = run_qforge("convert", sample_model, "-o", out, "--quant", "int8", "--calib",
                               calib, "--method", "minmax")
    assert rc == 0, stderr
    return out


# --- calibrate -----------------------------------------------------------------------------------


def test_calibrate_writes_json_and_tensorrt_cache(run_qforge, sample_model, calib, work):
    table, cache = work / "table.json", work / "table.cache"
    rc, stdout, stderr = run_qforge("calibrate", sample_model, "--calib", calib, "--method",
                                    "entropy", "-o", table, "--trt-cache", cache)
    assert rc == 0, stderr
    doc = json.loads(table.read_text())
    assert doc["format"] == "qforge-calibration" and doc["method"] == "entropy"
    assert doc["samples"] == 200
    assert len(doc["dataset_digest"]) == 64
    tensors = doc["tensors"]
    # Ranges are for the graph after BatchNorm folding: the BatchNormalization outputs (now the
    # conv outputs) are there, the pre-BN conv outputs are not.
    model = onnx.load(sample_model)
    bn_outputs = [n.output[0] for n in model.graph.node if n.op_type == "BatchNormalization"]
    conv_outputs = [n.output[0] for n in model.graph.node if n.op_type == "Conv"]
    assert all(name in tensors for name in bn_outputs + ["input", "logits"]), sorted(tensors)
    assert not any(name in tensors for name in conv_outputs)
    assert all(t["amax"] > 0 for t in tensors.values())

    lines = cache.read_text().splitlines()
    assert lines[0].startswith("TRT-") and lines[0].endswith("-EntropyCalibration2"), lines[0]
    entries = dict(line.rsplit(": ", 1) for line in lines[1:])
    assert set(entries) == set(tensors)
    for name, hexbits in entries.items():
        scale = struct.unpack(">f", bytes.fromhex(hexbits.rjust(8, "0")))[0]
        assert scale == pytest.approx(np.float32(tensors[name]["amax"]) / np.float32(127),
                                      rel=1e-6), name


def test_import_calib_round_trip_is_byte_identical(run_qforge, sample_model, calib, work,
                                                   quantized, check_full):
    table, cache = work / "rt.json", work / "rt.cache"
    rc, _, stderr = run_qforge("calibrate", sample_model, "--calib", calib, "--method", "minmax",
                               "-o", table, "--trt-cache", cache)
    assert rc == 0, stderr
    assert cache.read_text().splitlines()[0].endswith("-MinMaxCalibration")
    from_json = work / "from_json.onnx"
    rc, _, stderr = run_qforge("convert", sample_model, "-o", from_json, "--quant", "int8",
                               "--import-calib", table)
    assert rc == 0, stderr
    assert from_json.read_bytes() == quantized.read_bytes(), \
        "--import-calib of calibrate's table must give the bytes of --calib"

    from_cache = work / "from_cache.onnx"
    rc, _, stderr = run_qforge("convert", sample_model, "-o", from_cache, "--quant", "int8",
                               "--import-calib", cache)
    assert rc == 0, stderr
    check_full(from_cache)
    scales = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(from_cache).graph.initializer
              if t.name.endswith("_scale")}
    want = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(quantized).graph.initializer
            if t.name.endswith("_scale")}
    assert scales.keys() == want.keys()
    for name in want:  # the cache stores scale bits; amax = scale * 127 comes back within an ulp
        np.testing.assert_allclose(scales[name], want[name], rtol=2.5e-7, err_msg=name)


def test_import_calib_rejects_a_malformed_table(run_qforge, sample_model, work):
    bad = work / "bad.cache"
    bad.write_text("TRT-8601-EntropyCalibration2\ninput 3c010204\n")
    rc, _, stderr = run_qforge("convert", sample_model, "-o", work / "x.onnx", "--quant", "int8",
                               "--import-calib", bad)
    assert rc == EXIT_INVALID, stderr
    assert len(nonempty_lines(stderr)) == 1 and "bad.cache" in stderr
    assert not (work / "x.onnx").exists()


# --- compare -------------------------------------------------------------------------------------


def test_compare_reports_outputs_and_layers(run_qforge, sample_model, sample_dir, quantized):
    rc, stdout, stderr = run_qforge("compare", sample_model, quantized, "--data",
                                    sample_dir / "eval.npz", "--json")
    assert rc == 0, stderr
    doc = json.loads(stdout)
    assert doc["ok"] is True and doc["samples"] == 397
    [out] = doc["outputs"]
    assert out["name"] == "logits"
    assert 20.0 < out["sqnr_db"] < 80.0
    assert 0.99 < out["cosine"] <= 1.0
    assert out["max_abs_error"] > 0.0
    assert out["top1_agreement"] >= 0.99
    assert out["top1_accuracy_float"] == pytest.approx(393 / 397)
    layers = doc["layers"]
    sqnrs = [layer["sqnr_db"] for layer in layers]
    assert len(layers) >= 4 and sqnrs == sorted(sqnrs), "worst first"

    rc, text, stderr = run_qforge("compare", sample_model, quantized, "--data",
                                  sample_dir / "eval.npz")
    assert rc == 0, stderr
    assert "logits" in text and "per-layer SQNR" in text


@pytest.mark.parametrize("flag,value,metric", [("--fail-below-sqnr", "200", "SQNR"),
                                               ("--fail-below-cosine", "1.5", "cosine")])
def test_compare_gates_exit_6(flag, value, metric, run_qforge, sample_model, sample_dir,
                              quantized):
    rc, stdout, stderr = run_qforge("compare", sample_model, quantized, "--data",
                                    sample_dir / "eval.npz", flag, value)
    assert rc == EXIT_GATE, stderr
    [line] = nonempty_lines(stderr)
    assert metric in line and flag in line and "'logits'" in line, line
    rc, _, stderr = run_qforge("compare", sample_model, quantized, "--data",
                               sample_dir / "eval.npz", "--fail-below-sqnr", "10",
                               "--fail-below-cosine", "0.9")
    assert rc == 0, stderr


# --- bad data and bad flags ----------------------------------------------------------------------


def test_bad_calibration_data_names_the_mismatch(run_qforge, sample_model, work):
    x = np.load(Path(sample_model).parent / "calib.npz")["input"]
    wrong_name = work / "wrong_name.npz"
    np.savez(wrong_name, image=x)
    wrong_shape = work / "wrong_shape.npz"
    np.savez(wrong_shape, input=np.zeros((4, 1, 9, 9), np.float32))
    for data, expect in [(wrong_name, "'input'"), (wrong_shape, "9")]:
        for cmd in (["calibrate", sample_model, "-o", work / "t.json"],
                    ["convert", sample_model, "-o", work / "t.onnx", "--quant", "int8"]):
            rc, _, stderr = run_qforge(*cmd, "--calib", data)
            assert rc == EXIT_INVALID, (cmd, stderr)
            lines = nonempty_lines(stderr)
            assert len(lines) == 1 and expect in lines[0] and data.name in lines[0], lines
            assert not (work / "t.json").exists() and not (work / "t.onnx").exists()


@pytest.mark.parametrize("args,needle", [
    (["--quant", "int8"], "--calib"),
    (["--quant", "int8", "--calib", "C", "--import-calib", "C"], "one of them"),
    (["--quant", "int8-weights", "--calib", "C"], "need --quant int8"),
    (["--quant", "int8", "--calib", "C", "--override", "input"], "NAME=amax:X"),
    (["--quant", "int8", "--calib", "C", "--override", "nope=amax:2"], "'nope'"),
    (["--quant", "int8", "--calib", "C", "--op-types", "Relu"], "'Relu'"),
    (["--quant", "int8", "--calib", "C", "--per-tensor"], "--override NAME=per-tensor"),
    (["--quant", "int8", "--calib", "C", "--exclude", "("], "regular expression"),
])
def test_int8_flag_misuse_is_a_usage_error(args, needle, run_qforge, sample_model, calib, work):
    args = [str(calib) if a == "C" else a for a in args]
    rc, _, stderr = run_qforge("convert", sample_model, "-o", work / "u.onnx", *args)
    assert rc == EXIT_USAGE, stderr
    lines = nonempty_lines(stderr)
    assert len(lines) == 1 and needle in lines[0], lines


# --- determinism and progress --------------------------------------------------------------------


@pytest.mark.parametrize("method", ["entropy", "mse"])
def test_same_command_gives_identical_bytes_at_any_thread_count(method, run_qforge, sample_model,
                                                                calib, work):
    outs = []
    for i, threads in enumerate(["2", "2", "1"]):
        out = work / f"det_{method}_{i}.onnx"
        rc, _, stderr = run_qforge("convert", sample_model, "-o", out, "--quant", "int8",
                                   "--calib", calib, "--method", method, "--threads", threads,
                                   "--int32-bias")
        assert rc == 0, stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1], "same command twice"
    assert outs[1] == outs[2], "--threads 2 vs --threads 1"


def test_progress_lines_without_a_terminal(run_qforge, sample_model, calib, work):
    rc, _, stderr = run_qforge("calibrate", sample_model, "--calib", calib, "-o",
                               work / "p.json", "--batch", "10")
    assert rc == 0, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("calibrate: ")]
    assert lines and "(100%)" in lines[-1] and "samples/s" in lines[-1], stderr
    assert len(lines) <= 11 and "\r" not in stderr


def test_progress_bar_on_a_terminal(qforge_bin, repo_root, sample_model, calib, work):
    pid, fd = pty.fork()
    if pid == 0:  # child: stderr is the terminal
        os.chdir(repo_root)
        os.execv(str(qforge_bin), [str(qforge_bin), "calibrate", str(sample_model), "--calib",
                                   str(calib), "-o", str(work / "tty.json"), "--batch", "1"])
    chunks, deadline = [], time.time() + 120
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode(errors="replace")
    assert os.WEXITSTATUS(status) == 0, text
    assert "\r" in text and "samples/s" in text and "ETA" in text and "[" in text, text


def test_convert_int8_json_reports_every_step(run_qforge, sample_model, calib, work):
    rc, stdout, stderr = run_qforge("--json", "convert", sample_model, "-o", work / "j.onnx",
                                    "--quant", "int8", "--calib", calib, "--method", "minmax")
    assert rc == 0, stderr
    doc = json.loads(stdout)
    passes = {p["pass"]: p for p in doc["passes"]}
    assert list(passes) == ["fold-batchnorm", "cleanup", "calibrate", "static-int8"]
    assert passes["fold-batchnorm"]["stats"]["folded"] == 2
    assert passes["calibrate"]["stats"]["method"] == "minmax"
    stats = passes["static-int8"]["stats"]
    assert stats["nodes_quantized"] == 5  # 2 Conv, MaxPool, 2 Gemm
    assert stats["weights"] == 4 and stats["activations"] == 5
