"""The checkpoint format: a payload of plain values (model config, tokenizer and asset files,
default settings) beside the weights, so `torch.load(weights_only=True)` rebuilds the model."""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib
import inspect
import logging
import os
import pickle
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from asr.text import Tokenizer

log = logging.getLogger(__name__)

RECOGNIZER_KEY = "asr"
LM_KEY = "lm"
ASSET_KEYS = ("stats_path",)  # config arguments naming files embedded in checkpoints


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded safely or is malformed; names the file."""


def load_checkpoint(path: str | os.PathLike, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint with `weights_only=True`: tensors and plain containers, never code;
    `mmap` maps its tensors rather than read them (a look at its keys)."""
    if str(path).startswith("hf://"):  # Path() would make it hf:/..., no such file either
        raise FileNotFoundError(
            f"{path}: hf:// names a model package (--model); here a checkpoint file is read"
        )
    path = Path(path)
    if not path.is_file():
        what = "a folder, not a checkpoint file" if path.is_dir() else "no such checkpoint"
        raise FileNotFoundError(f"{path}: {what}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"PK\x03\x04" and head[:1] != b"\x80":  # torch.save's zip; its older pickle
        raise CheckpointError(f"{path}: not a checkpoint (torch.save writes a zip archive)")
    mmap = mmap and head != b"\x80"  # the older pickle format cannot be mapped
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"{path}: refused to load: it holds objects other than tensors and plain "
            f"containers, which could run code ({str(err).splitlines()[0]})"
        ) from None
    except (RuntimeError, EOFError, IndexError, KeyError, ValueError, OSError) as err:  # torn
        raise CheckpointError(f"{path}: not a readable checkpoint ({err})") from None


