"""`qforge convert DIR --quant w4a16|int8-weights [--w4-method gptq --calib ids.npz] --format
gptq|gptq-v2|awq|modelopt-hf -o OUT/` writes the same quantization as `--format
compressed-tensors`, in each engine's layout:
- each layout's tensors are unpacked by numpy code written from its loader's source (GPTQModel's
  qlinear unpack and v1 zero + 1, AutoAWQ's unpack with AWQ_REVERSE_ORDER, TensorRT-LLM's
  W4A16_AWQ weight of two output rows per byte), and give exactly the compressed-tensors
  output's integers, and its scales as the layout stores them (fp16 for GPTQ and AWQ, float32
  for ModelOpt), so the dequantized weights are bit-identical to what the `compressed-tensors`
  package decompresses (fp16 models; for bf16 ones GPTQ and AWQ dequantize in fp16, equal in
  float32 to q * scale);
- for modelopt-hf, nvidia-modelopt's own `pack_int4_in_uint8` packs the dequantized weights with
  the written scales into the same bytes (skipped when nvidia-modelopt is not installed);
- the configuration keys each loader reads; float tensors unchanged;
- the refusals: awq with 8 bits, awq with a Linear whose outputs are not a multiple of 8.

The real loaders. transformers 5 loads gptq and awq folders through GPTQModel (`gptqmodel`,
plus `optimum` for gptq). GPTQModel is not pinned in tests/requirements.txt: its releases pin
numpy==2.2.6 (this venv pins 2.4.6) and the newest need torch>=2.14.1; 7.3.6 installs on this CPU
machine in a separate venv that sees this one (about 5 minutes) and imports torchvision only for a
vision model's definition (a stand-in module is put in its place when torchvision is absent). When
`gptqmodel` imports, test_gptqmodel_loads_... loads each folder with transformers, checks that
each quantized module's own dequantized weight equals fp16(q * scale) bit for bit, and compares
the logits with transformers loading the compressed-tensors output: within 1e-3 relative with
GPTQModel's fp16 torch kernels (backend torch / torch_awq: identical logits here), within 1e-2
with the kernel it picks on a CPU by default, aten::_weight_int4pack_mm_for_cpu, which computes
in bf16 (4.2e-3 here). Both figures are reported.
modelopt-hf's loader, TensorRT-LLM, needs a GPU and is not on PyPI for this machine."""
from __future__ import annotations

import enum
import importlib.machinery
import json
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

from safetensors.torch import load_file  # noqa: E402
from test_compressed_tensors_export import make_model, read_weights  # noqa: E402
from test_compressed_tensors_export import unpack as unpack_ct  # noqa: E402

EXIT_UNSUPPORTED = 4
IDS = torch.tensor([[1, 5, 9, 200, 3, 77, 14, 250]])
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FORMATS = ("gptq", "gptq-v2", "awq", "modelopt-hf")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def modules(tensors) -> list[str]:
    return sorted(k[: -len(".weight_packed")] for k in tensors if k.endswith(".weight_packed"))


# --- unpackers written from the loaders' sources -----------------------------------------------


