"""qforge reads ModelOpt Hugging Face exports (modelopt-hf) and TensorRT-LLM checkpoints
(trtllm-ckpt) back (importers/quantized_checkpoint/modelopt_reader.h, trtllm_ckpt_reader.h);
every read layout against every written one is test_quantized_folder_read.py's
test_every_layout_reads_back_and_converts_to_every_other_bit_for_bit. Here:
- `inspect` shows each scheme (quant_method, quant_algo, bits, group size, Linears left float);
- W8A16 (int8 per channel) ModelOpt folders re-emit bit for bit as compressed-tensors and GPTQ;
- a tied bf16 model with a vocabulary TensorRT-LLM pads at tp 2: its trtllm-ckpt reads back to
  the same tensors as the direct compressed-tensors export (padding dropped, lm_head tied again),
  and transformers loading that folder (config.json synthesized from TensorRT-LLM's) gives the
  same logits as loading the direct export;
- pre_quant_scale: one value per group that multiplies exactly is folded into the group scales
  (the dequantized weight is the engine's (q * scale) * s); one that varies within a group is
  refused (exit 4) naming the tensor;
- config that disagrees with the tensors is refused (exit 3) naming the tensor, settings qforge
  does not read (exit 4) naming the setting, nothing left behind;
- folders written by nvidia-modelopt itself on the CPU (mtq.quantize + export_hf_checkpoint of a
  tiny Llama): INT4 blockwise and INT8 weight-only read back to ModelOpt's own integers and
  float32 scales; its AWQ export (o_proj / down_proj carry real pre-quant scales) is refused by
  name."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

from test_compressed_tensors_export import read_weights, unpack  # noqa: E402
from test_hf_decoder import IDS, MASK, positions, randomize  # noqa: E402

EXIT_INVALID, EXIT_UNSUPPORTED = 3, 4


def make_float(root: Path, name: str, dtype, tied: bool, vocab: int, seed: int) -> Path:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=vocab, max_position_embeddings=128,
                                   tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(cfg).eval()
    randomize(model, seed)
    out = root / name
    model.to(dtype).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def folders(run_qforge, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("modelopt_trtllm")
    out = {"f16": make_float(root, "f16", torch.float16, False, 256, 3),
           "tied": make_float(root, "tied", torch.bfloat16, True, 251, 4)}
    jobs = {  # name: (source, flags)
        "mo-w4": ("f16", ["--quant", "w4a16", "--block-size", "64", "--format", "modelopt-hf"]),
        "mo-w8": ("f16", ["--quant", "int8-weights", "--format", "modelopt-hf"]),
        "ct-w8": ("f16", ["--quant", "int8-weights"]),
        "ct-w4": ("f16", ["--quant", "w4a16", "--block-size", "64"]),
        "gptq-w8": ("f16", ["--quant", "int8-weights", "--format", "gptq"]),
        "trt-w4": ("f16", ["--quant", "w4a16", "--block-size", "64", "--format", "trtllm-ckpt"]),
        "tied-ct": ("tied", ["--quant", "w4a16", "--block-size", "64"]),
        "tied-trt1": ("tied", ["--quant", "w4a16", "--block-size", "64", "--format",
                               "trtllm-ckpt"]),
        "tied-trt2": ("tied", ["--quant", "w4a16", "--block-size", "64", "--format",
                               "trtllm-ckpt", "--tp", "2"]),
    }
    for name, (src, flags) in jobs.items():
        rc, _, stderr = run_qforge("convert", out[src], *flags, "-o", str(root / name) + "/")
        assert rc == 0, stderr
        out[name] = root / name
    return out


def tensors(folder: Path) -> dict[str, np.ndarray]:
    got = {}
    for f in sorted(folder.glob("*.safetensors")):
        got.update(safetensors.numpy.load_file(str(f)))
    return got


def same_tensors(a: Path, b: Path):
    ta, tb = tensors(a), tensors(b)
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
        assert ta[k].tobytes() == tb[k].tobytes(), k


@pytest.mark.parametrize("name,method,algo,scheme", [
    ("mo-w4", "modelopt", "W4A16_AWQ", (4, 64)),
    ("mo-w8", "modelopt", "W8A16", (8, None)),
    ("trt-w4", "trtllm-ckpt", "W4A16_AWQ", (4, 64)),
    ("tied-trt2", "trtllm-ckpt", "W4A16_AWQ", (4, 64)),
])
def test_inspect_shows_the_scheme(name, method, algo, scheme, folders, run_qforge):
    rc, stdout, stderr = run_qforge("--json", "inspect", folders[name])
    assert rc == 0, stderr
    hf = json.loads(stdout)["hf"]
    q = hf["quantization"]
    assert q["quant_method"] == method and q["format"] == algo
    assert [(s["bits"], s["group_size"]) for s in q["schemes"]] == [scheme]
    assert q["quantized_linears"] == 14 and q["schemes"][0]["linears"] == 14
    assert q["ignore"] == ["lm_head"]
    tied = name.startswith("tied")
    assert q["float_linears"] == ([] if tied else ["lm_head"])
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["num_key_value_heads"] == 2
    assert hf["tie_word_embeddings"] is tied and hf["vocab_size"] == (251 if tied else 256)
    rc, stdout, stderr = run_qforge("inspect", folders[name])
    assert rc == 0, stderr
    assert f"quantized: {method} {algo}, 14 Linears" in stdout, stdout


@pytest.mark.parametrize("dst,want", [("compressed-tensors", "ct-w8"), ("gptq", "gptq-w8")])
def test_modelopt_w8a16_reemits_bit_for_bit(dst, want, folders, run_qforge, tmp_path):
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("-v", "convert", folders["mo-w8"], "--format", dst,
                               "-o", str(out) + "/")
    assert rc == 0, stderr
    assert "nothing requantized" in stderr, stderr
    same_tensors(out, folders[want])
    cw = json.loads((folders[want] / "config.json").read_text())["quantization_config"]
    assert json.loads((out / "config.json").read_text())["quantization_config"] == cw


def logits(folder: Path) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", device_map="cpu").eval()
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK),
                    position_ids=torch.from_numpy(positions(MASK)))
    return out.logits.float().numpy()


@pytest.mark.parametrize("src", ["tied-trt1", "tied-trt2"])
def test_tied_padded_trtllm_ckpt_reads_back_as_the_hf_model(src, folders, run_qforge, tmp_path):
    out = tmp_path / "ct"
    rc, _, stderr = run_qforge("convert", folders[src], "-o", str(out) + "/")
    assert rc == 0, stderr
    assert "no tokenizer" in stderr, stderr  # said once: the folder has none to copy
    same_tensors(out, folders["tied-ct"])  # no lm_head: tied again, padding dropped
    cfg = json.loads((out / "config.json").read_text())
    want = json.loads((folders["tied-ct"] / "config.json").read_text())
    assert cfg["quantization_config"] == want["quantization_config"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings", "rms_norm_eps",
                "max_position_embeddings", "hidden_act"):
        assert cfg[key] == want[key], key
    # transformers on the synthesized config computes what it computes on the original one.
    got, ref = logits(out), logits(folders["tied-ct"])
    assert np.abs(ref).max() > 1.0
    np.testing.assert_array_equal(got, ref)
    # And back to TensorRT-LLM at the other tp: what quantizing the float model there writes.
    other = "tied-trt1" if src == "tied-trt2" else "tied-trt2"
    tp = ["--tp", "2"] if other == "tied-trt2" else []
    trt = tmp_path / "trt"
    rc, _, stderr = run_qforge("convert", folders[src], "--format", "trtllm-ckpt", *tp,
                               "-o", str(trt) + "/")
    assert rc == 0, stderr
    for f in sorted(folders[other].iterdir()):
        if f.suffix == ".safetensors":
            a = safetensors.numpy.load_file(str(f))
            b = safetensors.numpy.load_file(str(trt / f.name))
            assert sorted(a) == sorted(b)
            for k in a:
                assert a[k].tobytes() == b[k].tobytes() and a[k].shape == b[k].shape, (f.name, k)
        else:
            assert json.loads(f.read_text()) == json.loads((trt / f.name).read_text()), f.name


@pytest.mark.parametrize("src", ["trt-w4", "mo-w4"])
def test_to_onnx_runs_like_the_direct_export(src, folders, run_qforge, ort_run, tmp_path):
    """The decoder graph of a trtllm-ckpt (from its synthesized Hugging Face config) or
    modelopt-hf folder, each Linear dequantized, gives onnxruntime the same logits as the graph
    of the compressed-tensors export of the same float model."""
    got, want = tmp_path / "got.onnx", tmp_path / "want.onnx"
    for folder, model in ((folders[src], got), (folders["ct-w4"], want)):
        rc, _, stderr = run_qforge("convert", folder, "-o", model)
        assert rc == 0, stderr
    feeds = {"input_ids": IDS, "attention_mask": MASK}
    a, b = ort_run(got, feeds)[0], ort_run(want, feeds)[0]
    assert np.abs(b).max() > 1.0
    np.testing.assert_array_equal(a, b)


def rewrite(folder: Path, change) -> None:
    """Applies change(tensors) to the folder's one model.safetensors."""
    f = folder / "model.safetensors"
    t = dict(safetensors.numpy.load_file(str(f)))
    change(t)
    safetensors.numpy.save_file(t, str(f), metadata={"format": "pt"})