def atomic_save(obj: Any, path: str | os.PathLike, follow_link: bool = False) -> None:
    """`torch.save` atomically: a temporary file, fsync, then rename over `path`; a file
    written over keeps its permissions. `follow_link`: where `path` is a symbolic link, write
    its target (a model being updated) instead of replacing the link (Lightning's
    `save_last: link`, whose target is a kept checkpoint)."""
    path = Path(os.path.realpath(path) if follow_link else path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def checkpoint_payload(
    model_config: dict[str, Any], tokenizer: Tokenizer, **extra: Any
) -> dict[str, Any]:
    """The self-describing part of a checkpoint: config, tokenizer files, assets, `extra`."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        files = encoded_files(Path(tmp))
    payload = {"model_config": model_config, "tokenizer": files}
    payload["assets"] = _find_assets(model_config, {})
    payload.update({k: v for k, v in extra.items() if v is not None})
    return payload


def read_payload(path: str | os.PathLike, key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(checkpoint, payload)` of the checkpoint at `path`, the payload stored under `key`;
    CheckpointError where either is not what `asr fit` writes."""
    state = load_checkpoint(path)
    state = state if isinstance(state, dict) else {}  # a list or tensor of another tool's
    payload = state.get(key)
    if not isinstance(payload, dict) or "model_config" not in payload:
        kinds = {RECOGNIZER_KEY: "recognizer", LM_KEY: "language model"}
        other = next((kinds[k] for k in kinds if k != key and k in state), None)
        hint = f" (it is a {other} checkpoint)" if other else " (not written by `asr fit`?)"
        raise CheckpointError(f"{path}: no {kinds.get(key, key)} config inside{hint}")
    _check_payload(path, state, payload)
    return state, payload


def _check_payload(path: str | os.PathLike, state: dict[str, Any], payload: dict[str, Any]) -> None:
    """CheckpointError naming `path` and the first entry of a checkpoint that its readers
    would trip over: no state_dict, a model config that is no mapping, or tokenizer or asset
    files that are not base64 text by name."""
    check_state_dict(path, state)
    if not isinstance(payload["model_config"], dict):
        kind = type(payload["model_config"]).__name__
        raise CheckpointError(f"{path}: its model_config is a {kind}, not a mapping of settings")
    if "tokenizer" not in payload:
        raise CheckpointError(f"{path}: no tokenizer files inside (not written by `asr fit`?)")
    for entry in ("tokenizer", "assets"):
        files = payload.get(entry, {})  # assets: none in older checkpoints
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise CheckpointError(f"{path}: its {entry} entry is not files by name (base64 text)")


def check_state_dict(path: str | os.PathLike, state: Any) -> None:
    """CheckpointError naming `path` unless the checkpoint `state` holds a state_dict."""
    if not isinstance(state, dict) or not isinstance(state.get("state_dict"), dict):
        raise CheckpointError(f"{path}: no state_dict inside (not written by `asr fit`?)")


def refuse_non_finite(weights: Mapping[str, torch.Tensor], source: str | os.PathLike) -> None:
    """CheckpointError naming `source` and the first floating tensor of `weights` that holds a
    NaN or an infinity: damaged weights would decode every input as nothing, without a word."""
    for name, tensor in weights.items():
        if not tensor.is_floating_point() or tensor.numel() == 0:  # aminmax of none: an error
            continue
        # the extremes are non-finite where any value is (NaN propagates): one pass, no copy
        if not torch.isfinite(torch.stack(torch.aminmax(tensor))).all():
            raise CheckpointError(f"{source}: {name}: non-finite values (a damaged file)")


def payload_tokenizer(payload: dict[str, Any]) -> Tokenizer:
    """The tokenizer whose files the payload embeds."""
    with tempfile.TemporaryDirectory() as tmp:
        write_embedded_files(payload["tokenizer"], Path(tmp))
        return Tokenizer.load(tmp)  # reads everything into memory


def build_from_payload(
    builder: Callable[..., Any], payload: dict[str, Any], source: str | os.PathLike = "a model"
) -> Any:
    """Call `builder` with the payload's model config, its asset files unpacked meanwhile;
    CheckpointError names `source` where the config does not build (a newer asr's option, a
    class that is not there). The random initial weights, replaced by the checkpoint's, leave
    the caller's random numbers alone."""
    taken = inspect.signature(builder).parameters  # the rest (init_from...) is not parsed
    foreign = _foreign_name({k: v for k, v in payload["model_config"].items() if k in taken})
    if foreign is not None:
        raise CheckpointError(
            f"{source}: its model config names {foreign!r}, not a class of asr: building it "
            "would import and run code from elsewhere; refused"
        )
    with tempfile.TemporaryDirectory() as tmp, torch.random.fork_rng(devices=[]):
        assets = {}
        for i, (original, data) in enumerate(payload.get("assets", {}).items()):
            assets[original] = str(Path(tmp) / f"asset{i}_{Path(original).name}")
            Path(assets[original]).write_bytes(base64.b64decode(data))
        try:
            return instantiate(builder, replace_assets(payload["model_config"], assets))
        except (argparse.ArgumentError, TypeError, ValueError) as err:
            said = build_error(err)
            for original, unpacked in assets.items():  # a damaged asset: its own error alone
                found = re.search(re.escape(unpacked) + r"(:\d+)?: (.+?)(?= - |$)", said)
                if found:
                    line, reason = found.group(1) or "", found.group(2)
                    raise CheckpointError(f"{source}: its {original}{line}: {reason}") from None
            raise CheckpointError(f"{source}: its model config does not build: {said}") from None


def _foreign_name(config: Any) -> str | None:
    """The first string in a nested config that names something to import outside this package
    (a `class_path`, or any dotted name: jsonargparse imports one given for a class or callable
    argument), or None. A model file is data: loading it must not import a stranger's module.

    >>> _foreign_name({"e": {"class_path": "asr.models.rnn.RNNEncoder"}, "stats_path": "a.json"})
    >>> _foreign_name({"a": [{"class_path": "os.system"}]}), _foreign_name({"e": "this.s"})
    ('os.system', 'this.s')
    >>> _foreign_name({"e": "asr.models.seq2seq.nn.Identity"})  # torch's, by way of asr
    'asr.models.seq2seq.nn.Identity'
    """
    if isinstance(config, str):
        return config if _import_path(config) and not _in_asr(config) else None
    if isinstance(config, dict):  # file names (cmvn.json) are no import paths
        config = [v for k, v in config.items() if k not in ASSET_KEYS]
    if not isinstance(config, list):
        return None
    return next((f for f in map(_foreign_name, config) if f is not None), None)


def _import_path(text: str) -> bool:
    """Whether jsonargparse would take `text` for an import path: dotted Python names.

    >>> _import_path("ñpkg.payload.build"), _import_path("a/b.json"), _import_path("hann")
    (True, False, False)
    """
    return "." in text and all(part.isidentifier() for part in text.split("."))


def _in_asr(name: str) -> bool:
    """Whether `name` leads to nothing but this package's own: its longest prefix that imports
    is a module of asr, and the attributes after it, where they are there, are defined in asr
    (where one is not, the config does not build, and jsonargparse says so)."""
    parts = name.split(".")
    if parts[0] != "asr":
        return False
    for end in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:end]))
            break
        except ImportError:
            continue
    for attribute in parts[end:]:
        if not hasattr(found, attribute):
            return True
        found = getattr(found, attribute)
    home = found.__name__ if inspect.ismodule(found) else getattr(found, "__module__", None)
    return str(home).split(".")[0] == "asr"


