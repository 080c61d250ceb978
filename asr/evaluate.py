"""`asr evaluate`: decode a test manifest, score it, and write metrics.json, hyp.txt,
ref.txt, errors.txt, reliability.png, attention plots and the explorer's records
(`asr.explore.records`) into the output folder."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor
from tqdm import tqdm

from asr.audio import AudioError, load_audio
from asr.confidence import PlattScaling, UnfittableWords
from asr.data.manifest import (
    BadEntry,
    Utterance,
    format_bad_entries,
    read_manifest,
    validate_manifest,
)
from asr.explore.records import (
    ATTENTION,
    LAYOUT,
    METRICS,
    PAGE,
    RECORDS,
    RecordWriter,
    remove_records,
)
from asr.metrics import (
    Calibration,
    ErrorCounts,
    WordAlignment,
    char_errors,
    errors_by_length,
    word_calibration,
)
from asr.models.interfaces import attention_kind
from asr.recognizer import Recognizer
from asr.results import Decoded
from asr.search import LanguageModel, SearchOptions
from asr.timing import boundary_error_ms, word_products, word_tokens
from asr.transcribe import search_or_errors
from asr.writers import write_text_atomically

log = logging.getLogger(__name__)

TOP_ERRORS = 30
RECORDED_NBEST = 5  # hypotheses per utterance kept for the explorer


@dataclass
class ScoredUtterance:
    """One decoded utterance and its reference."""

    utt_id: str
    ref: str  # normalised
    hyp: str
    tokens: list[int]
    duration: float = 0.0
    word_probs: list[float] | None = None
    word_ctc_probs: list[float | None] | None = None
    repaired: str | None = None

    @cached_property
    def alignment(self) -> WordAlignment:
        """The word alignment of `hyp` with `ref`."""
        return WordAlignment.of(self.ref, self.hyp)


def evaluate(
    recognizer: Recognizer,
    manifest: str | os.PathLike,
    out_dir: str | os.PathLike,
    options: SearchOptions | None = None,
    lm: LanguageModel | None = None,
    batch_size: int = 8,
    plots: int = 5,
    plot_ids: Sequence[str] | None = None,
    progress: bool = True,
    extra: dict[str, Any] | None = None,
    skip_bad: bool = False,
    records: bool = True,
) -> dict[str, Any]:
    """Decode every utterance of `manifest`, write the reports, and return the metrics.

    With `records`, also keep each utterance's words, times, n-best, CTC path and
    cross-attention for `asr explore`."""
    options = options or recognizer.default_options
    recognizer.check_options(options, lm)
    _check_manifest_kept(manifest, Path(out_dir))
    utterances, failures = usable_utterances(manifest, skip_bad)
    if not utterances:
        raise _nothing_to_score(manifest, failures)
    normalize = recognizer.tokenizer.normalizer
    if not any(normalize(u.text).split() for u in utterances):
        raise ValueError(
            f"{manifest}: no reference has words to score against (WER is undefined); "
            "`asr transcribe --manifest` transcribes without scoring"
        )
    chosen = _chosen_for_plots(utterances, plots, plot_ids, manifest, left_out=bool(failures))
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir}: a file; the output is a folder of reports")
    _check_reports_free(out_dir, plots=bool(chosen))
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = RecordWriter(out_dir, record_layout(recognizer)) if records else None
    search = options
    if writer is not None and options.nbest is None:  # the explorer lists the n-best
        search = replace(options, nbest=min(options.beam_size, RECORDED_NBEST))
    skipped = failures if skip_bad else None
    results, timing, boundary_errors = _decode_all(
        recognizer, utterances, search, lm, batch_size, progress, skipped, writer=writer
    )
    if not results:
        raise _nothing_to_score(manifest, failures)
    decode_seconds, audio_seconds = timing
    refs, hyps = [r.ref for r in results], [r.hyp for r in results]
    words = sum((r.alignment.errors for r in results), ErrorCounts())
    if not words.reference_length:  # the utterances with words failed: as none had any
        listed = f"; left out:\n{format_bad_entries(failures)}" if failures else ""
        raise NothingToScore(
            f"{manifest}: no utterance decoded has reference words to score against (WER is "
            f"undefined){listed}",
            failures,
        )
    chars = char_errors(refs, hyps)
    sentence_errors = sum(r.ref.split() != r.hyp.split() for r in results)
    # an earlier run's go first: a run that fails from here leaves none beside its reports
    for stale in (METRICS, "reliability.png"):
        (out_dir / stale).unlink(missing_ok=True)
    remove_records(out_dir)  # this run's, if it keeps them, are written at its end
    _write_kaldi(out_dir / "hyp.txt", [(r.utt_id, r.hyp) for r in results])
    _write_kaldi(out_dir / "ref.txt", [(r.utt_id, r.ref) for r in results])
    (out_dir / "errors.txt").write_text(error_report(results), encoding="utf-8")
    scored = {r.utt_id for r in results}
    _plot(recognizer, [u for u in utterances if u.utt_id in chosen & scored], results, out_dir)
    confidence = _confidence_report(results, out_dir, recognizer.confidence_scaling)
    metrics = {
        "wer": 100 * words.rate,
        "cer": 100 * chars.rate,
        "substitutions": words.substitutions,
        "deletions": words.deletions,
        "insertions": words.insertions,
        "reference_words": words.reference_length,
        "reference_characters": chars.reference_length,
        "char_substitutions": chars.substitutions,
        "char_deletions": chars.deletions,
        "char_insertions": chars.insertions,
        "utterances": len(results),
        "sentence_errors": sentence_errors,
        "failures": [str(failure) for failure in failures],
        "audio_hours": audio_seconds / 3600,
        "decode_seconds": decode_seconds,
        "real_time_factor": decode_seconds / audio_seconds,
        "boundary_error_ms": _mean(boundary_errors),
        "boundary_error_ms_p90": float(np.percentile(boundary_errors, 90))
        if boundary_errors
        else None,
        "boundary_error_utterances": len(boundary_errors),
        "confidence": confidence,
        "by_length": _length_report(results),
        "repaired": dict(Counter(r.repaired for r in results if r.repaired)),
        "search": asdict(options),
        "precision": recognizer.precision,
        "backend": recognizer.backend,
        "checkpoint": recognizer.checkpoint,
        "weights": recognizer.weights_digest,
        "manifest": str(manifest),
        **(extra or {}),
    }
    write_text_atomically(out_dir / "metrics.json", json.dumps(metrics, indent=1) + "\n")
    if writer is not None:  # an earlier run's were removed before the reports
        writer.write(u.utt_id for u in utterances)
    return metrics


def usable_utterances(
    manifest: str | os.PathLike, skip_bad: bool
) -> tuple[list[Utterance], list[BadEntry]]:
    """The manifest's utterances; with `skip_bad`, the good ones and the bad lines."""
    if not skip_bad:
        return read_manifest(manifest), []
    report = validate_manifest(manifest, check_audio=True, require_text=False)
    return report.good, report.bad


