"""The sensitivity report: heatmap PNGs, a self-contained HTML page, and that page in a real headless browser."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy_opt.analysis.sensitivity.heatmap import write_heatmap, write_html

pytest.importorskip("matplotlib")

ODD_NAME = "/encoder/layer.0/attn<scores>&mask/MatMul"


def synthetic(count: int, seed: int = 0, exact: int = 8) -> dict[str, Any]:
    """A result shaped like the analyzer's: the ``exact`` highest proxy-ranked nodes evaluated, the rest None."""
    rng = np.random.default_rng(seed)
    ops = ["MatMul", "Gemm", "Conv", "Add"]
    sqnr = rng.uniform(12, 45, count)
    by_proxy = np.argsort(sqnr)  # low SQNR first = most suspicious
    nodes = []
    for i in range(count):
        layer, part = divmod(i, 6)
        name = ODD_NAME if i == 3 else f"/encoder/layer.{layer}/attention/self/block_{part}/projection/MatMul_{i}"
        is_exact = int(np.where(by_proxy == i)[0][0]) < exact
        both = float(rng.gamma(1.5, 0.6)) if is_exact else None
        nodes.append(
            {
                "name": name,
                "op_type": ops[i % len(ops)],
                "order": i,
                "weight_shape": [384, 384 * (1 + i % 4)] if i % 5 else None,
                "macs": 5898240 * (1 + i % 4),
                "mac_share": 1.0 / count,
                "proxy": {"sqnr_db": float(sqnr[i]), "cosine": float(1 - 10 ** (-sqnr[i] / 10))},
                "drop_both": both,
                "drop_weight_only": None if both is None else both * 0.2,
                "drop_activation_only": None if both is None or i % 7 == 0 else both * 0.8,
                "recovered_all_but": None if both is None else both * 1.3 - 0.2,
                "rank": int(np.where(by_proxy == i)[0][0]) + 1,
                "exact": is_exact,
            }
        )
    return {
        "format": "deploy_opt.analysis.sensitivity.analyze/1",
        "model": "minilm",
        "metric": {"name": "cosine", "higher_is_better": True, "fp32": 100.0, "int8": 94.1, "subset_samples": 26},
        "mode": "proxy+topk",
        "top_k": exact,
        "nodes": nodes,
        "timings_s": {"proxy": 3.1, "exact": 40.2},
    }


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


class _Page(HTMLParser):
    """Collects what the structural test checks."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.in_body_rows = False
        self.rows = 0
        self.cells: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self.in_body_rows = self.in_body_rows or tag == "tbody"
        self.rows += tag == "tr" and self.in_body_rows
        if tag == "td":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.cells.append("".join(self._cell))
            self._cell = None
        self.in_body_rows = self.in_body_rows and tag != "tbody"

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[dict[str, Any], Path, Path]]:
    """The 12- and 160-node results with their PNG and HTML written."""
    out = tmp_path_factory.mktemp("sensitivity")
    made = {}
    for count in (12, 160):
        result = synthetic(count, exact=8 if count == 12 else 40)
        png = write_heatmap(result, out / f"heatmap_{count}.png")
        made[count] = (result, png, write_html(result, png, out / f"sensitivity_{count}.html"))
    return made


def test_heatmaps_are_written_and_grow_with_rows(reports: dict[int, tuple[dict[str, Any], Path, Path]]) -> None:
    small, large = reports[12][1], reports[160][1]
    assert small.stat().st_size > 20_000 and large.stat().st_size > 60_000
    (small_w, small_h), (large_w, large_h) = png_size(small), png_size(large)
    assert large_h > 2 * small_h  # taller for more rows
    assert large_w > small_w  # 160 rows: split into side-by-side panels
    assert not [p for p in small.parent.iterdir() if p.name.startswith(".")]  # no temporary files left


@pytest.mark.parametrize("count", [12, 160])
def test_html_is_self_contained_and_complete(reports: dict[int, tuple[dict[str, Any], Path, Path]], count: int) -> None:
    result, _, page = reports[count]
    text = page.read_text(encoding="utf-8")
    parser = _Page()
    parser.feed(text)
    parser.close()
    tags = [tag for tag, _ in parser.tags]
    assert tags.count("table") == 1
    assert parser.rows == count
    images = [attrs.get("src") or "" for tag, attrs in parser.tags if tag == "img"]
    assert len(images) == 1 and images[0].startswith("data:image/png;base64,")
    for needle in ("http://", "https://", 'src="/', "src='/", 'href="/', "@import", "url("):
        assert needle not in text
    assert ODD_NAME not in text and "attn&lt;scores&gt;&amp;mask" in text  # escaped in the source ...
    assert ODD_NAME in parser.cells  # ... and read back intact
    assert "cosine" in text and "proxy+topk" in text and "26 samples" in text
    assert "–" in parser.cells  # not-evaluated cells


def test_empty_result_still_renders(tmp_path: Path) -> None:
    result = synthetic(0)
    png = write_heatmap(result, tmp_path / "empty.png")
    page = write_html(result, png, tmp_path / "empty.html")
    parser = _Page()
    parser.feed(page.read_text(encoding="utf-8"))
    assert parser.rows == 0 and png.stat().st_size > 1000


CONSOLE = re.compile(r"Uncaught|CONSOLE[(:]\d+")


def test_page_runs_clean_and_sorts_in_chromium(
    reports: dict[int, tuple[dict[str, Any], Path, Path]], tmp_path: Path
) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium not installed")
    result, _, page = reports[12]
    command = [
        chromium,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        "--dump-dom",
        page.resolve().as_uri() + "#selftest",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body[^>]*>", done.stdout)
    assert body is not None, done.stdout[:2000]
    assert 'data-ready="1"' in body.group(0)
    evaluated = [n for n in result["nodes"] if n["drop_both"] is not None]
    worst = max(evaluated, key=lambda n: n["drop_both"])
    assert f'data-sorted="{worst["rank"]}"' in body.group(0)  # two clicks on "drop both": descending
    errors = [line for line in done.stderr.splitlines() if CONSOLE.search(line)]
    assert not errors, errors
