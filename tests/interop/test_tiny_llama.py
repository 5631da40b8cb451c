"""4-bit weight quantization judged on a tiny Llama that has learned something.

The model (tests/interop/fixtures/tiny_llama.py) is trained on standard-library docstrings and
carries injected outlier channels; every method is judged by the mean per-token KL divergence of
its next-token distribution from the float model's on held-out text, with perplexity beside it
(perplexity swings by a few percent either way on such a model; KL does not). The references:
a numpy round-to-nearest (llm_metrics) and llmcompressor's GPTQ and AWQ (peer_llmcompressor, in
the peers' venv). qforge's own RTN / AWQ / GPTQ are held to both once `qforge convert` takes a
model folder with --w4-method.
"""
from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import llm_metrics  # noqa: E402
import peer_llmcompressor  # noqa: E402
import tiny_llama as fixture_script  # noqa: E402
from fixture_cache import FIXTURES_DIR, build_once, cache_dir  # noqa: E402

BLOCKS = (128, 32)
# The float model's held-out perplexity must be this far below the vocabulary size (an untrained
# model sits near it).
LEARNED_PPL_FRACTION = 0.3


@pytest.fixture(scope="module")
def heldout(tiny_llama):
    return llm_metrics.load_eval_set(tiny_llama / "heldout.npz")


@pytest.fixture(scope="module")
def float_state(tiny_llama):
    return llm_metrics._read_safetensors(tiny_llama)


@pytest.fixture(scope="module")
def float_logits(tiny_llama, float_state, heldout):
    model = llm_metrics.model_from_state_dict(tiny_llama, float_state)
    return llm_metrics.model_logits(model, *heldout)


@pytest.fixture(scope="module")
def rtn_rows(tiny_llama, float_state, float_logits, heldout):
    """{block: KL/perplexity of the numpy RTN reference}."""
    rows = {}
    for block in BLOCKS:
        model = llm_metrics.model_from_state_dict(
            tiny_llama, llm_metrics.rtn_state_dict(float_state, block))
        rows[block] = llm_metrics.kl_and_perplexity(
            float_logits, llm_metrics.model_logits(model, *heldout), *heldout)
    return rows


@pytest.fixture(scope="module")
def peer_rows(tiny_llama, tmp_path_factory, float_logits, heldout):
    """{config: KL, perplexity, wall time, peak RSS} of llmcompressor, made once per run (or
    reused from $QFORGE_FIXTURE_CACHE)."""
    why = peer_llmcompressor.peers_missing()
    if why:
        pytest.skip(why)
    folder = cache_dir(
        tmp_path_factory, "tiny_llama_peer", FIXTURES_DIR / "tiny_llama.py",
        peer_llmcompressor.__file__, extra=str(peer_llmcompressor.peers_python()))
    folder = build_once(folder, lambda out: peer_llmcompressor.run(
        tiny_llama, tiny_llama / "calib.npz", out))
    results = json.loads((folder / "results.json").read_text())
    rows = {}
    for config, row in results.items():
        rows[config] = {**row, **peer_llmcompressor.evaluate(folder / config, heldout,
                                                              float_logits)}
    return rows


def table(float_ppl: float, rows: dict[str, dict]) -> list[str]:
    lines = [f"{'tiny Llama W4A16':<28} {'KL (nats/token)':>16} {'ppl':>8} {'ppl vs float':>13}"
             f" {'wall s':>7} {'RSS MiB':>8}",
             f"{'float':<28} {0.0:>16.5f} {float_ppl:>8.3f} {'':>13} {'':>7} {'':>8}"]
    for name, r in rows.items():
        wall = f"{r['wall_s']:.1f}" if "wall_s" in r else ""
        rss = f"{r['peak_rss_mib']:.0f}" if "peak_rss_mib" in r else ""
        lines.append(f"{name:<28} {r['kl']:>16.5f} {r['ppl']:>8.3f} "
                     f"{100 * (r['ppl'] / float_ppl - 1):>+12.2f}% {wall:>7} {rss:>8}")
    return lines


