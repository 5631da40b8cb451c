"""llama.cpp itself (llama-cpp-python, built by scripts/setup_peers.sh) runs the GGUF files qforge
writes for the trained tiny Llama (tests/interop/fixtures/tiny_llama.py): for f32, q8_0, q4_0
and q4_1, llama.cpp's logits on held-out rows are compared with qforge's runtime running the
same quantized model (the file's tensors dequantized by the `gguf` package, the Q/K rows put back
in Hugging Face order, written as a model folder, converted to a graph and run by `qforge run`).
The two differ by what llama.cpp does beyond the weights: its matmuls quantize activations to
8 bits for q8_0/q4_0/q4_1 and accumulate in another order. The figures are printed; the
perplexity from llama.cpp's logits is within 1% of qforge's, and f32 logits agree to 1e-3."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python (tests/requirements-llama-cpp.txt) is built by "
    "scripts/setup_peers.sh; without it llama.cpp cannot load the files")
gguf = pytest.importorskip("gguf", reason="the gguf package (tests/requirements.txt) reads GGUF")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import llm_metrics  # noqa: E402

QUANTS = ["f32", "q8_0", "q4_0", "q4_1"]
ROWS = 8  # held-out rows of 128 tokens
# Relative max logit difference to qforge's runtime on the same dequantized weights: f32 differs
# by summation order only; the quantized types add llama.cpp's 8-bit activations.
MAX_REL = {"f32": 1e-3, "q8_0": 0.05, "q4_0": 0.05, "q4_1": 0.05}
LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight"}


def hf_name(name: str) -> str:
    if name in TOP:
        return TOP[name]
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{layer}.{LAYER_MAP[rest]}"


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of convert_hf_to_gguf's Q/K row regrouping for llama.cpp's RoPE pairing."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def file_tensors(src, gguf_path) -> dict:
    """The GGUF file's tensors dequantized to float32, by Hugging Face name, the Q/K rows put back
    in Hugging Face order (`src`'s config.json gives the head counts)."""
    cfg = json.loads((src / "config.json").read_text())
    reader = gguf.GGUFReader(str(gguf_path))
    state = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        name = hf_name(t.name)
        if name.endswith("q_proj.weight"):
            w = unpermute(w, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, cfg["num_key_value_heads"])
        state[name] = np.ascontiguousarray(w)
    return state


def write_folder(src, state: dict, dst):
    """A model folder at `dst`: `src`'s JSON files and `state` as its model.safetensors."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".json":
            shutil.copy(f, dst / f.name)
    safetensors_numpy.save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def dequantized_folder(src, gguf_path, dst):
    return write_folder(src, file_tensors(src, gguf_path), dst)


def with_file_floats(src, gguf_path, dst):
    """A copy of the quantized folder `src` whose float tensors (the embedding, the output head,
    the norms) hold the GGUF file's values: the export encodes them in the file's type as
    llama.cpp's converter does (Q4_0 embedding, Q8_0 head), an error of its own beside the
    activations'. The packed Linears stay as they are."""
    state = safetensors_numpy.load_file(str(src / "model.safetensors"))
    replaced = []
    for name, w in file_tensors(src, gguf_path).items():
        if name not in state:  # a packed Linear (its qweight, scales... are in the folder)
            continue
        assert w.shape == state[name].shape, name
        state[name] = w.astype(state[name].dtype)
        replaced.append(name)
    return write_folder(src, state, dst), replaced


def llama_cpp_logits(path, ids: np.ndarray) -> np.ndarray:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=ids.shape[1], n_batch=ids.shape[1],
                          logits_all=True, n_threads=2, seed=0, verbose=False)
    out = []
    for row in ids:
        llm.reset()
        llm.eval([int(v) for v in row])
        out.append(np.array(llm.scores[: len(row)], dtype=np.float32))
    return np.stack(out)


def qforge_logits(run_qforge, folder, ids, mask, tmp_path) -> np.ndarray:
    model = tmp_path / "model.onnx"
    rc, _, stderr = run_qforge("convert", folder, "-o", model)
    assert rc == 0, stderr
    feeds, out = tmp_path / "feeds.npz", tmp_path / "out.npz"
    np.savez(feeds, input_ids=ids, attention_mask=mask)
    rc, _, stderr = run_qforge("run", model, "--inputs", feeds, "-o", out)
    assert rc == 0, stderr
    with np.load(out) as data:
        return data["logits"]


