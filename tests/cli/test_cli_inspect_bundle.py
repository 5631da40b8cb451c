"""`qforge inspect NAME.qfb`: the manifest with every file's size, SHA-256 and verification
state, the scheme and passes, inputs and outputs, the quantized weights and report.json's
per-layer errors (worst first); a tampered bundle is shown with the file named and exit 3."""
from __future__ import annotations

import hashlib
import json

import pytest

EXIT_INVALID = 3


@pytest.fixture
def bundle(run_qforge, sample_model, tmp_path):
    out = tmp_path / "cnn.qfb"
    rc, _, stderr = run_qforge("convert", sample_model, "-o", out, "--quant", "int8-weights")
    assert rc == 0, stderr
    return out


def test_inspect_bundle_json(run_qforge, bundle):
    rc, stdout, stderr = run_qforge("inspect", bundle, "--json")
    assert rc == 0, stderr
    j = json.loads(stdout)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert j["format"] == "qforge-bundle" and j["version"] == manifest["version"]
    assert j["verified"] is True
    names = {f["name"] for f in j["files"]}
    assert {"model.onnx", "weights.safetensors", "report.json"} <= names
    for f in j["files"]:
        data = (bundle / f["name"]).read_bytes()
        assert f["state"] == "ok" and f["size"] == len(data)
        assert f["sha256"] == hashlib.sha256(data).hexdigest()
    assert j["scheme"] == "int8-weights"
    assert [v["name"] for v in j["inputs"]] == [v["name"] for v in manifest["inputs"]]
    assert [v["name"] for v in j["outputs"]] == [v["name"] for v in manifest["outputs"]]
    weights = [t for t in manifest["quantization"]["tensors"] if t["kind"] == "weight"]
    assert j["quantized"]["weights"] == len(weights) > 0
    assert j["quantized"]["bits"] == [8]
    # report.json's rows: bytes before/after and the SQNR of each, worst first.
    report = json.loads((bundle / "report.json").read_text())
    rows = [r for p in report["passes"] for r in p["stats"].get("tensors", [])
            if isinstance(r, dict) and isinstance(r.get("sqnr_db"), (int, float))]
    assert j["layer_error"]["layers"] == len(rows) > 0
    worst = j["layer_error"]["worst"]
    assert worst[0]["sqnr_db"] == min(r["sqnr_db"] for r in rows)
    assert [w["sqnr_db"] for w in worst] == sorted(w["sqnr_db"] for w in worst)
    assert j["quantized_bytes"]["after"] < j["quantized_bytes"]["before"]
    assert any(p["pass"] == "weight-int8" or "int8" in p["pass"] for p in j["passes"]), j["passes"]


def test_inspect_bundle_text(run_qforge, bundle):
    rc, stdout, stderr = run_qforge("inspect", bundle)
    assert rc == 0, stderr
    assert "verification: ok" in stdout
    assert "scheme int8-weights" in stdout
    assert "file weights.safetensors" in stdout and "file model.onnx" in stdout
    assert "layer SQNR:" in stdout and "worst:" in stdout
    assert "quantized: " in stdout and "bits 8" in stdout


def test_inspect_tampered_bundle_names_the_file(run_qforge, bundle):
    weights = bundle / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    rc, stdout, stderr = run_qforge("inspect", bundle, "--json")
    assert rc == EXIT_INVALID
    j = json.loads(stdout)
    assert j["verified"] is False
    states = {f["name"]: f["state"] for f in j["files"]}
    assert states["weights.safetensors"] == "modified"
    assert states["model.onnx"] == "ok"
    assert "weights.safetensors" in stderr
    rc, stdout, _ = run_qforge("inspect", bundle)
    assert rc == EXIT_INVALID
    assert "verification: FAILED" in stdout