class NothingToScore(ValueError):
    """No utterance of a manifest was left to decode and score; `failures` says why."""

    def __init__(self, message: str, failures: Sequence[BadEntry]) -> None:
        super().__init__(message)
        self.failures = list(failures)


def _nothing_to_score(
    manifest: str | os.PathLike, failures: Sequence[BadEntry], purpose: str = "evaluate"
) -> NothingToScore:
    listed = f":\n{format_bad_entries(failures)}" if failures else ""
    return NothingToScore(f"{manifest}: no utterances to {purpose}{listed}", failures)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _chosen_for_plots(
    utterances: Sequence[Utterance],
    plots: int,
    plot_ids: Sequence[str] | None,
    manifest: str | os.PathLike,
    left_out: bool = False,
) -> set[str]:
    """The ids to plot; `left_out`: bad lines were left out, which `plot_ids` may name."""
    ids = [u.utt_id for u in utterances]
    if not plot_ids:
        return set(ids[: max(plots, 0)])
    unknown = sorted(set(plot_ids) - set(ids))
    if unknown and not left_out:
        raise ValueError(f"{manifest}: no utterances with ids {unknown[:10]} (from --plot-ids)")
    if unknown:  # as utterances that fail to decode: listed with the bad lines, not plotted
        log.warning("%s: not plotting ids %s: no such utterance left to score", manifest, unknown)
    return set(plot_ids) - set(unknown)