def test_pre_quant_scale_constant_per_group_folds_exactly(folders, run_qforge, tmp_path):
    """s = 2 on o_proj's first group of 64 inputs, 0.5 on the second: (x * s) @ (q * w)^T is
    x @ (q * (w * s_group))^T, and w * 2^j is exact, so the integers stay and the scales move."""
    src = tmp_path / "mo"
    shutil.copytree(folders["mo-w4"], src)
    m = "model.layers.1.self_attn.o_proj"
    s = np.concatenate([np.full(64, 2.0), np.full(64, 0.5)]).astype(np.float16)
    rewrite(src, lambda t: t.__setitem__(m + ".pre_quant_scale", s))
    out = tmp_path / "ct"
    rc, _, stderr = run_qforge("convert", src, "-o", str(out) + "/")
    assert rc == 0, stderr
    mo, ct = tensors(src), read_weights(out)
    w = mo[m + ".weight_scale"].astype(np.float32)
    want_scale = w * np.array([2.0, 0.5], dtype=np.float32)
    got_scale = ct[m + ".weight_scale"].float().numpy()
    np.testing.assert_array_equal(got_scale, want_scale)
    # The integers are ModelOpt's: rows 2i and 2i + 1 of each byte.
    u = mo[m + ".weight"].astype(np.int16)
    lo, hi = u & 0xF, u >> 4
    q = np.empty((2 * u.shape[0], u.shape[1]), dtype=np.int16)
    q[0::2], q[1::2] = np.where(lo >= 8, lo - 16, lo), np.where(hi >= 8, hi - 16, hi)
    np.testing.assert_array_equal(unpack(ct[m + ".weight_packed"].numpy(), 4, 128), q)


