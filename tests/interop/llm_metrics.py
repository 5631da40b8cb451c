"""Quality of a quantized causal LM against its float model, and the pieces to measure it
without any qforge runtime.

- `kl_and_perplexity`: mean per-token KL(float || quantized) of the next-token distributions over
  the real tokens of a batch, with both models' perplexities. On a tiny model perplexity swings
  by a few percent either way under 4-bit quantization; the KL is the stable measure.
- `load_pack_quantized`: a float transformers model from a compressed-tensors `pack-quantized`
  folder (int32 words of eight 4-bit values along K, stored as q + 8; per-group scales; optional
  packed zero-points and g_idx), dequantized in numpy, independent of the compressed-tensors
  package.
- `rtn_state_dict` / `write_pack_quantized`: a numpy round-to-nearest reference (symmetric,
  per-block amax / 7 scales) and a writer of the same folder format, to check the metric and
  the loader.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

# The Linear layers of a Llama decoder that 4-bit weight quantization touches (lm_head stays).
DECODER_LINEARS = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)$")
PACK = 8  # 4-bit values per int32 word


# --- metrics ------------------------------------------------------------------------------------


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def mean_kl(float_logits: np.ndarray, quant_logits: np.ndarray, mask: np.ndarray) -> float:
    """Mean over positions with mask == 1 of KL(softmax(float) || softmax(quant)), in nats."""
    lp, lq = _log_softmax(float_logits), _log_softmax(quant_logits)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    keep = mask.astype(bool)
    return float(kl[keep].mean())


def perplexity(logits: np.ndarray, ids: np.ndarray, mask: np.ndarray) -> float:
    """exp of the mean next-token negative log-likelihood, over positions t where tokens t and
    t + 1 are both real."""
    lp = _log_softmax(logits[:, :-1])
    target = ids[:, 1:]
    nll = -np.take_along_axis(lp, target[..., None], axis=-1)[..., 0]
    keep = (mask[:, :-1] * mask[:, 1:]).astype(bool)
    return float(np.exp(nll[keep].mean()))


def model_logits(model, ids: np.ndarray, mask: np.ndarray, batch: int = 16) -> np.ndarray:
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, ids.shape[0], batch):
            t = torch.from_numpy(ids[i:i + batch])
            m = torch.from_numpy(mask[i:i + batch])
            out.append(model(input_ids=t, attention_mask=m, use_cache=False).logits.float().numpy())
    return np.concatenate(out)


def kl_and_perplexity(float_logits: np.ndarray, quant_logits: np.ndarray,
                      ids: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    return {
        "kl": mean_kl(float_logits, quant_logits, mask),
        "ppl": perplexity(quant_logits, ids, mask),
        "ppl_float": perplexity(float_logits, ids, mask),
    }


def load_eval_set(path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as data:
        return data["input_ids"].astype(np.int64), data["attention_mask"].astype(np.int64)


# --- compressed-tensors pack-quantized ----------------------------------------------------------


def unpack_int4(words: np.ndarray, count: int, axis: int) -> np.ndarray:
    """Signed 4-bit values from int32 words holding eight each (element k at bits 4k..4k+3,
    stored as q + 8) along `axis`; the first `count` values along that axis."""
    w = np.moveaxis(words.astype(np.int64) & 0xFFFFFFFF, axis, -1)
    nibbles = (w[..., None] >> (4 * np.arange(PACK))) & 0xF
    q = nibbles.reshape(*w.shape[:-1], -1)[..., :count] - 8
    return np.moveaxis(q, -1, axis).astype(np.int8)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Inverse of unpack_int4 along the last axis: q in [-8, 7], [N, K] -> int32 [N, ceil(K/8)]."""
    n, k = q.shape
    padded = np.zeros((n, -(-k // PACK) * PACK), dtype=np.int64)
    padded[:, :k] = q.astype(np.int64) + 8
    words = (padded.reshape(n, -1, PACK) << (4 * np.arange(PACK))).sum(axis=-1)
    return words.astype(np.uint32).view(np.int32)


def dequantize_module(tensors: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """The float [N, K] weight of the module `prefix` from its weight_packed / weight_scale
    (and weight_zero_point, weight_g_idx when present)."""
    n, k = (int(v) for v in tensors[f"{prefix}.weight_shape"])
    q = unpack_int4(tensors[f"{prefix}.weight_packed"], k, axis=1).astype(np.float64)
    scale = tensors[f"{prefix}.weight_scale"].astype(np.float64)
    if scale.ndim == 1:
        scale = scale.reshape(-1, 1)
    if scale.shape[0] == 1 and n != 1:
        scale = np.broadcast_to(scale, (n, scale.shape[1]))  # per-tensor
    groups = scale.shape[1]
    if f"{prefix}.weight_g_idx" in tensors:
        g_idx = tensors[f"{prefix}.weight_g_idx"].astype(np.int64)
    else:
        g_idx = np.arange(k) // -(-k // groups)
    zp_name = f"{prefix}.weight_zero_point"
    zp = (unpack_int4(tensors[zp_name], n, axis=0).astype(np.float64)
          if zp_name in tensors else np.zeros((n, groups)))
    return ((q - zp[:, g_idx]) * scale[:, g_idx]).astype(np.float32)


def _read_safetensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's *.safetensors as float32 / int numpy (bf16 read via torch)."""
    from safetensors.torch import load_file

    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        for name, t in load_file(str(path)).items():
            out[name] = t.float().numpy() if t.is_floating_point() else t.numpy()
    return out


def pack_quantized_state_dict(folder) -> dict[str, np.ndarray]:
    """Float state dict of a pack-quantized folder: quantized modules dequantized, the rest as
    stored. Raises ValueError when the folder is not 4-bit pack-quantized."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    qc = config.get("quantization_config")
    if not qc or qc.get("format") not in ("pack-quantized", "mixed-precision"):
        raise ValueError(f"{folder}: config.json has no pack-quantized quantization_config")
    for name, group in qc.get("config_groups", {}).items():
        bits = (group.get("weights") or {}).get("num_bits")
        if bits != 4:
            raise ValueError(f"{folder}: config group {name} has num_bits {bits}, only 4 is read")
    tensors = _read_safetensors(folder)
    prefixes = {n[: -len(".weight_packed")] for n in tensors if n.endswith(".weight_packed")}
    state = {}
    for name, value in tensors.items():
        module, _, param = name.rpartition(".")
        if module in prefixes:
            if param == "weight_packed":
                state[f"{module}.weight"] = dequantize_module(tensors, module)
        else:
            state[name] = value
    return state


def model_from_state_dict(config_dir, state: dict[str, np.ndarray]):
    """A float LlamaForCausalLM (or whatever config.json names) with `state` loaded strictly."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(str(config_dir))
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
    if cfg.tie_word_embeddings and "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if not m.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError(f"{config_dir}: state dict does not fit the model: missing {missing}, "
                         f"unexpected {unexpected}")
    return model


def load_pack_quantized(folder):
    """A float transformers model from a compressed-tensors pack-quantized folder."""
    return model_from_state_dict(folder, pack_quantized_state_dict(folder))


def load_float(folder):
    """The float model of a plain safetensors model folder."""
    return model_from_state_dict(folder, _read_safetensors(Path(folder)))


# --- numpy round-to-nearest reference -----------------------------------------------------------


def rtn_quantize(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric 4-bit round-to-nearest along K in blocks: scale = amax / 7 per block,
    q = clip(round(w / scale), -8, 7). Returns (q int8 [N, K], scale float32 [N, K/block])."""
    n, k = w.shape
    if k % block:
        raise ValueError(f"K = {k} is not a multiple of the block size {block}")
    blocks = w.astype(np.float64).reshape(n, k // block, block)
    scale = np.abs(blocks).max(axis=-1) / 7.0
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    q = np.clip(np.rint(blocks / scale[..., None]), -8, 7).astype(np.int8)
    return q.reshape(n, k), scale


def rtn_state_dict(state: dict[str, np.ndarray], block: int) -> dict[str, np.ndarray]:
    """`state` with every decoder Linear weight replaced by its RTN dequantization."""
    out = dict(state)
    for name, w in state.items():
        if name.endswith(".weight") and DECODER_LINEARS.match(name[: -len(".weight")]):
            q, scale = rtn_quantize(w, block)
            out[name] = (q.astype(np.float32).reshape(w.shape[0], -1, block)
                         * scale[..., None]).reshape(w.shape)
    return out


def write_pack_quantized(src_folder, dst_folder, block: int) -> None:
    """RTN of the float folder `src_folder` written as a symmetric 4-bit pack-quantized folder
    (the layout qforge and llmcompressor write), tokenizer files copied."""
    from safetensors.numpy import save_file

    src, dst = Path(src_folder), Path(dst_folder)
    dst.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, w in _read_safetensors(src).items():
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module and DECODER_LINEARS.match(module):
            q, scale = rtn_quantize(w, block)
            tensors[f"{module}.weight_packed"] = pack_int4(q)
            tensors[f"{module}.weight_scale"] = scale
            tensors[f"{module}.weight_shape"] = np.asarray(w.shape, dtype=np.int64)
        else:
            tensors[name] = np.ascontiguousarray(w)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                        "group_size": block, "dynamic": False, "actorder": None,
                        "observer": "minmax"}}},
    }
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / extra).exists():
            shutil.copy2(src / extra, dst / extra)
