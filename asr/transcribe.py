"""Transcribing recordings of any length with a `Recognizer`: cut into segments, decode them in
length-sorted batches, and join each input's segments on its timeline."""

from __future__ import annotations

import functools
import math
import numbers
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from torch import Tensor
from tqdm import tqdm

from asr.audio import AudioError, AudioInput, as_waveform, check_sample_rate
from asr.results import BatchResult, Decoded, Segment, Transcript, Word
from asr.search import LanguageModel, SearchOptions
from asr.segment import (
    ArraySource,
    AudioSource,
    Clip,
    SegmenterOptions,
    Span,
    open_source,
    segment_source,
)
from asr.text import Tokenizer
from asr.timing import word_index

if TYPE_CHECKING:
    from asr.recognizer import Recognizer

# More costs memory faster than it saves time.
TRANSCRIBE_BATCH_SIZE = 4

T = TypeVar("T")


def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def transcribe_sources(
    recognizer: Recognizer,
    audios: Sequence[AudioInput | Clip],
    *,
    sample_rate: int | None = None,
    options: SearchOptions | None = None,
    lm: LanguageModel | None = None,
    timestamps: str = "attention",
    batch_size: int = TRANSCRIBE_BATCH_SIZE,
    segmenter: SegmenterOptions | None = None,
    progress: bool = False,
    on_decoded: Callable[[int, Span, Transcript, Decoded], None] | None = None,
) -> list[BatchResult]:
    """Segment every input, decode all segments in batches, and join them per input.

    `on_decoded(index, span, transcript, decoded)` is called for each decoded segment of input
    `index`, in no set order, with its own transcript (times from the span's start) and search
    result (cross-attention, CTC posteriors), which the joined results do not keep: the
    explorer keeps their maps."""
    whole = isinstance(batch_size, numbers.Integral) and not isinstance(batch_size, bool)
    if not whole or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    batch_size = int(batch_size)
    if sample_rate is not None:  # checked once, before any input: files would never use it
        check_sample_rate(sample_rate)
    segmenter = recognizer.segmenter(segmenter)
    recognizer.check_options(options, lm, timestamps)  # before any file, not once per file
    names = [_input_name(audio, i) for i, audio in enumerate(audios)]
    results: list[Transcript | AudioError | None] = [None] * len(audios)
    sources: dict[int, AudioSource] = {}
    work: list[tuple[int, Span]] = []
    for i, audio in enumerate(audios):
        try:
            sources[i] = _open(audio, names[i], recognizer.sample_rate, sample_rate)
            work.extend((i, span) for span in segment_source(sources[i], segmenter))
        except AudioError as err:
            results[i] = err
    cut = Counter(i for i, _ in work)  # inputs of several segments, joined at cuts
    work.sort(key=lambda item: item[1][1] - item[1][0], reverse=True)  # less padding
    parts: dict[int, list[tuple[Span, Transcript]]] = {i: [] for i in sources}
    guides: dict[int, list[Transcript]] = {i: [] for i in sources}
    with tqdm(total=len(work), desc="segments", disable=not progress, leave=False) as bar:
        for batch in batches(work, batch_size):
            todo, waves = [], []
            for i, span in batch:
                if results[i] is None:
                    try:
                        wave = sources[i].read(*span)
                    except AudioError as err:
                        results[i] = err
                        continue
                    if len(wave) < recognizer.shortest_input:  # too short to hold speech
                        parts[i].append((span, _nothing(len(wave) / recognizer.sample_rate)))
                        guides[i].append(parts[i][-1][1])
                    else:
                        waves.append(wave)
                        todo.append((i, span))
            for (i, span), decoded in zip(todo, search_or_errors(recognizer, waves, options, lm)):
                if isinstance(decoded, ValueError):
                    results[i] = AudioError(sources[i].name, f"cannot be decoded: {decoded}")
                else:
                    part = recognizer.transcript(decoded, timestamps)
                    parts[i].append((span, part))
                    joined = cut[i] > 1 and timestamps != "ctc"  # else its own times are CTC's
                    guides[i].append(_join_times(recognizer, decoded, part, joined))
                    if on_decoded is not None:
                        on_decoded(i, span, part, decoded)
            bar.update(len(batch))
    for i, source in sources.items():
        if results[i] is None:
            results[i] = join_segments(recognizer.tokenizer, parts[i], source.duration, guides[i])
    return [
        BatchResult(name, None, r) if isinstance(r, AudioError) else BatchResult(name, r)
        for name, r in zip(names, results)
    ]