@pytest.mark.parametrize("values", ["varies", "inexact"])
def test_pre_quant_scale_that_does_not_fold_is_refused(values, folders, run_qforge, tmp_path):
    src = tmp_path / "mo"
    shutil.copytree(folders["mo-w4"], src)
    m = "model.layers.0.mlp.down_proj"
    if values == "varies":  # AWQ's per-channel scales: no per-group form
        s = np.linspace(0.5, 1.5, 256).astype(np.float16)
    else:  # one value per group, but w * 1.1f rounds in float32 for some scale w (an fp16
        # s would not: 11 by 11 significant bits fit float32's 24)
        s = np.full(256, 1.1, dtype=np.float32)
    rewrite(src, lambda t: t.__setitem__(m + ".pre_quant_scale", s))
    for args in (["inspect", src], ["convert", src, "-o", str(tmp_path / "o") + "/"]):
        rc, _, stderr = run_qforge(*args)
        assert rc == EXIT_UNSUPPORTED, stderr
        assert f"'{m}.pre_quant_scale'" in stderr, stderr
        assert "quantize the float model again" in stderr, stderr
    assert not (tmp_path / "o").exists()


def edit_json(path: Path, change) -> None:
    j = json.loads(path.read_text())
    change(j)
    path.write_text(json.dumps(j))


