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

ROOT = Path(__file__).resolve().parents[1]  # defaults hold from any working folder

# what can hold a docstring: its first statement, when a string
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def line_kinds(source: str) -> tuple[int, int]:
    """(documentation lines, code lines) of one Python source.

    >>> line_kinds('x = 1  # c\\ny = 2\\n')
    (0, 2)
    >>> line_kinds("'Doc.'\\nif x:\\n    'not a docstring'\\n# note\\n")
    (2, 2)
    """
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, DOCUMENTED) and node.body and isinstance(node.body[0], ast.Expr):
            first = node.body[0]
            if isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                doc_lines.update(range(first.lineno, first.end_lineno + 1))
    code_lines: set[int] = set()
    comment_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comment_lines.add(token.start[0])
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                tokenize.ENDMARKER):  # fmt: skip
            code_lines.update(range(token.start[0], token.end[0] + 1))
    code_lines -= doc_lines
    doc_lines |= comment_lines - code_lines  # a comment after code leaves its line code
    return len(doc_lines), len(code_lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.doc_ratio", description=__doc__.splitlines()[0]
    )
    parser.add_argument("folder", nargs="?", default=ROOT / "asr", help="(the package, asr/)")
    parser.add_argument("--per-file", action="store_true", help="a line per file, most first")
    args = parser.parse_args()
    rows = []
    for path in sorted(Path(args.folder).rglob("*.py")):
        doc, code = line_kinds(path.read_text(encoding="utf-8"))
        rows.append((path, doc, code))
    if not rows:
        parser.error(f"{args.folder}: no .py files below it")
    doc, code = sum(r[1] for r in rows), sum(r[2] for r in rows)
    if args.per_file:
        for path, d, c in sorted(rows, key=lambda r: -r[1]):
            print(f"{d:5d} {c:5d} {d / max(c, 1):5.2f} {path}")
    print(f"{args.folder}: {doc} documentation lines, {code} code lines, "
          f"ratio {doc / max(code, 1):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
