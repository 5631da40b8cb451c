#!/usr/bin/env python3
"""NumPy reference of qforge's threshold searches (kernels/calib.h), written from the contract
in that header, for tests/unit/quant/calib/test_calib_python_reference.cpp.

Usage: calib_reference.py HIST_FILE OUT_JSON
HIST_FILE holds the histogram counts, whitespace-separated. OUT_JSON gets the entropy and MSE
scores of every candidate (null for +inf), the candidates chosen (ties to the larger), and percentile cuts.
"""
import json
import sys

import numpy as np

LEVELS = 128
QUANT_MAX = 127


def entropy_scores(h):
    h = h.copy()
    h[0] = h[1]  # TensorRT's reference: bin 0 counts as bin 1
    n = h.size
    scores = []
    for i in range(LEVELS, n + 1):
        p = h[:i].copy()
        p[-1] += h[i:].sum()  # outliers folded into the last kept bin
        level = (np.arange(i) * LEVELS) // i
        level_sum = np.bincount(level, weights=h[:i], minlength=LEVELS)  # without outliers
        nonzero = h[:i] > 0  # the histogram's own non-empty bins
        level_nonzero = np.bincount(level, weights=nonzero.astype(np.float64), minlength=LEVELS)
        q = np.where(nonzero, level_sum[level] / np.maximum(level_nonzero[level], 1), 0.0)
        if not (q > 0).any() or ((p > 0) & (q == 0)).any():
            scores.append(float("inf"))
            continue
        ps = p / p.sum()
        qs = q / q.sum()
        inside = ps > 0
        scores.append(float(np.sum(ps[inside] * np.log(ps[inside] / qs[inside]))))
    return scores


def segment(a, b, c):
    return ((b - c) ** 3 - (a - c) ** 3) / 3


def mse_scores(h):
    n = h.size
    lo = np.arange(n, dtype=np.float64)
    hi = lo + 1
    total = h.sum()
    scores = []
    for i in range(QUANT_MAX + 1, n + 1):
        t = float(i)
        step = t / QUANT_MAX
        k = np.minimum(np.floor(lo / step + 0.5), QUANT_MAX)
        edge = (k + 0.5) * step
        inside = hi <= t
        split = inside & (edge < hi)
        err = np.where(inside, segment(lo, np.where(split, edge, hi), k * step), segment(lo, hi, t))
        err = err + np.where(split, segment(edge, hi, (k + 1) * step), 0.0)
        scores.append(float((h * err).sum() / total))
    return scores


def last_argmin(scores):
    s = np.asarray(scores)
    return int(s.size - 1 - np.argmin(s[::-1]))


def percentile(h, pct):
    target = pct / 100 * h.sum()
    below = np.concatenate([[0.0], np.cumsum(h)[:-1]])
    j = int(np.nonzero((h > 0) & (below + h >= target))[0][0])
    return j + min(max((target - below[j]) / h[j], 0.0), 1.0)


def main():
    h = np.loadtxt(sys.argv[1], dtype=np.float64).ravel()
    ent = entropy_scores(h)
    mse = mse_scores(h)
    out = {
        "entropy_scores": [s if np.isfinite(s) else None for s in ent],  # null: +inf
        "entropy_kept": LEVELS + last_argmin(ent),
        "mse_scores": mse,
        "mse_kept": QUANT_MAX + 1 + last_argmin(mse),
        "percentile": {str(p): percentile(h, p) for p in (50.0, 99.0, 99.9, 99.99, 100.0)},
    }
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