def _join_times(
    recognizer: Recognizer, decoded: Decoded, part: Transcript, joined: bool
) -> Transcript:
    """The part timed as decides where a part `joined` to others keeps its words: by CTC where
    the model has a CTC head, whatever `--timestamps` reports (attention, at a window's edge,
    often places a word far from its speech, and the text would depend on the choice); else
    the part itself."""
    if not joined or decoded.ctc_log_probs is None:
        return part
    try:
        return recognizer.transcript(decoded, "ctc", fallback=False)
    except ValueError:  # no CTC path for this hypothesis
        return part


def _nothing(duration: float) -> Transcript:
    """The transcript of audio too short to encode: no words."""
    segment = Segment(0.0, duration, "", 0.0, no_speech_prob=1.0)
    return Transcript("", [], [], [], [], [], 0.0, duration, [segment])


def _input_name(audio: AudioInput | Clip, index: int) -> str:
    """How an input is named in its result and errors: its path, or `<waveform i>`."""
    if isinstance(audio, Clip):
        return audio.path
    if isinstance(audio, (str, os.PathLike)):
        return str(audio)
    return f"<waveform {index}>"


def _open(audio: AudioInput | Clip, name: str, rate: int, sample_rate: int | None) -> AudioSource:
    """`open_source`, with an `AudioError` naming `name` for bad audio."""
    if isinstance(audio, (Clip, str, os.PathLike)):
        return open_source(audio, rate)
    try:
        return ArraySource(as_waveform(audio, sample_rate, rate), rate, name)
    except ValueError as err:
        raise AudioError(name, str(err)) from None


def search_or_errors(
    recognizer: Recognizer,
    waves: list[Tensor],
    options: SearchOptions | None,
    lm: LanguageModel | None,
) -> list[Decoded | ValueError]:
    """`recognizer.search`, or where the batch fails, each wave alone, a ValueError per bad one."""
    try:
        return recognizer.search(waves, options, lm)
    except ValueError as err:
        if len(waves) == 1:
            return [err]
    results: list[Decoded | ValueError] = []
    for wave in waves:
        try:
            results += recognizer.search([wave], options, lm)
        except ValueError as err:
            results.append(err)
    return results


def join_segments(
    tokenizer: Tokenizer,
    parts: Sequence[tuple[Span, Transcript]],
    duration: float,
    guides: Sequence[Transcript] | None = None,
) -> Transcript:
    """One `Transcript` from `(span, transcript)` parts; overlaps are cut at their midpoint, and
    a word both sides of a cut decoded (whole on one side, its onset on the other) kept once.
    `guides`: each part timed otherwise (its tokens, other times), by which the words kept are
    chosen (default: the part itself). The transcript keeps the parts' own times, but for a
    segment whose own times put a word it keeps past its cut: all of its words and tokens take
    the guide's, so that they stay in order.

    A segment that leaves out words of its window has no search `score` (NaN), `avg_logprob`
    or `alternatives`: they are of the whole window's hypotheses, and alternatives have no word
    times to cut them by. The transcript's score is the sum of its segments' (NaN then), its
    `avg_logprob` over the segments that have one."""
    guides = [part for _, part in parts] if guides is None else guides
    order = sorted(range(len(parts)), key=lambda k: parts[k][0][0])
    guided = []  # the parts as the guides time them, in order
    for k in order:
        span, part = parts[k]
        guide = guides[k]
        if guide.tokens != part.tokens or len(guide.token_starts) != len(part.tokens):
            raise ValueError(f"the guide of the part at {span} has other tokens than the part")
        guided.append((span, guide))
    parts = [parts[k] for k in order]
    spans = [span for span, _ in parts]
    ranges = [_kept_range(spans, k) for k in range(len(spans))]
    words = [_kept_words(part, span[0], *kept) for (span, part), kept in zip(guided, ranges)]
    for k in range(len(parts) - 1):
        if spans[k][1] > spans[k + 1][0]:
            between = (ranges[k][0], ranges[k][1], ranges[k + 1][1])  # where the cut may go
            cut = _keep_lost(guided[k], guided[k + 1], words[k], words[k + 1], between)
            ranges[k], ranges[k + 1] = (ranges[k][0], cut), (cut, ranges[k + 1][1])
            _keep_once(guided[k], guided[k + 1], words[k], words[k + 1])
    out = Transcript("", [], [], [], [], [], 0.0, duration, [])
    logprob_sum, logprob_count = 0.0, 0  # over whole segments: tokens and eos
    for k, (span, part) in enumerate(parts):
        low, high = ranges[k]
        keep = _kept_tokens(part, words[k])
        tokens = [t for t, stays in zip(part.tokens, keep) if stays]
        if tokens and out.tokens and tokenizer.word_break not in (None, tokens[0], out.tokens[-1]):
            _add_word_break(out, tokenizer)  # the segments' words apart, as in `text`
        out.tokens += tokens
        out.pieces += [p for p, stays in zip(part.pieces, keep) if stays]
        # A word kept by its middle may cross where overlapping windows are cut: its times stay
        # within its segment's, as the next segment's words start after it.
        start, end = max(span[0], low), min(span[1], high)
        within = functools.partial(_within, offset=span[0], start=start, end=end)
        kept = [w for w, stays in zip(part.words, words[k]) if stays]
        timed = part
        if any(not start <= span[0] + (w.start + w.end) / 2 <= end for w in kept):
            timed = guided[k][1]  # own times past the cut: the guide's, all in order
        out.token_starts += [within(s) for s, stays in zip(timed.token_starts, keep) if stays]
        out.token_ends += [within(e) for e, stays in zip(timed.token_ends, keep) if stays]
        out.token_probs += [p for p, stays in zip(part.token_probs, keep) if stays]
        for w, guide, stays in zip(part.words, timed.words, words[k]):
            if stays:
                out.words.append(replace(w, start=within(guide.start), end=within(guide.end)))
        [whole] = part.segments
        segment = replace(whole, start=start, end=end)
        if not all(keep):  # the window's score and n-best also score words a neighbour holds
            segment = replace(
                segment,
                text=tokenizer.decode(tokens),
                score=math.nan,
                avg_logprob=None,
                alternatives=[],
            )
        out.segments.append(segment)
        out.score += segment.score  # a cut window's NaN too: its score counts the overlap
        if segment.avg_logprob is not None:
            logprob_sum += segment.avg_logprob * (len(part.tokens) + 1)
            logprob_count += len(part.tokens) + 1
    out.text = " ".join(s.text for s in out.segments if s.text)
    out.avg_logprob = logprob_sum / logprob_count if logprob_count else None
    return out


