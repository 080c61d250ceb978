"""`asr robustness`: WER/CER of a test set under perturbed recording conditions, from seeded
copies of its audio (`DEFAULT_CONDITIONS`), as robustness.md and robustness.json."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
from torch import Tensor
from tqdm import tqdm

from asr import perturb
from asr.audio import AudioError, load_audio
from asr.data.manifest import BadEntry, Utterance, manifest_bytes, read_manifest, write_manifest
from asr.evaluate import NothingToScore, evaluate, usable_utterances
from asr.recognizer import Recognizer
from asr.search import LanguageModel, SearchOptions

BABBLE_TALKERS = 5
CONDITION_KINDS = (
    "clean",
    "pad",
    "level",
    *perturb.NOISE_COLORS,
    "babble",
    "reverb",
    "telephone",
    "speed",
)
DEFAULT_CONDITIONS = (
    "clean",
    "level:-20",
    "level:-30",
    "white:20",
    "white:10",
    "white:5",
    "babble:20",
    "babble:10",
    "babble:5",
    "reverb:0.3",
    "reverb:0.6",
    "reverb:0.9",
    "telephone",
    "speed:0.9",
    "speed:1.1",
)
LONGEST_PAD_SECONDS = 60.0  # of silence; more stands for no recording
# Values past these are no recording condition (and overflow a float: 10 ** (7000 / 20)).
_LIMITS = {"level": (-120.0, 120.0), "reverb": (0.0, 10.0)} | {
    kind: (-60.0, 120.0) for kind in (*perturb.NOISE_COLORS, "babble")
}
_UNITS = {"level": " dB", "reverb": " s RT60", "speed": "x", "pad": " s"} | {
    kind: " dB SNR" for kind in (*perturb.NOISE_COLORS, "babble")
}


@dataclass(frozen=True)
class Condition:
    """One recording condition, possibly followed by others (`then`).

    >>> Condition.parse("babble:10").label, Condition.parse("level:-20").slug
    ('babble 10 dB SNR', 'level-20')
    >>> Condition.parse("pad:10+white:0").label, Condition.parse("pad:10+white:0").slug
    ('pad 0-10 s + white 0 dB SNR', 'pad10+white0')
    """

    kind: str  # one of CONDITION_KINDS
    value: float | None = None  # gain dB, SNR dB, RT60 s, speed factor or seconds of silence
    then: Condition | None = None

    @classmethod
    def parse(cls, text: str) -> Condition:
        """`kind` or `kind:value` ("white:10"), or several joined by "+", applied in order (a
        "+" before a kind's name: "level:+6" is a value's sign).

        >>> Condition.parse("level:+6+white:1e+1").label
        'level 6 dB + white 10 dB SNR'
        """
        parts = re.split(rf"\+(?=(?:{'|'.join(CONDITION_KINDS)})\b)", text)
        if len(parts) == 1:
            return cls._parse_one(text)
        if not all(parts):
            raise ValueError(f"condition {text!r}: a '+' joins two conditions")
        try:
            conditions = [cls._parse_one(part) for part in parts]
        except ValueError as err:  # it names the part: and the whole, as written
            raise ValueError(f"{err} (in {text!r})") from None
        joined = conditions.pop()
        while conditions:
            joined = replace(conditions.pop(), then=joined)
        return joined

    @classmethod
    def _parse_one(cls, text: str) -> Condition:
        kind, _, value = text.partition(":")
        if kind not in CONDITION_KINDS:
            raise ValueError(f"unknown condition {text!r}: kinds are {', '.join(CONDITION_KINDS)}")
        needs_value = kind not in ("clean", "telephone")
        if needs_value != bool(value):
            form = f"{kind}:VALUE" if needs_value else kind
            raise ValueError(f"condition {text!r}: write it as {form}")
        try:
            condition = cls(kind, float(value) if value else None)
        except ValueError:
            raise ValueError(f"condition {text!r}: {value!r} is not a number") from None
        if value and not math.isfinite(condition.value):
            raise ValueError(f"condition {text!r}: the value must be a finite number")
        if kind in ("reverb", "speed", "pad") and condition.value <= 0:
            raise ValueError(f"condition {text!r}: the value must be > 0")
        if kind == "pad" and condition.value > LONGEST_PAD_SECONDS:
            raise ValueError(f"condition {text!r}: give at most {LONGEST_PAD_SECONDS:g} s")
        low, high = _LIMITS.get(kind, (-math.inf, math.inf))
        if value and not low <= condition.value <= high:
            unit = _UNITS[kind].split()[0]
            raise ValueError(f"condition {text!r}: give a value in [{low:g}, {high:g}] {unit}")
        if kind == "speed":
            try:
                perturb.speed_ratio(condition.value)
            except ValueError as err:
                raise ValueError(f"condition {text!r}: {err}") from None
        return condition

    @property
    def label(self) -> str:
        """Name in tables, e.g. "white 10 dB SNR"."""
        own = self.kind if self.value is None else f"{self.kind} {self.value:g}{_UNITS[self.kind]}"
        own = own.replace("pad ", "pad 0-")
        return own if self.then is None else f"{own} + {self.then.label}"

    @property
    def kinds(self) -> tuple[str, ...]:
        """Its kind and those after it, in order."""
        return (self.kind,) if self.then is None else (self.kind, *self.then.kinds)

    @property
    def slug(self) -> str:
        """Folder name, e.g. "white10"."""
        own = self.kind if self.value is None else f"{self.kind}{self.value:g}".replace("+", "")
        return own if self.then is None else f"{own}+{self.then.slug}"

    def apply(
        self,
        wave: Tensor,
        sample_rate: int,
        rng: np.random.Generator,
        talkers,
        speech: Tensor | None = None,
    ) -> Tensor:
        """`wave` `(T,)` under this condition and those after it; `speech`: the speech alone as
        earlier steps left it, unpadded (None: `wave`), which noise is set by."""
        speech = wave if speech is None else speech
        if self.kind in ("babble", *perturb.NOISE_COLORS):
            if self.kind == "babble":
                noise = perturb.babble(talkers(), wave.numel(), rng)
            else:
                noise = perturb.colored_noise(wave.numel(), self.kind, rng)
            out = perturb.add_noise(wave, noise, self.value, speech)
        elif self.kind == "pad":  # silence: the speech alone stays as it was
            out = perturb.pad_silence(wave, self.value, sample_rate, rng)
        elif self.kind == "reverb":  # the same room, and the mixture's level kept for both
            rir = perturb.synthetic_rir(self.value, sample_rate, rng)
            wet = perturb.reverberate(wave, rir, keep_level=False)
            gain = perturb.level_gain(wave, wet)
            out = (wet * gain).to(wave.dtype)
            if speech is wave:
                speech = out
            elif speech.numel():
                speech = perturb.reverberate(speech, rir, keep_level=False) * gain
        else:  # the speech alone changes with the wave (a filter, unlike a level, not alike
            change = self._change(sample_rate)  # on speech and noise)
            out = change(wave)
            speech = out if speech is wave else change(speech) if speech.numel() else speech
        if self.then is None:
            return out
        return self.then.apply(out, sample_rate, rng, talkers, speech)

    def _change(self, sample_rate: int) -> Callable[[Tensor], Tensor]:
        """This condition, a level, speed, channel or none, as a function of a wave."""
        if self.kind == "level":
            return partial(perturb.change_gain, db=self.value)
        if self.kind == "speed":
            return partial(perturb.change_speed, factor=self.value)
        if self.kind == "telephone":
            return partial(perturb.telephone, sample_rate=sample_rate)
        return lambda wave: wave  # clean


def build_condition(
    condition: Condition,
    utterances: Sequence[Utterance],
    out_dir: str | os.PathLike,
    sample_rate: int = 16000,
    seed: int = 0,
    progress: bool = True,
    failures: list[BadEntry] | None = None,
    clipping: dict[str, float] | None = None,
) -> Path:
    """Write `utterances` under `condition` as 16-bit WAVs and a manifest; return its path.
    Samples beyond full scale clip, as a recorder's would: a warning says what share (also
    put in `clipping`, as "clipped", where given).
    Given `failures`, an utterance whose audio cannot be read is left out and recorded there
    (and hears in no other's babble), else it stops the copy."""
    out_dir = Path(out_dir)
    (out_dir / "wav").mkdir(parents=True, exist_ok=True)
    pool = _Talkers(utterances, sample_rate, seed, strict=failures is None)
    written = []
    clipped = samples = 0
    items = tqdm(utterances, desc=condition.slug, disable=not progress, leave=False)
    for index, utterance in enumerate(items):
        rng = np.random.default_rng([seed, zlib.crc32(condition.slug.encode()), index])
        try:
            wave = load_audio(
                utterance.audio_filepath, sample_rate, utterance.offset, utterance.duration
            )
        except AudioError as error:
            if failures is None:
                raise
            failures.append(BadEntry(_location(utterance), error.reason))
            continue
        wave = condition.apply(wave, sample_rate, rng, partial(pool.others, index, rng))
        path = out_dir / "wav" / f"{index:06d}.wav"
        clipped += int((wave.abs() > 1.0).sum())
        samples += wave.numel()
        # rounded here: libsndfile floors floats written as WAV's 16 bits (a -0.5 LSB offset,
        # and a sign's worth of speech left in audio 120 dB down)
        pcm = (wave * 32768.0).round().clamp(-32768, 32767).short().numpy()
        soundfile.write(path, pcm, sample_rate, subtype="PCM_16")
        duration = wave.numel() / sample_rate
        # Relative to the manifest, as manifests are read: wherever out_dir was given from.
        relative = f"wav/{path.name}"
        # with its source's id: decodes under two conditions compare utterance by utterance
        written.append(replace(utterance, id=utterance.utt_id, audio_filepath=relative,
                               offset=0.0, duration=duration))  # fmt: skip
    if clipped:
        _warn_of_clipping(condition, clipped / samples)
    if clipping is not None:
        clipping["clipped"] = clipped / samples if samples else 0.0
    manifest = out_dir / "manifest.jsonl"
    write_manifest(manifest, written)
    return manifest


def _warn_of_clipping(condition: Condition, share: float) -> None:
    """The row then measures the clipping too: said whenever the copies are scored."""
    warnings.warn(
        f"{condition.label}: {100 * share:.2g} % of the copies' samples were beyond full scale "
        "and clipped, as a 16-bit recording would be",
        stacklevel=3,
    )


class _Talkers:
    """Other utterances of a set for babble, loaded once each; `strict`: one that cannot be
    read stops the copy, else it is left out of the babble."""

    def __init__(
        self, utterances: Sequence[Utterance], sample_rate: int, seed: int, strict: bool = True
    ) -> None:
        self.utterances, self.sample_rate, self.seed = utterances, sample_rate, seed
        self.strict = strict
        self._loaded: dict[int, Tensor | None] = {}

    def others(self, index: int, rng: np.random.Generator) -> list[Tensor]:
        if len(self.utterances) < 2:
            raise ValueError("babble needs a test set of at least two utterances")
        picks = perturb.other_indices(rng, len(self.utterances), BABBLE_TALKERS, index)
        talkers = [wave for j in picks if (wave := self._wave(j)) is not None]
        if not talkers:
            raise ValueError(f"babble: no other utterance of {len(self.utterances)} could be read")
        return talkers

    def _wave(self, index: int) -> Tensor | None:
        if index not in self._loaded:
            u = self.utterances[index]
            try:
                wave = load_audio(u.audio_filepath, self.sample_rate, u.offset, u.duration)
            except AudioError:
                if self.strict:
                    raise
                wave = None  # its own copy names it
            self._loaded[index] = wave
        return self._loaded[index]


def robustness(
    recognizer: Recognizer,
    manifest: str | os.PathLike,
    out_dir: str | os.PathLike,
    conditions: Sequence[Condition] | None = None,
    options: SearchOptions | None = None,
    lm: LanguageModel | None = None,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = True,
    extra: dict[str, Any] | None = None,
    skip_bad: bool = False,
) -> list[dict[str, Any]]:
    """Evaluate `recognizer` on `manifest` under each condition; one row of metrics each;
    `extra` is recorded in each decode's metrics.json (as `evaluate` records it). With
    `skip_bad`, a manifest line or utterance that cannot be scored is left out and listed in
    the row's "failures" (where, in "left_out"), as `evaluate` leaves it out, instead of
    stopping the run."""
    conditions = conditions or [Condition.parse(c) for c in DEFAULT_CONDITIONS]
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir}: a file; the output is a folder of copies and tables")
    utterances, bad = usable_utterances(manifest, skip_bad)
    if any("babble" in c.kinds for c in conditions):  # before any condition runs
        readable = _readable(utterances, recognizer.sample_rate, 2) if skip_bad else utterances
        if len(readable) < 2:
            raise ValueError(
                f"{manifest}: babble needs a test set of at least two readable utterances, "
                f"it has {len(readable)}"
            )
    digest = hashlib.sha256(manifest_bytes(manifest)).hexdigest()  # copies of what it says
    # the lines a copy holds (others may be left out): a stamp as the manifest is spelt apart
    usable = hashlib.sha256("\n".join(u.utt_id for u in utterances).encode()).hexdigest()
    rate = recognizer.sample_rate
    places = [f"{_location(u)}: " for u in utterances] + [f"{b.location}: " for b in bad]
    rows = []
    for condition in conditions:
        folder = out_dir / condition.slug
        as_given = condition.kind == "clean" and condition.then is None
        copy = Path(manifest) if as_given else folder / "manifest.jsonl"
        stamp = {"source": str(Path(manifest).resolve()), "seed": seed, "sample_rate": rate,
                 "paths": "relative", "manifest_sha256": digest,
                 "utterances_sha256": usable}  # fmt: skip
        built = None if as_given else _read_stamp(folder)
        # a copy that left files out is built again: they may be readable now; so is one
        # whose files were since removed or changed
        if not as_given and (
            built is None
            or {k: built.get(k) for k in stamp} != stamp
            or built.get("left_out")
            or built.get("files") is None
            or built.get("clipped") is None  # built by an asr that did not keep it
            or built["files"] != _copy_sizes(folder)
        ):
            # gone first: a rebuild that stops halfway must not leave other copies passing
            (folder / "built.json").unlink(missing_ok=True)
            unread: list[BadEntry] | None = [] if skip_bad else None
            clipping: dict[str, float] = {}
            copy = build_condition(condition, utterances, folder, rate, seed, progress, unread,
                                   clipping)  # fmt: skip
            built = {**stamp, "left_out": list(map(str, unread or [])),
                     "files": _copy_sizes(folder), **clipping}  # fmt: skip
            (folder / "built.json").write_text(json.dumps(built) + "\n", encoding="utf-8")
        elif built and built.get("clipped"):  # copies reused: their clipping is said as when built
            _warn_of_clipping(condition, built["clipped"])
        try:
            metrics = evaluate(recognizer, copy, folder / "decode", options, lm, batch_size,
                               plots=0, progress=progress, extra=extra,
                               skip_bad=skip_bad)  # fmt: skip
        except NothingToScore as err:  # under this condition alone: a row that says so
            if as_given:
                raise
            shutil.rmtree(folder / "decode", ignore_errors=True)  # an earlier run's reports
            metrics = _nothing_scored(err.failures)
        # a copy holds the manifest's usable, readable lines: its own failures are not all of
        # them, and name its files, which are the source's
        named = {} if as_given or not metrics["failures"] else _source_names(copy, utterances)
        failures = [*map(str, bad), *(built or {}).get("left_out", []),
                    *(_as_source(f, named) for f in metrics["failures"])]  # fmt: skip
        failures = list(dict.fromkeys(failures))
        left_out = [next((p[:-2] for p in places if f.startswith(p)), f) for f in failures]
        rows.append({"condition": condition.label, **metrics, "failures": failures,
                     "left_out": left_out})  # fmt: skip
    (out_dir / "robustness.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    (out_dir / "robustness.md").write_text(robustness_table(rows), encoding="utf-8")
    return rows


def _nothing_scored(failures: Sequence[BadEntry]) -> dict[str, Any]:
    """The row of a condition under which no utterance was left to score."""
    counts = dict.fromkeys(("utterances", "reference_words", "substitutions", "deletions"), 0)
    return counts | {
        "insertions": 0,
        "wer": None,
        "cer": None,
        "failures": list(map(str, failures)),
    }


def _readable(utterances: Sequence[Utterance], sample_rate: int, enough: int) -> list[Utterance]:
    """The first `enough` utterances whose audio loads (fewer where fewer do)."""
    found = []
    for u in utterances:
        try:
            load_audio(u.audio_filepath, sample_rate, u.offset, u.duration)
        except AudioError:
            continue
        found.append(u)
        if len(found) == enough:
            break
    return found


def _location(utterance: Utterance) -> str:
    """How failures name an utterance (as `evaluate` does)."""
    return f"{utterance.audio_filepath} ({utterance.utt_id})"


def _source_names(copy: Path, utterances: Sequence[Utterance]) -> dict[str, str]:
    """How a copy's utterances are named in failures ("PATH (ID): "), and their sources'
    (the copy holds them in order, less those it could not read)."""
    sources = iter(utterances)
    return {
        f"{_location(c)}: ": f"{_location(next(u for u in sources if u.utt_id == c.utt_id))}: "
        for c in read_manifest(copy)
    }


def _scored_apart(row: dict[str, Any], clean: dict[str, Any]) -> bool:
    """Whether `row` scored other utterances than `clean`: as many, others left out too."""
    return row["utterances"] != clean["utterances"] or set(row.get("left_out", [])) != set(
        clean.get("left_out", [])
    )


def not_scored(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The manifest lines and utterances some condition left out, once each: the first
    reason given, and the conditions that left it out where not all did."""
    heard: dict[str, tuple[str, list[str]]] = {}
    for row in rows:
        for failure, place in zip(row["failures"], row["left_out"], strict=True):
            first, labels = heard.setdefault(place, (failure, []))
            if row["condition"] not in labels:
                labels.append(row["condition"])
    return [
        first if len(labels) == len(rows) else f"{first} (under {', '.join(labels)})"
        for first, labels in heard.values()
    ]


def _as_source(failure: str, named: dict[str, str]) -> str:
    """An evaluation failure of a copy, naming its source's audio instead."""
    for copied, source in named.items():
        if failure.startswith(copied):
            return source + failure[len(copied) :]
    return failure


def _copy_sizes(folder: Path) -> list[int] | None:
    """Bytes of each file of the copy in `folder` (its manifest, then the audio it lists in
    order), or None where one is missing or the manifest unreadable."""
    manifest = folder / "manifest.jsonl"
    try:
        files = [manifest, *(Path(u.audio_filepath) for u in read_manifest(manifest))]
        return [path.stat().st_size for path in files]
    except (OSError, ValueError):
        return None


def _read_stamp(folder: Path) -> dict | None:
    """What a condition's copy in `folder` was built from, or None."""
    try:
        return json.loads((folder / "built.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def robustness_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of `robustness` rows, WER relative to the clean one (marked where a
    condition scored other utterances than clean: some were left out under one of them)."""
    clean = next((r for r in rows if r["condition"] == "clean"), None)
    lines = [
        "| condition | Snt | Wrd | Sub | Del | Ins | WER | CER | WER / clean | Rep |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    apart = False
    for r in rows:
        scored = r["wer"] is not None  # else nothing was left to score under it
        ratio = f"{r['wer'] / clean['wer']:.2f}" if scored and clean and clean["wer"] else "-"
        if clean and ratio != "-" and _scored_apart(r, clean):
            ratio, apart = ratio + " *", True
        wer, cer = (f"{r[k]:.1f}" if scored else "-" for k in ("wer", "cer"))
        lines.append(
            f"| {r['condition']} | {r['utterances']} | {r['reference_words']} | "
            f"{r['substitutions']} | {r['deletions']} | {r['insertions']} | "
            f"{wer} | {cer} | {ratio} | {sum(r.get('repaired', {}).values())} |"
        )
    if apart:
        lines.append(
            "\n\\* over other utterances than clean (some left out under one of the two): "
            "the WERs are not of the same speech"
        )
    return "\n".join(lines) + "\n"