MODELOPT_EDITS = {
    # name: (edit, exit code, what the message names)
    "group_size": (lambda d: [edit_json(d / f, lambda j: (j.get("quantization") or j[
        "quantization_config"]).update(group_size=32))
        for f in ("hf_quant_config.json", "config.json")],
        EXIT_INVALID, "model.layers.0.mlp.down_proj.weight_scale"),
    "config_disagrees": (lambda d: edit_json(d / "config.json", lambda j: j[
        "quantization_config"].update(quant_algo="W8A16")), EXIT_INVALID, "disagree"),
    "w8_on_int4": (lambda d: [edit_json(d / f, lambda j: (j.get("quantization") or j[
        "quantization_config"]).update(quant_algo="W8A16"))
        for f in ("hf_quant_config.json", "config.json")],
        EXIT_INVALID, "model.layers.0.mlp.down_proj.weight'"),
    "no_scale": (lambda d: rewrite(d, lambda t: [t.pop(
        f"model.layers.1.mlp.up_proj.{n}") for n in ("weight_scale", "pre_quant_scale")]),
        EXIT_INVALID, "model.layers.1.mlp.up_proj.weight'"),
    "short_weight": (lambda d: rewrite(d, lambda t: t.__setitem__(
        "model.layers.0.self_attn.k_proj.weight",
        t["model.layers.0.self_attn.k_proj.weight"][:-1].copy())),
        EXIT_INVALID, "model.layers.0.self_attn.k_proj.weight_scale"),
    "excluded_yet_packed": (lambda d: edit_json(d / "hf_quant_config.json", lambda j: j[
        "quantization"]["exclude_modules"].append("model.layers.1.mlp.*")),
        EXIT_INVALID, "model.layers.1.mlp.down_proj.weight_scale"),
    "fp8": (lambda d: [edit_json(d / f, lambda j: (j.get("quantization") or j[
        "quantization_config"]).update(quant_algo="FP8"))
        for f in ("hf_quant_config.json", "config.json")], EXIT_UNSUPPORTED, "FP8"),
    "kv_cache": (lambda d: edit_json(d / "hf_quant_config.json", lambda j: j[
        "quantization"].update(kv_cache_quant_algo="FP8")), EXIT_UNSUPPORTED,
        "kv_cache_quant_algo"),
    "zero_point": (lambda d: edit_json(d / "hf_quant_config.json", lambda j: j[
        "quantization"].update(has_zero_point=True)), EXIT_UNSUPPORTED, "has_zero_point"),
}


@pytest.mark.parametrize("edit", list(MODELOPT_EDITS))
def test_modelopt_folder_that_disagrees_with_its_config_is_refused(edit, folders, run_qforge,
                                                                    tmp_path):
    change, code, needle = MODELOPT_EDITS[edit]
    bad = tmp_path / "bad"
    shutil.copytree(folders["mo-w4"], bad)
    change(bad)
    before = {p.name: p.read_bytes() for p in bad.iterdir()}
    for args in (["inspect", bad], ["convert", bad, "-o", str(tmp_path / "o") + "/"]):
        rc, _, stderr = run_qforge(*args)
        assert rc == code, stderr
        assert needle in stderr, stderr
        assert len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "o").exists()
    assert {p.name: p.read_bytes() for p in bad.iterdir()} == before  # input untouched