def _add_word_break(out: Transcript, tokenizer: Tokenizer) -> None:
    """The tokenizer's space token after `out`'s last, at its end; no decoder gave it, so it
    has no probability (NaN)."""
    out.tokens.append(tokenizer.word_break)
    out.pieces += tokenizer.pieces([tokenizer.word_break])
    out.token_starts.append(out.token_ends[-1])
    out.token_ends.append(out.token_ends[-1])
    if out.token_probs:
        out.token_probs.append(math.nan)


def _within(t: float, offset: float, start: float, end: float) -> float:
    """Time `t` of a part starting at `offset`, in the input, held to [start, end]."""
    return min(max(offset + t, start), end)


def _kept_range(spans: Sequence[Span], k: int) -> tuple[float, float]:
    """Where span `k`'s words may lie: its overlaps with its neighbours cut at the middle, or at
    the end of a span that lies within the one before (a silence cut short a window)."""
    low, high = -math.inf, math.inf
    if k > 0 and spans[k - 1][1] > spans[k][0]:
        low = min((spans[k - 1][1] + spans[k][0]) / 2, spans[k][1])
    if k + 1 < len(spans) and spans[k + 1][0] < spans[k][1]:
        high = min((spans[k][1] + spans[k + 1][0]) / 2, spans[k + 1][1])
    return low, high


def _kept_words(part: Transcript, offset: float, low: float, high: float) -> list[bool]:
    """Which words of a part starting at `offset` lie (by their middle) in [low, high)."""
    return [low <= offset + (w.start + w.end) / 2 < high for w in part.words]


def _keep_lost(
    before: tuple[Span, Transcript],
    after: tuple[Span, Transcript],
    kept_before: list[bool],
    kept_after: list[bool],
    between: tuple[float, float, float],
) -> float:
    """Speech at a cut that each window timed on the other's side ("ERASE" at 4.3-4.6 s in one
    window, "N AS" at 4.6-4.9 s in the other, cut at 4.5 s) is in neither's kept words: where
    it is not the speech of a word the other side kept, and fewer of a text are kept about the
    overlap than either side decoded, one side's words for it are kept, the longer. `between`:
    the cut before the first window, this cut, and the one after the second. Returns this cut,
    moved past the words kept (within the two windows' ranges, and not into the other side's
    words) so that they keep their times."""
    low, cut, high = between
    overlap = (max(after[0][0], low), min(before[0][1], after[0][1], high))
    times_before, times_after = _input_times(before), _input_times(after)
    said: Counter[str] = Counter()  # of each text, the most either side decoded about the overlap
    kept: Counter[str] = Counter()
    for part, times, keep in (
        (before, times_before, kept_before),
        (after, times_after, kept_after),
    ):
        about = [
            i for i, (start, end) in enumerate(times) if start <= overlap[1] and end >= overlap[0]
        ]
        said |= Counter(part[1].words[i].text for i in about)
        kept += Counter(part[1].words[i].text for i in about if keep[i])
    held_before = [(*times_before[i], before[1].words[i].text)
                   for i, keep in enumerate(kept_before) if keep]  # fmt: skip
    held_after = [(*times_after[i], after[1].words[i].text)
                  for i, keep in enumerate(kept_after) if keep]  # fmt: skip
    kept_until = held_before[-1][1] if held_before else overlap[0]
    kept_from = held_after[0][0] if held_after else overlap[1]
    lost_before = _lost(before[1].words, times_before, range(len(times_before)),
                        (max(cut, overlap[0]), min(kept_from, overlap[1])), held_after,
                        said - kept)  # fmt: skip
    lost_after = _lost(after[1].words, times_after, reversed(range(len(times_after))),
                       (max(kept_until, overlap[0]), min(cut, overlap[1])), held_before,
                       said - kept)  # fmt: skip
    lasting_before = sum(times_before[i][1] - times_before[i][0] for i in lost_before)
    lasting_after = sum(times_after[i][1] - times_after[i][0] for i in lost_after)
    if lost_before and lasting_before >= lasting_after:
        for i in lost_before:
            kept_before[i] = True
        until = max([cut, *(times_before[i][1] for i in lost_before)])
        return max(cut, min(until, kept_from, overlap[1]))
    for i in lost_after:
        kept_after[i] = True
    since = min([cut, *(times_after[i][0] for i in lost_after)])
    return min(cut, max(since, kept_until, overlap[0]))


