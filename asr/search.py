"""Greedy and beam search over the decoder step interface, with joint CTC/attention decoding
(Watanabe et al. 2017) and LM shallow fusion."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from asr.ctc_prefix import CTCPrefixScorer
from asr.models.interfaces import State
from asr.text import BLANK_ID, PAD_ID, SOS_EOS_ID, first_difference

# Past it the LM's scores swamp the model's; far past it, they overflow float32 to -inf
# and no hypothesis ends.
MAX_LM_WEIGHT = 100.0
NON_OUTPUT_IDS = (BLANK_ID, PAD_ID)
NEG_INF = float("-inf")
# Weights where the model has a CTC head, or an LM is given, and none is set.
DEFAULT_CTC_WEIGHT = 0.3
DEFAULT_LM_WEIGHT = 0.3
# A live stream's, of a model that stores no search of its own (asr.streaming): rescoring
# CTC prefixes leans on CTC more than a joint beam search does.
STREAM_BEAM, STREAM_CTC_WEIGHT = 10, 0.5
COMPACT_FINISHED = 0.25  # searches drop ended utterances once they are this share of the batch


@dataclass
class Hypothesis:
    """One decoded utterance."""

    tokens: list[int]  # output ids, without sos/eos
    score: float  # greedy: total log-probability, eos included; beam: the search score
    attention: Tensor  # (K, len(tokens) + 1, T_enc) cross-attention, the eos step last


class LanguageModel(Protocol):
    """What shallow fusion needs from a token-level language model (ids as the decoder's)."""

    def init_state(self, batch_size: int, device: torch.device) -> State: ...

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """tokens `(B,)` -> next-token log-probs `(B, V)` and the new state."""
        ...

    def reorder_state(self, state: State, index: Tensor) -> State: ...


def check_language_model(
    lm_weight: float,
    lm: LanguageModel | None,
    vocab_size: int | None = None,
    vocabulary: Sequence[str] | None = None,
) -> None:
    """Raise where a fusion weight and a language model do not go together: a weight without
    a model, a model without a weight (it would go unused), `asr.load_lm`'s (model,
    tokenizer) pair given whole, anything else that is no model (a path), or a model whose
    vocabulary is not `vocab_size` tokens, or not the pieces of `vocabulary` (where
    `asr.load_lm` gave the model its `vocabulary`)."""
    if isinstance(lm, tuple):
        raise TypeError("lm= takes the model alone: recognizer.load_lm(path) gives it")
    if lm is not None and not all(hasattr(lm, m) for m in ("init_state", "step", "reorder_state")):
        raise TypeError(
            f"lm= takes a language model, got {type(lm).__name__} {lm!r:.80}: "
            "recognizer.load_lm(path) reads one from its checkpoint"
        )
    if getattr(lm, "training", False):  # load_lm's is not; one's own module may be
        raise ValueError("lm= is in training mode, so dropout changes its scores: call lm.eval()")
    if lm_weight > 0 and lm is None:
        raise ValueError(f"lm_weight={lm_weight} but no language model was given")
    if lm is not None and lm_weight == 0:
        raise ValueError("a language model was given with lm_weight=0: set lm_weight (0.3?)")
    own = getattr(lm, "vocabulary", None)
    if None not in (own, vocabulary) and tuple(own) != tuple(vocabulary):
        raise ValueError(
            "the language model's vocabulary differs from the recognizer's "
            f"({_first_difference(own, vocabulary)}): an LM trained with the recognizer's "
            "tokenizer is needed"
        )
    size = getattr(lm, "vocab_size", None)
    if lm is not None and None not in (size, vocab_size) and size != vocab_size:
        raise ValueError(
            f"the language model has {size} tokens and the recognizer {vocab_size}: an LM "
            "trained with the recognizer's tokenizer is needed (recognizer.load_lm checks it)"
        )


def _first_difference(ours: Sequence[str], theirs: Sequence[str]) -> str:
    """The first token id whose pieces differ, as `id 5: 'a' for 'A'` (the LM's first)."""
    index = first_difference(ours, theirs)
    if index is None or index >= min(len(ours), len(theirs)):
        return f"{len(ours)} pieces for {len(theirs)}"
    return f"id {index}: {ours[index]!r} for {theirs[index]!r}"


def option_number(named: str, value: Any, whole: bool = False) -> int | float:
    """`value` as a Python number (numpy's are not: JSON and weights-only checkpoints take
    none), ValueError where it is none (`"0.3"`, True, 2.5 for a whole number).

    >>> import numpy as np
    >>> option_number("beam", np.int64(4), whole=True), option_number("ctc", np.float32(0.5))
    (4, 0.5)
    """
    kind = numbers.Integral if whole else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(
            f"{named} must be {'a whole number' if whole else 'a number'}, got {value!r}"
        )
    if whole:
        return int(value)
    return value if type(value) in (int, float) else float(value)


# CTC chooses among at least the default beam's pre-beam of tokens per hypothesis: from
# attention's best one alone (beam 1), it took attention's next choice again and again where
# that wanted to end.
FEWEST_PRE_BEAM = 15


@dataclass(frozen=True)
class SearchOptions:
    """Beam search settings.

    A hypothesis `y` of `n` tokens plus eos scores `(1 - ctc_weight) log p_att(y) +
    ctc_weight log p_ctc(y) + lm_weight log p_lm(y) + length_bonus * (n + 1)`, divided by
    `n + 1` when `length_normalization` is set.
    """

    beam_size: int = 10  # hypotheses kept per utterance; 1 without CTC or LM = greedy
    nbest: int | None = None  # hypotheses returned per utterance, best first; None: beam_size
    ctc_weight: float = 0.0  # in [0, 1]; > 0 needs `ctc_log_probs` (prefix-scored on the fly)
    lm_weight: float = 0.0  # shallow fusion weight; > 0 needs `lm`
    length_bonus: float = 0.0  # added per emitted token, eos included (ESPnet's "penalty")
    length_normalization: bool = False  # rank ended hypotheses by score / (tokens + 1)
    max_len_ratio: float = 1.0  # at most ceil(ratio * enc_len) + max_len_extra tokens, eos too
    max_len_extra: int = 0  # raised by a recognizer to fit its fastest speech (`length_bound`)
    min_len_ratio: float = 0.0  # eos is blocked before floor(ratio * enc_len) tokens
    # eos only where log p_att(eos) >= eos_threshold * max_c log p_att(c) (Hannun et al. 2019)
    eos_threshold: float | None = None
    # CTC scores only the max(beam, ratio * beam) best tokens by attention; None: all tokens
    pre_beam_ratio: float | None = 1.5
    repair: bool = True  # decode failed hypotheses again with CTC weight (`asr.guard`)

    def __post_init__(self) -> None:
        whole = ("beam_size", "max_len_extra") + (("nbest",) if self.nbest is not None else ())
        for name in whole:  # counts: 2.5 would fail deep in the search
            value = option_number(f"SearchOptions: {name}", getattr(self, name), whole=True)
            object.__setattr__(self, name, value)
        optional = ("eos_threshold", "pre_beam_ratio")
        for name in ("ctc_weight", "lm_weight", "length_bonus", "max_len_ratio", "min_len_ratio",
                     *optional):  # fmt: skip
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            value = option_number(f"SearchOptions: {name}", value)  # "0.3", None
            if not math.isfinite(value):  # inf scores every hypothesis -inf
                raise ValueError(f"SearchOptions: {name} must be finite, got {value!r}")
            object.__setattr__(self, name, value)
        for name in ("length_normalization", "repair"):  # "false" would be taken as true
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"SearchOptions: {name} must be True or False, got {value!r}")
        checks = {
            "beam_size must be >= 1": self.beam_size >= 1,
            "ctc_weight must lie in [0, 1]": 0.0 <= self.ctc_weight <= 1.0,
            f"lm_weight must lie in [0, {MAX_LM_WEIGHT:g}]": 0.0 <= self.lm_weight <= MAX_LM_WEIGHT,
            "max_len_ratio must be > 0": self.max_len_ratio > 0.0,
            "max_len_extra must be >= 0": self.max_len_extra >= 0,
            "min_len_ratio must be >= 0": self.min_len_ratio >= 0.0,
            "min_len_ratio must not exceed max_len_ratio (no hypothesis could end)": (
                self.min_len_ratio <= self.max_len_ratio
            ),
            "eos_threshold must be None or >= 1": self.eos_threshold is None
            or self.eos_threshold >= 1.0,
            "pre_beam_ratio must be None or >= 1": self.pre_beam_ratio is None
            or self.pre_beam_ratio >= 1.0,
            f"nbest must be None or in [1, beam_size] (beam_size {self.beam_size})": (
                self.nbest is None or 1 <= self.nbest <= self.beam_size
            ),
        }
        for message, ok in checks.items():
            if not ok:
                field = message.split()[0]  # the field it checks
                got = f", got {getattr(self, field)!r}" if hasattr(self, field) else ""
                raise ValueError(f"SearchOptions: {message}{got}")

    def pre_beam_size(self, vocab_size: int) -> int | None:
        """Candidates per hypothesis given to CTC scoring; None: the whole vocabulary.

        >>> SearchOptions(beam_size=20, ctc_weight=0.3).pre_beam_size(100)
        30
        >>> SearchOptions(beam_size=1, ctc_weight=0.3).pre_beam_size(100)
        15
        >>> SearchOptions(beam_size=4, ctc_weight=1.0).pre_beam_size(100) is None
        True
        """
        if self.pre_beam_ratio is None or not 0.0 < self.ctc_weight < 1.0:
            return None
        size = max(self.beam_size, int(self.pre_beam_ratio * self.beam_size), FEWEST_PRE_BEAM)
        return size if size < vocab_size else None


