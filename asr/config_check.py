"""The `--config` files of `asr fit|validate|test` read before LightningCLI parses them, so that
the commonest mistakes are named with their file and line: text that is not UTF-8, YAML that
does not parse, a key given twice, a `class_path` that imports nothing, an `init_args`,
`trainer` or `checkpoint` key the class does not take (in a config laid over another, the class
that one named), a key a dataclass of options lacks, a value a plain `int`, `float`, `bool` or
`str` argument refuses, a setting that a link overrides. A top-level key may name a file of
its own (`model: m.yaml`), checked the same way. What this passes, jsonargparse still checks in
full; where a class of options refuses a value as it is built, `where_set` finds the line that
set it."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import json
import re
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import get_loader

Problem = tuple[int, str]  # the line, and `KEY: what is wrong`
SPEC_KEYS = ("class_path", "init_args", "dict_kwargs")  # jsonargparse's for a class and its args
# The keys of a config's top level: LightningCLI's and `asr.train.ASRCLI`'s (a test compares).
TOP_LEVEL_KEYS = (
    "seed_everything", "trainer", "model", "data", "checkpoint", "step_checkpoint",
    "epoch_clock", "bf16_fallback", "onednn_kernel_cache", "optimizer", "lr_scheduler",
    "ckpt_path", "weights_only",
)  # fmt: skip
EVALUATION_KEYS = ("verbose",)  # what `asr validate` and `asr test` take beside those
# The top-level keys `asr.train.ASRCLI` reads as one class's arguments, that class and its name.
GROUPS = {
    "trainer": ("lightning.pytorch.Trainer", "the Trainer"),
    "checkpoint": ("asr.train.RunCheckpoint", "RunCheckpoint"),
    "step_checkpoint": ("asr.train.StepCheckpoint", "StepCheckpoint"),
    "epoch_clock": ("asr.train.EpochClock", "EpochClock"),
}
# The top-level keys whose value may be the path of a file holding it (relative to the config).
FILE_KEYS = ("model", "data", "optimizer", "lr_scheduler", *GROUPS)
# `ASRCLI.add_arguments_to_parser`'s links (a test compares): each target, `init_args` left
# out, and the setting to give instead. jsonargparse overwrites a target given, saying nothing.
LINKED = {"model.tokenizer": "data.tokenizer", "model.vocab_size": "data.tokenizer"}
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
STR_TAG = "tag:yaml.org,2002:str"
MERGE = "<<"  # YAML's merge key: a mapping's entries taken into another
_RESOLVER = yaml.resolver.Resolver()  # the tag PyYAML gives a plain scalar with none of its own


def frontend_settings(config: str | Path) -> dict[str, Any]:
    """What a training config's frontend computes features with, its CMVN and augmentation
    left out: `features` and `level` (a bare feature extractor as `features`). CMVN statistics
    depend on these alone (`asr cmvn --config`, and the recipes' CMVN stage)."""
    with open(config, encoding="utf-8") as file:
        data = yaml.safe_load(file) or {}
    model = data.get("model") if isinstance(data, dict) else None
    if isinstance(model, str) and model.endswith(CONFIG_SUFFIXES):  # `model: m.yaml`
        with open(Path(config).parent / model, encoding="utf-8") as file:
            model = yaml.safe_load(file)
    try:
        frontend = model["init_args"]["frontend"]
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


def without_empty_configs(argv: Sequence[str]) -> list[str]:
    """`argv` less the `--config` files that hold no settings (empty, or comments alone): read
    as an overlay that changes nothing, where jsonargparse refuses them unnamed."""
    kept: list[str] = []
    given = iter(argv)
    for arg in given:
        if arg in ("--config", "-c"):
            path = next(given, None)
            if path is None or not _holds_no_settings(path):
                kept += [arg] if path is None else [arg, path]
        elif not (arg.startswith("--config=") and _holds_no_settings(arg.split("=", 1)[1])):
            kept.append(arg)
    return kept


def _holds_no_settings(path: str | Path) -> bool:
    """Whether the file `path` reads as YAML with no settings: empty, comments alone, or a
    null document (`---`, `null`)."""
    try:
        root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):  # said elsewhere
        return False
    return root is None or root.tag == "tag:yaml.org,2002:null"


