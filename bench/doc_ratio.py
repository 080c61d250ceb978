"""Docstring and comment lines per line of code in a package (default: asr/).

    python bench/doc_ratio.py [FOLDER] [--per-file]

A line counts as documentation when it holds only a comment or lies inside a docstring (the
string that opens a module, class or function); blank lines count as neither.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path


def line_kinds(source: str) -> tuple[int, int]:
    """(documentation lines, code lines) of one Python source."""
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            doc_lines.add(token.start[0])
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                tokenize.ENDMARKER):  # fmt: skip
            code_lines.update(range(token.start[0], token.end[0] + 1))
    code_lines -= doc_lines
    comment_only = {n for n in doc_lines if n not in code_lines}
    return len(comment_only), len(code_lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="asr")
    parser.add_argument("--per-file", action="store_true", help="a line per file, most first")
    args = parser.parse_args()
    rows = []
    for path in sorted(Path(args.folder).rglob("*.py")):
        doc, code = line_kinds(path.read_text(encoding="utf-8"))
        rows.append((path, doc, code))
    doc, code = sum(r[1] for r in rows), sum(r[2] for r in rows)
    if args.per_file:
        for path, d, c in sorted(rows, key=lambda r: -r[1]):
            print(f"{d:5d} {c:5d} {d / max(c, 1):5.2f} {path}")
    print(f"{args.folder}: {doc} documentation lines, {code} code lines, ratio {doc / code:.2f}")


if __name__ == "__main__":
    main()