# Outputs may run this many times the training set's fastest speech, so none is cut short.
RATE_MARGIN = 1.5


def fastest_speech(
    token_counts: Sequence[int], durations: Sequence[float], speed: float = 1.0
) -> float | None:
    """Tokens per second, eos included, of the fastest utterance played at `speed`.

    >>> fastest_speech([5, 9], [0.3, 2.0])
    20.0
    """
    rates = [(n + 1) / d for n, d in zip(token_counts, durations, strict=True) if d > 0]
    return max(rates) * speed if rates else None


def length_bound(
    max_len_ratio: float,
    max_len_extra: int,
    tokens_per_second: float | None,
    frame_seconds: float,
    edge_seconds: float = 0.0,
) -> tuple[float, int]:
    """The length bound raised to allow `RATE_MARGIN * tokens_per_second` tokens per second.

    >>> length_bound(0.5, 0, 20.0, 0.04, 0.1)
    (1.2, 3)
    >>> length_bound(2.0, 5, 20.0, 0.04, 0.1), length_bound(0.5, 0, None, 0.04)
    ((2.0, 5), (0.5, 0))
    """
    if tokens_per_second is None:
        return max_len_ratio, max_len_extra
    rate = RATE_MARGIN * tokens_per_second
    extra = math.ceil(round(rate * max(edge_seconds, 0.0), 6))
    return max(max_len_ratio, round(rate * frame_seconds, 6)), max(max_len_extra, extra)


