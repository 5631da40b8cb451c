"""LoRA merged into tied weights, held to PEFT 0.21's merge_and_unload(). A tiny Llama with
tie_word_embeddings=True (lm_head.weight is model.embed_tokens.weight) gets an adapter on
lm_head, embed_tokens and q_proj; PEFT merges both deltas into the one shared tensor. qforge
must do the same in the three forms a tied base comes in:
  - a torch.save state dict: both names, one storage;
  - save_pretrained: model.safetensors (or shards and their index) without lm_head.weight,
    the tie in config.json;
  - a TorchScript ONNX export: the embedding for Gather and a transposed onnx::MatMul_N copy
    of it for the lm_head MatMul.
Updating only the name the adapter names leaves logits several units away from PEFT's."""
from __future__ import annotations

import copy
import json
import shutil
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

VOCAB, HIDDEN = 128, 32
IDS = [[1, 5, 9, 100, 3, 77, 64, 2]]
LOGITS_TOL = 1e-4  # fp32 sums in another order; PEFT's own deltas move logits by units


class Logits(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids):
        # Explicit mask and positions keep transformers off aten::diff (no TorchScript export).
        pos = torch.arange(input_ids.shape[1]).unsqueeze(0).expand(input_ids.shape[0], -1)
        return self.inner(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                          position_ids=pos, use_cache=False).logits


def tied_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True, attn_implementation="eager")
    return transformers.LlamaForCausalLM(config).eval()


def logits(model) -> np.ndarray:
    with torch.no_grad():
        return Logits(model)(torch.tensor(IDS)).numpy()


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    root = tmp_path_factory.mktemp("tied")
    warnings.filterwarnings("ignore")
    model = tied_llama()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.save(model.state_dict(), root / "base.pt")
    model.save_pretrained(root / "st")
    model.save_pretrained(root / "sharded", max_shard_size="20KB")
    assert (root / "sharded" / "model.safetensors.index.json").exists()
    assert "tie_word_embeddings" in json.loads((root / "st" / "config.json").read_text())
    with torch.no_grad():
        torch.onnx.export(Logits(model), (torch.tensor(IDS),), str(root / "base.onnx"),
                          dynamo=False, opset_version=17, input_names=["input_ids"],
                          output_names=["logits"])
    base_logits = logits(model)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                          target_modules=["lm_head", "embed_tokens", "q_proj"])
    adapted = peft.get_peft_model(copy.deepcopy(model), cfg)
    gen = torch.Generator().manual_seed(18)
    with torch.no_grad():
        for name, p in sorted(adapted.named_parameters()):
            if "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    adapted.save_pretrained(root / "adapter")
    merged = adapted.merge_and_unload().eval()
    assert merged.lm_head.weight is merged.model.embed_tokens.weight
    return {"root": root, "base_logits": base_logits, "merged_logits": logits(merged),
            "merged_embedding": merged.model.embed_tokens.weight.detach().numpy().copy()}


def test_peft_merge_moves_the_logits(tied):
    # What the tests below would miss if qforge updated one alias only.
    assert np.abs(tied["merged_logits"] - tied["base_logits"]).max() > 0.5


def test_torch_state_dict_updates_both_names(tied, run_qforge, tmp_path, report_figure):
    from safetensors.torch import load_file
    out = tmp_path / "merged.safetensors"
    rc, stdout, stderr = run_qforge("convert", tied["root"] / "base.pt", "--lora",
                                    tied["root"] / "adapter", "-o", out, "--json")
    assert rc == 0, stderr
    assert '"how": "shared storage"' in json.dumps(json.loads(stdout)), "the report names the tie"
    state = load_file(str(out))
    want = tied["merged_embedding"]
    for name in ("lm_head.weight", "model.embed_tokens.weight"):
        np.testing.assert_allclose(state[name].numpy(), want, atol=1e-6, err_msg=name)
    model = tied_llama()
    model.load_state_dict(state)
    diff = float(np.abs(logits(model) - tied["merged_logits"]).max())
    report_figure(f"tied LoRA, torch.save base: max |logits - PEFT| {diff:.2e}")
    assert diff <= LOGITS_TOL, diff


@pytest.mark.parametrize("source", ["st/model.safetensors",
                                    "sharded/model.safetensors.index.json"])
def test_safetensors_with_tied_config_merges_into_the_embedding(source, tied, run_qforge, tmp_path,
                                                                report_figure):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc, stdout, stderr = run_qforge("convert", tied["root"] / source,
                                    "--lora", tied["root"] / "adapter", "-o",
                                    out_dir / "model.safetensors", "--json")
    assert rc == 0, stderr
    assert '"match": "tied"' in json.dumps(json.loads(stdout)), "the report names the tie"
    shutil.copy(tied["root"] / "st" / "config.json", out_dir / "config.json")
    loaded = transformers.LlamaForCausalLM.from_pretrained(out_dir).eval()
    np.testing.assert_allclose(loaded.model.embed_tokens.weight.detach().numpy(),
                               tied["merged_embedding"], atol=1e-6)
    diff = float(np.abs(logits(loaded) - tied["merged_logits"]).max())
    report_figure(f"tied LoRA, {source} + config.json: max |logits - PEFT| {diff:.2e}")
    assert diff <= LOGITS_TOL, diff


def test_onnx_transposed_copy_gets_the_merge_too(tied, run_qforge, ort_run, tmp_path,
                                                 report_figure):
    out = tmp_path / "merged.onnx"
    rc, stdout, stderr = run_qforge("convert", tied["root"] / "base.onnx", "--lora",
                                    tied["root"] / "adapter", "-o", out, "--json")
    assert rc == 0, stderr
    assert '"how": "transposed copy"' in json.dumps(json.loads(stdout)), "the report names the tie"
    (got,) = ort_run(out, {"input_ids": np.array(IDS, dtype=np.int64)})
    diff = float(np.abs(got - tied["merged_logits"]).max())
    report_figure(f"tied LoRA, ONNX base (transposed copy): max |logits - PEFT| {diff:.2e}")
    assert diff <= LOGITS_TOL, diff


def test_modules_to_save_of_a_tied_head_is_refused(tied, run_qforge, tmp_path):
    model = tied_llama()
    cfg = peft.LoraConfig(r=2, lora_alpha=4, init_lora_weights=False, target_modules=["q_proj"],
                          modules_to_save=["lm_head"])
    adapted = peft.get_peft_model(model, cfg)
    adapted.save_pretrained(tmp_path / "mts")
    out = tmp_path / "merged.safetensors"
    rc, _, stderr = run_qforge("convert", tied["root"] / "st" / "model.safetensors", "--lora",
                               tmp_path / "mts", "-o", out)
    assert rc == 4, stderr
    assert "modules_to_save" in stderr and "tie_word_embeddings=False" in stderr
    assert not out.exists()