def unpack_fields(words: np.ndarray, bits: int) -> np.ndarray:
    """int32 [..., W] -> [..., W, 32 / bits] unsigned fields, field j at bits j * bits."""
    w = words.view(np.uint32)
    return np.stack([(w >> np.uint32(bits * j)) & np.uint32((1 << bits) - 1)
                     for j in range(32 // bits)], axis=-1).astype(np.int32)


def unpack_gptq(t: dict, m: str, bits: int, v2: bool):
    """GPTQModel: qweight [K*b/32, N] sequential along K, qzeros [G, N*b/32] along N (v1 stores
    zero - 1), scales [G, N], weight[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n].
    Returns signed q [N, K], the scale [N, G] (fp16) and the dequantized weight [N, K] in fp16
    (the product of an integer and an fp16 scale rounded once, as GPTQModel's fp16 dequant)."""
    qw = t[m + ".qweight"].numpy()
    n = qw.shape[1]
    q = unpack_fields(qw.T, bits).reshape(n, -1)  # [N, K]
    z = unpack_fields(t[m + ".qzeros"].numpy(), bits).reshape(t[m + ".qzeros"].shape[0], -1)
    z = z[:, :n] + (0 if v2 else 1)
    g_idx = t[m + ".g_idx"].numpy()
    scales = t[m + ".scales"]
    assert scales.dtype == torch.float16
    s = scales.float().numpy()
    signed = q - z[g_idx].T
    w = (signed * s[g_idx].T).astype(np.float32)
    return signed, scales.T, torch.from_numpy(w).half()


def unpack_awq(t: dict, m: str):
    """AutoAWQ GEMM: qweight [K, N/8], fields in order [0,2,4,6,1,3,5,7], undone with
    AWQ_REVERSE_ORDER; qzeros the same; weight = (q - z) * s per group along K."""
    qw = t[m + ".qweight"].numpy()
    k = qw.shape[0]
    fields = unpack_fields(qw, 4).reshape(k, -1)
    n = fields.shape[1]
    reverse = np.arange(n).reshape(-1, 8)[:, AWQ_REVERSE_ORDER].reshape(-1)
    q = fields[:, reverse]  # [K, N]
    qz = t[m + ".qzeros"].numpy()
    z = unpack_fields(qz, 4).reshape(qz.shape[0], -1)[:, reverse]
    scales = t[m + ".scales"]
    assert scales.dtype == torch.float16
    s = scales.float().numpy()
    group = k // s.shape[0]
    signed = (q - np.repeat(z, group, axis=0)).T
    w = (signed * np.repeat(s, group, axis=0).T).astype(np.float32)
    return signed, scales.T, torch.from_numpy(w).half()


def unpack_modelopt(t: dict, m: str):
    """ModelOpt unified HF export (TensorRT-LLM W4A16_AWQ / W8A16): int4 weight uint8 [N/2, K],
    row 2r in the low nibble, 2r+1 in the high one, signed; weight_scale float32 [N, K/g] (or int8
    [N, K] with a float32 [N] scale). Returns q [N, K], the scale and q * scale in float32."""
    wt = t[m + ".weight"]
    scale = t[m + ".weight_scale"]
    assert scale.dtype == torch.float32
    if wt.dtype == torch.int8:
        q = wt.numpy().astype(np.int32)
        return q, scale, torch.from_numpy(q * scale.numpy()[:, None])
    assert wt.dtype == torch.uint8
    b = wt.numpy().astype(np.int32)
    low, high = b & 15, b >> 4
    q = np.stack([low, high], axis=1).reshape(-1, b.shape[1])
    q = np.where(q >= 8, q - 16, q)
    s = scale.numpy()
    group = q.shape[1] // s.shape[1]
    return q, scale, torch.from_numpy((q * np.repeat(s, group, axis=1)).astype(np.float32))


def compressed_tensors_of(t: dict, m: str):
    """q [N, K] and the scale [N, G] of the compressed-tensors output."""
    k = int(t[m + ".weight_shape"][1])
    bits = 32 * t[m + ".weight_packed"].shape[1] // k
    return unpack_ct(t[m + ".weight_packed"].numpy(), bits, k), t[m + ".weight_scale"]


def decompressed_by_compressed_tensors(t: dict, m: str, cfg: dict) -> torch.Tensor:
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    scheme = QuantizationConfig.model_validate(cfg["quantization_config"]).config_groups["group_0"]
    local = {p: t[f"{m}.{p}"] for p in ("weight_packed", "weight_scale", "weight_shape")}
    return PackedQuantizationCompressor.decompress(local, scheme)["weight"]


def unpack(fmt: str, t: dict, m: str, bits: int):
    if fmt in ("gptq", "gptq-v2"):
        return unpack_gptq(t, m, bits, fmt == "gptq-v2")
    if fmt == "awq":
        return unpack_awq(t, m)
    return unpack_modelopt(t, m)


# --- fixtures ----------------------------------------------------------------------------------

# (dtype, quant, method): method gptq calibrates on random ids (--calib), rtn does not.
CASES = [
    (torch.float16, "w4a16", "rtn"),
    (torch.bfloat16, "w4a16", "rtn"),
    (torch.float16, "w4a16", "gptq"),
    (torch.bfloat16, "w4a16", "gptq"),
    (torch.float16, "int8-weights", "rtn"),
]
INT8_FORMATS = ("gptq", "gptq-v2", "modelopt-hf")


def case_id(case):
    return "-".join([str(case[0]).split(".")[-1], case[1], case[2]])


@pytest.fixture(scope="module")
def converted(run_qforge, tmp_path_factory):
    root = tmp_path_factory.mktemp("quant_layouts")
    rng = np.random.default_rng(0)
    np.savez(root / "ids.npz", input_ids=rng.integers(0, 256, (4, 16)))
    out = {}
    for dtype in (torch.float16, torch.bfloat16):
        name = str(dtype).split(".")[-1]
        model = make_model(dtype, 64, 128, seed=3)
        model.save_pretrained(root / name)
    for case in CASES:
        dtype, quant, method = case
        src = root / str(dtype).split(".")[-1]
        formats = ("compressed-tensors",) + (FORMATS if quant == "w4a16" else INT8_FORMATS)
        for fmt in formats:
            dst = root / f"{case_id(case)}_{fmt}"
            args = ["convert", src, "--quant", quant, "--format", fmt, "-o", str(dst) + "/"]
            if quant == "w4a16":
                args += ["--block-size", "32"]
            if method != "rtn":
                args += ["--w4-method", method, "--calib", root / "ids.npz"]
            rc, _, stderr = run_qforge(*args)
            assert rc == 0, (fmt, stderr)
            out[(case, fmt)] = (src, dst)
    return out


def cases_and_formats():
    for case in CASES:
        for fmt in (FORMATS if case[1] == "w4a16" else INT8_FORMATS):
            yield pytest.param(case, fmt, id=f"{case_id(case)}-{fmt}")


# --- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("case,fmt", list(cases_and_formats()))
def test_config_keys(case, fmt, converted):
    _, dst = converted[(case, fmt)]
    bits = 4 if case[1] == "w4a16" else 8
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    if fmt.startswith("gptq"):
        assert qc["quant_method"] == "gptq" and qc["bits"] == bits
        assert qc["group_size"] == (32 if bits == 4 else -1)
        assert qc["desc_act"] is False and qc["sym"] is True
        assert qc["checkpoint_format"] == ("gptq_v2" if fmt == "gptq-v2" else "gptq")
        assert "dynamic" not in qc  # only lm_head stays float, which GPTQ never quantizes
    elif fmt == "awq":
        assert qc == {"quant_method": "awq", "zero_point": True, "group_size": 32, "bits": 4,
                      "version": "gemm", "modules_to_not_convert": ["lm_head"]}
    else:
        hq = json.loads((dst / "hf_quant_config.json").read_text())
        want = ({"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": 32,
                 "has_zero_point": False, "pre_quant_scale": True,
                 "exclude_modules": ["lm_head"]} if bits == 4 else
                {"quant_algo": "W8A16", "kv_cache_quant_algo": None,
                 "exclude_modules": ["lm_head"]})
        assert hq["quantization"] == want
        assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == want["quant_algo"]
        assert qc["ignore"] == ["lm_head"]


@pytest.mark.parametrize("case,fmt", list(cases_and_formats()))
def test_same_integers_and_scales_as_compressed_tensors(case, fmt, converted):
    dtype, quant, _ = case
    bits = 4 if quant == "w4a16" else 8
    src, dst = converted[(case, fmt)]
    _, ct_dst = converted[(case, "compressed-tensors")]
    ct, got = read_weights(ct_dst), read_weights(dst)
    ct_cfg = json.loads((ct_dst / "config.json").read_text())
    ms = modules(ct)
    assert len(ms) == 2 * len(LINEARS)
    for m in ms:
        q_ct, s_ct = compressed_tensors_of(ct, m)
        q, s, w = unpack(fmt, got, m, bits)
        np.testing.assert_array_equal(q, q_ct, err_msg=m)
        s_ct = s_ct.reshape(s.shape)
        if fmt == "modelopt-hf":
            assert torch.equal(s, s_ct.float()), m  # float32: exact from any model dtype
        else:
            # fp16, rounded to nearest even; these scales are in fp16's normal range, where a
            # bf16 or fp16 scale converts exactly.
            assert torch.equal(s, s_ct.half()), m
            assert torch.equal(s.float(), s_ct.float()), m
        ref = decompressed_by_compressed_tensors(ct, m, ct_cfg)
        if dtype == torch.float16 or fmt == "modelopt-hf":
            # The loader's weight in the model dtype is bit-identical to compressed-tensors'.
            mine = w.to(ref.dtype)
            assert torch.equal(mine.view(torch.int16), ref.view(torch.int16)), m
        else:
            # bf16 model: GPTQ/AWQ dequantize in fp16; in float32 q * s is the same number.
            exact = torch.from_numpy((q_ct * np.repeat(s_ct.float().numpy(), q.shape[1] //
                                                        s_ct.shape[1], axis=1)).astype(np.float32))
            assert torch.equal(w, exact.half()), m
            assert torch.equal(ref, exact.to(torch.bfloat16)), m


@pytest.mark.parametrize("case,fmt", list(cases_and_formats()))
def test_float_tensors_unchanged(case, fmt, converted):
    src, dst = converted[(case, fmt)]
    got, original = read_weights(dst), read_weights(src)
    floats = [k for k in original if not any(f".{lin}." in k for lin in LINEARS)]
    for k in floats:
        assert torch.equal(got[k].view(torch.uint8), original[k].view(torch.uint8)), k
    for k in got:  # nothing but the layout's tensors and the float ones
        assert k in floats or any(f".{lin}." in k for lin in LINEARS), k
    if fmt == "modelopt-hf" and case[1] == "w4a16":
        pqs = got["model.layers.0.mlp.down_proj.pre_quant_scale"]
        assert pqs.dtype == case[0] and torch.equal(pqs, torch.ones(128, dtype=case[0]))


@pytest.mark.parametrize("case", [c for c in CASES if c[1] == "w4a16"], ids=case_id)
def test_modelopt_packs_the_same_bytes(case, converted):
    quant_utils = pytest.importorskip("modelopt.torch.export.quant_utils")
    _, dst = converted[(case, "modelopt-hf")]
    t = read_weights(dst)
    for m in sorted(k[: -len(".weight_scale")] for k in t if k.endswith(".weight_scale")):
        _, scale, w = unpack_modelopt(t, m)
        ref = quant_utils.pack_int4_in_uint8(w, scale, 32)
        assert ref.dtype == torch.uint8 and torch.equal(ref, t[m + ".weight"]), m


def test_awq_refuses_eight_bits(converted, run_qforge, tmp_path):
    src, _ = converted[(CASES[0], "compressed-tensors")]
    rc, _, stderr = run_qforge("convert", src, "--quant", "int8-weights", "--format", "awq",
                               "-o", str(tmp_path / "q") + "/")
    assert rc == EXIT_UNSUPPORTED, stderr
    assert "4-bit" in stderr and "model.layers.0" in stderr, stderr
    assert list(tmp_path.iterdir()) == []


def test_awq_refuses_outputs_not_a_multiple_of_8(run_qforge, tmp_path):
    torch.manual_seed(0)
    # head_dim 4 with one key/value head: k_proj and v_proj have 4 outputs; every K is 64 or 32.
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=8, num_key_value_heads=1, head_dim=4,
                                   vocab_size=256, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).to(torch.float16).save_pretrained(tmp_path / "src")
    rc, _, stderr = run_qforge("convert", tmp_path / "src", "--quant", "w4a16", "--block-size",
                               "32", "--format", "awq", "-o", str(tmp_path / "q") + "/")
    assert rc == EXIT_UNSUPPORTED, stderr
    assert "multiple of 8" in stderr and "model.layers.0.self_attn.k_proj" in stderr, stderr
    assert not (tmp_path / "q").exists()
    # gptq holds it (qzeros' last word is partly filled).
    rc, _, stderr = run_qforge("convert", tmp_path / "src", "--quant", "w4a16", "--block-size",
                               "32", "--format", "gptq", "-o", str(tmp_path / "g") + "/")
    assert rc == 0, stderr
    t = load_file(str(tmp_path / "g" / "model.safetensors"))
    assert tuple(t["model.layers.0.self_attn.k_proj.qzeros"].shape) == (2, 1)


# --- the real loader, where GPTQModel imports --------------------------------------------------


def import_gptqmodel():
    """gptqmodel, importing torchvision for a vision model's definition only: a stand-in module
    takes its place when torchvision is not installed (after transformers has looked)."""
    transformers.LlamaConfig  # noqa: B018  (transformers decides torchvision's absence first)
    try:
        import torchvision  # noqa: F401
    except ImportError:
        tv, tvt, tvf = (types.ModuleType(n) for n in (
            "torchvision", "torchvision.transforms", "torchvision.transforms.functional"))
        tvf.InterpolationMode = enum.Enum("InterpolationMode", "BICUBIC BILINEAR NEAREST")
        tvt.functional, tv.transforms = tvf, tvt
        for mod in (tv, tvt, tvf):
            mod.__spec__ = importlib.machinery.ModuleSpec(mod.__name__, None)
            sys.modules[mod.__name__] = mod
    return pytest.importorskip(
        "gptqmodel", reason="GPTQModel needs numpy 2.2: it lives in .venv-gptq, where "
        "test_gptqmodel_loader.py runs this test (scripts/setup_peers.sh makes the venv)")


@pytest.mark.parametrize("fmt", ["gptq", "gptq-v2", "awq"])
def test_gptqmodel_loads_dequantizes_exactly_and_logits_match(fmt, converted, report_figure):
    import_gptqmodel()
    if fmt.startswith("gptq"):
        pytest.importorskip("optimum")
    case = CASES[0]  # fp16, the dtype GPTQModel's kernels compute in
    _, dst = converted[(case, fmt)]
    _, ct_dst = converted[(case, "compressed-tensors")]
    ct = read_weights(ct_dst)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(ct_dst),
                                                                  device_map="cpu").eval()
    with torch.no_grad():
        want = reference(IDS).logits.float()
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    config_class = transformers.GPTQConfig if fmt.startswith("gptq") else transformers.AwqConfig
    # GPTQModel's fp16 torch kernel, then the kernel it picks by default on a CPU
    # (aten::_weight_int4pack_mm_for_cpu, which casts activations and scales to bf16).
    for backend, bound in (("torch" if fmt.startswith("gptq") else "torch_awq", 1e-3),
                           (None, 1e-2)):
        kwargs = {}
        if backend:
            kwargs["quantization_config"] = config_class.from_dict({**qc, "backend": backend})
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(dst), device_map="cpu",
                                                                   **kwargs).eval()
        for m in modules(ct):
            mod = loaded.get_submodule(m)
            if hasattr(mod, "dequantize_weight"):
                w = mod.dequantize_weight()
            elif hasattr(mod, "awq_weight_dequantize"):
                w = mod.awq_weight_dequantize(device="cpu", dtype=torch.float16)
            else:  # GPTQModel's copy of AutoAWQ's dequantizer, on the module's buffers
                from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm
                w = dequantize_gemm(mod.qweight, mod.qzeros, mod.scales, 4, 32)
            q, s = compressed_tensors_of(ct, m)
            exact = torch.from_numpy((q * np.repeat(s.float().numpy(), q.shape[1] // s.shape[1],
                                                    axis=1)).astype(np.float32)).half()
            assert torch.equal(w.T.half(), exact), m  # both dequantize to [in, out]
        with torch.no_grad():
            got = loaded(IDS).logits.float()
        err = float((got - want).abs().max() / want.abs().max())
        kernel = type(loaded.get_submodule(modules(ct)[0])).__name__
        report_figure(f"{fmt} through GPTQModel {sys.modules['gptqmodel'].__version__} "
                      f"({kernel}, CPU): logits vs compressed-tensors in transformers, max rel "
                      f"err {err:.2e}")
        assert err <= bound, f"{kernel}: logits differ by {err:.2e} relative"


