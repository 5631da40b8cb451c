"""The decoder graph qforge builds from a model folder's config.json (`qforge convert DIR -o
m.onnx`), held to transformers' float model: tiny random Llama (plain, Llama 3 rope_scaling,
tied), Mistral (sliding window), Qwen2 (q/k/v biases, per-layer sliding window), Qwen3
(head_dim != hidden / heads, q/k norm) and Phi-3 (fused qkv and gate_up, partial rotary)
models, stored fp32, bf16 and fp16, one sharded, one config rewritten with transformers 4's
legacy keys. Each graph passes onnx's full check and runs on qforge's runtime and on ONNX
Runtime; logits agree with transformers (eager attention, float32, the same position ids) to
1e-4 relative on every real token of a batch with left padding, right padding and an odd
length; the left-padded row agrees with its unpadded run. An unsupported model_type is refused
by name with nothing written."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

REL_TOL = 1e-4
VOCAB = 256
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
              max_position_embeddings=128)

# Batch of 3 x 7: a full row, a left-padded row (3 pads), a right-padded row (2 pads).
IDS = np.array([[11, 200, 37, 5, 99, 143, 7],
                [0, 0, 0, 42, 18, 250, 3],
                [61, 9, 120, 77, 31, 0, 0]], dtype=np.int64)
MASK = np.array([[1, 1, 1, 1, 1, 1, 1],
                 [0, 0, 0, 1, 1, 1, 1],
                 [1, 1, 1, 1, 1, 0, 0]], dtype=np.int64)


def positions(mask: np.ndarray) -> np.ndarray:
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def llama3_scaling():
    return {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


# name -> (config class, config kwargs, model class, stored dtype, save_pretrained kwargs)
CASES = {
    "llama-f32": ("LlamaConfig", dict(tie_word_embeddings=False), "LlamaForCausalLM",
                  torch.float32, {}),
    "llama3-tied-bf16": ("LlamaConfig", dict(tie_word_embeddings=True,
                                             rope_scaling=llama3_scaling()),
                         "LlamaForCausalLM", torch.bfloat16, {}),
    "llama-sharded-f16": ("LlamaConfig", dict(tie_word_embeddings=False, attention_bias=True,
                                              mlp_bias=True, num_key_value_heads=1),
                          "LlamaForCausalLM", torch.float16, dict(max_shard_size="40KB")),
    "mistral-window3": ("MistralConfig", dict(sliding_window=3), "MistralForCausalLM",
                        torch.float32, {}),
    "qwen2-bf16": ("Qwen2Config", dict(tie_word_embeddings=True), "Qwen2ForCausalLM",
                   torch.bfloat16, {}),
    "qwen2-sliding": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=2,
                                          max_window_layers=1),
                      "Qwen2ForCausalLM", torch.float32, {}),
    "qwen3-f32": ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=True),
                  "Qwen3ForCausalLM", torch.float32, {}),
    "qwen3-sharded-bf16": ("Qwen3Config", dict(head_dim=8, tie_word_embeddings=False),
                           "Qwen3ForCausalLM", torch.bfloat16, dict(max_shard_size="40KB")),
    "phi3-f32": ("Phi3Config", dict(pad_token_id=0, bos_token_id=1, eos_token_id=2),
                 "Phi3ForCausalLM", torch.float32, {}),
    "phi3-partial-f16": ("Phi3Config", dict(partial_rotary_factor=0.5, pad_token_id=0,
                                            bos_token_id=1, eos_token_id=2),
                         "Phi3ForCausalLM", torch.float16, {}),
}


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights large enough that every part of the graph moves the logits (transformers'
    init, std 0.02, leaves them all near zero); norm weights around 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def make_folder(root: Path, name: str, seed: int) -> Path:
    cfg_name, kwargs, model_name, dtype, save = CASES[name]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_name)(**{**COMMON, **kwargs})
    model = getattr(transformers, model_name)(cfg).eval()
    randomize(model, seed)
    folder = root / name
    model.to(dtype).save_pretrained(folder, **save)
    return folder


def write_legacy(root: Path, seed: int) -> Path:
    """A Llama 3 folder whose config.json is written as transformers 4 wrote it: torch_dtype,
    a top-level rope_theta, rope_scaling with the old "type" key, no rope_parameters."""
    cfg = transformers.LlamaConfig(**COMMON, tie_word_embeddings=False,
                                   rope_scaling=llama3_scaling())
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    randomize(model, seed)
    folder = root / "llama3-legacy"
    model.save_pretrained(folder)
    path = folder / "config.json"
    data = json.loads(path.read_text())
    rope = data.pop("rope_parameters")
    data["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    data["rope_scaling"] = rope
    data["torch_dtype"] = data.pop("dtype", "float32")
    path.write_text(json.dumps(data, indent=2))
    return folder


@pytest.fixture(scope="session")
def decoder_folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_decoders")
    out = {name: make_folder(root, name, seed) for seed, name in enumerate(CASES)}
    out["llama3-legacy"] = write_legacy(root, 100)
    return out


def reference_logits(folder: Path, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers' logits in float32 from the stored values, eager attention, with the
    position ids the graph computes."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    position_ids=torch.from_numpy(positions(mask)))
    return out.logits.numpy()


def relative_error(got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> float:
    real = mask.astype(bool)
    return float(np.abs(got[real] - want[real]).max() / np.abs(want[real]).max())


@pytest.fixture(scope="session")
def converted(decoder_folders, run_qforge, tmp_path_factory):
    """convert(name) -> the ONNX file `qforge convert` wrote for that folder (once)."""
    out_dir = tmp_path_factory.mktemp("hf_decoder_onnx")
    done: dict[str, Path] = {}

    def convert(name: str) -> Path:
        if name not in done:
            out = out_dir / f"{name}.onnx"
            rc, _, stderr = run_qforge("convert", decoder_folders[name], "-o", out)
            assert rc == 0, stderr
            done[name] = out
        return done[name]

    return convert


def run_on_qforge(run_qforge, model: Path, ids: np.ndarray, mask: np.ndarray,
                  tmp_path: Path) -> np.ndarray:
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, input_ids=ids, attention_mask=mask)
    out = tmp_path / "out.npz"
    rc, _, stderr = run_qforge("run", model, "--inputs", feeds, "-o", out)
    assert rc == 0, stderr
    with np.load(out) as data:
        return data["logits"]


NAMES = list(CASES) + ["llama3-legacy"]


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(name, decoder_folders, converted, run_qforge, ort_run,
                                   check_full, report_figure, tmp_path):
    model = converted(name)
    check_full(model)
    want = reference_logits(decoder_folders[name], IDS, MASK)
    assert np.abs(want).max() > 1.0  # the random weights move the logits
    ours = run_on_qforge(run_qforge, model, IDS, MASK, tmp_path)
    ort = ort_run(model, {"input_ids": IDS, "attention_mask": MASK})[0]
    assert ours.shape == ort.shape == want.shape == (3, 7, VOCAB)
    assert np.isfinite(ours).all() and np.isfinite(ort).all()
    err_ours, err_ort = relative_error(ours, want, MASK), relative_error(ort, want, MASK)
    report_figure(f"hf decoder {name}: logits vs transformers, max rel error qforge "
                  f"{err_ours:.2e}, onnxruntime {err_ort:.2e}")
    assert err_ours < REL_TOL
    assert err_ort < REL_TOL
    # The left-padded row gives its tokens the logits they have unpadded.
    alone_ids, alone_mask = IDS[1:2, 3:], MASK[1:2, 3:]
    alone = run_on_qforge(run_qforge, model, alone_ids, alone_mask, tmp_path)
    assert relative_error(ours[1:2, 3:], alone, alone_mask) < REL_TOL
    alone_ort = ort_run(model, {"input_ids": alone_ids, "attention_mask": alone_mask})[0]
    assert relative_error(ort[1:2, 3:], alone_ort, alone_mask) < REL_TOL


def test_graph_interface(converted):
    import onnx
    m = onnx.load(str(converted("qwen3-f32")))
    inputs = {i.name: i for i in m.graph.input}
    assert list(inputs) == ["input_ids", "attention_mask"]
    for i in inputs.values():
        assert i.type.tensor_type.elem_type == onnx.TensorProto.INT64
        dims = i.type.tensor_type.shape.dim
        assert [d.dim_param for d in dims] == ["batch", "sequence"]
    (out,) = m.graph.output
    assert out.name == "logits"
    assert out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == \
        ["batch", "sequence", VOCAB]
    # Every Linear is a Gemm reading the folder's tensor, transB=1; all initializers f32 or i64.
    gemms = [n for n in m.graph.node if n.op_type == "Gemm"]
    assert len(gemms) == 2 * 7 + 1
    names = {t.name for t in m.graph.initializer}
    for g in gemms:
        assert g.input[1] in names
        assert any(a.name == "transB" and a.i == 1 for a in g.attribute)
    assert "model.layers.1.self_attn.q_norm.weight" in names
    assert {t.data_type for t in m.graph.initializer} <= {onnx.TensorProto.FLOAT,
                                                          onnx.TensorProto.INT64}


@pytest.mark.parametrize("flags,min_cosine", [
    (["--quant", "w4a16", "--block-size", "16"], 0.95),
    (["--quant", "w4a16", "--block-size", "16", "--w4-method", "gptq", "--calib", "CALIB"], 0.95),
    (["--quant", "int8", "--calib", "CALIB", "--method", "minmax"], 0.98),
], ids=["w4a16-rtn", "w4a16-gptq", "int8"])
def test_quantization_runs_on_the_graph(flags, min_cosine, decoder_folders, run_qforge, ort_run,
                                        report_figure, tmp_path):
    """The existing ONNX pipeline quantizes the built graph as any ONNX model (--calib holding
    input_ids and attention_mask); ONNX Runtime runs the result close to the float model."""
    calib = tmp_path / "calib.npz"
    np.savez(calib, input_ids=IDS, attention_mask=MASK)
    out = tmp_path / "q.onnx"
    args = [str(calib) if f == "CALIB" else f for f in flags]
    rc, _, stderr = run_qforge("convert", decoder_folders["llama-f32"], "-o", out, *args)
    assert rc == 0, stderr
    got = ort_run(out, {"input_ids": IDS, "attention_mask": MASK})[0]
    want = reference_logits(decoder_folders["llama-f32"], IDS, MASK)
    real = MASK.astype(bool)
    a, b = got[real].ravel(), want[real].ravel()
    cosine = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    shown = " ".join(flags).replace("CALIB", "ids.npz")
    report_figure(f"hf decoder llama-f32 {shown}: logits cosine {cosine:.4f}")
    assert cosine > min_cosine, cosine


def test_unsupported_model_type_is_refused_by_name(run_qforge, tmp_path):
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    out = tmp_path / "gpt2.onnx"
    rc, stdout, stderr = run_qforge("convert", tmp_path / "gpt2", "-o", out)
    assert rc != 0
    errors = [line for line in stderr.splitlines() if "error" in line]
    assert len(errors) == 1, stderr
    assert "gpt2" in errors[0] and "llama, mistral, qwen2, qwen3, phi3" in errors[0], stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".onnx" or p.name.startswith(".")]