def report(report_figure, lines: list[str]) -> None:
    print("\n" + "\n".join(lines))
    for line in lines:
        report_figure(line)


# --- the fixture --------------------------------------------------------------------------------


def test_fixture_is_deterministic(tiny_llama, tmp_path):
    """Two short builds in fresh folders give the same bytes, and the corpus, tokenizer and
    token splits are those of the full fixture (they do not depend on the training length)."""
    digests = []
    for name in ("a", "b"):
        fixture_script.build(tmp_path / name, steps=2)
        digests.append(fixture_script.digest(tmp_path / name))
    assert digests[0] == digests[1]
    full = fixture_script.digest(tiny_llama)
    for name in ("tokenizer.json", "tokenizer_config.json", "calib.npz", "heldout.npz"):
        assert digests[0][name] == full[name], name
    assert digests[0]["model.safetensors"] != full["model.safetensors"]


def test_outlier_injection_keeps_float_logits(tiny_llama, float_state, heldout):
    """The outlier columns stand out of their weights, and undoing the injection (norm weight up,
    columns down) changes the float logits by at most 1e-4 relative."""
    outliers = json.loads((tiny_llama / "fixture_summary.json").read_text())["outliers"]
    targets = {"input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
               "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj")}
    undone = {k: v.copy() for k, v in float_state.items()}
    assert len(outliers) == 2 * 4
    for norm, pairs in outliers.items():
        layer, _, kind = norm.rpartition(".")
        for channel, factor in pairs:
            assert fixture_script.OUTLIER_MIN <= factor <= fixture_script.OUTLIER_MAX
            undone[f"{norm}.weight"][channel] *= factor
            for target in targets[kind]:
                w = float_state[f"{layer}.{target}.weight"]
                col_amax = np.abs(w).max(axis=0)
                assert col_amax[channel] > 4 * np.median(col_amax), (target, channel)
                undone[f"{layer}.{target}.weight"][:, channel] /= factor
    ids, mask = heldout[0][:8], heldout[1][:8]
    with_outliers = llm_metrics.model_logits(
        llm_metrics.model_from_state_dict(tiny_llama, float_state), ids, mask)
    without = llm_metrics.model_logits(
        llm_metrics.model_from_state_dict(tiny_llama, undone), ids, mask)
    rel = np.abs(with_outliers - without).max() / np.abs(without).max()
    assert rel <= fixture_script.LOGITS_RTOL


def test_model_has_learned(tiny_llama, float_logits, heldout, report_figure):
    """Held-out perplexity far below the vocabulary size, and far below an untrained model's."""
    ppl = llm_metrics.perplexity(float_logits, *heldout)
    torch.manual_seed(0)
    untrained = fixture_script.make_model(torch, transformers).eval()
    ppl_untrained = llm_metrics.perplexity(
        llm_metrics.model_logits(untrained, *heldout), *heldout)
    summary = json.loads((tiny_llama / "fixture_summary.json").read_text())
    report_figure(f"tiny Llama: {summary['params']} parameters, {summary['steps']} steps in "
                  f"{summary['seconds_train']:.0f} s (Python {summary['python']}, torch "
                  f"{summary['torch']}); held-out perplexity {ppl:.2f}, untrained "
                  f"{ppl_untrained:.1f}, vocabulary {fixture_script.VOCAB}")
    assert ppl < LEARNED_PPL_FRACTION * fixture_script.VOCAB
    assert ppl < 0.25 * ppl_untrained


# --- the metric and the loader ------------------------------------------------------------------


def test_pack_quantized_loader_reads_back_rtn(tiny_llama, float_state, tmp_path):
    """RTN written as a pack-quantized folder loads back as exactly the RTN weights."""
    llm_metrics.write_pack_quantized(tiny_llama, tmp_path / "rtn", 32)
    got = llm_metrics.pack_quantized_state_dict(tmp_path / "rtn")
    want = llm_metrics.rtn_state_dict(float_state, 32)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert not np.array_equal(want["model.layers.0.mlp.down_proj.weight"],
                              float_state["model.layers.0.mlp.down_proj.weight"])


