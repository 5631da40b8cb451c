"""A quantized model folder (compressed-tensors, GPTQ, AWQ: what qforge reads back) written as
GGUF without a second rounding: `qforge convert QDIR --format gguf -o model.gguf`.

- Without --quant, each quantized Linear keeps its integers and scales: int4 becomes Q4_0 (the
  group scale repeated over each 32-block it covers, levels q + 8), int8 becomes Q8_0; the `gguf`
  package reads the file and dequantizes every such tensor to exactly q * scale of the folder
  (after convert_hf_to_gguf's Q/K row regrouping), the float tensors as a float folder's export
  writes them.
- --quant q4_1 and q8_0 hold int4 exactly too (Q4_1 with the minimum -8 * scale).
- A type that cannot hold the stored weight (int8 into Q4_0, scales that are not fp16 values)
  stops with exit 4 naming the tensor and leaves no file; --requantize dequantizes and quantizes
  again, saying so.
- Same bytes at 1 and 2 threads.
Folders: tiny random Llamas (tests/interop/test_gguf_export.py's make_folder) quantized by qforge
into compressed-tensors (fp16 int4 groups of 32 and 64, fp16 int8 per channel, float32 int8) and
GPTQ (fp16 int4 groups of 64)."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf", reason="the gguf package (tests/requirements.txt) reads GGUF")

from test_compressed_tensors_export import read_weights, unpack  # noqa: E402
from test_gguf_export import HEADS, KV_HEADS, LAYER_MAP, make_folder, permute  # noqa: E402

EXIT_UNSUPPORTED = 4
GT = gguf.GGMLQuantizationType

# name -> (float folder dtype, convert flags)
CASES = {
    "w4g32-f16": (torch.float16, ["--quant", "w4a16", "--block-size", "32"]),
    "w4g64-f16": (torch.float16, ["--quant", "w4a16", "--block-size", "64"]),
    "w8ch-f16": (torch.float16, ["--quant", "int8-weights"]),
    "w8ch-f32": (None, ["--quant", "int8-weights"]),
    "gptq-w4g64-f16": (torch.float16, ["--quant", "w4a16", "--block-size", "64",
                                       "--format", "gptq"]),
}


@pytest.fixture(scope="module")
def qdirs(run_qforge, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_from_quantized")
    floats = {}
    out = {}
    for name, (dtype, flags) in CASES.items():
        if dtype not in floats:
            sub = root / f"float_{str(dtype).split('.')[-1]}"
            sub.mkdir()
            floats[dtype] = make_folder(sub, tied=False, dtype=dtype)
        rc, _, stderr = run_qforge("convert", floats[dtype], "-o", str(root / name) + "/", *flags)
        assert rc == 0, stderr
        out[name] = root / name
    return out


def stored_linears(folder) -> dict[str, np.ndarray]:
    """Each quantized Linear's q * scale in float32 (exact), by its Hugging Face weight name,
    read from the folder's own tensors (compressed-tensors or GPTQ)."""
    t = read_weights(folder)
    out = {}
    for key in t:
        if key.endswith(".weight_packed"):  # compressed-tensors
            m = key[: -len(".weight_packed")]
            n, k = (int(v) for v in t[m + ".weight_shape"].numpy())
            scale = t[m + ".weight_scale"].float().numpy()
            bits = 32 * t[key].shape[1] // k
            q = unpack(t[key].numpy(), bits, k)
            out[m + ".weight"] = (q * np.repeat(scale, k // scale.shape[1], axis=1)).astype(
                np.float32)
        elif key.endswith(".qweight"):  # GPTQ: [K/8, N] packed along K, q + 8
            m = key[: -len(".qweight")]
            packed = t[key].numpy()
            k, n = packed.shape[0] * 8, packed.shape[1]
            q = unpack(np.ascontiguousarray(packed.T), 4, k)  # [N, K]
            scale = t[m + ".scales"].float().numpy().T  # [N, K/g]
            out[m + ".weight"] = (q * np.repeat(scale, k // scale.shape[1], axis=1)).astype(
                np.float32)
    assert out, f"no quantized Linear in {folder}"
    return out


def gguf_tensors(path) -> dict[str, tuple[int, np.ndarray]]:
    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        out[t.name] = (t.tensor_type, w)
    return out


def gguf_name(hf: str) -> str:
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{LAYER_MAP[rest]}"


def expected_in_gguf(hf: str, w: np.ndarray) -> np.ndarray:
    if hf.endswith("q_proj.weight"):
        return permute(w, HEADS)
    if hf.endswith("k_proj.weight"):
        return permute(w, KV_HEADS)
    return w


def convert_gguf(run_qforge, qdir, path, *flags):
    return run_qforge("convert", qdir, "--format", "gguf", "-o", path, *flags)


@pytest.mark.parametrize("name", ["w4g32-f16", "w4g64-f16", "w8ch-f16", "gptq-w4g64-f16"])
def test_stored_integers_and_scales_become_gguf_blocks_exactly(name, qdirs, run_qforge, tmp_path):
    path = tmp_path / "m.gguf"
    rc, stdout, stderr = convert_gguf(run_qforge, qdirs[name], path, "--json")
    assert rc == 0, stderr
    report = json.loads(stdout)
    gguf_pass = next(p for p in report["passes"] if p["pass"] == "gguf-export")["stats"]
    stored = stored_linears(qdirs[name])
    assert gguf_pass["quantized_linears_as_stored"] == len(stored)
    assert gguf_pass["quantized_linears_requantized"] == 0
    tensors = gguf_tensors(path)
    want_type = GT.Q8_0 if name.startswith("w8") else GT.Q4_0
    for hf, w in stored.items():
        ttype, got = tensors[gguf_name(hf)]
        assert ttype == want_type, (hf, ttype)
        np.testing.assert_array_equal(got, expected_in_gguf(hf, w), err_msg=hf)
    # the file's type follows the folder's bits; the float tensors as that type's export writes
    # them: the embeddings and the output projection from their float weights
    assert tensors["output_norm.weight"][0] == GT.F32
    assert tensors["output.weight"][0] == GT.Q8_0


@pytest.mark.parametrize("quant,gtype", [("q4_1", GT.Q4_1), ("q8_0", GT.Q8_0)])
def test_int4_fits_q4_1_and_q8_0_exactly(quant, gtype, qdirs, run_qforge, tmp_path):
    path = tmp_path / "m.gguf"
    rc, _, stderr = convert_gguf(run_qforge, qdirs["w4g32-f16"], path, "--quant", quant)
    assert rc == 0, stderr
    tensors = gguf_tensors(path)
    for hf, w in stored_linears(qdirs["w4g32-f16"]).items():
        ttype, got = tensors[gguf_name(hf)]
        assert ttype == gtype
        np.testing.assert_array_equal(got, expected_in_gguf(hf, w), err_msg=hf)


def test_int8_into_q4_0_is_refused_naming_the_tensor(qdirs, run_qforge, tmp_path):
    path = tmp_path / "m.gguf"
    rc, _, stderr = convert_gguf(run_qforge, qdirs["w8ch-f16"], path, "--quant", "q4_0")
    assert rc == EXIT_UNSUPPORTED, stderr
    assert "model.layers.0.self_attn.q_proj.weight" in stderr and "--requantize" in stderr
    assert not path.exists() and not list(tmp_path.iterdir())


def test_scales_that_are_not_fp16_values_are_refused(qdirs, run_qforge, tmp_path):
    # a float32 model's int8 scales (amax / 127) are not fp16 values: Q8_0 would round them
    path = tmp_path / "m.gguf"
    rc, _, stderr = convert_gguf(run_qforge, qdirs["w8ch-f32"], path)
    assert rc == EXIT_UNSUPPORTED, stderr
    assert "is not an fp16 value (f32 scales)" in stderr
    assert not path.exists()


def test_requantize_dequantizes_and_quantizes_again(qdirs, run_qforge, tmp_path):
    path = tmp_path / "m.gguf"
    rc, stdout, stderr = convert_gguf(run_qforge, qdirs["w8ch-f16"], path, "--quant", "q4_0",
                                      "--requantize", "--json", "-v")
    assert rc == 0, stderr
    assert "--requantize:" in stderr
    gguf_pass = next(p for p in json.loads(stdout)["passes"]
                     if p["pass"] == "gguf-export")["stats"]
    stored = stored_linears(qdirs["w8ch-f16"])
    assert gguf_pass["quantized_linears_requantized"] == len(stored)
    tensors = gguf_tensors(path)
    for hf, w in stored.items():
        ttype, got = tensors[gguf_name(hf)]
        assert ttype == GT.Q4_0
        # ggml's Q4_0 quantizer on the dequantized weight (rounded to the folder's fp16), as
        # gguf.quants computes it
        ref = gguf.quants.quantize(expected_in_gguf(hf, w.astype(np.float16).astype(np.float32)),
                                   GT.Q4_0)
        np.testing.assert_array_equal(
            got, gguf.quants.dequantize(ref, GT.Q4_0).reshape(got.shape), err_msg=hf)


def test_requantize_needs_a_quantized_folder(run_qforge, tmp_path):
    folder = make_folder(tmp_path, tied=True)
    rc, _, stderr = convert_gguf(run_qforge, folder, tmp_path / "m.gguf", "--requantize")
    assert rc == 2, stderr
    assert "--requantize is for an already quantized model folder" in stderr


def test_same_bytes_at_any_thread_count(qdirs, run_qforge, tmp_path):
    outs = []
    for threads in ("1", "2"):
        path = tmp_path / f"m{threads}.gguf"
        rc, _, stderr = convert_gguf(run_qforge, qdirs["w4g64-f16"], path, "--threads", threads)
        assert rc == 0, stderr
        outs.append(path.read_bytes())
    assert outs[0] == outs[1]