# --- a GPTQ folder with Linears left float -----------------------------------------------------

FLOAT_RULE = r"layers\.1\.mlp\.down_proj$=float"
FLOAT_MODULE = "model.layers.1.mlp.down_proj"


@pytest.fixture(scope="module")
def gptq_with_float(converted, run_qforge, tmp_path_factory):
    """gptq and compressed-tensors folders of the fp16 model with layer 1's down_proj left float."""
    src, _ = converted[(CASES[0], "compressed-tensors")]
    root = tmp_path_factory.mktemp("gptq_float")
    out = {}
    for fmt in ("gptq", "compressed-tensors"):
        dst = root / fmt
        rc, _, stderr = run_qforge("convert", src, "--quant", "w4a16", "--block-size", "32",
                                   "--format", fmt, "--precision", FLOAT_RULE,
                                   "-o", str(dst) + "/")
        assert rc == 0, stderr
        out[fmt] = dst
    return src, out


def test_gptq_float_modules_config(gptq_with_float):
    """The float module is a GPTQModel `dynamic` exclusion (GPTQModel, vLLM), and every quantized
    one is listed in `modules_in_block_to_quantize` (transformers' loader, optimum, reads only
    that list)."""
    src, out = gptq_with_float
    qc = json.loads((out["gptq"] / "config.json").read_text())["quantization_config"]
    assert qc["dynamic"] == {"-:^model\\.layers\\.1\\.mlp\\.down_proj$": {}}
    t = read_weights(out["gptq"])
    quantized = sorted(k[: -len(".qweight")] for k in t if k.endswith(".qweight"))
    assert len(quantized) == 2 * len(LINEARS) - 1 and FLOAT_MODULE not in quantized
    (listed,) = qc["modules_in_block_to_quantize"]
    assert sorted(listed) == quantized
    original = read_weights(src)
    assert torch.equal(t[FLOAT_MODULE + ".weight"], original[FLOAT_MODULE + ".weight"])