def _load(recognizer: Recognizer, utterance: Utterance) -> Tensor:
    return load_audio(
        utterance.audio_filepath, recognizer.sample_rate, utterance.offset, utterance.duration
    )


def _decode_all(
    recognizer: Recognizer,
    utterances: Sequence[Utterance],
    options: SearchOptions,
    lm: LanguageModel | None,
    batch_size: int,
    progress: bool,
    failures: list[BadEntry] | None = None,
    boundaries: bool = True,
    writer: RecordWriter | None = None,
) -> tuple[list[ScoredUtterance], tuple[float, float], list[float]]:
    """Results in manifest order, (decode seconds, audio seconds), and boundary errors (ms)."""
    order = sorted(range(len(utterances)), key=lambda i: utterances[i].duration, reverse=True)
    results: list[ScoredUtterance | None] = [None] * len(utterances)
    decode_seconds, audio_seconds, boundary_errors = 0.0, 0.0, []
    normalize = recognizer.tokenizer.normalizer
    with tqdm(total=len(order), desc="evaluate", unit="utt", disable=not progress) as bar:
        for first in range(0, len(order), batch_size):
            chosen = order[first : first + batch_size]
            batch, waves = _load_batch(recognizer, utterances, chosen, failures)
            start = time.perf_counter()
            decoded = search_or_errors(recognizer, waves, options, lm) if waves else []
            decode_seconds += time.perf_counter() - start
            for i, wave, item in zip(batch, waves, decoded):
                if isinstance(item, ValueError):  # too short for the encoder
                    _fail(utterances[i], str(item), failures)
                    continue
                audio_seconds += len(wave) / recognizer.sample_rate
                hyp = recognizer.tokenizer.decode(item.hypothesis.tokens)
                ref = normalize(utterances[i].text)
                probs, ctc_probs = _word_probs(recognizer, item, hyp)
                results[i] = ScoredUtterance(
                    utterances[i].utt_id,
                    ref,
                    hyp,
                    item.hypothesis.tokens,
                    duration=len(wave) / recognizer.sample_rate,
                    word_probs=probs,
                    word_ctc_probs=ctc_probs,
                    repaired=item.repaired,
                )
                if writer is not None:
                    writer.add(*_record(recognizer, utterances[i], item, results[i]))
                exact = boundaries and hyp == ref and hyp
                error = _boundary_error(recognizer, item) if exact else None
                if error is not None:
                    boundary_errors.append(error)
            bar.update(len(chosen))
    return [r for r in results if r is not None], (decode_seconds, audio_seconds), boundary_errors


def record_layout(recognizer: Recognizer) -> dict[str, Any]:
    """How to read the records' attention maps and times (`asr.explore.records.LAYOUT`)."""
    decoder = recognizer.model.decoder
    return {
        "layers": decoder.attention_layers,
        "heads": decoder.num_attention_maps // decoder.attention_layers,
        "attention": attention_kind(decoder),
        "timing_heads": recognizer.alignment_heads,
        "frame_seconds": recognizer.frame_seconds,
        "sample_rate": recognizer.sample_rate,
        "checkpoint": recognizer.checkpoint,
    }


def _record(
    recognizer: Recognizer, utterance: Utterance, decoded: Decoded, result: ScoredUtterance
) -> tuple[dict[str, Any], np.ndarray | None]:
    """The explorer's record of one decoded utterance, and its cross-attention `(K, L+1, T)`."""
    shown = recognizer.transcript(decoded, "attention").to_dict()
    nbest = [{"text": result.hyp, "score": shown["score"]}]
    nbest += shown["segments"][0].get("alternatives", [])
    try:
        path = decoded.ctc_path()
        ctc = {"starts": list(path.start_frames), "ends": list(path.end_frames),
               "frames": path.num_frames}  # fmt: skip
    except ValueError:
        ctc = None
    record = {
        "id": utterance.utt_id,
        "speaker": utterance.speaker,
        "audio": utterance.audio_filepath,
        "offset": utterance.offset,
        "duration": result.duration,
        "ref": result.ref,
        "hyp": result.hyp,
        "words": shown["words"],
        "tokens": shown["tokens"],
        "nbest": nbest,
        "repaired": decoded.repaired,
        "finished": shown["score"] is not None,
        "ctc": ctc,
    }
    attention = decoded.hypothesis.attention
    return record, None if attention is None else attention.float().cpu().numpy()