def config_problems(
    path: str | Path,
    classes: dict[str, tuple[Any, str]] | None = None,
    subcommand: str = "fit",
    within: str = "",
) -> list[str]:
    """Each problem found in the config file `path` as `FILE:LINE: KEY: what is wrong`; none for
    a file that does not exist or cannot be read (LightningCLI says so itself). `classes` maps
    key paths to the classes (and their class_path) earlier configs named there, for a config
    laid over them that gives `init_args` alone; this file's are added to it. `subcommand`:
    fit, validate or test, whose top-level keys differ. `within`: a key path, to check only
    what lies under it, for a command that builds that part alone (`asr cmvn`: the frontend);
    the classes of the keys on the way there are not imported."""
    classes = {} if classes is None else classes
    root, problems = _compose(path)
    if root is None:
        return problems
    keys = TOP_LEVEL_KEYS + (EVALUATION_KEYS if subcommand in ("validate", "test") else ())
    found = [*([] if within else _top_level_problems(root, keys))]
    found += _missing_named_files(root, Path(path).parent)
    found += _problems(root, "", classes, within)
    problems = [f"{path}:{line}: {said}" for line, said in found]
    for key, file in _named_files(root, Path(path).parent):
        if not within or within.startswith(f"{key}."):
            problems += _file_problems(file, key, classes, within)
    return problems


def where_set(paths: Sequence[str | Path], key: str) -> str | None:
    """`FILE:LINE` of the value that sets `key` (dotted, `init_args` left out, ending a key path
    of the config: `augment.noise.prob` is `data.init_args.augment.noise.prob`) in the last
    of the config files `paths` that sets it (files named by a top-level key included), as
    jsonargparse lays them over each other; None where none does."""
    wanted = key.split(".")
    found = None
    for file, keys, value in _laid_settings(paths):
        if keys[-len(wanted) :] == wanted:
            found = f"{file}:{value.start_mark.line + 1}"
    return found


def where_built(paths: Sequence[str | Path], name: str, said: str) -> tuple[str, list[str]] | None:
    """`FILE:LINE` and key path of the setting behind `said`, a refusal of the class `name`
    (`LogMelFilterbank`) as it was built, in the config files `paths` (and the files their
    top-level keys name) as jsonargparse lays them: the argument of that class the refusal is
    about, else the last set of those it names (`_arguments_named`), else its `class_path`.
    None where none is set."""
    subject, named = _arguments_named(said)
    settings = list(_laid_settings(paths))
    owners = [
        keys[:-1]
        for _, keys, value in settings
        if keys[-1] == "class_path"
        and isinstance(value, yaml.ScalarNode)
        and value.value.rsplit(".", 1)[-1] == name
    ]
    found: dict[str, tuple[str, list[str]]] = {}  # each one's last setting, the last set last
    for file, keys, value in settings:
        argument = keys[-1] in named and not isinstance(value, yaml.MappingNode)
        if keys[:-1] in owners and (argument or keys[-1] == "class_path"):
            kind = "class" if keys[-1] == "class_path" else keys[-1]
            found.pop(kind, None)
            found[kind] = (f"{file}:{value.start_mark.line + 1}", keys)
    if subject in found:  # what the refusal is about, not an argument its advice names
        return found[subject]
    arguments = [where for kind, where in found.items() if kind != "class"]
    return arguments[-1] if arguments else found.get("class")


def _arguments_named(said: str) -> tuple[str | None, list[str]]:
    """The argument a refusal is about, where it leads with one (after its class's name:
    `TransformerEncoder: num_layers must be...`), and every name it gives a value or a verdict
    (`f_min=9000`, `n_mfcc (99)`, `target_dbfs 5.0`, `mask_value must be`).

    >>> _arguments_named("KaldiFbank: num_mel_bins (3) and frame_shift_ms (0) must be positive")
    (None, ['num_mel_bins', 'frame_shift_ms'])
    >>> _arguments_named("inter_ctc_layers names no block: or set inter_ctc_weight 0 instead")
    ('inter_ctc_layers', ['inter_ctc_layers', 'inter_ctc_weight'])
    """
    leading = re.match(r"(?:[A-Za-z_]\w*: )?([A-Za-z_]\w*) [a-z]", said)
    subject = leading.group(1) if leading else None
    given = re.findall(r"\b([A-Za-z_]\w*)(?:=| \(| [-+]?\.?\d| must\b| needs?\b| is\b)", said)
    return subject, list(dict.fromkeys(([subject] if subject else []) + given))


