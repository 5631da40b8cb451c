"""Hugging Face model folders as qforge input: tiny Llama and Qwen3 (head_dim != hidden/heads)
models made by transformers with fixed seeds and saved with save_pretrained (one file, sharded,
and as pytorch_model.bin), fp32 and bf16. `inspect --json` reports what config.json says and
what the weights hold; `convert DIR -o OUT/` writes a folder that from_pretrained loads to the
same logits; a broken or missing config.json is refused with nothing written."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess

import pytest
import torch

transformers = pytest.importorskip("transformers")

IDS = torch.tensor([[1, 5, 9, 200, 3, 77]])


def make_model(family: str, dtype: torch.dtype):
    torch.manual_seed(0)
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    if family == "llama":
        cfg = transformers.LlamaConfig(**common, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3Config(**common, head_dim=32, tie_word_embeddings=True)
        model = transformers.Qwen3ForCausalLM(cfg)
    return model.to(dtype).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{(family, dtype, layout): (model, folder)} for every case the tests use."""
    root = tmp_path_factory.mktemp("hf_folders")
    out = {}
    for family in ("llama", "qwen3"):
        for dtype in (torch.float32, torch.bfloat16):
            model = make_model(family, dtype)
            name = f"{family}_{str(dtype).split('.')[-1]}"
            model.save_pretrained(root / f"{name}_single")
            model.save_pretrained(root / f"{name}_sharded", max_shard_size="50KB")
            out[(family, dtype, "single")] = (model, root / f"{name}_single")
            out[(family, dtype, "sharded")] = (model, root / f"{name}_sharded")
    # Tokenizer files travel unchanged (their bytes only matter); other files stay behind.
    side = root / "llama_float32_single"
    (side / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    (side / "tokenizer_config.json").write_text('{"model_max_length": 128}')
    (side / "special_tokens_map.json").write_text('{"bos_token": "<s>"}')
    (side / "merges.txt").write_text("#version: 0.2\na b\n")
    (side / "tokenizer.model").write_bytes(bytes(range(256)))
    (side / "notes.txt").write_text("not a model file")
    # pytorch_model.bin, as transformers 4 wrote with safe_serialization=False (transformers 5
    # always writes safetensors, so the file is written here with torch.save).
    model = make_model("llama", torch.float32)
    bin_dir = root / "llama_bin"
    model.save_pretrained(bin_dir)
    os.remove(bin_dir / "model.safetensors")
    torch.save(model.state_dict(), bin_dir / "pytorch_model.bin")
    out[("llama", torch.float32, "bin")] = (model, bin_dir)
    return out


CASES = [("llama", torch.float32, "single"), ("llama", torch.bfloat16, "sharded"),
         ("qwen3", torch.float32, "sharded"), ("qwen3", torch.bfloat16, "single"),
         ("llama", torch.float32, "bin")]


def tree_digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{str(c[1])[6:]}-{c[2]}")
def test_inspect_reports_config_and_weights(case, folders, run_qforge):
    model, folder = folders[case]
    rc, stdout, stderr = run_qforge("inspect", folder, "--json")
    assert rc == 0, stderr
    info = json.loads(stdout)
    assert info["format"] == "hf-folder"
    hf = info["hf"]
    cfg = model.config
    assert hf["architectures"] == cfg.architectures
    assert hf["model_type"] == cfg.model_type
    assert hf["num_hidden_layers"] == cfg.num_hidden_layers
    assert hf["hidden_size"] == cfg.hidden_size
    assert hf["intermediate_size"] == cfg.intermediate_size
    assert hf["num_attention_heads"] == cfg.num_attention_heads
    assert hf["num_key_value_heads"] == cfg.num_key_value_heads
    assert hf["head_dim"] == (32 if case[0] == "qwen3" else 16)
    assert hf["vocab_size"] == cfg.vocab_size
    assert hf["tie_word_embeddings"] == cfg.tie_word_embeddings
    assert hf["lm_head_stored"] == (not cfg.tie_word_embeddings)
    assert hf["config_dtype"] == str(case[1]).split(".")[-1]
    assert hf["stored_dtypes"] == ["bf16" if case[1] == torch.bfloat16 else "f32"]
    expected_format = {"single": "safetensors", "sharded": "safetensors-index",
                       "bin": "torch"}[case[2]]
    assert hf["weights_format"] == expected_format
    # The model's own count: tied lm_head counted once, as save_pretrained stores it.
    assert info["parameters"]["count"] == model.num_parameters()
    assert info["parameters"]["bytes"] == model.num_parameters() * case[1].itemsize
    rc, text, stderr = run_qforge("inspect", folder)
    assert rc == 0, stderr
    assert f"heads 4, kv heads 2, head_dim {hf['head_dim']}" in text


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{str(c[1])[6:]}-{c[2]}")
def test_convert_folder_loads_with_the_same_logits(case, folders, run_qforge, tmp_path):
    model, folder = folders[case]
    before = tree_digest(folder)
    out = tmp_path / "out"
    rc, _, stderr = run_qforge("convert", folder, "-o", f"{out}/")
    assert rc == 0, stderr
    assert tree_digest(folder) == before  # input untouched
    assert (out / "model.safetensors").exists()  # 5 GB default: one file
    assert not (out / "model.safetensors.index.json").exists()
    assert (out / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    assert (out / "generation_config.json").read_bytes() == \
        (folder / "generation_config.json").read_bytes()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "merges.txt", "tokenizer.model"):
        assert (out / name).exists() == (folder / name).exists(), name
        if (folder / name).exists():
            assert (out / name).read_bytes() == (folder / name).read_bytes(), name
    assert not (out / "notes.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
    # The original is loaded the same way: model.to(bf16) also rounds the rotary inv_freq
    # buffer, which from_pretrained keeps in fp32, so the in-memory model is not the reference.
    original = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=case[1]).eval()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=case[1]).eval()
    assert loaded.state_dict().keys() == model.state_dict().keys()
    for k, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], t), k
    with torch.no_grad():
        a = original(IDS).logits
        b = loaded(IDS).logits
    assert torch.equal(a, b), float((a - b).abs().max())
    # Same inputs, same bytes.
    rc, _, stderr = run_qforge("convert", folder, "-o", tmp_path / "again")
    assert rc == 0, stderr
    assert tree_digest(tmp_path / "again") == tree_digest(out)


