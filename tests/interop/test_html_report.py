"""The HTML report (`--report out.html` on convert, calibrate and compare; `qforge report
report.json -o out.html`): its charts have their elements, its tables hold the numbers that
`--json` prints, its histograms and thresholds are calibration's own, and it renders in a real
browser (Debian's chromium, headless) to a page that is not blank and logs no error.

The browser check reads chromium's console on stderr (--enable-logging=stderr: an uncaught
error prints an INFO:CONSOLE line) and the DOM after load (--dump-dom): the page's script marks
<body data-report="ready"> only once it has parsed the embedded data. test_browser_check_sees_errors
proves both signals fire on a page with a deliberate error.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

CHROMIUM_TIMEOUT_S = 120
METHODS = ["minmax", "percentile", "entropy", "mse"]


# --- reading the report -------------------------------------------------------------------------


class ReportParser(HTMLParser):
    """Charts (each <svg class="chart ...">: its rect/circle/text/g elements by class), tables by
    data-table (rows of (data-v or None, text) cells), and script blocks."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.charts: list[dict] = []
        self.tables: dict[str, list[list[tuple]]] = {}
        self.scripts: list[tuple[dict, str]] = []
        self.body_attrs: dict = {}
        self._svg = None
        self._table = None
        self._cell = None
        self._text_class = None
        self._script = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class", "") or ""
        if tag == "body":
            self.body_attrs = a
        if tag == "svg" and "chart" in cls.split():
            self._svg = {"class": cls, "rect": [], "circle": [], "text": [], "g": [], "line": [],
                         "polyline": 0}
            self.charts.append(self._svg)
        elif self._svg is not None and tag in ("rect", "circle", "g", "line"):
            self._svg[tag].append(cls)
        elif self._svg is not None and tag == "polyline":
            self._svg["polyline"] += 1
        elif self._svg is not None and tag == "text":
            self._text_class = cls
            self._svg["text"].append([cls, ""])
        if tag == "table" and "data-table" in a:
            self._table = a["data-table"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td",) and self._table is not None:
            self._cell = [a.get("data-v"), ""]
        if tag == "script":
            self._script = [a, ""]

    def handle_endtag(self, tag):
        if tag == "svg":
            self._svg = None
        elif tag == "text":
            self._text_class = None
        elif tag == "table":
            self._table = None
        elif tag == "td" and self._cell is not None:
            self.tables[self._table][-1].append(tuple(self._cell))
            self._cell = None
        elif tag == "script" and self._script is not None:
            self.scripts.append(tuple(self._script))
            self._script = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data
        if self._svg is not None and self._text_class is not None:
            self._svg["text"][-1][1] += data
        if self._script is not None:
            self._script[1] += data


def parse_report(path: Path) -> ReportParser:
    p = ReportParser()
    p.feed(path.read_text(encoding="utf-8"))
    p.close()
    return p


def rows(report: ReportParser, table: str) -> list[list[tuple]]:
    """The table's data rows (the header row has no <td>)."""
    return [r for r in report.tables[table] if r]


def value(cell) -> float:
    return float(cell[0])


def json_number(v) -> float:
    return float(v)  # numbers, or "inf" / "-inf" / "nan" (README "JSON output")


def charts(report: ReportParser, kind: str) -> list[dict]:
    return [c for c in report.charts if kind in c["class"].split()]


def count_class(items: list, cls: str) -> int:
    return sum(1 for c in items if cls in (c if isinstance(c, str) else c[0]).split())


def check_chart_basics(chart: dict):
    """Every chart has bars or points, an x axis with tick labels and an axis title."""
    assert count_class(chart["g"], "x-axis") == 1
    assert count_class(chart["text"], "tick-label") >= 2
    assert count_class(chart["text"], "axis-label") >= 1
    assert count_class(chart["text"], "chart-title") == 1


# --- the browser ---------------------------------------------------------------------------------


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium is not installed: scripts/setup.sh installs Debian's chromium "
                "(apt-get install chromium)")