def max_output_length(enc_lens: Tensor, ratio: float, extra: int = 0) -> Tensor:
    """Per-utterance step limit: `ceil(ratio * enc_len) + extra`, at least 1.

    >>> max_output_length(torch.tensor([10, 3]), 0.5).tolist()
    [5, 2]
    >>> max_output_length(torch.tensor([10, 0]), 0.5, extra=2).tolist()
    [7, 2]
    >>> max_output_length(torch.tensor([98]), 1e20).tolist()  # as good as no limit
    [2147483648]
    """
    steps = torch.ceil(enc_lens.float() * ratio) + extra  # clamped before int64 could overflow
    return steps.clamp(1, 2**31).long()


@torch.no_grad()
def greedy_search(
    decoder: nn.Module,
    enc: Tensor,
    enc_lens: Tensor,
    max_len_ratio: float = 1.0,
    max_len_extra: int = 0,
) -> list[Hypothesis]:
    """Batched greedy decoding of `(B, T, D)` encoder output: one `Hypothesis` per utterance."""
    batch = enc.size(0)
    limits = max_output_length(enc_lens.to(enc.device), max_len_ratio, max_len_extra)
    max_steps = int(limits.max()) if batch else 0
    state = decoder.init_state(enc, enc_lens)
    non_outputs = torch.tensor(NON_OUTPUT_IDS, device=enc.device)
    rows = torch.arange(batch, device=enc.device)
    prev = torch.full((batch,), SOS_EOS_ID, dtype=torch.long, device=enc.device)
    done = torch.zeros(batch, dtype=torch.bool, device=enc.device)
    steps: list[Tensor] = []  # (B,) each: grown, as a limit may be as good as none
    scores = torch.zeros(batch, device=enc.device)
    attns: list[tuple[Tensor, Tensor]] = []  # per step: its rows and their attention
    for t in range(max_steps):
        logp, state, attn = decoder.step(prev, state)
        logp = logp.float().index_fill(1, non_outputs, NEG_INF)
        best = logp.argmax(dim=-1).masked_fill_(limits[rows] <= t + 1, SOS_EOS_ID)
        scores[rows] += logp.gather(1, best[:, None]).squeeze(1).masked_fill_(done, 0.0)
        best.masked_fill_(done, SOS_EOS_ID)
        steps.append(prev.new_full((batch,), SOS_EOS_ID).index_copy_(0, rows, best))
        attns.append((rows, attn.float()))
        done |= best == SOS_EOS_ID
        prev = best
        finished = int(done.sum())
        if finished == rows.numel():
            break
        if _compact_now(finished, rows.numel()):
            running = (~done).nonzero().squeeze(1)
            state = decoder.reorder_state(state, running)
            rows, prev, done = rows[running], prev[running], done[running]
    tokens = torch.stack(steps, 1) if steps else prev.new_zeros(batch, 0)
    return _collect(tokens, _gather_steps(attns, batch), scores, enc_lens)