def test_resharded_folder_loads(folders, run_qforge, tmp_path):
    model, folder = folders[("qwen3", torch.float32, "single")]
    out = tmp_path / "resharded"
    rc, _, stderr = run_qforge("convert", folder, "-o", out, "--max-shard-size", "40KB")
    assert rc == 0, stderr
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, loaded(IDS).logits)


def test_existing_output_folder_needs_overwrite(folders, run_qforge, tmp_path):
    _, folder = folders[("llama", torch.float32, "single")]
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc, _, stderr = run_qforge("convert", folder, "-o", out)
    assert rc == 2, stderr
    assert "--overwrite" in stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    rc, _, stderr = run_qforge("convert", folder, "-o", out, "--overwrite")
    assert rc == 0, stderr
    assert (out / "model.safetensors").exists() and not (out / "keep.txt").exists()


@pytest.mark.parametrize("config,code,words", [
    (None, 5, "config.json"),
    ("{not json", 3, "config.json"),
    ('{"hidden_size": "64"}', 3, "hidden_size"),
])
def test_broken_config_is_refused_and_nothing_written(config, code, words, folders, run_qforge,
                                                      tmp_path):
    _, folder = folders[("llama", torch.float32, "single")]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    if config is not None:
        (broken / "config.json").write_text(config)
    for args in (["inspect", broken], ["convert", broken, "-o", tmp_path / "out"]):
        rc, stdout, stderr = run_qforge(*args)
        assert rc == code, stderr
        assert words in stderr
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


FLUSHES = re.compile(r"\b(?:fsync|fdatasync)\(\d+<([^>]+)>\) = 0")
RENAME = re.compile(r'\brename(?:at2?)?\((?:[^"]*)"([^"]+)",(?:[^"]*)"([^"]+)"')


@pytest.mark.skipif(shutil.which("strace") is None,
                    reason="strace is not installed (scripts/setup.sh installs it): the test "
                           "reads the flushes from its trace of the system calls")
@pytest.mark.parametrize("extra", [[], ["--max-shard-size", "40KB"],
                                   ["--quant", "w4a16", "--block-size", "32"]],
                         ids=["one-file", "sharded", "w4a16"])
def test_every_file_of_a_folder_is_on_disk_before_the_folder_is_renamed(extra, folders,
                                                                      qforge_bin, tmp_path):
    """A folder is written whole or not at all: each of its files is flushed (fsync) while it
    still lies in the temporary folder, before the rename that makes the folder visible, so
    that after a crash the folder never holds a file cut short."""
    _, folder = folders[("llama", torch.float32, "single")]
    out = tmp_path / "out"
    trace = tmp_path / "trace.txt"
    proc = subprocess.run(["strace", "-f", "-y", "-qq", "-e",
                           "trace=fsync,fdatasync,rename,renameat,renameat2", "-o", str(trace),
                           str(qforge_bin), "-q", "convert", str(folder), "-o", str(out), *extra],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    lines = trace.read_text().splitlines()
    into_place = [i for i, line in enumerate(lines)
                  if (m := RENAME.search(line)) and os.path.realpath(m.group(2)) ==
                  os.path.realpath(out) and ".tmp-" in m.group(1)]
    assert len(into_place) == 1, "\n".join(lines[-20:])
    temp = os.path.realpath(RENAME.search(lines[into_place[0]]).group(1))
    flushed = {os.path.relpath(m.group(1), temp) for line in lines[:into_place[0]]
               if (m := FLUSHES.search(line)) and m.group(1).startswith(temp + os.sep)}
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert len(written) >= 3, written
    assert written <= flushed, f"not flushed before the rename: {sorted(written - flushed)}"
