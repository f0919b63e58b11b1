"""The pieces every ``report.html`` is made of: one self-contained page (inline CSS, inline images and SVG, one
small inline script for sortable tables; no network, no CDN), sections and tables. The charts are in
:mod:`deploy_opt.report.charts`.

Everything a page shows is escaped here; callers pass plain text and numbers.
"""

from __future__ import annotations

import base64
import html
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dopt_common.files import atomic_path

log = logging.getLogger(__name__)

MAX_IMAGE_BYTES = 1_500_000  # an image larger than this is linked, not inlined, so a page stays under 5 MB

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:78em;margin:0 auto;padding:1em 1.5em 3em}
h1{font-size:1.5em;margin:.4em 0}h2{font-size:1.15em;margin:1.6em 0 .5em;border-bottom:1px solid #ddd}
.verdict{padding:.8em 1em;border-radius:6px;font-size:1.05em;margin:.6em 0}
.pass{background:#e3f4e3;border:1px solid #8c8}.fail{background:#fbe4e4;border:1px solid #d88}
.info{background:#eef2fa;border:1px solid #aab8d8}
table{border-collapse:collapse;font-size:.85em;background:#fff;margin:.4em 0}
th,td{border:1px solid #ddd;padding:.25em .55em;text-align:right;vertical-align:top}
th{background:#f0f0f0;cursor:pointer;user-select:none}td.t,th.t{text-align:left}
tr.hl td{background:#fff6d6}.muted{color:#777;font-size:.85em}
img{max-width:100%;border:1px solid #eee;background:#fff}svg{background:#fff;border:1px solid #eee}
pre{background:#fff;border:1px solid #ddd;padding:.6em;overflow:auto;font-size:.8em;max-height:30em}
.grid{display:flex;flex-wrap:wrap;gap:1em}.grid>div{flex:1 1 24em}
"""

SORT_JS = """
document.querySelectorAll('table.sortable th').forEach(function(th){th.addEventListener('click',function(){
var table=th.closest('table'),body=table.tBodies[0],i=Array.prototype.indexOf.call(th.parentNode.children,th);
var asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';
var rows=Array.prototype.slice.call(body.rows);rows.sort(function(a,b){
var x=a.cells[i].dataset.v!==undefined?a.cells[i].dataset.v:a.cells[i].textContent;
var y=b.cells[i].dataset.v!==undefined?b.cells[i].dataset.v:b.cells[i].textContent;
var nx=parseFloat(x),ny=parseFloat(y);var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:String(x).localeCompare(String(y));
return asc?c:-c;});rows.forEach(function(r){body.appendChild(r);});});});
"""


def esc(value: Any) -> str:
    """Text for HTML."""
    return html.escape(str(value))


def fmt(value: Any, spec: str = ".4g") -> str:
    """A number in ``spec`` (blank for None/NaN), anything else as text."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return "" if isinstance(value, float) and not math.isfinite(value) else format(value, spec)


def verdict(passed: bool | None, text: str) -> str:
    """The coloured box at the top: pass, fail, or (None) information."""
    css = "info" if passed is None else ("pass" if passed else "fail")
    word = "" if passed is None else ("PASS: " if passed else "FAIL: ")
    return f'<div class="verdict {css}"><b>{word}</b>{esc(text)}</div>'


def section(title: str, body: str, note: str = "") -> str:
    """An ``<h2>`` section; empty bodies are left out."""
    if not body:
        return ""
    extra = f'<p class="muted">{esc(note)}</p>' if note else ""
    return f"<h2>{esc(title)}</h2>{extra}{body}"


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    text_columns: Sequence[int] = (0,),
    highlight: Sequence[int] = (),
) -> str:
    """A sortable table; cells are escaped; numbers sort as numbers."""
    if not rows:
        return ""
    head = "".join(f'<th class="{"t" if i in text_columns else ""}">{esc(h)}</th>' for i, h in enumerate(headers))
    body = []
    for index, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            css = ' class="t"' if i in text_columns else ""
            raw = f' data-v="{esc(cell)}"' if isinstance(cell, (int, float)) and not isinstance(cell, bool) else ""
            cells.append(f"<td{css}{raw}>{esc(fmt(cell))}</td>")
        css = ' class="hl"' if index in highlight else ""
        body.append(f"<tr{css}>{''.join(cells)}</tr>")
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    """A two-column table of facts (no header row)."""
    rows = "".join(
        f'<tr><td class="t"><b>{esc(k)}</b></td><td class="t">{esc(fmt(v))}</td></tr>'
        for k, v in pairs
        if v not in (None, "")
    )
    return f"<table>{rows}</table>" if rows else ""


def image(path: Path, alt: str) -> str:
    """An inline PNG (base64) from a file next to the page; a link when it is too large; nothing when absent."""
    if not path.is_file():
        return ""
    data = path.read_bytes()
    if len(data) > MAX_IMAGE_BYTES:
        return f'<p><a href="{esc(path.name)}">{esc(alt)} ({len(data) / 1e6:.1f} MB, opened separately)</a></p>'
    encoded = base64.b64encode(data).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{encoded}">'


def write_page(path: Path, title: str, body: str) -> Path:
    """The whole page, written atomically."""
    page = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{esc(title)}</title>'
        f"<style>{CSS}</style></head><body><main>{body}</main><script>{SORT_JS}</script></body></html>"
    )
    with atomic_path(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    log.info("wrote %s (%.0f kB)", path, len(page) / 1e3)
    return path