def _laid_settings(
    paths: Sequence[str | Path],
) -> Iterator[tuple[str | Path, list[str], yaml.Node]]:
    """Every setting of the config files `paths` and the files their top-level keys name: its
    file, key path (`init_args` left out) and value, in the order jsonargparse lays them."""
    for path in paths:
        root, _ = _compose(path)
        files = [(path, root, [])] + [
            (file, _compose(file)[0], [key]) for key, file in _named_files(root, Path(path).parent)
        ]
        for file, node, prefix in files:
            for keys, value in _settings(node, prefix):
                yield file, keys, value


def built_class(error: BaseException) -> str | None:
    """The name of the class jsonargparse was building when `error` was raised in its
    `__init__`: the first of this package's after jsonargparse last called (an MFCC for the
    LogMelFilterbank it holds; an encoder, not the module a config built it into)."""
    package = Path(__file__).resolve().parent  # asr
    tb, building, built = error.__traceback__, False, None
    while tb is not None:
        frame = tb.tb_frame
        where = Path(frame.f_code.co_filename)
        if "jsonargparse" in where.parts:
            building, built = True, None
        elif building and frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
            if where.resolve().is_relative_to(package):
                building, built = False, type(frame.f_locals["self"]).__name__
        tb = tb.tb_next
    return built


def refused_as_built(error: BaseException) -> tuple[BaseException, str] | None:
    """The error within `error` (jsonargparse wraps it, in a union's list of subtypes tried)
    that a class of this package raised as jsonargparse built it, and that class's name."""
    while error is not None:
        if isinstance(error, ValueError) and (name := built_class(error)) is not None:
            return error, name
        error = error.__cause__ or error.__context__
    return None


def _settings(node: yaml.Node | None, keys: list[str]) -> Iterator[tuple[list[str], yaml.Node]]:
    """Every key path of a mapping (`init_args` left out) and its value node."""
    if not isinstance(node, yaml.MappingNode):
        return
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode) or k.value == MERGE:
            continue
        if k.value == "init_args":
            yield from _settings(v, keys)
            continue
        yield [*keys, k.value], v
        yield from _settings(v, [*keys, k.value])


def _file_problems(
    path: str | Path, key: str, classes: dict[str, tuple[Any, str]], within: str = ""
) -> list[str]:
    """config_problems for a file that holds the value of the top-level `key` alone (`--model
    m.yaml`, or `model: m.yaml` in a config)."""
    root, problems = _compose(path)
    if isinstance(root, yaml.MappingNode):  # anything else jsonargparse refuses in its words
        found = _problems(root, key, classes, within)
        problems += [f"{path}:{line}: {said}" for line, said in found]
    return problems


def _compose(path: str | Path) -> tuple[yaml.Node | None, list[str]]:
    """The YAML node tree of the file `path`, or None and why it does not parse (nothing for
    a file that cannot be read)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None, []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:  # jsonargparse stops on it with a traceback
        line = data[: err.start].count(b"\n") + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        said = f"byte 0x{data[err.start]:02x} at column {column}; save the file as UTF-8"
        return None, [f"{path}:{line}: not UTF-8 text ({said})"]
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader), []
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        context = ""
        if err.context and err.context_mark and err.problem:
            context = f" ({err.context} from line {err.context_mark.line + 1})"
        return None, [f"{where}: not valid YAML: {err.problem or err.context}{context}"]
    except yaml.YAMLError as err:
        return None, [f"{path}: not valid YAML: {err}"]


def _named_files(root: yaml.Node | None, folder: Path) -> Iterator[tuple[str, Path]]:
    """The top-level keys of a config whose value names a file that holds it, and that file."""
    for key, value in _file_values(root):
        if (folder / value.value).is_file():
            yield key, folder / value.value


def _missing_named_files(root: yaml.Node | None, folder: Path) -> Iterator[Problem]:
    """A top-level key naming a config file that is not there: jsonargparse took it for a
    class to import and refused it with a page of usage."""
    for key, value in _file_values(root):
        if not (folder / value.value).is_file():
            where = "" if Path(value.value).is_absolute() else f" in {folder}"
            yield value.start_mark.line + 1, f"{key}: {value.value}: no such file{where}"


def _file_values(root: yaml.Node | None) -> Iterator[tuple[str, yaml.ScalarNode]]:
    """The top-level keys of a config whose value is a config file's name, and that value."""
    if not isinstance(root, yaml.MappingNode):
        return
    for k, v in root.value:
        if k.value in FILE_KEYS and isinstance(v, yaml.ScalarNode) and v.tag == STR_TAG:
            if v.value.endswith(CONFIG_SUFFIXES):
                yield k.value, v