@pytest.mark.parametrize("quant", QUANTS)
def test_llama_cpp_runs_the_file_as_qforge_runs_it(quant, tiny_llama, run_qforge, tmp_path,
                                                   report_figure):
    ids, mask = llm_metrics.load_eval_set(tiny_llama / "heldout.npz")
    ids, mask = ids[:ROWS], mask[:ROWS]
    assert mask.all()  # held-out rows are whole windows of the token stream
    path = tmp_path / f"tiny_{quant}.gguf"
    rc, _, stderr = run_qforge("convert", tiny_llama, "--format", "gguf", "--quant", quant,
                               "-o", path)
    assert rc == 0, stderr
    theirs = llama_cpp_logits(path, ids)
    ours = qforge_logits(run_qforge, dequantized_folder(tiny_llama, path, tmp_path / "deq"),
                         ids, mask, tmp_path)
    assert theirs.shape == ours.shape
    rel = float(np.abs(theirs - ours).max() / np.abs(ours).max())
    ppl_theirs = llm_metrics.perplexity(theirs, ids, mask)
    ppl_ours = llm_metrics.perplexity(ours, ids, mask)
    report_figure(f"gguf {quant}: llama.cpp vs qforge runtime, max rel logit diff {rel:.2e}, "
                  f"perplexity {ppl_theirs:.4f} vs {ppl_ours:.4f} "
                  f"({100 * (ppl_theirs / ppl_ours - 1):+.3f}%)")
    assert rel < MAX_REL[quant], rel
    assert abs(ppl_theirs / ppl_ours - 1) < 0.01, (ppl_theirs, ppl_ours)


def test_llama_cpp_runs_a_gptq_folder_as_stored(tiny_llama, run_qforge, tmp_path,
                                                report_figure):
    """A GPTQ-quantized folder (group 32) written as GGUF with no --quant: its int4 Linears
    become Q4_0 blocks holding the GPTQ integers and scales as they are, and llama.cpp's logits
    match qforge's runtime running the quantized folder itself (its Linears dequantized as
    transformers does), its float tensors given the values the file holds (the export encodes
    them in the file's type, as llama.cpp's converter does), within the same
    activation-quantization error as the float exports."""
    ids, mask = llm_metrics.load_eval_set(tiny_llama / "heldout.npz")
    ids, mask = ids[:ROWS], mask[:ROWS]
    qdir = tmp_path / "gptq"
    rc, _, stderr = run_qforge("convert", tiny_llama, "--quant", "w4a16", "--block-size", "32",
                               "--w4-method", "gptq", "--calib", tiny_llama / "calib.npz",
                               "--calib-size", "16", "--format", "gptq", "-o", str(qdir) + "/")
    assert rc == 0, stderr
    path = tmp_path / "tiny_gptq.gguf"
    rc, stdout, stderr = run_qforge("convert", qdir, "--format", "gguf", "-o", path, "--json")
    assert rc == 0, stderr
    gguf_pass = next(p for p in json.loads(stdout)["passes"]
                     if p["pass"] == "gguf-export")["stats"]
    assert gguf_pass["quantized_linears_as_stored"] == 4 * 7
    theirs = llama_cpp_logits(path, ids)
    same, replaced = with_file_floats(qdir, path, tmp_path / "gptq_file_floats")
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(replaced), replaced
    ours = qforge_logits(run_qforge, same, ids, mask, tmp_path)
    rel = float(np.abs(theirs - ours).max() / np.abs(ours).max())
    # The folder as written, its float embedding and head unquantized: the file's encoding of
    # them adds to the difference (5.7e-2 on one trained tiny Llama, 1e-2 without it).
    folder = qforge_logits(run_qforge, qdir, ids, mask, tmp_path)
    rel_folder = float(np.abs(theirs - folder).max() / np.abs(folder).max())
    ppl_theirs = llm_metrics.perplexity(theirs, ids, mask)
    ppl_ours = llm_metrics.perplexity(ours, ids, mask)
    report_figure(f"gguf from a GPTQ folder (Q4_0 as stored): llama.cpp vs qforge runtime, max "
                  f"rel logit diff {rel:.2e} ({rel_folder:.2e} against the folder's float "
                  f"embedding and head), perplexity {ppl_theirs:.4f} vs {ppl_ours:.4f} "
                  f"({100 * (ppl_theirs / ppl_ours - 1):+.3f}%)")
    assert rel < MAX_REL["q4_0"], rel
    assert abs(ppl_theirs / ppl_ours - 1) < 0.01, (ppl_theirs, ppl_ours)