def test_rtn_kl_is_positive_and_finer_blocks_help(rtn_rows, float_logits, heldout,
                                                 report_figure):
    ppl = llm_metrics.perplexity(float_logits, *heldout)
    report(report_figure, table(ppl, {f"numpy RTN sym g{b}": r for b, r in rtn_rows.items()}))
    for block, row in rtn_rows.items():
        assert math.isfinite(row["kl"]) and row["kl"] > 0, block
    assert rtn_rows[32]["kl"] < rtn_rows[128]["kl"]


# --- the peer -----------------------------------------------------------------------------------


def test_peer_gptq_and_awq_beat_rtn(peer_rows, rtn_rows, float_logits, heldout, report_figure):
    ppl = llm_metrics.perplexity(float_logits, *heldout)
    rows = {f"numpy RTN sym g{b}": r for b, r in rtn_rows.items()}
    rows.update({f"llmcompressor {c}": r for c, r in peer_rows.items()})
    report(report_figure, table(ppl, rows))
    for config, row in peer_rows.items():
        _, _, block = peer_llmcompressor.CONFIGS[config]
        assert row["kl"] < rtn_rows[block]["kl"], config


# --- qforge -------------------------------------------------------------------------------------

QFORGE_METHODS = ("rtn", "awq", "gptq")


@pytest.fixture(scope="module")
def qforge_folder_methods(run_qforge):
    """Skips unless `qforge convert --help` lists --w4-method with awq and gptq and names the
    compressed-tensors output of a model folder (--w4-method alone has long existed for ONNX
    models)."""
    code, out, err = run_qforge("convert", "--help")
    text = out + err
    needed = ("--w4-method", "--block-size", "--calib", "awq", "gptq")
    folder_output = "compressed-tensors" in text or "pack-quantized" in text
    if code != 0 or not all(flag in text for flag in needed) or not folder_output:
        pytest.skip("qforge convert of a model folder with --w4-method awq/gptq not available "
                    "in this build")


def test_qforge_awq_and_gptq_beat_rtn_and_peer(qforge_folder_methods, run_qforge, tiny_llama,
                                               tmp_path, float_logits, heldout, peer_rows,
                                               report_figure):
    rows = {}
    for block in BLOCKS:
        for method in QFORGE_METHODS:
            out = tmp_path / f"{method}-{block}"
            calib = () if method == "rtn" else ("--calib", tiny_llama / "calib.npz")
            start = time.perf_counter()
            code, stdout, stderr = run_qforge(
                "convert", tiny_llama, "--quant", "w4a16", "--w4-method", method,
                "--block-size", block, *calib, "-o", out)
            wall = time.perf_counter() - start
            assert code == 0, f"{method} block {block}: {stderr}"
            groups = json.loads((out / "config.json").read_text())["quantization_config"][
                "config_groups"]
            assert len(groups) == 1, f"{method} block {block}: {sorted(groups)}"
            weights = next(iter(groups.values()))["weights"]
            assert weights["group_size"] == block
            model = llm_metrics.load_pack_quantized(out)
            rows[(method, block)] = {
                **llm_metrics.kl_and_perplexity(
                    float_logits, llm_metrics.model_logits(model, *heldout), *heldout),
                "symmetric": weights["symmetric"], "wall_s": wall}
    ppl = llm_metrics.perplexity(float_logits, *heldout)
    named = {f"qforge {m} g{b}": r for (m, b), r in rows.items()}
    named.update({f"llmcompressor {c}": r for c, r in peer_rows.items()})
    report(report_figure, table(ppl, named))
    for block in BLOCKS:
        rtn = rows[("rtn", block)]["kl"]
        for method in ("awq", "gptq"):
            row = rows[(method, block)]
            sym = "sym" if row["symmetric"] else "asym"
            peer = peer_rows[f"{method}-{sym}-{block}"]["kl"]
            assert row["kl"] < rtn, f"{method} g{block}: KL {row['kl']:.5f} vs RTN {rtn:.5f}"
            assert row["kl"] <= peer, (f"{method} g{block}: KL {row['kl']:.5f} vs "
                                       f"llmcompressor {peer:.5f}")
