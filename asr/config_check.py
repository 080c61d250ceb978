"""The `--config` files of `asr fit|validate|test` read before LightningCLI parses them, so that
the commonest mistakes are named with their file and line: YAML that does not parse, a
`class_path` that imports nothing, an `init_args` or `trainer` key the class does not take (in
a config laid over another, the class that one named), a key a dataclass of options lacks.
What this passes, jsonargparse still checks in full (types, values, the other keys)."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

Problem = tuple[int, str, str]  # the line, the key, what is wrong
SPEC_KEYS = ("class_path", "init_args", "dict_kwargs")  # jsonargparse's for a class and its args
# The keys of a config's top level: LightningCLI's and `asr.train.ASRCLI`'s (a test compares).
TOP_LEVEL_KEYS = (
    "seed_everything", "trainer", "model", "data", "checkpoint", "step_checkpoint",
    "epoch_clock", "bf16_fallback", "onednn_kernel_cache", "optimizer", "lr_scheduler",
    "ckpt_path", "weights_only",
)  # fmt: skip
EVALUATION_KEYS = ("verbose",)  # what `asr validate` and `asr test` take beside those


def frontend_settings(config: str | Path) -> dict[str, Any]:
    """What a training config's frontend computes features with, its CMVN and augmentation
    left out: `features` and `level` (a bare feature extractor as `features`). CMVN statistics
    depend on these alone (`asr cmvn --config`, and the recipes' CMVN stage)."""
    with open(config, encoding="utf-8") as file:
        data = yaml.safe_load(file) or {}
    try:
        frontend = data["model"]["init_args"]["frontend"]
        parts = frontend.get("init_args") or {}
    except (KeyError, TypeError, AttributeError):
        raise ValueError(f"{config}: no model.init_args.frontend to take features from") from None
    if "features" not in parts:  # a bare feature extractor
        return {"features": frontend}
    return {k: parts[k] for k in ("features", "level") if k in parts}


def config_paths(argv: Sequence[str]) -> list[str]:
    """The files of `--config PATH`, `--config=PATH` and `-c PATH` in `argv`, in order."""
    paths = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            paths.append(argv[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths


def config_problems(
    path: str | Path, classes: dict[str, tuple[Any, str]] | None = None, subcommand: str = "fit"
) -> list[str]:
    """Each problem found in the config file `path` as `FILE:LINE: KEY: what is wrong`; none for
    a file that does not exist or cannot be read (LightningCLI says so itself). `classes` maps
    key paths to the classes (and their class_path) earlier configs named there, for a config
    laid over them that gives `init_args` alone; this file's are added to it. `subcommand`:
    fit, validate or test, whose top-level keys differ."""
    classes = {} if classes is None else classes
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        context = ""
        if err.context and err.context_mark and err.problem:
            context = f" ({err.context} from line {err.context_mark.line + 1})"
        return [f"{where}: not valid YAML: {err.problem or err.context}{context}"]
    except yaml.YAMLError as err:
        return [f"{path}: not valid YAML: {err}"]
    keys = TOP_LEVEL_KEYS + (EVALUATION_KEYS if subcommand in ("validate", "test") else ())
    found = [*_top_level_problems(root, keys), *_problems(root, "", classes)]
    return [f"{path}:{line}: {key}: {problem}" for line, key, problem in found]


def _top_level_problems(root: yaml.Node | None, keys: tuple[str, ...]) -> Iterator[Problem]:
    if not isinstance(root, yaml.MappingNode):
        return
    for k, _ in root.value:
        if isinstance(k, yaml.ScalarNode) and k.value not in keys:
            known = list(keys)
            yield k.start_mark.line + 1, k.value, f"no such key{_did_you_mean(k.value, known)}"


def _problems(node: yaml.Node, key: str, classes: dict[str, tuple[Any, str]]) -> Iterator[Problem]:
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _problems(item, f"{key}[{i}]", classes)
        return
    if not isinstance(node, yaml.MappingNode):
        return
    entries = {k.value: (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    if key == "trainer":
        from lightning.pytorch import Trainer

        yield from _arguments(Trainer, "the Trainer", node, key)
    target, named = entries.get("class_path"), classes.get(key)
    if target is not None and isinstance(target[1], yaml.ScalarNode):
        found, named = _resolve(target[1].value), None
        if isinstance(found, str):
            yield target[1].start_mark.line + 1, _join(key, "class_path"), found
        elif found is not None:
            named = classes[key] = (found, target[1].value)
    if named is not None and "init_args" in entries:
        found, name = named
        yield from _arguments(found, name, entries["init_args"][1], _join(key, "init_args"))
    for name, (_, value) in entries.items():
        yield from _problems(value, _join(key, name), classes)


def _arguments(target, name: str, node: yaml.Node, key: str) -> Iterator[Problem]:
    """The keys of the mapping `node` that `target`'s signature has no parameter for (none
    where it takes `**kwargs`: they may go on to a parent class), and within those it has, the
    keys of a mapping given for a parameter typed as a dataclass of options."""
    known = _parameters(target)
    if not isinstance(node, yaml.MappingNode) or known is None:
        return
    for k, value in node.value:
        if not isinstance(k, yaml.ScalarNode):
            continue
        if k.value not in known:
            problem = f"{name} takes no argument {k.value!r}{_did_you_mean(k.value, known)}"
            yield k.start_mark.line + 1, _join(key, k.value), problem
        elif isinstance(value, yaml.MappingNode) and not _subclass_spec(value):
            typed = _options_class(_hints(target).get(k.value))
            if typed is not None:
                yield from _arguments(typed, typed.__qualname__, value, _join(key, k.value))


def _parameters(target) -> list[str] | None:
    """The names of the arguments `target` takes; None where it takes `**kwargs` (they may go
    on to a parent class) or has no signature (a builtin)."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind is not p.VAR_POSITIONAL]


def option_problems(
    argv: Sequence[str], classes: dict[str, tuple[Any, str]], groups: dict[str, Any]
) -> list[str]:
    """Each `--key.name` option in `argv` whose class takes no argument `name`, as `--option:
    what is wrong`. `classes` maps key paths to the classes the configs named there (and their
    class_path); a key whose class the command line names anew is left to jsonargparse.
    `groups` maps keys to the classes whose arguments are the CLI's own options (the Trainer's),
    where an abbreviation of an argument's name passes (argparse expands it)."""
    named = {_plain(key): found for key, found in classes.items()}
    named.update((key, (found, found.__qualname__)) for key, found in groups.items())
    options = [a.split("=", 1)[0][2:] for a in argv if a.startswith("--")]
    given = {_plain(o.removesuffix(".class_path")) for o in options} & set(named)
    problems = []
    for option in options:
        parts = _plain(option.rstrip("+")).split(".")
        keys = [".".join(parts[:i]) for i in range(1, len(parts))]
        if "dict_kwargs" in parts or given.intersection(keys):
            continue
        at = max((i for i, key in enumerate(keys, 1) if key in named), default=0)
        if not at:
            continue
        target, name = named[keys[at - 1]]
        for part in parts[at:]:
            known = _parameters(target)
            if known is None:
                break
            if part not in known:
                if parts[0] not in groups or not any(k.startswith(part) for k in known):
                    problem = f"{name} takes no argument {part!r}{_did_you_mean(part, known)}"
                    problems.append(f"--{option}: {problem}")
                break
            target = _options_class(_hints(target).get(part))
            if target is None:
                break
            name = target.__qualname__
    return problems


def _plain(key: str) -> str:
    """A key path without its `init_args` steps (`model.init_args.x` and `model.x` are one)."""
    return ".".join(p for p in key.split(".") if p != "init_args")


def _subclass_spec(node: yaml.MappingNode) -> bool:
    """A mapping jsonargparse reads as a class and its arguments (checked where it stands)."""
    return any(isinstance(k, yaml.ScalarNode) and k.value in SPEC_KEYS for k, _ in node.value)


def _hints(target) -> dict[str, Any]:
    """The resolved annotations of `target`'s parameters; none where they cannot be resolved."""
    try:
        return typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    except Exception:  # noqa: BLE001 - names only a type checker sees: nothing to check against
        return {}


def _options_class(annotation) -> type | None:
    """The dataclass an annotation names, `| None` aside (jsonargparse reads a mapping given
    for it as its fields); None for anything else."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = members[0] if len(members) == 1 else None
    is_options = inspect.isclass(annotation) and dataclasses.is_dataclass(annotation)
    return annotation if is_options else None


def _resolve(class_path: str):
    """The class or function `class_path` names; a sentence saying why there is none; or None
    for a name without a module, which jsonargparse looks up among known subclasses."""
    module_name, _, attribute = class_path.rpartition(".")
    if not module_name:
        return None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and module_name.startswith(err.name):
            return f"no module named {err.name!r}"
        return None  # the module is there, and something it imports is not: jsonargparse says
    if hasattr(module, attribute):
        return getattr(module, attribute)
    names = [n for n in dir(module) if not n.startswith("_")]
    return f"{module_name} has no {attribute!r}{_did_you_mean(attribute, names)}"


def _did_you_mean(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name
