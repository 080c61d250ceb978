"""Starting a model from a trained one (`asr fit --model.init_from MODEL`): weights of the same
name and shape are copied, and vocabulary-axis weights keep the rows of shared tokens."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from asr.checkpoint import training_only, weight_differences
from asr.loading import trained_tokenizer
from asr.package import read_recognizer
from asr.text import Tokenizer


@dataclass
class Transfer:
    """What `init_from` did with each tensor of the new model (and the trained one's)."""

    copied: list[str] = field(default_factory=list)
    remapped: dict[str, tuple[int, int]] = field(default_factory=dict)  # (copied, total) tokens
    reinitialised: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)  # in the trained model only
    # tensors of this model that another one's copy wrote over (tied): name -> the other's
    overwritten: dict[str, str] = field(default_factory=dict)
    trained_config: dict = field(default_factory=dict)  # the trained model's config

    def summary(self) -> str:
        """Lines for the log: counts, then every tensor not copied whole."""
        lines = [
            f"init_from: {len(self.copied)} tensors copied, {len(self.remapped)} remapped to the "
            f"new vocabulary, {len(self.reinitialised)} re-initialised, "
            f"{len(self.unused)} of the trained model unused"
        ]
        lines += [f"  remapped {k}: {n} of {total} tokens copied"
                  for k, (n, total) in self.remapped.items()]  # fmt: skip
        lines += [f"  re-initialised {k}" for k in self.reinitialised]
        lines += [f"  unused {k}" for k in self.unused]
        lines += [f"  {k} is tied to {other} here: it holds the trained {other}"
                  for k, other in self.overwritten.items()]  # fmt: skip
        return "\n".join(lines)


def shared_tokens(source: Tokenizer, target: Tokenizer) -> dict[int, int]:
    """Target id -> source id of every piece both vocabularies hold.

    >>> from asr.text import CharTokenizer
    >>> shared = shared_tokens(CharTokenizer.train(["AB"]), CharTokenizer.train(["BC"]))
    >>> {CharTokenizer.train(["BC"]).pieces([t])[0]: s for t, s in shared.items()}["B"] > 0
    True
    """
    ids = {piece: i for i, piece in enumerate(source.pieces(range(source.vocab_size)))}
    pieces = target.pieces(range(target.vocab_size))
    return {t: ids[p] for t, p in enumerate(pieces) if p in ids}


OUTPUT_LAYERS = ("decoder.output", "ctc.proj")  # `Seq2Seq` layers with one row per token


ENCODER_SIDE = ("frontend.", "encoder.")  # what a fine-tune must start from as trained


