"""The report's HTML: one file of data (JSON, escaped) + plotly.js + a small script that draws it.

    html = render({"title": "hookrun report", "source": "run.h5", "sections": [...]})
    dumps({"t": "</script>"})      # '{"t":"\\u003c/script\\u003e"}': no text can end the script block

Nothing from the file is ever written into markup: the data sits in a `<script type="application/json">`
block with `<`, `>`, `&`, U+2028 and U+2029 escaped, and the script builds every element with
`createElement` and `textContent` (images only from `data:image/png;base64,` URIs it checks).
plotly.js is inlined once; each figure is a `{data, layout}` object given to `Plotly.newPlot`.
The page loads nothing from the network.
"""

from __future__ import annotations

import html
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

ASSETS = Path(__file__).with_name("assets")


@lru_cache(maxsize=1)
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if "</script" in js.lower():  # (never so in plotly 7; a script block could not hold it)
        raise RuntimeError("plotly.js holds '</script': it cannot be inlined")
    return js


def clean(value: Any) -> Any:
    """JSON-ready: NaN and infinities as None (JSON has neither), numpy scalars as Python's."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        return clean(value.item())
    return value


def dumps(data: Any) -> str:
    """JSON that is safe inside a <script> block and inside any HTML parser's view of one."""
    text = json.dumps(clean(data), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, code in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, code)
    return text


def render(data: dict) -> str:
    css = (ASSETS / "report.css").read_text()
    app = (ASSETS / "report.js").read_text()
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        f"<meta name=\"hookrun-source\" content=\"{html.escape(str(data.get('source', '')), quote=True)}\">\n"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; "
        "style-src 'unsafe-inline'; img-src data: blob:; font-src data:\">\n"
        f"<title>hookrun report</title>\n<style>{css}</style>\n"
        f"<script>{plotly_js()}</script>\n</head><body>\n"
        "<header><h1 id=\"title\"></h1><nav id=\"nav\"></nav></header><main id=\"main\"></main>\n"
        f"<script type=\"application/json\" id=\"hookrun-data\">{dumps(data)}</script>\n"
        f"<script>{app}</script>\n</body></html>\n"
    )


def source_of(path: Path) -> str | None:
    """The run or sweep a report written by render() shows (None for any other file)."""
    try:
        head = path.read_bytes()[:4096].decode("utf-8", "replace")
    except OSError:
        return None
    start = head.find('<meta name="hookrun-source" content="')
    if start < 0:
        return None
    start += len('<meta name="hookrun-source" content="')
    return html.unescape(head[start : head.find('"', start)])