def chromium(args: list[str], page: Path) -> subprocess.CompletedProcess:
    base = [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-dev-shm-usage", "--no-first-run", "--enable-logging=stderr", "--v=0"]
    try:
        return subprocess.run(base + args + [page.resolve().as_uri()], capture_output=True,
                              text=True, timeout=CHROMIUM_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.skip(f"chromium did not finish within {CHROMIUM_TIMEOUT_S} s here")


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def render(page: Path, png: Path) -> tuple[list[str], str]:
    """Renders `page` to `png` (1200 x 3000) and loads it once more for its DOM. Returns the
    console lines of both loads and the DOM."""
    shot = chromium(["--hide-scrollbars", f"--screenshot={png}", "--window-size=1200,3000"], page)
    if not png.is_file():
        last = (shot.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"headless chromium cannot run here (exit {shot.returncode}): {last}")
    dom = chromium(["--dump-dom"], page)
    return console_errors(shot.stderr) + console_errors(dom.stderr), dom.stdout


def png_pixels(path: Path, max_rows: int) -> np.ndarray:
    """The first `max_rows` rows of an 8-bit RGB or RGBA, non-interlaced PNG (what chromium
    writes) as [rows, width, 3]."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    c = 3 if colour == 2 else 4
    stride = width * c
    raw = zlib.decompress(idat)
    rows_out = []
    prev = [0] * stride
    for y in range(min(height, max_rows)):
        f = raw[y * (stride + 1)]
        line = raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)]
        if f == 0:
            cur = list(line)
        elif f == 2:
            cur = [(a + b) & 0xFF for a, b in zip(line, prev)]
        else:  # Sub, Average, Paeth: each byte depends on the one to its left
            cur = [0] * stride
            for i in range(stride):
                left = cur[i - c] if i >= c else 0
                up = prev[i]
                if f == 1:
                    pred = left
                elif f == 3:
                    pred = (left + up) >> 1
                else:
                    ul = prev[i - c] if i >= c else 0
                    p = left + up - ul
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                    pred = left if pa <= pb and pa <= pc else (up if pb <= pc else ul)
                cur[i] = (line[i] + pred) & 0xFF
        rows_out.append(cur)
        prev = cur
    return np.array(rows_out, dtype=np.uint8).reshape(len(rows_out), width, c)[:, :, :3]


def check_renders(page: Path, tmp_path: Path):
    png = tmp_path / (page.stem + ".png")
    errors, dom = render(page, png)
    assert errors == [], errors
    assert re.search(r'<body[^>]*data-report="ready"', dom), "the page's script did not finish"
    # The top of the page (title, tables, the first charts) is far from one colour: text, and
    # the charts' coloured marks.
    pixels = png_pixels(png, max_rows=1500)
    assert pixels.shape == (1500, 1200, 3)
    colours = np.unique(pixels.reshape(-1, 3), axis=0)
    assert len(colours) > 20, f"the screenshot has only {len(colours)} colours"
    spread = pixels.max(axis=2).astype(int) - pixels.min(axis=2).astype(int)
    assert np.count_nonzero(spread > 80) > 500, "no coloured chart marks in the screenshot"


# --- the runs ------------------------------------------------------------------------------------


def run_ok(run_qforge, *args):
    code, out, err = run_qforge("--json", *args)
    assert code == 0, err
    return json.loads(out)


def pass_named(result, name):
    return next(p for p in result["passes"] if p["pass"] == name)


def check_histograms(report: ReportParser, calib_rows: list[dict], chosen: str):
    """One histogram chart per calibrated tensor with a range: 128 bars, a marker per method,
    the chosen method's threshold equal to the table's amax."""
    by_name = {r["name"]: r for r in calib_rows}
    hist = charts(report, "histogram-chart")
    with_range = [r for r in calib_rows if r["observed_amax"] > 0]
    assert len(hist) == len(with_range) > 0
    for chart in hist:
        check_chart_basics(chart)
        assert count_class(chart["rect"], "bar") == 128
        assert count_class(chart["g"], "threshold") == 4
        assert count_class(chart["g"], "chosen") == 1
        assert count_class(chart["g"], "y-axis") == 1
    names = [n for n in sorted(by_name) if by_name[n]["observed_amax"] > 0]
    for i, name in enumerate(names, start=1):
        t = rows(report, f"hist-{i}-thresholds")
        assert [r[0][1].split()[0] for r in t] == METHODS
        used = [r for r in t if r[3][1] == "yes"]
        assert len(used) == 1 and used[0][0][1].split()[0] == chosen
        assert value(used[0][1]) == by_name[name]["amax"], name
        assert value(t[0][1]) == by_name[name]["observed_amax"], name  # minmax: |x| max
        bars = rows(report, f"hist-{i}-bars")
        assert len(bars) == 128
        # The histogram's top edge: the largest |x| lies in its last bin, and at least 1025 of
        # its power-of-two bins (of 2048) cover [0, amax] (quant/calib/observer.h).
        amax = by_name[name]["observed_amax"]
        assert amax * (1 - 1e-6) <= value(bars[-1][1]) <= amax * 1025 / 1024 * (1 + 1e-6), name
    return names


def test_convert_static_int8_report(run_qforge, sample_model, sample_dir, tmp_path):
    page = tmp_path / "int8.html"
    out = tmp_path / "int8.onnx"
    result = run_ok(run_qforge, "convert", sample_model, "-o", out, "--quant", "int8", "--calib",
                    sample_dir / "calib.npz", "--report", page)
    assert result["report"] == str(page)
    report = parse_report(page)

    # Weight error: the table holds every quantized weight with --json's SQNR, worst first.
    weights = pass_named(result, "static-int8")["stats"]["tensors"]
    table = rows(report, "errors-1")
    assert len(table) == len(weights) == 4
    sqnr = {w["name"]: json_number(w["sqnr_db"]) for w in weights}
    assert {r[1][1]: value(r[2]) for r in table} == sqnr
    assert [value(r[2]) for r in table] == sorted(sqnr.values())
    bar_chart = charts(report, "bar-chart")[0]
    check_chart_basics(bar_chart)
    assert count_class(bar_chart["rect"], "bar") == 4
    assert count_class(bar_chart["text"], "label") == 4

    # Calibration: the ranges table is --json's, and every tensor has its histogram.
    calib = pass_named(result, "calibrate")["stats"]["tensors"]
    ranges = rows(report, "ranges")
    assert [r[0][1] for r in ranges] == [t["name"] for t in calib]
    assert [value(r[4]) for r in ranges] == [t["amax"] for t in calib]
    check_histograms(report, calib, "entropy")

    # Same inputs, same bytes.
    first = page.read_bytes()
    run_ok(run_qforge, "convert", sample_model, "-o", out, "--quant", "int8", "--calib",
           sample_dir / "calib.npz", "--report", page, "--threads", "1")
    assert page.read_bytes() == first
    assert b"http" not in first and b" src=" not in first

    check_renders(page, tmp_path)


def test_calibrate_report_thresholds_are_each_methods(run_qforge, sample_model, sample_dir,
                                                      tmp_path):
    """The four thresholds drawn on each histogram are what `calibrate --method M` chooses, and
    the input's histogram is numpy's count of |input| in bins of the least power of two for which
    2048 of them hold amax, up to the last non-empty bin, summed to 128 bars."""
    page = tmp_path / "calib.html"
    result = run_ok(run_qforge, "calibrate", sample_model, "--calib", sample_dir / "calib.npz",
                    "--method", "minmax", "-o", tmp_path / "t.json", "--report", page)
    report = parse_report(page)
    calib = result["calibration"]["tensors"]
    names = check_histograms(report, calib, "minmax")
    for m in ["percentile", "entropy", "mse"]:
        other = run_ok(run_qforge, "calibrate", sample_model, "--calib",
                       sample_dir / "calib.npz", "--method", m, "-o", tmp_path / f"{m}.json")
        amax = {t["name"]: t["amax"] for t in other["calibration"]["tensors"]}
        for i, name in enumerate(names, start=1):
            t = rows(report, f"hist-{i}-thresholds")
            assert value(t[METHODS.index(m)][1]) == amax[name], (m, name)

    x = np.load(sample_dir / "calib.npz")["input"].astype(np.float32)
    amax = float(np.abs(x).max())
    e = -127
    while 2048 * 2.0 ** e <= amax:
        e += 1
    bins = np.floor(np.abs(x).astype(np.float64) * 2.0 ** -e).astype(np.int64)
    counts = np.bincount(bins.ravel())
    n = max(len(counts), 256)
    counts = np.pad(counts, (0, n - len(counts)))
    expected = [int(counts[b * n // 128:(b + 1) * n // 128].sum()) for b in range(128)]
    i = names.index("input") + 1
    assert [int(value(r[2])) for r in rows(report, f"hist-{i}-bars")] == expected
    check_renders(page, tmp_path)


def test_compare_report(run_qforge, sample_model, sample_dir, tmp_path):
    quant = tmp_path / "q.onnx"
    run_ok(run_qforge, "convert", sample_model, "-o", quant, "--quant", "int8", "--calib",
           sample_dir / "calib.npz")
    page = tmp_path / "compare.html"
    result = run_ok(run_qforge, "compare", sample_model, quant, "--data",
                    sample_dir / "eval.npz", "--report", page)
    report = parse_report(page)
    outputs = rows(report, "outputs")
    assert len(outputs) == len(result["outputs"]) == 1
    o = result["outputs"][0]
    assert outputs[0][0][1] == o["name"]
    assert value(outputs[0][1]) == json_number(o["sqnr_db"])
    assert value(outputs[0][2]) == o["cosine"]
    assert value(outputs[0][3]) == o["max_abs_error"]
    assert value(outputs[0][4]) == o["top1_agreement"]
    # Per-layer: --json's order (worst first) and figures, in the table and as bars.
    layers = rows(report, "errors-1")
    assert [r[1][1] for r in layers] == [l["name"] for l in result["layers"]]
    assert [value(r[2]) for r in layers] == [json_number(l["sqnr_db"]) for l in result["layers"]]
    assert [value(r[3]) for r in layers] == [l["cosine"] for l in result["layers"]]
    sqnr_chart, cosine_chart = charts(report, "bar-chart")[:2]
    for chart in (sqnr_chart, cosine_chart):
        check_chart_basics(chart)
        assert count_class(chart["rect"], "bar") == min(60, len(result["layers"]))
    check_renders(page, tmp_path)


@pytest.mark.parametrize("budget_flags, target_text, metric", [
    # the all-int8 CNN already meets it: no sensitivity to measure
    (["--eval", "calib_data/eval.npz", "--max-drop", "0.3"], "target <= 0.3", "top1_drop"),
    # the all-int8 CNN misses it (40.4 dB): sensitivity ranking, then the greedy search
    (["--target-sqnr", "45"], "target >= 45", "sqnr_db"),
])
def test_budget_report(run_qforge, sample_model, sample_dir, tmp_path, budget_flags,
                       target_text, metric):
    page = tmp_path / "budget.html"
    result = run_ok(run_qforge, "convert", sample_model, "-o", tmp_path / "b.onnx", "--quant",
                    "int8", "--calib", sample_dir / "calib.npz", *budget_flags, "--report", page)
    budget = pass_named(result, "budget")["stats"]
    report = parse_report(page)
    layers = rows(report, "budget-layers")
    assert [(r[1][1], r[2][1]) for r in layers] == [(l["name"], l["precision"])
                                                    for l in budget["layers"]]
    ranked = [l for l in budget["layers"] if "sensitivity_rank" in l]
    for r, l in zip(layers, budget["layers"]):
        if "sensitivity_rank" in l:
            assert int(value(r[0])) == l["sensitivity_rank"]
            assert value(r[3]) == l["alone"]["cosine"]
            assert value(r[4]) == json_number(l["alone"]["sqnr_db"])
    search = rows(report, "budget-search")
    assert [(r[0][1], int(value(r[1])), r[2][1] == "yes") for r in search] == \
        [(t["trial"], t["kept"], t["meets"]) for t in budget["search"]]
    assert [value(r[3]) for r in search] == [t["cosine"] for t in budget["search"]]
    assert [value(r[4]) for r in search] == [json_number(t["sqnr_db"]) for t in budget["search"]]

    curve = charts(report, "curve-chart")
    assert len(curve) == 1
    check_chart_basics(curve[0])
    assert len(curve[0]["circle"]) == len(budget["search"])
    assert count_class(curve[0]["circle"], "meets") == sum(t["meets"] for t in budget["search"])
    assert count_class(curve[0]["circle"], "misses") == sum(not t["meets"]
                                                           for t in budget["search"])
    assert count_class(curve[0]["g"], "target") == 1
    assert any(target_text in t[1] for t in curve[0]["text"])
    bar_charts = charts(report, "bar-chart")
    if metric == "sqnr_db":
        assert len(ranked) == len(budget["layers"]) > 0
        ranking = bar_charts[-1]
        check_chart_basics(ranking)
        assert count_class(ranking["rect"], "bar") == len(ranked)
        assert count_class(ranking["rect"], "prec-float") == budget["kept"] > 0
        order = sorted(ranked, key=lambda l: l["sensitivity_rank"])
        labels = [t[1] for t in ranking["text"] if t[0] == "label"]
        assert labels == [l["name"] for l in order]
        values = [t[1] for t in ranking["text"] if t[0] == "value"]
        assert values == [f"{json_number(l['alone']['sqnr_db']):.2f} ({l['precision']})"
                          for l in order]
    else:
        assert ranked == [] and len(bar_charts) == 1  # the weight error chart only
    # The budget calibrated with entropy: its histograms come along.
    check_histograms(report, pass_named(result, "calibrate")["stats"]["tensors"], "entropy")
    check_renders(page, tmp_path)


def test_report_from_a_bundle(run_qforge, sample_model, sample_dir, tmp_path):
    # Without --report the bundle's report.json has no histograms (their threshold searches
    # cost time); `qforge report` still draws the per-layer error.
    plain = tmp_path / "plain.qfb"
    run_ok(run_qforge, "convert", sample_model, "-o", plain, "--quant", "int8",
           "--calib", sample_dir / "calib.npz")
    assert "histograms" not in json.loads((plain / "report.json").read_text())
    run_ok(run_qforge, "report", plain, "-o", tmp_path / "plain.html")
    assert len(rows(parse_report(tmp_path / "plain.html"), "errors-1")) == 4
    bundle = tmp_path / "cnn.qfb"
    result = run_ok(run_qforge, "convert", sample_model, "-o", bundle, "--quant", "int8",
                    "--calib", sample_dir / "calib.npz", "--report", tmp_path / "convert.html")
    page = tmp_path / "bundle.html"
    run_ok(run_qforge, "report", bundle / "report.json", "-o", page)
    report = parse_report(page)
    assert len(rows(report, "errors-1")) == 4
    check_histograms(report, pass_named(result, "calibrate")["stats"]["tensors"], "entropy")
    # The folder names its report.json; the same data gives the same page.
    page2 = tmp_path / "bundle2.html"
    run_ok(run_qforge, "report", bundle, "-o", page2)
    assert page2.read_bytes() == page.read_bytes()
    # The embedded data is the bundle's report.json.
    data = [s for a, s in report.scripts if a.get("type") == "application/json"]
    assert len(data) == 1
    assert json.loads(data[0]) == json.loads((bundle / "report.json").read_text())


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not JSON (byte"),
    ('{"passes": [{"pass": "x", "stats": {"tensors": [{"name": "w", "sqnr_db": true}]}}]}',
     "passes[0].stats.tensors[0].sqnr_db is not a number"),
    ('{"command": "convert"}', "holds no per-layer error, calibration or accuracy budget"),
])
def test_report_refuses_bad_input(run_qforge, tmp_path, content, message):
    src = tmp_path / "report.json"
    src.write_text(content)
    page = tmp_path / "out.html"
    code, out, err = run_qforge("report", src, "-o", page)
    assert code == 3, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert not page.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_report_path_checked_before_work(run_qforge, sample_model, sample_dir, tmp_path):
    out = tmp_path / "q.onnx"
    code, _, err = run_qforge("convert", sample_model, "-o", out, "--quant", "int8", "--calib",
                              sample_dir / "calib.npz", "--report", tmp_path / "no" / "r.html")
    assert code == 5 and "does not exist" in err
    code, _, err = run_qforge("convert", sample_model, "-o", out, "--quant", "int8", "--calib",
                              sample_dir / "calib.npz", "--report", out)
    assert code == 2 and "--report" in err
    assert list(tmp_path.iterdir()) == []


def test_browser_check_sees_errors(run_qforge, sample_model, sample_dir, tmp_path):
    """The browser check fails a page whose script throws: a deliberate error in the page's own
    script, and a data block that is not JSON (what a bad escape would give)."""
    page = tmp_path / "good.html"
    run_ok(run_qforge, "calibrate", sample_model, "--calib", sample_dir / "calib.npz", "-o",
           tmp_path / "t.json", "--report", page)
    html = page.read_text(encoding="utf-8")
    good_errors, good_dom = render(page, tmp_path / "good.png")
    assert good_errors == [] and 'data-report="ready"' in good_dom

    thrown = tmp_path / "thrown.html"
    thrown.write_text(html.replace("(function () {", "(function () { throw new Error('boom');", 1))
    errors, dom = render(thrown, tmp_path / "thrown.png")
    assert any("boom" in e for e in errors), errors
    assert 'data-report="ready"' not in dom

    broken = tmp_path / "broken.html"
    broken.write_text(html.replace('id="qforge-report-data">{', 'id="qforge-report-data">{,', 1))
    errors, dom = render(broken, tmp_path / "broken.png")
    assert any("SyntaxError" in e for e in errors), errors
    assert 'data-report="ready"' not in dom


def test_report_in_a_job_file(run_qforge, sample_model, sample_dir, tmp_path):
    """`report:` in a --config job file is a path beside the file, as `output:` is."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "job.yaml").write_text(
        f"input: {sample_model}\noutput: q.onnx\nquant: int8\n"
        f"calib: {sample_dir / 'calib.npz'}\nreport: q.html\n")
    result = run_ok(run_qforge, "convert", "--config", jobs / "job.yaml")
    assert Path(result["report"]) == jobs / "q.html"
    assert len(rows(parse_report(jobs / "q.html"), "errors-1")) == 4