def _load_batch(
    recognizer: Recognizer,
    utterances: Sequence[Utterance],
    batch: Sequence[int],
    failures: list[BadEntry] | None,
) -> tuple[list[int], list[Tensor]]:
    """The indices of `batch` whose audio loads, and their waveforms."""
    loaded, waves = [], []
    for i in batch:
        try:
            waves.append(_load(recognizer, utterances[i]))
            loaded.append(i)
        except AudioError as error:
            _fail(utterances[i], error.reason, failures)
    return loaded, waves


def _fail(utterance: Utterance, reason: str, failures: list[BadEntry] | None) -> None:
    """Raise a ValueError naming the utterance, or record it in `failures`."""
    entry = BadEntry(f"{utterance.audio_filepath} ({utterance.utt_id})", reason)
    if failures is None:
        raise ValueError(str(entry))
    failures.append(entry)


def _boundary_error(recognizer: Recognizer, decoded: Decoded) -> float | None:
    """Attention vs CTC word boundary error of one hypothesis (ms), or None."""
    if decoded.ctc_log_probs is None:
        return None
    try:
        ctc = recognizer.words(decoded, "ctc", fallback=False)
    except ValueError:
        return None
    return boundary_error_ms(recognizer.words(decoded, "attention"), ctc)


def _word_probs(
    recognizer: Recognizer, decoded: Decoded, hyp: str
) -> tuple[list[float] | None, list[float | None] | None]:
    """The decoder's and the CTC head's probability of each word of `hyp`, where known."""
    if decoded.token_log_probs is None:
        return None, None
    words = word_tokens(recognizer.tokenizer.pieces(decoded.hypothesis.tokens))
    if len(words) != len(hyp.split()):
        return None, None
    probs = word_products(words, decoded.token_probs)
    if decoded.ctc_log_probs is None:
        return probs, None
    ctc = decoded.token_ctc_probs
    return probs, [None] * len(words) if ctc is None else word_products(words, ctc)


def _confidence_report(
    results: Sequence[ScoredUtterance], out_dir: Path, scaling: PlattScaling | None
) -> dict[str, Any] | None:
    """Word confidence calibration for metrics.json, plotted to `reliability.png`."""
    words = LabelledWords.of(results)
    if not words.probs:
        (out_dir / "reliability.png").unlink(missing_ok=True)  # an earlier decode's
        return None
    calibration = word_calibration(words.confidences(scaling), words.correct)
    from asr.plotting import plot_reliability, save_figure  # matplotlib: only when plotting

    save_figure(plot_reliability(calibration), str(out_dir / "reliability.png"))
    report = asdict(calibration) | {"utterances_left_out": words.left_out}
    if scaling is not None:
        report |= {
            "scaling": scaling.as_dict(),
            "unscaled_ece": word_calibration(words.probs, words.correct).ece,
        }
    return report


@dataclass(frozen=True)
class LabelledWords:
    """The hypothesis words of decoded utterances: their probabilities and whether each is right."""

    probs: list[float]
    ctc_probs: list[float | None] | None
    correct: list[bool]
    left_out: int  # non-empty hypotheses without word probabilities

    @classmethod
    def of(cls, results: Sequence[ScoredUtterance]) -> LabelledWords:
        scored = [r for r in results if r.word_probs is not None]
        left_out = sum(bool(r.hyp.split()) for r in results if r.word_probs is None)
        probs = [p for r in scored for p in r.word_probs]
        correct = [c for r in scored for c in r.alignment.hypothesis_correct]
        with_ctc = all(r.word_ctc_probs is not None for r in scored)
        ctc = [c for r in scored for c in r.word_ctc_probs] if with_ctc else None
        return cls(probs, ctc, correct, left_out)

    def confidences(self, scaling: PlattScaling | None) -> list[float]:
        """The words' confidences under `scaling`; their probabilities without one."""
        if scaling is None:
            return list(self.probs)
        ctc = self.ctc_probs or [None] * len(self.probs)
        return [scaling(p, c) for p, c in zip(self.probs, ctc, strict=True)]

    def fit(self) -> PlattScaling:
        """`PlattScaling.fit` to these words."""
        return PlattScaling.fit(self.probs, self.correct, self.ctc_probs)


