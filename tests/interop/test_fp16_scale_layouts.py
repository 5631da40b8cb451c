"""GPTQ and AWQ store fp16 scales whatever the model dtype (exporters/quant_checkpoint/
linear_values.h): qforge never rounds a scale on the way into them.
- Quantizing a float32 or bf16 model straight into gptq, its int8 scales are put on fp16's grid
  before the codes are chosen: the stored fp16 scale is the one the integers were rounded with,
  so the loader's q * s is the quantizer's own weight (|w - q * s| <= s / 2 everywhere).
- Re-emitting a folder whose scales fp16 does not hold (a float32 model's int8 amax / 127; a
  bf16 scale off fp16's grid) stops with exit 4 naming the module and the scale, writing
  nothing; `--quant ... --requantize` quantizes again with fp16 scales instead."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import safetensors.torch

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_compressed_tensors_export import make_model, read_weights  # noqa: E402
from test_quant_layouts import unpack_gptq  # noqa: E402

EXIT_UNSUPPORTED = 4
MODULE = "model.layers.0.self_attn.q_proj"


@pytest.fixture(scope="module")
def floats(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp16_scales")
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).split(".")[-1]
        model = make_model(dtype, 64, 128, seed=5)
        with torch.no_grad():  # one row far below fp16's normal range: scale < 2^-14
            model.model.layers[0].self_attn.q_proj.weight[3].mul_(1e-4)
        model.save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int8_straight_into_gptq_chooses_fp16_scales(dtype, floats, run_qforge, tmp_path):
    out = tmp_path / "gptq"
    rc, _, stderr = run_qforge("convert", floats[dtype], "--quant", "int8-weights", "--format",
                               "gptq", "-o", str(out) + "/")
    assert rc == 0, stderr
    got = read_weights(out)
    float_w = read_weights(floats[dtype])
    for key in got:
        if not key.endswith(".qweight"):
            continue
        m = key[: -len(".qweight")]
        q, s, _ = unpack_gptq(got, m, 8, False)
        s = s.float().numpy()  # [N, 1] fp16 values
        w = float_w[m + ".weight"].float().numpy()
        amax = np.abs(w).max(axis=1, keepdims=True)
        # the scale: amax / 127 on fp16's grid, then in the model dtype (bf16 keeps it there)
        want = torch.from_numpy(amax / np.float32(127)).half().to(float_w[m + ".weight"].dtype)
        np.testing.assert_array_equal(s, want.float().numpy(), err_msg=m)
        err = np.abs(w - q * s)
        assert (err <= s / 2 * (1 + 1e-6)).all(), m


@pytest.fixture(scope="module")
def ct_int8_f32(floats, run_qforge, tmp_path_factory):
    out = tmp_path_factory.mktemp("ct") / "w8"
    rc, _, stderr = run_qforge("convert", floats["float32"], "--quant", "int8-weights",
                               "-o", str(out) + "/")
    assert rc == 0, stderr
    return out


@pytest.mark.parametrize("fmt", ["gptq", "gptq-v2"])
def test_float32_scales_are_refused_not_rounded(fmt, ct_int8_f32, run_qforge, tmp_path):
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("convert", ct_int8_f32, "--format", fmt, "-o", str(out) + "/")
    assert rc == EXIT_UNSUPPORTED, stderr
    assert "stores fp16 scales" in stderr and "f32 scale" in stderr
    assert "'model.layers." in stderr and "--requantize" in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_requantize_writes_fp16_scales(ct_int8_f32, run_qforge, tmp_path):
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("-v", "convert", ct_int8_f32, "--format", "gptq", "--quant",
                               "int8-weights", "--requantize", "-o", str(out) + "/")
    assert rc == 0, stderr
    assert "--requantize: dequantized" in stderr
    q, s, _ = unpack_gptq(read_weights(out), MODULE, 8, False)
    assert s.dtype == torch.float16 and q.min() >= -127 and q.max() <= 127


def test_bf16_scale_off_fp16_grid_is_refused(floats, run_qforge, tmp_path):
    ct = tmp_path / "ct"
    rc, _, stderr = run_qforge("convert", floats["bfloat16"], "--quant", "w4a16", "--block-size",
                               "32", "-o", str(ct) + "/")
    assert rc == 0, stderr
    # a checkpoint quantized elsewhere may hold any bf16 scale: 1e-6 is off fp16's grid
    edited = tmp_path / "edited"
    shutil.copytree(ct, edited)
    shard = edited / "model.safetensors"
    tensors = safetensors.torch.load_file(str(shard))
    tensors[MODULE + ".weight_scale"][0, 0] = 1e-6
    meta = json.loads(shard.read_bytes()[8:8 + int.from_bytes(shard.read_bytes()[:8], "little")])
    safetensors.torch.save_file(tensors, str(shard), metadata=meta.get("__metadata__"))
    for fmt in ("gptq", "awq"):
        out = tmp_path / fmt
        rc, _, stderr = run_qforge("convert", edited, "--format", fmt, "-o", str(out) + "/")
        assert rc == EXIT_UNSUPPORTED, (fmt, stderr)
        assert f"'{MODULE}'" in stderr and "bf16 scale" in stderr, stderr
        assert not out.exists()
    # the same folder into a layout that keeps its scales
    rc, _, stderr = run_qforge("convert", edited, "--format", "compressed-tensors",
                               "-o", str(tmp_path / "kept") + "/")
    assert rc == 0, stderr