def _lost(
    words: Sequence[Word],
    times: Sequence[tuple[float, float]],
    order: Iterable[int],
    within: tuple[float, float],
    held: Sequence[tuple[float, float, str]],
    missing: Counter[str],
) -> list[int]:
    """The words of one side in `order` (nearest the cut first) whose middles lie `within`, up
    to the first that is the speech of a word the other side `held` (`_free`), or whose text is
    not `missing` (as many kept already as either side decoded: one word, timed apart)."""
    missing = Counter(missing)
    lost = []
    for i in order:
        if not within[0] <= sum(times[i]) / 2 < within[1]:
            if lost:
                break
            continue  # kept already, or beyond the overlap
        if missing[words[i].text] <= 0 or not _free(times[i], words[i].text, held):
            break
        missing[words[i].text] -= 1
        lost.append(i)
    return lost


def _input_times(part: tuple[Span, Transcript]) -> list[tuple[float, float]]:
    """Each word's (start, end) in the input."""
    (offset, _), transcript = part
    return [(offset + w.start, offset + w.end) for w in transcript.words]


def _free(span: tuple[float, float], text: str, held: Sequence[tuple[float, float, str]]) -> bool:
    """Whether `span` (of `text`) is the speech of none of the `held` words: not the same
    speech, nor a piece of one it overlaps that its text begins or ends ("TY" of "SIXTY").
    Two windows' times of neighbouring words often overlap by a frame or two."""
    return not any(
        _same_speech(span, (start, end))
        or (
            min(span[1], end) > max(span[0], start)
            and (word.endswith(text) or word.startswith(text))
        )
        for start, end, word in held
    )


def _keep_once(
    before: tuple[Span, Transcript],
    after: tuple[Span, Transcript],
    kept_before: list[bool],
    kept_after: list[bool],
) -> None:
    """Where the last word kept before a cut and the first kept after it are one stretch of
    speech decoded twice (a window cut through a word gave its onset, "U", the next its whole,
    "ERASE"), the shorter is left out, until the two kept are not."""
    while True:
        last = next((i for i in reversed(range(len(kept_before))) if kept_before[i]), None)
        first = next((i for i, kept in enumerate(kept_after) if kept), None)
        if last is None or first is None:
            return
        a, b = before[1].words[last], after[1].words[first]
        a = (before[0][0] + a.start, before[0][0] + a.end)
        b = (after[0][0] + b.start, after[0][0] + b.end)
        if not _same_speech(a, b):
            return
        if a[1] - a[0] <= b[1] - b[0]:
            kept_before[last] = False
        else:
            kept_after[first] = False


def _same_speech(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two word spans share at least half of the shorter one (a span of no length:
    whether it lies inside the other); word times are too rough to judge by less."""
    shared = min(a[1], b[1]) - max(a[0], b[0])
    shorter = min(a[1] - a[0], b[1] - b[0])
    if shorter > 0:
        return shared >= 0.5 * shorter
    return max(a[0], b[0]) < min(a[1], b[1]) or a == b


def _kept_tokens(part: Transcript, kept_words: list[bool]) -> list[bool]:
    """Which tokens stay: those of kept words, and spaces between kept words."""
    if all(kept_words):
        return [True] * len(part.tokens)
    index = word_index(part.pieces)
    keep = []
    for j, word in enumerate(index):
        if word is not None:
            keep.append(kept_words[word])
            continue
        before = next((w for w in reversed(index[:j]) if w is not None), None)
        after = next((w for w in index[j + 1 :] if w is not None), None)
        keep.append(all(kept_words[w] for w in (before, after) if w is not None))
    return keep