@dataclass(frozen=True)
class ConfidenceFit:
    """A word confidence scaling and the calibration before and after it."""

    scaling: PlattScaling
    before: Calibration
    after: Calibration


def fit_confidence(
    recognizer: Recognizer,
    manifest: str | os.PathLike,
    options: SearchOptions | None = None,
    lm: LanguageModel | None = None,
    batch_size: int = 8,
    progress: bool = True,
    failures: list[str] | None = None,
) -> ConfidenceFit:
    """Decode `manifest` (a dev set) and fit `PlattScaling` to its hypothesis words; manifest
    lines and audio that cannot be used are left out, and added to `failures`."""
    options = options or recognizer.default_options
    recognizer.check_options(options, lm)
    utterances, bad = usable_utterances(manifest, skip_bad=True)
    results, _, _ = _decode_all(
        recognizer, utterances, options, lm, batch_size, progress, bad, boundaries=False
    )
    if failures is not None:
        failures += [str(entry) for entry in bad]
    if not results:
        raise _nothing_to_score(manifest, bad, "fit word confidences on")
    words = LabelledWords.of(results)
    if words.left_out and not words.probs:
        raise ValueError(f"{manifest}: no hypothesis word has a probability to calibrate")
    if not words.probs:
        raise UnfittableWords(f"{manifest}: every hypothesis is empty; no word to calibrate")
    scaling = words.fit()
    before = word_calibration(words.probs, words.correct)
    after = word_calibration(words.confidences(scaling), words.correct)
    return ConfidenceFit(scaling, before, after)


def _length_report(results: Sequence[ScoredUtterance]) -> list[dict[str, Any]]:
    """WER and (tail) deletion rates per duration bucket: attention decoders stop early. None
    for a bucket without reference words: no number says how wrong inserted words are."""
    buckets = errors_by_length([r.duration for r in results], [r.alignment for r in results])
    rows = []
    for b in buckets:
        scored = b.errors.reference_length > 0
        rows.append({
            "bucket": b.name,
            "utterances": b.utterances,
            "reference_words": b.errors.reference_length,
            "wer": 100 * b.errors.rate if scored else None,
            "deletion_rate": 100 * b.deletion_rate if scored else None,
            "tail_deletion_rate": 100 * b.tail_deletion_rate if scored else None,
        })  # fmt: skip
    return rows


def _write_kaldi(path: Path, rows: Sequence[tuple[str, str]]) -> None:
    path.write_text("".join(f"{i} {t}".rstrip() + "\n" for i, t in rows), encoding="utf-8")


def alignment_lines(ref: Sequence[str], hyp: Sequence[str], chunks) -> list[str]:
    """sclite-style REF/HYP/mark lines of one utterance from jiwer's alignment chunks.

    >>> a = WordAlignment.of("A B C", "A X C D")
    >>> print("\\n".join(alignment_lines(a.ref, a.hyp, a.chunks)))
    REF: A B C *
    HYP: A X C D
           S   I
    """
    columns: list[tuple[str, str, str]] = []
    for chunk in chunks:
        refs = ref[chunk.ref_start_idx : chunk.ref_end_idx]
        hyps = hyp[chunk.hyp_start_idx : chunk.hyp_end_idx]
        if chunk.type == "delete":
            hyps = ["*" * len(r) for r in refs]
        elif chunk.type == "insert":
            refs = ["*" * len(h) for h in hyps]
        mark = {"equal": "", "substitute": "S", "delete": "D", "insert": "I"}[chunk.type]
        columns += [(r, h, mark) for r, h in zip(refs, hyps)]
    widths = [max(len(r), len(h)) for r, h, _ in columns]
    ref_line = " ".join(r.ljust(w) for (r, _, _), w in zip(columns, widths))
    hyp_line = " ".join(h.ljust(w) for (_, h, _), w in zip(columns, widths))
    marks = " ".join(m.ljust(w) for (_, _, m), w in zip(columns, widths))
    return [f"REF: {ref_line}".rstrip(), f"HYP: {hyp_line}".rstrip(), f"     {marks}".rstrip()]