def test_gptqmodel_loads_float_modules_as_float(gptq_with_float):
    """transformers with GPTQModel keeps the float module an nn.Linear holding the original
    weight, and its logits match the compressed-tensors folder of the same mixed model (before
    `modules_in_block_to_quantize` was written, optimum made the float module a quantized layer
    and the load failed on its missing tensors)."""
    import_gptqmodel()
    pytest.importorskip("optimum")
    src, out = gptq_with_float
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(out["compressed-tensors"]), device_map="cpu").eval()
    qc = json.loads((out["gptq"] / "config.json").read_text())["quantization_config"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(out["gptq"]), device_map="cpu",
        quantization_config=transformers.GPTQConfig.from_dict({**qc, "backend": "torch"})).eval()
    mod = loaded.get_submodule(FLOAT_MODULE)
    assert type(mod) is torch.nn.Linear, type(mod)
    assert torch.equal(mod.weight, read_weights(src)[FLOAT_MODULE + ".weight"])
    with torch.no_grad():
        want = reference(IDS).logits.float()
        got = loaded(IDS).logits.float()
    err = float((got - want).abs().max() / want.abs().max())
    assert err <= 1e-3, f"logits differ by {err:.2e} relative"


# --- other decoder families through the real loaders -------------------------------------------

ARCH_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                   max_position_embeddings=128)
ARCHS = {
    # q/k/v with biases, tied embeddings
    "qwen2": lambda: transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**ARCH_COMMON, tie_word_embeddings=True)),
    "mistral": lambda: transformers.MistralForCausalLM(
        transformers.MistralConfig(**ARCH_COMMON, sliding_window=None)),
    # fused qkv_proj and gate_up_proj
    "phi3": lambda: transformers.Phi3ForCausalLM(
        transformers.Phi3Config(**ARCH_COMMON, pad_token_id=0)),
    # q_norm / k_norm, head_dim != hidden / heads
    "qwen3": lambda: transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**ARCH_COMMON, head_dim=32, tie_word_embeddings=True)),
}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_gptqmodel_loads_other_decoder_families(arch, run_qforge, tmp_path, report_figure):
    """Qwen2, Mistral, Phi-3 and Qwen3 (fp16, 2 layers) in gptq and awq: transformers with
    GPTQModel's torch kernels gives the logits of transformers on the compressed-tensors folder
    of the same quantization (within 1e-3), and all are near the float model's."""
    import_gptqmodel()
    pytest.importorskip("optimum")
    torch.manual_seed(0)
    model = ARCHS[arch]().to(torch.float16).eval()
    model.save_pretrained(tmp_path / "src")
    with torch.no_grad():
        float_logits = model(IDS).logits.float()
    logits = {}
    for fmt in ("compressed-tensors", "gptq", "awq"):
        dst = tmp_path / fmt
        rc, _, stderr = run_qforge("convert", tmp_path / "src", "--quant", "w4a16",
                                   "--block-size", "32", "--format", fmt, "-o", str(dst) + "/")
        assert rc == 0, (fmt, stderr)
        kwargs = {}
        qc = json.loads((dst / "config.json").read_text())["quantization_config"]
        if fmt == "gptq":
            kwargs["quantization_config"] = transformers.GPTQConfig.from_dict(
                {**qc, "backend": "torch"})
        elif fmt == "awq":
            kwargs["quantization_config"] = transformers.AwqConfig.from_dict(
                {**qc, "backend": "torch_awq"})
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(dst), device_map="cpu",
                                                                   **kwargs).eval()
        with torch.no_grad():
            logits[fmt] = loaded(IDS).logits.float()
    want = logits["compressed-tensors"]
    to_float = float((want - float_logits).abs().max() / float_logits.abs().max())
    assert to_float < 0.25, f"compressed-tensors vs float: {to_float:.2e}"
    for fmt in ("gptq", "awq"):
        err = float((logits[fmt] - want).abs().max() / want.abs().max())
        report_figure(f"{arch} {fmt} through GPTQModel (torch kernel) vs compressed-tensors in "
                      f"transformers: max rel err {err:.2e} (W4 vs float {to_float:.2e})")
        assert err <= 1e-3, f"{fmt}: logits differ by {err:.2e} relative"