def vocabulary_tensors(model: nn.Module) -> dict[str, int]:
    """Name -> vocabulary axis of every tensor of a `Seq2Seq` indexed by token."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            found[f"{name}.weight"] = 0
        elif name in OUTPUT_LAYERS:
            found |= {f"{name}.{p}": 0 for p, _ in module.named_parameters(recurse=False)}
    return found


@torch.no_grad()
def transfer_weights(
    model: nn.Module,
    weights: dict[str, Tensor],
    source: Tokenizer,
    target: Tokenizer,
) -> Transfer:
    """Copy `weights` (tokenizer `source`) into `model` (tokenizer `target`), in place."""
    report = Transfer()
    same_vocabulary = source.pieces(range(source.vocab_size)) == target.pieces(
        range(target.vocab_size)
    )
    shared = shared_tokens(source, target)
    new_rows, old_rows = torch.tensor(list(shared)), torch.tensor(list(shared.values()))
    by_token = {} if same_vocabulary else vocabulary_tensors(model)
    state = model.state_dict()
    _check_same_encoder(state, weights)
    writer: dict[tuple, str] = {}  # a tensor's memory -> the last name copied into it
    for name, tensor in state.items():
        old = weights.get(name)
        axis = by_token.get(name)
        if old is None:
            report.reinitialised.append(name)
            continue
        if axis is not None and _same_but(old, tensor, axis) and len(shared):
            tensor.index_copy_(axis, new_rows, old.index_select(axis, old_rows).to(tensor.dtype))
            report.remapped[name] = (len(shared), target.vocab_size)
        elif axis is None and old.shape == tensor.shape:
            tensor.copy_(old)
            report.copied.append(name)
        else:
            report.reinitialised.append(name)
            continue
        writer[tensor.data_ptr(), tensor.shape] = name
    for name in [*report.copied, *report.remapped]:  # tied here, not in the trained model
        last = writer[state[name].data_ptr(), state[name].shape]
        if last != name and not torch.equal(weights[last], weights[name]):
            report.overwritten[name] = last
    report.copied = [name for name in report.copied if name not in report.overwritten]
    report.remapped = {k: v for k, v in report.remapped.items() if k not in report.overwritten}
    report.unused = [name for name in weights if name not in state]
    return report


def _check_same_encoder(state: dict[str, Tensor], weights: dict[str, Tensor]) -> None:
    """ValueError where the frontend or encoder of the config is not the trained one's: its
    tensors would be re-initialised, and the fine-tune would start from almost nothing (a
    decoder of another size may be re-initialised: it learns again from the encoder)."""
    encoder_side = {n: t for n, t in state.items() if n.startswith(ENCODER_SIDE)}
    differ = weight_differences(encoder_side, weights, unexpected=False)
    if differ:
        first, more = differ[0], len(differ) - 1
        raise ValueError(
            f"init_from: the trained model's frontend or encoder is not this config's: {first}"
            + (f" (and {more} more)" if more else "")
            + "; give the config it was trained with"
        )


def _same_but(old: Tensor, new: Tensor, axis: int) -> bool:
    """Whether `old` and `new` have the same shape but for `axis`."""
    return old.dim() == new.dim() and all(
        a == b for d, (a, b) in enumerate(zip(old.shape, new.shape)) if d != axis
    )


def init_from(model: nn.Module, path: str | os.PathLike, tokenizer: Tokenizer) -> Transfer:
    """Initialise `model` from the trained recognizer at `path` (checkpoint, package, hf://)."""
    path = os.path.expanduser(path)  # as a shell would
    weights, payload = read_recognizer(path)
    report = transfer_weights(model, weights, trained_tokenizer(payload, path), tokenizer)
    report.trained_config = payload["model_config"]
    return report


# Beside settings of training or speed alone (`asr.checkpoint.training_only`), a fine-tune
# may give other CMVN statistics inline (the trained ones are copied over them, as over those
# of another file); a resume may not.
FINE_TUNE_ONLY = frozenset({"mean", "std"})


def check_same_settings(trained: dict, config: dict) -> None:
    """ValueError where the frontend or encoder settings of `config` (a model config, as the
    trained one's) compute otherwise than `trained`'s with tensors of the same shapes: the
    encoder would meet features of another frame rate, or positions of another kind.

    >>> check_same_settings({"frontend": {"hop_length": 160, "dropout": 0.1}},
    ...                     {"frontend": {"hop_length": 160, "dropout": 0.3}})
    >>> check_same_settings({"frontend": {"hop_length": 160}}, {"frontend": {"hop_length": 320}})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: init_from: the trained model's frontend.hop_length is 160, this config's 320; ...
    """
    differ = setting_differences(trained, config, ("frontend", "encoder"))
    if differ:
        (first, then, now), more = differ[0], len(differ) - 1
        raise ValueError(
            f"init_from: the trained model's {first} is {then!r}, this config's {now!r}"
            + (f" (and {more} more)" if more else "")
            + "; give the settings it was trained with"
        )


def decoder_differences(trained: dict, config: dict) -> str | None:
    """A warning where the decoder settings of `config` differ from `trained`'s: a decoder
    of another size is re-initialised, but its tensors of the same shapes (all of them, for
    another head count) are copied, and compute otherwise than they learnt to."""
    differ = setting_differences(trained, config, ("decoder",))
    if not differ:
        return None
    said = "; ".join(f"{key} is {then!r} there, {now!r} here" for key, then, now in differ)
    return (
        f"init_from: the trained model's decoder has other settings ({said}): its tensors of "
        "the same shapes were copied, and compute otherwise than they learnt to"
    )


def setting_differences(
    trained: dict, config: dict, parts: Sequence[str], fine_tune: bool = True
) -> list[tuple[str, Any, Any]]:
    """`(key, trained's, config's)` of each setting of the model config `parts` that both give
    otherwise (training-only ones aside, and with `fine_tune` inline CMVN statistics; one
    given by a single config is passed over: the other's asr had it not, and its default
    held), by dotted key without `init_args`.

    >>> setting_differences({"e": {"n": 1, "dropout": 0.1}}, {"e": {"n": 2, "dropout": 0}}, ["e"])
    [('e.n', 1, 2)]
    """
    then: dict[str, Any] = {}
    now: dict[str, Any] = {}
    for part in parts:
        _flatten(trained.get(part), part, then, fine_tune)
        _flatten(config.get(part), part, now, fine_tune)
    return [(k, then[k], now[k]) for k in sorted(then.keys() & now.keys()) if then[k] != now[k]]


def _class_name(class_path: str) -> str:
    """The module and name of the class `class_path` names (a re-export names its home), where
    its module is imported already (a model's config, once built); else `class_path` itself:
    a checkpoint's config is data, and comparing it must not import a stranger's module."""
    module, _, name = class_path.rpartition(".")
    found = getattr(sys.modules.get(module), name, None)
    if not isinstance(found, type):
        return class_path
    return f"{found.__module__}.{found.__qualname__}"


def _flatten(value: Any, key: str, into: dict[str, Any], fine_tune: bool = True) -> None:
    """`value`'s leaves by dotted key, without `init_args` parts or training-only settings; a
    part given as a class, under its own key too (so that one and None differ).

    >>> found = {}
    >>> _flatten({"level": {"class_path": "L", "init_args": {"dbfs": -20}}}, "f", found)
    >>> found
    {'f.level': 'L', 'f.level.dbfs': -20}
    """
    name = key.rsplit(".", 1)[-1]
    if training_only(name) or (fine_tune and name in FINE_TUNE_ONLY):
        return
    if not isinstance(value, dict):
        into[key] = value
        return
    if "class_path" in value:  # as the class it names: asr.frontends.X is ...features.X
        into[key] = _class_name(str(value["class_path"]))
    for part, item in value.items():
        if part != "class_path":
            _flatten(item, key if part == "init_args" else f"{key}.{part}", into, fine_tune)
