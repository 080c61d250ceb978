"""The package's layers point one way, and nothing below training needs Lightning.

The import graph is read from the source (every `import` a module runs, function-local ones
included; names imported only for type checking are not edges), so a new upward import fails
here before it can form a cycle.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "asr"
# The package's layer map, stated here and nowhere else. Each module's layer, bottom (0) to
# top; a module may import from its own layer or below.
LAYERS = {
    # leaves: text (tokenizers, the special ids), audio and its levels, frontends, models/
    # (plain nn.Modules)
    0: {
        "text",
        "files",
        "audio",
        "levels",
        "perturb",
        "frontends",
        "metrics",
        "precision",
        "models",
        "data.manifest",
    },
    # format: what a checkpoint or package holds, and loading it
    1: {"checkpoint", "package", "loading", "finetune", "onnx_runtime"},
    # algorithms: search, timing, confidence, long-audio segmentation, attention-failure guard
    2: {"search", "ctc_prefix", "ctc_beam", "timing", "confidence", "segment", "guard", "vad"},
    # the recognizer: decoding, times and words, results, long-audio transcription, writers,
    # live streams
    3: {"results", "decoding", "alignment", "writers", "transcribe", "streaming", "recognizer"},
    # its users: evaluation, robustness, plots, alignment-map choice, finishing a model, the
    # explorer page, the live server, int8 graphs calibrated by decoding
    4: {"evaluate", "robustness", "plotting", "heads", "finalize", "explore", "serve", "onnx_int8"},
    # training and the command line
    5: {"data", "lightning", "lm", "optim", "train", "config_check", "cli", "__main__"},
}
TRAINING = 5
RECOGNIZER = 3
# Training: what `asr fit` runs. It shares the models and algorithms with inference but needs
# nothing from the recognizer layer.
TRAINING_MODULES = {"lightning", "lm", "optim", "train", "config_check", "data"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__") or "__init__"


def layer_of(module: str) -> int:
    """The layer of `module`: its own entry, else its package's (`models.rnn` -> `models`)."""
    for name in (module, module.split(".")[0]):
        for layer, members in LAYERS.items():
            if name in members:
                return layer
    raise AssertionError(f"asr.{module} is in no layer: add it to LAYERS")


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def runtime_imports(path: Path) -> set[str]:
    """Top-level names of every module `path` imports at run time (`asr.x.y` kept whole)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking_block(child):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.add(child.module)
                if child.module == "asr":  # `from asr import transcribe`
                    found.update(f"asr.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def package_graph() -> dict[str, set[str]]:
    """asr module -> the asr modules it imports (package names resolved to their __init__)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = {m.removeprefix("asr.") for m in runtime_imports(path) if m.startswith("asr.")}
        graph[name] = {t for t in targets if t in modules or f"{t}.__init__" in modules}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt] if nxt in path else path + [nxt]
            if nxt not in state and (cycle := walk(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := walk(start, [start])):
            return cycle
    return None


def test_find_cycle_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_runtime_imports_skip_type_checking_blocks(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from asr.x import Y\n"
        "def f():\n    from asr.z import W\n"
    )
    assert runtime_imports(source) == {"typing", "asr.z"}


def test_the_package_import_graph_has_no_cycle():
    assert find_cycle(package_graph()) is None


def test_every_import_points_down_or_sideways():
    upward = [
        f"asr.{module} (layer {layer_of(module)}) imports asr.{target} (layer {layer_of(target)})"
        for module, targets in package_graph().items()
        if module != "__init__"
        for target in targets
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "\n".join(upward)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_training_imports_nothing_from_the_recognizer():
    graph = package_graph()
    training = [m for m in graph if m.split(".")[0] in TRAINING_MODULES and m != "data.manifest"]
    assert "lightning" in training and "data.dataset" in training
    offenders = {
        module: sorted(t for t in reachable(graph, module) if layer_of(t) == RECOGNIZER)
        for module in training
    }
    assert not {m: t for m, t in offenders.items() if t}, offenders


def test_reachable_follows_imports_through_others():
    assert reachable({"a": {"b"}, "b": {"c"}, "c": set()}, "a") == {"b", "c"}


def test_nothing_below_training_imports_lightning():
    offenders = [
        module_name(path)
        for path in PACKAGE.rglob("*.py")
        if module_name(path) != "__init__" and layer_of(module_name(path)) < TRAINING
        if any(m.split(".")[0] == "lightning" for m in runtime_imports(path))
    ]
    assert not offenders


CHECK_INFERENCE_WITHOUT_LIGHTNING = """
import os, sys
sys.modules["lightning"] = None  # any `import lightning` now raises ImportError
environ = dict(os.environ)
import asr
[getattr(asr, name) for name in asr.__all__]  # every public name resolves
import asr.evaluate, asr.plotting, asr.writers
assert dict(os.environ) == environ, "importing asr changed the environment"
assert "matplotlib.pyplot" not in sys.modules, "pyplot holds process-wide state"
print("ok")
"""


def test_the_inference_layers_import_without_lightning_and_change_nothing():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", CHECK_INFERENCE_WITHOUT_LIGHTNING],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


LIGHT = {
    "asr": "import asr",
    "asr.cli": "import asr.cli",
    "asr --help": "import asr.cli; asr.cli._parser(None)",
    "asr prepare's parser": "import asr.cli; asr.cli._parser('prepare')",
    "asr tokenizer's parser": "import asr.cli; asr.cli._parser('tokenizer')",
    "preparing and tokenizing": "import asr.data.prepare, asr.text",
}


@pytest.mark.parametrize("code", LIGHT.values(), ids=LIGHT.keys())
def test_importing_the_package_or_its_light_commands_imports_no_torch(code):
    """`import asr`, the `asr` entry point and the data commands import neither torch nor
    lightning: they start in a fraction of the time."""
    code += "; import sys; print(sorted({'torch', 'lightning'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert out.stdout.strip() == "[]", out.stderr[-2000:]
