"""The explorer page: one self-contained HTML file from the data `asr.explore.build` gathers.

The page is `static/template.html` with `static/explorer.css` and `static/explorer.js` inlined
and the data `asr.explore.build` gathers embedded as JSON, each utterance's arrays in an element
of their own. Nothing is fetched when it opens.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import Any

BASE64 = re.compile(r"[A-Za-z0-9+/=]+")


def _static(name: str) -> str:
    return resources.files("asr.explore").joinpath("static", name).read_text(encoding="utf-8")


def embedded_json(data: Any) -> str:
    """`data` as JSON that is safe inside a <script> element: no `<`, `>`, `&` or line
    separators survive as themselves, so no string in it can close the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(char, escape)
    return text


def build_page(data: dict[str, Any]) -> str:
    """The HTML of the explorer showing `data` (the keys `asr.explore.build` fills)."""
    data, blobs = _blobs_apart(data)
    template = _static("template.html")
    parts = {
        "{{TITLE}}": html.escape(str(data.get("title") or "asr explorer")),
        "{{STYLE}}": _static("explorer.css"),
        "{{DATA}}": embedded_json(data),
        "{{BLOBS}}": blobs,
        "{{SCRIPT}}": _static("explorer.js"),
    }
    pieces = re.split("(" + "|".join(map(re.escape, parts)) + ")", template)
    missing = set(parts) - set(pieces[1::2])
    if missing:
        raise RuntimeError(f"asr/explore/static/template.html lacks {sorted(missing)}")
    # the template is split before anything is put in: no data can hold a placeholder's place
    return "".join(parts.get(piece, piece) if i % 2 else piece for i, piece in enumerate(pieces))


def _blobs_apart(data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`data` with each utterance's blob replaced by "#<id>" of an element of its own that
    holds it: the page parses its JSON without the arrays, and reads a blob when opened."""
    utterances = data.get("utterances")
    if not isinstance(utterances, list):
        return data, ""
    elements, moved = [], []
    for i, utterance in enumerate(utterances):
        blob = utterance.get("blob") if isinstance(utterance, dict) else None
        if isinstance(blob, str) and blob and BASE64.fullmatch(blob):
            elements.append(f'<script type="text/plain" id="asr-blob-{i}">{blob}</script>\n')
            utterance = utterance | {"blob": f"#asr-blob-{i}"}
        moved.append(utterance)
    return data | {"utterances": moved}, "".join(elements)
