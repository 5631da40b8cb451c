"""End-to-end runs of `qforge run` and `qforge verify` (DESIGN.md, "The engine bundle").

`qforge run MODEL --inputs x.npz -o out.npz` is held to ONNX Runtime on the same inputs, for a
plain ONNX model and for a bundle; `qforge verify` and `run` refuse a bundle whose files no
longer match their manifest digests (exit 3, naming the file). The bundle tests start from
`qforge convert ... -o NAME.qfb`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

EXIT_USAGE, EXIT_INVALID = 2, 3


def max_rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """Largest absolute difference relative to the largest reference magnitude."""
    assert got.shape == want.shape, f"shape {got.shape}, want {want.shape}"
    scale = max(float(np.max(np.abs(want))), 1e-12)
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def model_feeds(eval_set) -> dict[str, np.ndarray]:
    return {"input": eval_set["input"]}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# --- run on a plain ONNX model -----------------------------------------------------------------


def test_run_onnx_model_matches_onnxruntime(run_qforge, sample_model, sample_dir, eval_set,
                                            ort_run, tmp_path):
    out = tmp_path / "out.npz"
    rc, stdout, stderr = run_qforge("run", sample_model, "--inputs", sample_dir / "eval.npz",
                                    "-o", out)
    assert rc == 0, stderr
    got = load_npz(out)
    assert list(got) == ["logits"], f"outputs are keyed by graph output name: {list(got)}"
    (want,) = ort_run(sample_model, model_feeds(eval_set))
    assert got["logits"].dtype == np.float32
    assert got["logits"].shape == (eval_set["input"].shape[0], 10)
    err = max_rel_err(got["logits"], want)
    assert err <= 1e-4, f"qforge run differs from ONNX Runtime by {err:.3g} (relative)"
    assert "out.npz" in stdout
    assert leftovers(tmp_path) == []


def test_run_json_describes_the_outputs(run_qforge, sample_model, sample_dir, eval_set, tmp_path):
    out = tmp_path / "out.npz"
    rc, stdout, stderr = run_qforge("run", sample_model, "--inputs", sample_dir / "eval.npz",
                                    "-o", out, "--json", "--threads", "1", "--device", "cpu")
    assert rc == 0, stderr
    result = json.loads(stdout)
    assert result["ok"] is True and result["bundle"] is False
    assert result["samples"] == eval_set["input"].shape[0]
    assert result["outputs"] == [
        {"name": "logits", "dtype": "f32", "shape": [eval_set["input"].shape[0], 10]}]


def test_run_refuses_inputs_that_do_not_fit(run_qforge, sample_model, eval_set, tmp_path):
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, image=eval_set["input"])
    out = tmp_path / "out.npz"
    rc, _, stderr = run_qforge("run", sample_model, "--inputs", wrong, "-o", out)
    assert rc == EXIT_INVALID, stderr
    assert "'input'" in stderr, f"the error should name the model input: {stderr!r}"
    assert len([l for l in stderr.splitlines() if l.strip()]) == 1, stderr
    assert not out.exists()

    np.savez(wrong, input=eval_set["input"][:, :, :4, :])  # a fixed dimension differs
    rc, _, stderr = run_qforge("run", sample_model, "--inputs", wrong, "-o", out)
    assert rc == EXIT_INVALID, stderr
    assert "'input'" in stderr, stderr
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_run_output_must_be_npz(run_qforge, sample_model, sample_dir, tmp_path):
    rc, _, stderr = run_qforge("run", sample_model, "--inputs", sample_dir / "eval.npz",
                               "-o", tmp_path / "out.npy")
    assert rc == EXIT_USAGE, stderr
    assert ".npz" in stderr


def test_verify_refuses_a_file_that_is_not_a_bundle(run_qforge, sample_model):
    rc, _, stderr = run_qforge("verify", sample_model)
    assert rc == EXIT_INVALID, stderr
    assert "not a folder" in stderr


def test_verify_refuses_a_folder_without_manifest(run_qforge, tmp_path):
    folder = tmp_path / "empty.qfb"
    folder.mkdir()
    rc, _, stderr = run_qforge("verify", folder)
    assert rc == EXIT_INVALID, stderr
    assert "manifest.json" in stderr
    rc, stdout, stderr = run_qforge("verify", folder, "--json")
    assert rc == EXIT_INVALID, stderr
    result = json.loads(stdout)  # one JSON object on stdout, also on failure
    assert result["ok"] is False and result["exit_code"] == EXIT_INVALID
    assert "manifest.json" in result["error"]


# --- bundles -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle(run_qforge, sample_model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bundle") / "sample.qfb"
    rc, _, stderr = run_qforge("convert", sample_model, "-o", path, "--quant", "int8-weights")
    assert rc == 0, stderr
    assert path.is_dir()
    return path


@pytest.fixture
def bundle_copy(bundle, tmp_path) -> Path:
    copy = tmp_path / "copy.qfb"
    shutil.copytree(bundle, copy)
    return copy


def test_bundle_layout_and_manifest(bundle, check_full):
    names = sorted(p.name for p in bundle.iterdir())
    for name in ("manifest.json", "model.onnx", "weights.safetensors", "report.json"):
        assert name in names, f"{name} missing from {names}"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["format"] == "qforge-bundle" and manifest["version"] == 1
    listed = {f["name"] for f in manifest["files"]}
    assert listed == set(names) - {"manifest.json"}
    check_full(bundle / "model.onnx")


def test_verify_accepts_a_fresh_bundle(run_qforge, bundle):
    rc, stdout, stderr = run_qforge("verify", bundle)
    assert rc == 0, stderr
    rc, stdout, stderr = run_qforge("verify", bundle, "--json")
    assert rc == 0, stderr
    result = json.loads(stdout)
    assert result["ok"] is True
    assert {f["status"] for f in result["files"]} == {"ok"}


def test_run_bundle_matches_onnxruntime_on_its_model(run_qforge, bundle, sample_dir, eval_set,
                                                     ort_run, tmp_path):
    out = tmp_path / "out.npz"
    rc, _, stderr = run_qforge("run", bundle, "--inputs", sample_dir / "eval.npz", "-o", out)
    assert rc == 0, stderr
    (want,) = ort_run(bundle / "model.onnx", model_feeds(eval_set))
    err = max_rel_err(load_npz(out)["logits"], want)
    assert err <= 1e-3, f"qforge run of the bundle differs from ONNX Runtime by {err:.3g}"


def test_tampered_bundle_is_refused_naming_the_file(run_qforge, bundle_copy, sample_dir,
                                                    tmp_path):
    weights = bundle_copy / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))

    rc, _, stderr = run_qforge("verify", bundle_copy)
    assert rc == EXIT_INVALID, stderr
    assert "weights.safetensors" in stderr and "modified" in stderr, stderr

    out = tmp_path / "out.npz"
    rc, _, stderr = run_qforge("run", bundle_copy, "--inputs", sample_dir / "eval.npz", "-o", out)
    assert rc == EXIT_INVALID, stderr
    assert "weights.safetensors" in stderr, stderr
    assert not out.exists()


def test_missing_file_is_refused(run_qforge, bundle_copy):
    (bundle_copy / "model.onnx").unlink()
    rc, stdout, stderr = run_qforge("verify", bundle_copy, "--json")
    assert rc == EXIT_INVALID, stderr
    result = json.loads(stdout)
    assert result["ok"] is False
    assert {f["name"]: f["status"] for f in result["files"]}["model.onnx"] == "missing"
