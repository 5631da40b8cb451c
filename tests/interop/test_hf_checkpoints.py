"""Sharded Hugging Face checkpoints in and out: a tiny Llama saved by transformers'
save_pretrained (sharded safetensors + model.safetensors.index.json) and the same weights as
sharded torch.save .bin files with pytorch_model.bin.index.json (the layout transformers 4 wrote
with safe_serialization=False; transformers 5 always writes safetensors). qforge reads both,
tensor for tensor equal, and its own sharded output loads back with from_pretrained and gives
the same logits."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    model = transformers.LlamaForCausalLM(cfg).eval()
    root = tmp_path_factory.mktemp("hf")
    model.save_pretrained(root / "st", max_shard_size="100KB")
    # transformers 4's sharded .bin layout, written with torch.save.
    state = model.state_dict()
    bin_dir = root / "bin"
    bin_dir.mkdir()
    names = sorted(state)
    shards = [names[i::3] for i in range(3)]
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"pytorch_model-{i:05d}-of-{len(shards):05d}.bin"
        torch.save({k: state[k] for k in shard}, bin_dir / fname)
        weight_map.update({k: fname for k in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (bin_dir / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return model, root


def read_back(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    index = path.parent / "model.safetensors.index.json"
    if index.exists():
        out = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            out.update(load_file(str(path.parent / shard)))
        return out
    return load_file(str(path))


@pytest.mark.parametrize("source", ["st/model.safetensors.index.json",
                                    "bin/pytorch_model.bin.index.json"])
def test_sharded_checkpoint_reads_tensor_for_tensor(source, tiny_llama, run_qforge, tmp_path):
    model, root = tiny_llama
    rc, stdout, stderr = run_qforge("inspect", root / source, "--json")
    assert rc == 0, stderr
    info = json.loads(stdout)
    state = model.state_dict()
    assert info["parameters"]["count"] == sum(t.numel() for t in state.values())
    out = tmp_path / "model.safetensors"
    rc, _, stderr = run_qforge("convert", root / source, "-o", out)
    assert rc == 0, stderr
    back = read_back(out)
    assert set(back) == set(state)
    for k, t in state.items():
        assert torch.equal(back[k], t), k


def test_sharded_output_loads_in_transformers(tiny_llama, run_qforge, tmp_path):
    model, root = tiny_llama
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc, _, stderr = run_qforge("convert", root / "bin" / "pytorch_model.bin.index.json",
                               "-o", out_dir / "model.safetensors", "--max-shard-size", "60000")
    assert rc == 0, stderr
    assert (out_dir / "model.safetensors.index.json").exists()
    assert len(list(out_dir.glob("model-*-of-*.safetensors"))) > 1
    shutil.copy(root / "st" / "config.json", out_dir / "config.json")
    loaded = transformers.LlamaForCausalLM.from_pretrained(out_dir).eval()
    ids = torch.tensor([[1, 5, 9, 200, 3]])
    with torch.no_grad():
        a = model(ids).logits
        b = loaded(ids).logits
    assert torch.equal(a, b), float((a - b).abs().max())