def error_report(results: Sequence[ScoredUtterance]) -> str:
    """errors.txt: each utterance's alignment, then the most frequent errors."""
    lines = ["# Per utterance: REF/HYP word alignment, S substitution, D deletion, I insertion", ""]
    substitutions, deletions, insertions = Counter(), Counter(), Counter()
    for result in results:
        ref, hyp, chunks = result.alignment.ref, result.alignment.hyp, result.alignment.chunks
        counts = Counter()
        for chunk in chunks:
            refs = ref[chunk.ref_start_idx : chunk.ref_end_idx]
            hyps = hyp[chunk.hyp_start_idx : chunk.hyp_end_idx]
            counts[chunk.type] += max(len(refs), len(hyps))
            if chunk.type == "substitute":
                substitutions.update(zip(refs, hyps))
            elif chunk.type == "delete":
                deletions.update(refs)
            elif chunk.type == "insert":
                insertions.update(hyps)
        lines.append(
            f"{result.utt_id}  C={counts['equal']} S={counts['substitute']} "
            f"D={counts['delete']} I={counts['insert']}"
        )
        lines += alignment_lines(ref, hyp, chunks) + [""]
    lines += _frequent("substitutions (REF -> HYP)", substitutions, lambda k: f"{k[0]} -> {k[1]}")
    lines += _frequent("deletions", deletions, str)
    lines += _frequent("insertions", insertions, str)
    return "\n".join(lines) + "\n"


# What a decode writes into its folder, files then folders: each checked before decoding,
# as one in the way stopped the run halfway and left new reports beside old ones
REPORTS = ("hyp.txt", "ref.txt", "errors.txt", METRICS, "reliability.png", RECORDS, ATTENTION,
           LAYOUT, PAGE)  # fmt: skip
PLOTS = "alignments"


def _check_reports_free(out_dir: Path, plots: bool) -> None:
    """IsADirectoryError or NotADirectoryError naming a report's path that is taken by a
    thing of the other kind (the plots' folder only where there are `plots`)."""
    for name in REPORTS:
        if (out_dir / name).is_dir():
            raise IsADirectoryError(
                f"{out_dir / name}: a folder where the report is written: move it, or give "
                "another --out"
            )
    if plots and (out_dir / PLOTS).exists() and not (out_dir / PLOTS).is_dir():
        raise NotADirectoryError(
            f"{out_dir / PLOTS}: a file where the folder of plots goes: move it, or give "
            "another --out"
        )


def _check_manifest_kept(manifest: str | os.PathLike, out_dir: Path) -> None:
    """ValueError where the manifest is one of the files the reports replace (a manifest kept
    as `utterances.jsonl` beside them, say)."""
    for name in REPORTS:
        report = out_dir / name
        if report.is_file() and os.path.isfile(manifest) and os.path.samefile(manifest, report):
            raise ValueError(
                f"--manifest {manifest} is {report}, which the reports replace: give another "
                "--out, or move the manifest"
            )


def _frequent(title: str, counts: Counter, name) -> list[str]:
    lines = [f"# Most frequent {title}: count"]
    lines += [f"{count:6d}  {name(key)}" for key, count in counts.most_common(TOP_ERRORS)]
    return lines + [""]


def _plot(
    recognizer: Recognizer,
    utterances: Sequence[Utterance],
    results: Sequence[ScoredUtterance],
    out_dir: Path,
) -> None:
    """Attention plots of the hypotheses of `utterances`, by teacher forcing."""
    from asr.plotting import save_alignment_plots  # matplotlib: only when plotting

    for stale in (out_dir / PLOTS).glob("*.png"):  # an earlier decode's into this folder
        stale.unlink()
    by_id = {r.utt_id: r for r in results}
    for utterance in utterances:
        result = by_id[utterance.utt_id]
        alignment = recognizer.align_tokens(_load(recognizer, utterance), result.tokens)
        title = f"{utterance.utt_id}\nREF: {result.ref}\nHYP: {result.hyp}"
        save_alignment_plots(
            recognizer, alignment, out_dir / PLOTS / f"{utterance.utt_id}.png", title
        )