def build_error(error: BaseException) -> str:
    """jsonargparse's error of building a config, on one line, without its dump of the config.

    >>> build_error(ValueError('Parser key "n": Expected int. Got value: forty'))
    'Parser key "n": Expected int. Got value: forty'
    >>> build_error(ValueError("Problem with x. Given value: Namespace(a=1,\\n b=2)"))
    'Problem with x.'
    """
    said = " ".join(str(error).split())
    return re.split(r" G(?:ot|iven) value: (?:Namespace|\{)", said)[0]


def weight_differences(
    own: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], unexpected: bool = True
) -> list[str]:
    """How `weights` ("there") do not fit the state dict `own` ("here"): tensors of another
    shape, then those missing, then (`unexpected`) those `own` lacks.

    >>> weight_differences({"a": torch.zeros(2), "b": torch.zeros(1)}, {"a": torch.zeros(3)})
    ['a is (3,) there, (2,) here', 'b is not there']
    """
    differ = [
        f"{name} is {tuple(weights[name].shape)} there, {tuple(tensor.shape)} here"
        for name, tensor in own.items()
        if name in weights and weights[name].shape != tensor.shape
    ]
    differ += [f"{name} is not there" for name in own if name not in weights]
    if unexpected:
        differ += [f"{name} is not here" for name in weights if name not in own]
    return differ


def store_in_payload(path: str | os.PathLike, values: dict[str, Any]) -> None:
    """Set keys of a recognizer checkpoint's payload, rewriting it atomically once."""
    if Path(path).is_dir():
        raise CheckpointError(
            f"{path}: a folder; finalize a checkpoint file (a package's checkpoint, then export "
            "it again)"
        )
    state, payload = read_payload(path, RECOGNIZER_KEY)
    payload.update(values)
    atomic_save(state, path, follow_link=True)