def rewrite_rank(folder: Path, rank: int, change) -> None:
    f = folder / f"rank{rank}.safetensors"
    t = dict(safetensors.numpy.load_file(str(f)))
    change(t)
    safetensors.numpy.save_file(t, str(f), metadata={"format": "pt"})


TRTLLM_EDITS = {
    # name: (folder, edit, exit code, what the message names)
    "group_size": ("tied-trt2", lambda d: edit_json(d / "config.json", lambda j: j[
        "quantization"].update(group_size=128)), EXIT_INVALID,
        "transformer.layers.0.attention.qkv.weights_scaling_factor"),
    "missing_rank": ("tied-trt2", lambda d: (d / "rank1.safetensors").unlink(), EXIT_INVALID,
                     "rank1.safetensors"),
    "rank_differs": ("tied-trt2", lambda d: rewrite_rank(d, 1, lambda t: t.__setitem__(
        "transformer.ln_f.weight", t["transformer.ln_f.weight"][::-1].copy())), EXIT_INVALID,
        "transformer.ln_f.weight"),
    "qkv_shape": ("trt-w4", lambda d: rewrite_rank(d, 0, lambda t: t.__setitem__(
        "transformer.layers.1.attention.qkv.weight",
        t["transformer.layers.1.attention.qkv.weight"][:-2].copy())), EXIT_INVALID,
        "transformer.layers.1.attention.qkv.weight"),
    "not_tied": ("tied-trt1", lambda d: rewrite_rank(d, 0, lambda t: t.__setitem__(
        "lm_head.weight", t["lm_head.weight"][::-1].copy())), EXIT_INVALID, "lm_head.weight"),
    "padding": ("tied-trt2", lambda d: rewrite_rank(d, 1, lambda t: t.__setitem__(
        "lm_head.weight", np.ones_like(t["lm_head.weight"]))), EXIT_INVALID, "lm_head.weight"),
    "excluded_yet_quantized": ("trt-w4", lambda d: edit_json(d / "config.json", lambda j: j[
        "quantization"]["exclude_modules"].append("transformer.layers.*.mlp.fc")),
        EXIT_INVALID, "transformer.layers.0.mlp.fc.weights_scaling_factor"),
    "w8a16": ("trt-w4", lambda d: edit_json(d / "config.json", lambda j: j[
        "quantization"].update(quant_algo="W8A16")), EXIT_UNSUPPORTED, "W8A16"),
    "pipeline": ("trt-w4", lambda d: edit_json(d / "config.json", lambda j: j[
        "mapping"].update(world_size=2, pp_size=2)), EXIT_UNSUPPORTED, "pp_size"),
    "bias": ("trt-w4", lambda d: rewrite_rank(d, 0, lambda t: t.__setitem__(
        "transformer.layers.0.mlp.proj.bias", np.zeros(128, np.float16))), EXIT_UNSUPPORTED,
        "transformer.layers.0.mlp.proj.bias"),
}


@pytest.mark.parametrize("edit", list(TRTLLM_EDITS))
def test_trtllm_ckpt_that_disagrees_with_its_config_is_refused(edit, folders, run_qforge,
                                                                tmp_path):
    name, change, code, needle = TRTLLM_EDITS[edit]
    bad = tmp_path / "bad"
    shutil.copytree(folders[name], bad)
    change(bad)
    before = {p.name: p.read_bytes() for p in bad.iterdir()}
    for args in (["inspect", bad], ["convert", bad, "-o", str(tmp_path / "o") + "/"]):
        rc, _, stderr = run_qforge(*args)
        assert rc == code, stderr
        assert needle in stderr, stderr
        assert len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "o").exists()
    assert {p.name: p.read_bytes() for p in bad.iterdir()} == before


# --- folders nvidia-modelopt writes itself ---------------------------------------------------


