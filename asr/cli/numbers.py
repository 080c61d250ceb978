"""argparse types of the numeric options: each refuses what is not a finite number in its
range by the option's name (argparse says which), before any model loads; and the search
options that refuse each other as given."""

from __future__ import annotations

import argparse
import math


def whole(low: int):
    """A whole number of at least `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


count = whole(1)  # threads, beams, streams...


def number(text: str) -> float:
    """A finite number: nan and inf would pass every range check below, or fail deep inside."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def at_least(low: float, strictly: bool = False):
    """A finite number of at least (more than, `strictly`) `low`."""

    def parse(text: str) -> float:
        value = number(text)
        if value < low or (strictly and value == low):
            least = "more than" if strictly else "at least"
            raise argparse.ArgumentTypeError(f"must be {least} {low:g}, got {value:g}")
        return value

    return parse


positive = at_least(0.0, strictly=True)
non_negative = at_least(0.0)


def decibels_below(floor: float):
    """A level in dB below 0 and above `floor`."""

    def parse(text: str) -> float:
        value = number(text)
        if not floor < value < 0:
            raise argparse.ArgumentTypeError(f"must lie in ({floor:g}, 0) dB, got {value:g}")
        return value

    return parse


def weight(text: str, high: float = 1.0) -> float:
    """A weight in [0, `high`]."""
    value = number(text)
    if not 0.0 <= value <= high:
        raise argparse.ArgumentTypeError(f"must lie in [0, {high:g}], got {value:g}")
    return value


def lm_weight(text: str) -> float:
    """A shallow-fusion weight, in [0, MAX_LM_WEIGHT]."""
    from asr.search import MAX_LM_WEIGHT

    return weight(text, MAX_LM_WEIGHT)


def port(text: str) -> int:
    """A TCP port: 0 (any free one) to 65535."""
    value = whole(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port, 0 to 65535, got {value}")
    return value


def check_search_arguments(args: argparse.Namespace) -> None:
    """ValueError for decoding arguments that refuse each other as given (`--nbest` above
    `--beam-size`, `--lm-weight` without `--lm`), before any model's defaults are known."""
    from asr.search import SearchOptions

    if getattr(args, "lm", None) == "":  # an unset shell variable: not "no LM"
        raise ValueError("--lm is empty: give a language model checkpoint, or leave --lm out")
    if getattr(args, "lm_weight", None) is not None and not getattr(args, "lm", None):
        raise ValueError("--lm-weight needs --lm")
    nbest, beam = getattr(args, "nbest", None), getattr(args, "beam_size", None)
    if nbest is not None and beam is not None:  # else the model's own beam decides
        check_nbest(nbest, beam, stored=False)
        SearchOptions(beam_size=beam, nbest=nbest)


def check_nbest(nbest: int | None, beam_size: int, stored: bool, default: bool = False) -> None:
    """ValueError where `--nbest` asks for more hypotheses than the search keeps (`stored`:
    no `--beam-size` given, the model's own beam; `default`: it stores none, asr's default)."""
    if nbest is not None and nbest > beam_size:
        keeps = f"--beam-size {beam_size}"
        if stored:
            whose = "the default beam" if default else "the model's stored beam"
            keeps = f"{whose} ({beam_size})"
        raise ValueError(
            f"--nbest {nbest}: more hypotheses than {keeps} keeps; give --beam-size {nbest} or more"
        )