def _top_level_problems(root: yaml.Node | None, keys: tuple[str, ...]) -> Iterator[Problem]:
    if not isinstance(root, yaml.MappingNode):
        return
    for k, _ in root.value:
        if isinstance(k, yaml.ScalarNode) and k.value not in (*keys, MERGE):
            known = list(keys)
            yield k.start_mark.line + 1, f"{k.value}: no such key{_did_you_mean(k.value, known)}"


def _problems(
    node: yaml.Node, key: str, classes: dict[str, tuple[Any, str]], within: str = ""
) -> Iterator[Problem]:
    if within and not (key == within or key.startswith(f"{within}.")):
        if key and not within.startswith(f"{key}."):
            return  # beside the part checked
        if isinstance(node, yaml.MappingNode):  # on the way to it: its class is not built
            step = _join(key, (within[len(key) + 1 :] if key else within).split(".")[0])
            for line, said in _duplicates(node, key):  # of its keys, the one on the way alone
                if said.startswith(f"duplicate key {step!r}"):
                    yield line, said
            yaml.SafeLoader("").flatten_mapping(node)
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    yield from _problems(v, _join(key, k.value), classes, within)
        return
    group = _group(key)
    value = None if group is None or isinstance(node, yaml.MappingNode) else _value(node)
    if value not in (None, UNJUDGED) and not isinstance(value, str):  # a string may name a file
        yield node.start_mark.line + 1, f"{key}: {_not_a_mapping(group[1], value)}"
        return  # jsonargparse would drop it silently
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _problems(item, f"{key}[{i}]", classes, within)
        return
    if not isinstance(node, yaml.MappingNode):
        return
    yield from _duplicates(node, key)
    yaml.SafeLoader("").flatten_mapping(node)  # `<<: *defaults` merged in, as YAML reads it
    entries = {k.value: (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    if _subclass_spec(node):  # jsonargparse names a key beside them in its own words alone
        for name, (k, _) in entries.items():
            if name not in SPEC_KEYS:
                said = f"no such key beside {', '.join(SPEC_KEYS)}"
                yield (
                    k.start_mark.line + 1,
                    f"{_join(key, name)}: {said}" + _did_you_mean(name, list(SPEC_KEYS)),
                )
    for name, (k, _) in entries.items():
        source = LINKED.get(_plain(_join(key, name)))
        if source is not None:
            yield k.start_mark.line + 1, f"{_join(key, name)}: {_linked(source)}"
    if group is not None:
        yield from _arguments(*group, node, key)
    target, named = entries.get("class_path"), classes.get(key)
    if target is not None and isinstance(target[1], yaml.ScalarNode):
        found, named = _resolve(target[1].value), None
        if isinstance(found, str):
            yield target[1].start_mark.line + 1, f"{_join(key, 'class_path')}: {found}"
        elif found is not None:
            named = classes[key] = (found, target[1].value)
    if named is not None and "init_args" in entries:
        found, name = named
        yield from _arguments(found, name, entries["init_args"][1], _join(key, "init_args"))
    for name, (_, value) in entries.items():
        yield from _problems(value, _join(key, name), classes, within)


def _duplicates(node: yaml.MappingNode, key: str) -> Iterator[Problem]:
    """The keys given twice in a mapping: YAML keeps the last value, silently."""
    first: dict[str, int] = {}
    for k, _ in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value != MERGE:
            line = k.start_mark.line + 1
            if k.value in first:
                said = f"(first at line {first[k.value]}): YAML keeps only the last"
                yield line, f"duplicate key {_join(key, k.value)!r} {said}"
            first.setdefault(k.value, line)


def _linked(source: str) -> str:
    """What to say of a setting that the link from `source` overrides."""
    return f"set from {source} (a link, which overrides it); set that instead"


def _arguments(target, name: str, node: yaml.Node, key: str) -> Iterator[Problem]:
    """The keys of the mapping `node` that `target`'s signature has no parameter for (none
    where it takes `**kwargs`: they may go on to a parent class), and within those it has, a
    value its plain type refuses and the keys of a mapping given for a parameter typed as a
    dataclass of options."""
    parameters = _signature(target)
    if not isinstance(node, yaml.MappingNode) or parameters is None:
        return
    # `<<: *shared` merged in, as YAML reads it, on a copy: its own keys are checked for
    # duplicates unmerged, as they were written
    node = yaml.MappingNode(node.tag, list(node.value), node.start_mark, node.end_mark)
    yaml.SafeLoader("").flatten_mapping(node)
    known = list(parameters)
    for k, value in node.value:
        if not isinstance(k, yaml.ScalarNode):
            continue
        if k.value not in known:
            problem = f"{name} takes no argument {k.value!r}{_did_you_mean(k.value, known)}"
            yield k.start_mark.line + 1, f"{_join(key, k.value)}: {problem}"
            continue
        annotation = _hints(target).get(k.value)
        problem = _type_problem(annotation, _value(value), parameters[k.value].default)
        if problem is not None:
            yield value.start_mark.line + 1, f"{_join(key, k.value)}: {problem}"
            continue
        typed = _options_class(annotation)
        if typed is None or (isinstance(value, yaml.MappingNode) and _subclass_spec(value)):
            continue
        if isinstance(value, yaml.MappingNode):
            yield from _arguments(typed, typed.__qualname__, value, _join(key, k.value))
            continue
        said = _options_problem(typed, annotation, _value(value))
        if said is not None:
            yield value.start_mark.line + 1, f"{_join(key, k.value)}: {said}"


def _options_problem(typed: type, annotation, read: Any) -> str | None:
    """What is wrong with `read` (as `_value` or `_loaded` reads it) given for a parameter
    annotated `annotation`, a dataclass of options `typed`: anything but a mapping, null where
    allowed, or a string (it may name a file). Else jsonargparse fails deep in instantiation,
    with pages of tracebacks."""
    if read is UNJUDGED or isinstance(read, (str, dict)):
        return None
    if read is None and type(None) in typing.get_args(annotation):
        return None
    return _not_a_mapping(typed.__qualname__, read)


def _not_a_mapping(name: str, value: Any) -> str:
    """What to say of `value` (as `_value` reads it) given for `name`'s arguments."""
    shown = "a list" if isinstance(value, list) else repr(value)
    if value is None or isinstance(value, bool):  # as YAML spells them
        shown = json.dumps(value)
    return f"expected a mapping of {name}'s arguments, got {shown}"


def _signature(target) -> dict[str, inspect.Parameter] | None:
    """The arguments `target` takes by name; None where it takes `**kwargs` (they may go on to
    a parent class) or has no signature (a builtin)."""
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return None
    return {n: p for n, p in parameters.items() if p.kind is not p.VAR_POSITIONAL}


UNJUDGED = object()  # a scalar with a tag of its own


def _value(node: yaml.Node) -> Any:
    """The value jsonargparse reads for a node (its YAML loader resolves `1e3` as a float, which
    PyYAML's does not), a list or dict standing for a sequence or mapping; UNJUDGED for a
    scalar with a tag of its own (not judged here)."""
    if isinstance(node, yaml.SequenceNode):
        return [_value(item) for item in node.value]
    if isinstance(node, yaml.MappingNode):
        return {}
    untagged = _RESOLVER.resolve(yaml.ScalarNode, node.value, (True, False))  # plain, no tag
    if node.style is None and node.tag == untagged:
        return _loaded(node.value)
    return node.value if node.tag == STR_TAG else UNJUDGED


def _loaded(text: str) -> Any:
    """`text` as jsonargparse reads a value given for a plain type other than `str`."""
    if not text.strip():
        return text  # jsonargparse's loader keeps a blank string
    try:
        return get_loader("yaml")(text)
    except (yaml.YAMLError, ValueError):
        return text


def _type_problem(annotation, value, default=inspect.Parameter.empty) -> str | None:
    """What is wrong with `value` (as read from YAML, or a command-line string) for a parameter
    annotated `annotation` and defaulting to `default`, as jsonargparse judges it; None where it
    takes it, and for any annotation but a plain `int`, `float`, `bool` or `str`, `| None` aside.
    A null is refused where neither the annotation nor the default allows it: jsonargparse
    takes it within a class's `init_args`, which then fails on None far from the config."""
    members = [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = list(typing.get_args(annotation))
    plain = [a for a in members if a is not type(None)]
    if len(plain) == 1 and typing.get_origin(plain[0]) is tuple and value is not UNJUDGED:
        return _tuple_problem(plain[0], _loaded(value) if isinstance(value, str) else value)
    if value is not UNJUDGED and len(plain) > 1:
        return _number_for_text_problem(plain, value)
    if len(plain) != 1 or plain[0] not in (int, float, bool, str) or value is UNJUDGED:
        return None
    if type(value) is type(default) and value == default:
        return None  # jsonargparse takes a value equal to the default unchecked (not 0 for False)
    expected = plain[0]
    read = _loaded(value) if isinstance(value, str) and expected is not str else value
    if read is None:
        if len(members) > 1 or default is None:
            return None
        return f"expected {expected.__name__}, got null"
    if expected is float and type(read) is int:
        return None
    if isinstance(read, expected) and (expected is bool or not isinstance(read, bool)):
        return None
    shown = {list: "a list", dict: "a mapping"}.get(type(value), repr(value))
    return f"expected {expected.__name__}{' or null' if len(members) > 1 else ''}, got {shown}"


def _number_for_text_problem(members: list, value: Any) -> str | None:
    """A number (or boolean) from YAML where a union of text and lists takes none: `subsample: 2_2`
    unquoted is YAML's 22, which jsonargparse refused with a page of usage."""
    kinds = {typing.get_origin(m) or m for m in members}
    if not isinstance(value, (int, float)) or not kinds <= {str, list, tuple}:
        return None
    names = {str: "a string", list: "a list", tuple: "a list"}
    wanted = " or ".join(dict.fromkeys(names[k] for k in (str, list, tuple) if k in kinds))
    hint = " (quote it: YAML reads 2_2 as 22)" if type(value) is int else ""
    return f"expected {wanted}, got {value!r}{hint}"


def _tuple_problem(annotation, read: Any) -> str | None:
    """What is wrong with `read` for a `tuple[T, T]` or `tuple[T, ...]` of plain types (a range,
    a list of names): not a list, or not of that length or type; None where it fits or the
    annotation is another."""
    items = typing.get_args(annotation)
    many = len(items) == 2 and items[1] is Ellipsis
    kinds = set(items[:1] if many else items)
    if read is None or not kinds <= {int, float, str}:
        return None
    (kind,) = kinds if len(kinds) == 1 else (None,)
    noun = {int: "whole numbers", float: "numbers", str: "strings"}.get(kind, "values")
    wanted = f"a list of {noun}" if many else f"a list of {len(items)} {noun}"
    shown = {list: "a list", dict: "a mapping"}.get(type(read), repr(read))
    if not isinstance(read, list):
        return f"expected {wanted}, got {shown}"
    if not many and len(read) != len(items):
        return f"expected {wanted}, got a list of {len(read)}"
    for item, typed in zip(read, [items[0]] * len(read) if many else items):
        if item is UNJUDGED:
            continue
        if typed is not str and isinstance(item, str):  # "5" for a number, as jsonargparse reads
            item = _loaded(item)
        fits = (
            isinstance(item, str)
            if typed is str
            else (
                isinstance(item, (int, float) if typed is float else int)
                and not isinstance(item, bool)
            )
        )
        if not fits:
            return f"expected {wanted}, got {item!r} among them"
    return None


def option_problems(
    argv: Sequence[str],
    classes: dict[str, tuple[Any, str]],
    groups: dict[str, Any] | None = None,
) -> list[str]:
    """Each `--key.name` option in `argv` whose class takes no argument `name`, or whose value
    the argument's plain type refuses, or that a link overrides, as `--option: what is wrong`;
    and the problems of a file given for a top-level key (`--model m.yaml`). `classes` maps key
    paths to the classes the configs named there (and their class_path); a key whose class the
    command line names anew is left to jsonargparse. `groups` maps keys to the classes whose
    arguments are the CLI's own options (None: those of GROUPS), where an abbreviation of an
    argument's name passes (argparse expands it)."""
    if groups is None:
        groups = {key: found[0] for key in GROUPS if (found := _group(key)) is not None}
    options = list(_options(argv))
    problems = []
    for option, value in options:
        if option in FILE_KEYS and value and value.endswith(CONFIG_SUFFIXES):
            problems += _file_problems(value, option, classes)
    named = {_plain(key): found for key, found in classes.items()}
    named.update((key, (found, found.__qualname__)) for key, found in groups.items())
    given = {_plain(o.removesuffix(".class_path")) for o, _ in options} & set(named)
    for option, value in options:
        parts = _plain(option.rstrip("+")).split(".")
        keys = [".".join(parts[:i]) for i in range(1, len(parts))]
        source = LINKED.get(".".join(parts))
        if source is not None:
            problems.append(f"--{option}: {_linked(source)}")
            continue
        if "dict_kwargs" in parts or parts[-1] == "help" or given.intersection(keys):
            continue  # `--model.help CLASS` is jsonargparse's help on a class's arguments
        at = max((i for i, key in enumerate(keys, 1) if key in named), default=0)
        if at:
            target, name = named[keys[at - 1]]
            abbreviates = parts[0] in groups
            problem = _option_problem(target, name, parts[at:], value, abbreviates)
            if problem is not None:
                problems.append(f"--{option}: {problem}")
    return problems


def _options(argv: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    """Each `--option` in `argv` without its dashes, and its value where one is plain to see
    (`--option=VALUE`, or `--option VALUE` with no dash at its start)."""
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            option, equals, value = arg[2:].partition("=")
            following = argv[i + 1] if i + 1 < len(argv) else "-"
            yield option, value if equals else (None if following.startswith("-") else following)


def _option_problem(target, name: str, parts: list[str], value, abbreviates: bool) -> str | None:
    """What is wrong with the option that gives `value` to the argument `parts` of `target`
    (named `name`), descending into dataclasses of options."""
    for i, part in enumerate(parts):
        parameters = _signature(target)
        if parameters is None:
            return None
        if part not in parameters:
            if abbreviates and any(k.startswith(part) for k in parameters):
                return None
            return f"{name} takes no argument {part!r}{_did_you_mean(part, list(parameters))}"
        annotation = _hints(target).get(part)
        if i == len(parts) - 1:
            if value in ("null", "None") and _optional_module(annotation):
                return (
                    "a part is not removed on the command line (jsonargparse takes no null "
                    f"for it there): lay a config over this one, with `{part}: null` under "
                    "its place (asr fit --config CONFIG --config WITHOUT.yaml)"
                )
            if value is None:  # no value given: jsonargparse says so
                return None
            typed = _options_class(annotation)
            if typed is not None:
                return _options_problem(typed, annotation, _loaded(value))
            return _type_problem(annotation, value, parameters[part].default)
        target = _options_class(annotation)
        if target is None:
            return None
        name = target.__qualname__
    return None


def _optional_module(annotation) -> bool:
    """Whether an annotation is `SomeModule | None` (a part a config may leave out)."""
    from torch import nn  # loaded already: the configs' classes are torch modules

    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return False
    members = [a for a in typing.get_args(annotation) if a is not type(None)]
    return len(members) == 1 and inspect.isclass(members[0]) and issubclass(members[0], nn.Module)


def _group(key: str) -> tuple[Any, str] | None:
    """The class of the top-level `key` of GROUPS, and its name; None for another key."""
    if key not in GROUPS:
        return None
    found = _resolve(GROUPS[key][0])
    return (found, GROUPS[key][1]) if found is not None and not isinstance(found, str) else None


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