@pytest.fixture(scope="module")
def modelopt_exports(tmp_path_factory) -> dict[str, Path]:
    """A tiny fp16 Llama quantized by nvidia-modelopt (mtq.quantize on the CPU, calibrated on
    random ids) and exported by its own export_hf_checkpoint: INT4 blockwise with max
    calibration (no pre-quant scales), INT8 weight-only, and INT4 AWQ (awq_lite)."""
    mtq = pytest.importorskip("modelopt.torch.quantization")
    from modelopt.torch.export import export_hf_checkpoint
    import copy

    root = tmp_path_factory.mktemp("modelopt_own")
    out = {}
    for name, base, algorithm in (("int4-max", "INT4_AWQ_CFG", "max"),
                                  ("int8", "INT8_WEIGHT_ONLY_CFG", None),
                                  ("int4-awq", "INT4_AWQ_CFG", None)):
        torch.manual_seed(11)
        cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=256,
                                       max_position_embeddings=128, tie_word_embeddings=False)
        cfg.architectures = ["LlamaForCausalLM"]
        model = transformers.LlamaForCausalLM(cfg).eval()
        randomize(model, 11)
        qcfg = copy.deepcopy(getattr(mtq, base))
        if algorithm:
            qcfg["algorithm"] = algorithm
        ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))

        def forward(m):
            with torch.no_grad():
                m(ids)

        model = mtq.quantize(model, qcfg, forward)
        export_hf_checkpoint(model.half(), export_dir=root / name)
        out[name] = root / name
    return out


def modelopt_integers(packed: np.ndarray) -> np.ndarray:
    u = packed.view(np.uint8).astype(np.int16)
    lo, hi = u & 0xF, u >> 4
    q = np.empty((2 * u.shape[0], u.shape[1]), dtype=np.int16)
    q[0::2], q[1::2] = np.where(lo >= 8, lo - 16, lo), np.where(hi >= 8, hi - 16, hi)
    return q


@pytest.mark.parametrize("name", ["int4-max", "int8"])
def test_modelopt_own_export_reads_back_to_its_integers(name, modelopt_exports, run_qforge,
                                                        tmp_path):
    src = modelopt_exports[name]
    rc, stdout, stderr = run_qforge("--json", "inspect", src)
    assert rc == 0, stderr
    q = json.loads(stdout)["hf"]["quantization"]
    assert q["quant_method"] == "modelopt"
    assert q["format"] == ("W4A16_AWQ" if name == "int4-max" else "W8A16")
    assert q["ignore"] == ["lm_head", "model.embed_tokens"] and q["quantized_linears"] == 14
    out = tmp_path / "ct"
    rc, _, stderr = run_qforge("convert", src, "-o", str(out) + "/")
    assert rc == 0, stderr
    mo, ct = tensors(src), read_weights(out)
    modules = [k[: -len(".weight_scale")] for k in mo if k.endswith(".weight_scale")]
    assert len(modules) == 14
    for m in modules:
        w = mo[m + ".weight"]
        bits = 4 if w.dtype == np.uint8 else 8
        want = modelopt_integers(w) if bits == 4 else w.astype(np.int16)
        k = want.shape[1]
        np.testing.assert_array_equal(unpack(ct[m + ".weight_packed"].numpy(), bits, k), want)
        # ModelOpt's float32 scales (amax / 7, amax / 127), kept as float32 where the model's
        # fp16 does not hold them.
        scale = ct[m + ".weight_scale"].numpy()
        ms = mo[m + ".weight_scale"]
        assert scale.reshape(ms.shape).astype(np.float32).tobytes() == \
            ms.astype(np.float32).tobytes(), m


def test_modelopt_own_awq_export_is_refused_naming_the_pre_quant_scale(modelopt_exports,
                                                                       run_qforge):
    src = modelopt_exports["int4-awq"]
    mo = tensors(src)
    pqs = sorted(k for k in mo if k.endswith(".pre_quant_scale"))
    # ModelOpt folds q/k/v's and gate/up's into the norms; o_proj's and down_proj's stay.
    assert pqs and all(("o_proj" in k or "down_proj" in k) for k in pqs), pqs
    rc, _, stderr = run_qforge("inspect", src)
    assert rc == EXIT_UNSUPPORTED, stderr
    assert ".pre_quant_scale'" in stderr, stderr