def _compact_now(finished: int, searched: int) -> bool:
    return finished > 0 and finished >= COMPACT_FINISHED * searched


def _gather_steps(attns: list[tuple[Tensor, Tensor]], batch: int) -> Tensor:
    """`(B, K, S, T)` from per-step `(rows, (R, K, T))`; zeros where a row had left."""
    if not attns:
        return torch.zeros(batch, 0, 0, 0)
    first = attns[0][1]
    out = first.new_zeros(batch, first.size(1), len(attns), first.size(2))
    for t, (rows, attn) in enumerate(attns):
        out[rows, :, t] = attn
    return out


def _collect(ids: Tensor, attn: Tensor, scores: Tensor, enc_lens: Tensor) -> list[Hypothesis]:
    """Cut each row at its first eos. ids `(B, S)`, attn `(B, K, S, T)`."""
    hyps = []
    for b, row in enumerate(ids.tolist()):
        n = row.index(SOS_EOS_ID) if SOS_EOS_ID in row else len(row)
        att = attn[b, :, : n + 1, : int(enc_lens[b])].cpu()
        hyps.append(Hypothesis(row[:n], float(scores[b]), att))
    return hyps


@torch.no_grad()
def beam_search(
    decoder: nn.Module,
    enc: Tensor,
    enc_lens: Tensor,
    options: SearchOptions | None = None,
    ctc_log_probs: Tensor | None = None,
    lm: LanguageModel | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search with optional CTC prefix scores `(B, T, V)` and LM: n-best lists."""
    options = options or SearchOptions()
    _check_search_inputs(decoder, enc, enc_lens, options, ctc_log_probs, lm)
    batch, beam = enc.size(0), options.beam_size
    if batch == 0:
        return []
    enc_lens = enc_lens.to(enc.device)
    rows = torch.arange(batch, device=enc.device).repeat_interleave(beam)  # (B * beam,)
    state = decoder.reorder_state(decoder.init_state(enc, enc_lens), rows)
    fusion = _Fusion(options, ctc_log_probs, enc_lens, lm, rows)
    beams = _Beams(batch, beam, options, enc.device)
    prev = torch.full_like(rows, SOS_EOS_ID)
    for t in range(int(fusion.limits.max())):
        logp, state, attn = decoder.step(prev, state)
        scores = fusion.token_scores(prev, logp.float(), t)
        candidates = fusion.candidates(scores)
        ctc = fusion.ctc_scores(candidates, t)
        fusion.let_stuck_rows_end(scores, candidates, ctc)
        source, prev = beams.advance(scores, candidates, ctc, attn, t)
        if not bool(beams.running.any()):
            break
        kept = beams.drop_ended()
        if kept is not None:
            source, prev = source[kept], prev[kept]
            fusion.keep_rows(kept)
        state = decoder.reorder_state(state, source)
        fusion.reorder(source, prev)
    return beams.nbest(enc_lens)


def _can_prune(options: SearchOptions) -> bool:
    """Whether scores never rise as a hypothesis grows, so ended ones bound running ones."""
    return not options.length_normalization and options.length_bonus <= 0.0


class _Fusion:
    """Weighted attention, LM and CTC scores of `B * beam` hypotheses, with the length rules."""

    def __init__(
        self,
        options: SearchOptions,
        ctc_log_probs: Tensor | None,
        enc_lens: Tensor,
        lm: LanguageModel | None,
        rows: Tensor,
    ) -> None:
        self.options = options
        self.non_outputs = torch.tensor(NON_OUTPUT_IDS, device=rows.device)
        self.eos_id = torch.tensor([SOS_EOS_ID], device=rows.device)
        limits = max_output_length(enc_lens, options.max_len_ratio, options.max_len_extra)
        self.limits = limits[rows]
        self.min_lens = torch.floor(enc_lens.float() * options.min_len_ratio).long()[rows]
        self.lm = lm if options.lm_weight > 0 else None
        self.lm_state = self.lm.init_state(rows.numel(), rows.device) if self.lm else None
        self.ctc = None
        if options.ctc_weight > 0:
            self.ctc = CTCPrefixScorer(ctc_log_probs, enc_lens, BLANK_ID, SOS_EOS_ID)
            self.ctc_state = self.ctc.init_state(options.beam_size)

    def token_scores(self, prev: Tensor, att: Tensor, t: int) -> Tensor:
        """`(N, V)` fused scores of the next tokens; -inf where the rules forbid a token."""
        weight = 1.0 - self.options.ctc_weight
        scores = weight * att if weight > 0 else torch.zeros_like(att)
        if self.lm is not None:
            lm_logp, self.lm_state = self.lm.step(prev, self.lm_state)
            if lm_logp.shape != att.shape:
                raise ValueError(
                    f"beam_search: lm log-probs {tuple(lm_logp.shape)} != {tuple(att.shape)}"
                )
            scores = scores + self.options.lm_weight * lm_logp.float()
        scores = (scores + self.options.length_bonus).index_fill(1, self.non_outputs, NEG_INF)
        forced = t + 1 >= self.limits  # only eos remains
        long_enough, threshold_ok = t >= self.min_lens, self._eos_threshold_ok(att)
        eos_ok = long_enough & threshold_ok
        # eos that the threshold alone holds back: let_stuck_rows_end may need it
        self.held_eos = scores[:, SOS_EOS_ID].masked_fill(~long_enough | threshold_ok, NEG_INF)
        eos = scores[:, SOS_EOS_ID].masked_fill(~(eos_ok | forced), NEG_INF)
        scores = scores.masked_fill(forced[:, None], NEG_INF)
        scores[:, SOS_EOS_ID] = eos
        return scores

    def let_stuck_rows_end(
        self, scores: Tensor, candidates: Tensor | None, ctc: Tensor | None
    ) -> None:
        """Give back, in place, eos that the eos threshold held back to rows that CTC lets
        go on with no token (a prefix that used every frame): else, beam by beam, every
        hypothesis of an utterance could die before one ended."""
        if ctc is None or self.options.eos_threshold is None:
            return
        if candidates is None:  # every token scored, eos among them
            going_on = (scores + ctc).index_fill(1, self.eos_id, NEG_INF)
        else:  # eos is the last candidate
            going_on = scores.gather(1, candidates[:, :-1]) + ctc[:, :-1]
        stuck = ~torch.isfinite(going_on).any(dim=1) & torch.isfinite(self.held_eos)
        scores[:, SOS_EOS_ID] = torch.where(stuck, self.held_eos, scores[:, SOS_EOS_ID])

    def _eos_threshold_ok(self, att: Tensor) -> Tensor:
        threshold = self.options.eos_threshold
        if threshold is None:
            return torch.ones(att.size(0), dtype=torch.bool, device=att.device)
        best = att.index_fill(1, self.non_outputs, NEG_INF).max(dim=-1).values
        return att[:, SOS_EOS_ID] >= threshold * best

    def candidates(self, scores: Tensor) -> Tensor | None:
        """`(N, C)` token ids CTC scores (the pre-beam, and eos); None: all."""
        size = self.options.pre_beam_size(scores.size(1)) if self.ctc is not None else None
        if size is None:
            return None
        # eos always: unscored by CTC, a hypothesis cannot end, and an utterance whose
        # attention ranks eos low (beam 1, short audio) would end with no hypothesis at all
        best = scores.topk(size + 1, dim=-1).indices
        # eos last (a stable sort keeps the rest in order; among -inf ties it may be anywhere),
        # then cut: each row holds eos once
        best = best.gather(1, (best == SOS_EOS_ID).to(torch.int8).argsort(dim=1, stable=True))
        return torch.cat([best[:, :size], self.eos_id.expand(len(best), 1)], 1)

    def ctc_scores(self, candidates: Tensor | None, t: int) -> Tensor | None:
        if self.ctc is None:
            return None
        forced = t + 1 >= self.limits  # eos made to end these hypotheses at step t
        scores = self.ctc.score(self.ctc_state, candidates, complete=forced)
        return self.options.ctc_weight * scores

    def keep_rows(self, rows: Tensor) -> None:
        self.limits, self.min_lens = self.limits[rows], self.min_lens[rows]

    def reorder(self, source: Tensor, tokens: Tensor) -> None:
        if self.lm is not None:
            self.lm_state = self.lm.reorder_state(self.lm_state, source)
        if self.ctc is not None:
            self.ctc_state = self.ctc.extend(self.ctc.reorder_state(self.ctc_state, source), tokens)


class _Beams:
    """Scores and history of live utterances x `beam` rows (row `u * beam + k`)."""

    def __init__(self, batch: int, beam: int, options: SearchOptions, device: torch.device):
        self.utterances, self.beam = batch, beam
        self.live = torch.arange(batch, device=device)
        self.returned = options.nbest or beam
        self.prune = _can_prune(options)
        self.normalise = options.length_normalization
        start = torch.full((batch, beam), NEG_INF, device=device)
        start[:, 0] = 0.0  # one hypothesis, sos, per utterance
        self.partial = start.flatten()  # (N,) summed attention, LM and length terms
        self.ctc = torch.zeros_like(self.partial)  # (N,) CTC score of the whole prefix, not a sum
        self.best_ended = torch.full((batch, beam), NEG_INF, device=device)
        # Per step over its live rows; `ended` covers all B * beam rows (final score at eos).
        self.lives: list[Tensor] = []
        self.tokens: list[Tensor] = []
        self.parents: list[Tensor] = []
        self.attention: list[Tensor] = []
        self.ended: list[Tensor] = []

    @property
    def running(self) -> Tensor:
        return self.partial > NEG_INF

    def advance(
        self, scores: Tensor, candidates: Tensor | None, ctc: Tensor | None, attn: Tensor, t: int
    ) -> tuple[Tensor, Tensor]:
        """Keep the `beam` best extensions per live utterance: `(N,)` source rows and tokens."""
        if candidates is not None:
            scores = scores.gather(1, candidates)
        partial = self.partial[:, None] + scores
        total = partial + (ctc if ctc is not None else self.ctc[:, None])
        width = total.size(1)
        best, index = total.view(self.live.numel(), -1).topk(self.beam, dim=1)  # of beam * C
        flat = (index + self._offsets(self.live.numel(), self.beam * width)).flatten()
        source = flat // width
        tokens = flat % width if candidates is None else candidates.flatten()[flat]
        if ctc is not None:
            self.ctc = ctc.flatten()[flat]
        ended = self._record(tokens, source, best.flatten(), attn.float(), t)
        keep = self._keep(tokens, best, ended)
        self.partial = partial.flatten()[flat].masked_fill(~keep, NEG_INF)
        return source, tokens

    def _offsets(self, utterances: int, stride: int) -> Tensor:
        return torch.arange(utterances, device=self.partial.device)[:, None] * stride

    def _record(
        self, tokens: Tensor, source: Tensor, total: Tensor, attn: Tensor, t: int
    ) -> Tensor:
        final = total / (t + 1) if self.normalise else total  # t tokens + eos
        ended = final.masked_fill(tokens != SOS_EOS_ID, NEG_INF)
        every_row = torch.full((self.utterances, self.beam), NEG_INF, device=ended.device)
        every_row[self.live] = ended.view(-1, self.beam)
        self.ended.append(every_row.flatten())
        self.lives.append(self.live)
        self.tokens.append(tokens)
        self.parents.append(source)
        self.attention.append(attn)
        return ended

    def _keep(self, tokens: Tensor, total: Tensor, ended: Tensor) -> Tensor:
        """`(N,)` rows still running: not ended and, when pruning, above the `beam`-th ended."""
        threshold = torch.full_like(total[:, :1], NEG_INF)
        if self.prune:
            ended = ended.view(-1, self.beam)
            self.best_ended = torch.cat([self.best_ended, ended], 1).topk(self.beam, dim=1).values
            threshold = self.best_ended[:, -1:]
        return (total > threshold).flatten() & (tokens != SOS_EOS_ID)

    def drop_ended(self) -> Tensor | None:
        """Drop finished utterances once they are a `COMPACT_FINISHED` share; rows kept or None."""
        running = self.running.view(-1, self.beam).any(1)
        if not _compact_now(running.numel() - int(running.sum()), running.numel()):
            return None
        utterances = running.nonzero().squeeze(1)
        rows = (
            utterances[:, None] * self.beam + torch.arange(self.beam, device=utterances.device)
        ).flatten()
        self.live, self.best_ended = self.live[utterances], self.best_ended[utterances]
        self.partial, self.ctc = self.partial[rows], self.ctc[rows]
        return rows

    def nbest(self, enc_lens: Tensor) -> list[list[Hypothesis]]:
        steps, batch = len(self.ended), self.utterances
        ended = torch.stack(self.ended).view(steps, batch, self.beam)
        ended = ended.transpose(0, 1).reshape(batch, steps * self.beam)  # (B, S * beam)
        scores, index = ended.topk(self.returned, dim=1)
        end_step = index // self.beam
        slot = index % self.beam + self._offsets(batch, self.beam)
        tokens, attention = self._backtrack(end_step.flatten(), slot.flatten())
        hyps: list[list[Hypothesis]] = []
        for b, (row_scores, row_steps) in enumerate(zip(scores.tolist(), end_step.tolist())):
            hyps.append([])
            for k, (score, step) in enumerate(zip(row_scores, row_steps)):
                if score > NEG_INF:
                    m, frames = b * self.returned + k, int(enc_lens[b])
                    att = attention[m, :, : step + 1, :frames].cpu()
                    hyps[-1].append(Hypothesis(tokens[m][:step], score, att))
        return hyps

    def _backtrack(self, end_step: Tensor, slot: Tensor) -> tuple[list[list[int]], Tensor]:
        """Tokens and attention `(M, K, S, T)` of hypotheses ending at `end_step` in `slot`."""
        row = torch.zeros_like(slot)
        tokens, attention = [], []
        for s in reversed(range(len(self.tokens))):
            row = torch.where(end_step == s, self._live_row(s, slot), row)
            tokens.append(self.tokens[s][row])
            row = self.parents[s][row]
            attention.append(self.attention[s][row])
            if s and self.lives[s].numel() < self.lives[s - 1].numel():  # dropped before s
                row = self._live_row(s - 1, self._every_row(s, row))
        return torch.stack(tokens[::-1], 1).tolist(), torch.stack(attention[::-1], 2)

    def _live_row(self, step: int, slot: Tensor) -> Tensor:
        """Rows of step `step`'s history for rows `slot` of all B * beam."""
        live = self.lives[step]
        position = torch.zeros(self.utterances, dtype=torch.long, device=live.device)
        position[live] = torch.arange(live.numel(), device=live.device)
        return position[slot // self.beam] * self.beam + slot % self.beam

    def _every_row(self, step: int, row: Tensor) -> Tensor:
        return self.lives[step][row // self.beam] * self.beam + row % self.beam


def _check_search_inputs(
    decoder: nn.Module,
    enc: Tensor,
    enc_lens: Tensor,
    options: SearchOptions,
    ctc_log_probs: Tensor | None,
    lm: LanguageModel | None,
) -> None:
    if enc.dim() != 3 or enc_lens.shape != enc.shape[:1]:
        raise ValueError(
            f"beam_search: enc must be (B, T, D) with enc_lens (B,), got "
            f"{tuple(enc.shape)} and {tuple(enc_lens.shape)}"
        )
    if options.lm_weight > 0 and lm is None:
        raise ValueError(f"beam_search: lm_weight={options.lm_weight} but no lm was given")
    if options.ctc_weight == 0:
        return
    if ctc_log_probs is None:
        raise ValueError(
            f"beam_search: ctc_weight={options.ctc_weight} but no ctc_log_probs were given"
        )
    expected = (enc.size(0), enc.size(1), decoder.vocab_size)
    if tuple(ctc_log_probs.shape) != expected:
        raise ValueError(
            f"beam_search: ctc_log_probs must be (B, T, V) = {expected}, "
            f"got {tuple(ctc_log_probs.shape)}"
        )