def weights_digest(weights: Mapping[str, torch.Tensor]) -> str:
    """A digest of a model's parameters and buffers (a `state_dict`): the same for a checkpoint,
    its package and the model loaded from either."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(weights.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def submodule_weights(state: dict[str, Any], prefix: str) -> dict[str, torch.Tensor]:
    """The `state_dict` entries under `prefix` ("model." in recognizer checkpoints), renamed."""
    weights = state["state_dict"]
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}


def instantiate(builder: Callable[..., Any], config: dict[str, Any]) -> Any:
    """Call `builder` with plain init args, `class_path`s built, unknown keys ignored."""
    from jsonargparse import ArgumentParser

    taken = inspect.signature(builder).parameters
    parser = ArgumentParser(exit_on_error=False)
    if inspect.isclass(builder):
        parser.add_class_arguments(builder, "model", fail_untyped=False)
    else:
        parser.add_function_arguments(builder, "model", fail_untyped=False)
    parsed = parser.parse_object({"model": {k: v for k, v in config.items() if k in taken}})
    arguments = parser.instantiate(parsed).model
    return arguments if inspect.isclass(builder) else builder(**vars(arguments))


def write_embedded_files(files: dict[str, str], folder: Path) -> None:
    """Write base64 files (as `checkpoint_payload` embeds them) into `folder`."""
    for name, data in files.items():
        (folder / Path(name).name).write_bytes(base64.b64decode(data))


def encoded_files(folder: Path) -> dict[str, str]:
    """The files in `folder`, base64, by name."""
    return {p.name: base64.b64encode(p.read_bytes()).decode() for p in folder.iterdir()}


def _find_assets(config: Any, found: dict[str, str]) -> dict[str, str]:
    """Collect files named by ASSET_KEYS anywhere in a nested config."""
    if isinstance(config, dict):
        for key, value in config.items():
            if key in ASSET_KEYS and isinstance(value, str) and value:
                found[value] = base64.b64encode(Path(value).read_bytes()).decode()
            else:
                _find_assets(value, found)
    elif isinstance(config, list):
        for value in config:
            _find_assets(value, found)
    return found


def replace_assets(config: Any, paths: dict[str, str]) -> Any:
    """`config` with the files its ASSET_KEYS name renamed as `paths` maps them."""
    if isinstance(config, dict):
        return {
            k: paths.get(v, v) if k in ASSET_KEYS else replace_assets(v, paths)
            for k, v in config.items()
        }
    if isinstance(config, list):
        return [replace_assets(v, paths) for v in config]
    return config


def best_checkpoints(last: str | os.PathLike, count: int) -> list[Path]:
    """The `count` best checkpoints recorded in `last`, found beside it if the run moved (one
    missing there: FileNotFoundError, never the original run's file)."""
    state = load_checkpoint(last)
    check_state_dict(last, state)
    scored: dict[str, float] = {}
    mode = "min"
    folders = set()  # where its checkpoint callbacks write: one is `last`'s unless it moved
    for key, value in state.get("callbacks", {}).items():
        if isinstance(value, dict) and isinstance(value.get("dirpath"), str):
            folders.add(os.path.realpath(value["dirpath"]))
        if key.startswith("ModelCheckpoint") and value.get("best_k_models"):
            scored.update({p: float(s) for p, s in value["best_k_models"].items()})
            mode = "max" if "'mode': 'max'" in key else "min"
    if not scored:
        raise CheckpointError(f"{last}: records no best checkpoints (was a metric monitored?)")
    ranked = sorted(scored, key=scored.get, reverse=mode == "max")
    in_place = os.path.realpath(Path(last).parent) in folders
    later = _later_run_last(state, Path(last)) if in_place else None
    if later is not None:
        log.info("%s: the best checkpoints as %s, written later, records them", last, later)
        return best_checkpoints(later, count)
    return [_beside(Path(p), Path(last), in_place) for p in ranked[:count]]


def _later_run_last(state: dict[str, Any], last: Path) -> Path | None:
    """The run's own last.ckpt where `last` (`state`) is a step-checkpoint folder's written
    before it (the run went on past its step checkpoint): its record of the best is the later."""
    for key, value in state.get("callbacks", {}).items():
        recorded = value.get("last_model_path") if isinstance(value, dict) else None
        if not (key.startswith("ModelCheckpoint") and isinstance(recorded, str) and recorded):
            continue
        if os.path.realpath(recorded) == os.path.realpath(last) or not Path(recorded).is_file():
            continue
        theirs = load_checkpoint(recorded, mmap=True)
        step = theirs.get("global_step", -1) if isinstance(theirs, dict) else -1
        if step > state.get("global_step", -1):
            return Path(recorded)
    return None


def _beside(recorded: Path, last: Path, in_place: bool = False) -> Path:
    """The file of `recorded`'s name beside `last` (the record): a run moved or copied reads
    its own checkpoints, never the original's, which may be other weights by now, so one
    missing there is an error; `recorded` itself where the run was not moved (`in_place`: a
    last.ckpt in the folder it was written to, a step-checkpoint folder's too)."""
    if in_place:
        return recorded  # load_checkpoint names it where it is missing
    here = last.parent / recorded.name
    if here.exists():
        return here
    if recorded.parent.resolve() == last.parent.resolve():
        return recorded  # not moved: load_checkpoint names it missing
    raise FileNotFoundError(
        f"{here}: no such checkpoint, though {last} records it among the best; {recorded}, in "
        "another folder (of the run this one was moved or copied from?), is not read in its "
        "place: copy it here, or name the checkpoints to read (asr average --checkpoints)"
    )


# Settings of a network's config that training alone reads, or speed alone (dropouts of any
# name too; the CMVN statistics' file is compared by its content): the network decodes alike
# whatever they are, so a run resumed with others (`asr fit` lets it) averages as one model.
# (max_len: the positional table grows on demand.)
TRAINING_ONLY = frozenset({"augment", "stats_path", "full_context_prob", "dynamic_chunk", "dither",
                           "unpacked_on_cpu", "max_len", "scheduled_sampling"})  # fmt: skip


def training_only(key: str) -> bool:
    """Whether a model config's setting `key` (its last name) is one of `TRAINING_ONLY`."""
    return key in TRAINING_ONLY or "dropout" in key


NETWORK_PARTS = ("frontend", "encoder", "decoder", "lm")  # a recognizer's, or an LM's


def _differences(state: dict[str, Any], first: dict[str, Any]) -> str | None:
    """What makes the recognizer or LM of checkpoint `state` another model than `first`'s: its
    tokenizer, asset files (CMVN statistics, by content) or the parts of its config that build
    the network as it decodes (those that differ); None: nothing."""
    ours, theirs = (s.get(RECOGNIZER_KEY) or s.get(LM_KEY) or {} for s in (state, first))
    if ours.get("tokenizer") != theirs.get("tokenizer"):
        return "its tokenizer"
    if sorted((ours.get("assets") or {}).values()) != sorted((theirs.get("assets") or {}).values()):
        return "its asset file (CMVN statistics)"
    config, other = (_network(p.get("model_config") or {}) for p in (ours, theirs))
    parts = [k for k in NETWORK_PARTS if config[k] != other[k]]
    return f"its model config ({', '.join(parts)})" if parts else None


def _network(config: dict[str, Any]) -> dict[str, Any]:
    """The network parts of a model config without what training alone reads (dropout too)."""

    def kept(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: kept(v) for k, v in node.items() if not training_only(k)}
        return [kept(v) for v in node] if isinstance(node, list) else node

    return {part: kept(config.get(part)) for part in NETWORK_PARTS}


TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks")
# Payload entries `asr finalize` fits on one checkpoint's weights: search settings, confidence
# scaling, alignment heads; no average of other weights inherits them
FINALIZED = ("decoding", "confidence_scaling", "alignment_heads")


def holds_training_state(path: str | os.PathLike) -> bool:
    """Whether `path` is a checkpoint that `asr fit --ckpt_path` resumes (False for weights
    alone, an average, or a file that is not a checkpoint)."""
    if not Path(path).is_file():
        return False
    try:
        return "optimizer_states" in load_checkpoint(path, mmap=True)
    except (CheckpointError, OSError):
        return False


def average_checkpoints(paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Average the floating-point weights of checkpoints, each given once; the rest comes from
    the first, but for what `asr finalize` fitted on its weights alone (FINALIZED), which the
    average is to be finalized for anew."""
    if not paths:
        raise ValueError("no checkpoints to average")
    _refuse_repeats(paths)
    if Path(out).resolve() in {Path(p).resolve() for p in paths}:
        raise ValueError(f"{out} is one of the checkpoints averaged: write the average elsewhere")
    if holds_training_state(out):
        raise ValueError(
            f"{out} holds a training state (asr fit resumes from it): write the average elsewhere"
        )
    states = [load_checkpoint(p) for p in paths]
    for path, state in zip(paths, states):
        check_state_dict(path, state)
    first = states[0]["state_dict"]
    for path, state in zip(paths[1:], states[1:]):
        if state["state_dict"].keys() != first.keys():
            raise CheckpointError(f"{path}: parameters differ from {paths[0]}")
        for name, tensor in state["state_dict"].items():
            if tensor.shape != first[name].shape:
                raise CheckpointError(
                    f"{path}: {name} is {tuple(tensor.shape)}, {tuple(first[name].shape)} in "
                    f"{paths[0]}: checkpoints of another model"
                )
        different = _differences(state, states[0])
        if different is not None:
            raise CheckpointError(f"{path}: {different} is not that of {paths[0]}")
    averaged = {}
    for name, tensor in first.items():
        if tensor.is_floating_point():
            stacked = torch.stack([s["state_dict"][name].double() for s in states])
            averaged[name] = stacked.mean(0).to(tensor.dtype)
        else:
            averaged[name] = tensor
    # weights, not a training state: no optimizer, schedule, loop or best-checkpoint records
    result = {k: v for k, v in states[0].items() if k not in TRAINING_STATE}
    result["state_dict"] = averaged
    _drop_finalized(result, paths[0])
    result["averaged_from"] = [str(p) for p in paths]
    atomic_save(result, out)
    return Path(out)


def _refuse_repeats(paths: Sequence[str | os.PathLike]) -> None:
    """ValueError naming a file given twice (by any spelling or link): it would weigh double."""
    seen: dict[Any, str | os.PathLike] = {}
    for path in paths:
        try:
            status = os.stat(path)
            key: Any = (status.st_dev, status.st_ino)
        except OSError:  # missing: load_checkpoint names it
            key = Path(path).resolve()
        if key in seen:
            also = "" if str(seen[key]) == str(path) else f" (as {seen[key]} too)"
            raise ValueError(f"{path}: given twice{also}; each checkpoint is averaged once")
        seen[key] = path


def _drop_finalized(state: dict[str, Any], first: str | os.PathLike) -> None:
    """Remove from the average's payload what `asr finalize` fitted on `first`'s weights."""
    payload = state.get(RECOGNIZER_KEY)
    if not isinstance(payload, dict):
        return
    dropped = [key for key in FINALIZED if payload.pop(key, None) is not None]
    if dropped:
        log.info(
            "%s: its %s (of `asr finalize`) were fitted on its weights alone: left out of the "
            "average; `asr finalize` fits them to it",
            first,
            ", ".join(dropped),
        )
