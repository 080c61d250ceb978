"""CTC prefix scoring for joint CTC/attention decoding (Watanabe et al. 2017, Algorithm 2),
vectorised over hypotheses and candidates and windowed to the frames where a prefix can end."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from asr.models.interfaces import State, lengths_to_mask, reorder_batch

# exp(-1e4) is 0 in float64, yet cumulative sums of floored values still difference exactly.
LOG_FLOOR = -1e4

NEG_INF = float("-inf")

# A prefix's forward mass more than WINDOW_NATS below its best frame is dropped. Log-probabilities
# are <= 0, so each cut drops less than frames * exp(-WINDOW_NATS): scores above about
# -(WINDOW_NATS - log(frames * tokens)) are exact, lower ones lower bounds. Where CTC puts every
# hypothesis below that (a CTC head at odds with all of them), the search ranks bounds and may
# end elsewhere than exact scoring (`window=None`) would. The band it keeps grows with it slowly;
# no window at all is quadratic in length.
WINDOW_NATS = 200.0
BAND_GROWTH = 16  # frames a band first grows by while still significant at its end


def log_linear_recurrence(
    inputs: Tensor, log_factors: Tensor, initial: Tensor | None = None
) -> Tensor:
    """Solve `y_{i+1} = (y_i + u_i) * a_i` for all `i` at once, in logs: `(..., T + 1)` log `y`.

    >>> u, a = torch.tensor([0.5, 0.25]).log(), torch.tensor([0.5, 0.5]).log()
    >>> log_linear_recurrence(u, a).exp().tolist()  # (0 + .5) * .5, (.25 + .25) * .5
    [0.0, 0.25, 0.25]
    >>> log_linear_recurrence(u, a, torch.tensor(0.5).log()).exp().tolist()
    [0.5, 0.5, 0.375]
    """
    if initial is not None and inputs.size(-1):
        inputs = torch.cat(
            [torch.logaddexp(inputs[..., :1], initial[..., None]), inputs[..., 1:]], -1
        )
    cumulative = F.pad(log_factors.cumsum(-1), (1, 0))  # (..., T + 1), C_0 = 0
    summed = torch.logcumsumexp(inputs - cumulative[..., :-1], dim=-1)
    first = torch.full_like(summed[..., :1], NEG_INF) if initial is None else initial[..., None]
    return torch.cat([first.to(summed.dtype), summed + cumulative[..., 1:]], -1)


class CTCPrefixScorer:
    """CTC prefix scores of `(B, T, V)` log-posteriors for utterances x beams x candidates.

    Each hypothesis keeps its own band of frames (`end`, past which its forward variables are
    -inf): the rows share storage, never a decision, so a score depends on its prefix and its
    utterance alone, not on the other hypotheses or utterances batched with it.
    """

    def __init__(
        self,
        log_probs: Tensor,
        lengths: Tensor,
        blank: int = 0,
        eos: int | None = 3,
        dtype: torch.dtype | None = None,
        window: float | None = WINDOW_NATS,
    ) -> None:
        _check_inputs(log_probs, lengths, blank)
        self.window = window
        if dtype is None:  # cumulative log sums need float64; MPS has none
            dtype = torch.float32 if log_probs.device.type == "mps" else torch.float64
        self.dtype = dtype
        valid = lengths_to_mask(lengths, log_probs.size(1))
        frames = log_probs.float().clamp(min=LOG_FLOOR)
        frames = frames.masked_fill(~valid[..., None], 0.0)  # finite, never scored
        self.frames = frames.transpose(1, 2).contiguous()  # (B, V, T)
        self.num_frames = log_probs.size(1)
        self.lengths = lengths.to(log_probs.device)
        self.blank = blank
        self.eos = eos
        self.vocab_size = log_probs.size(2)

    def init_state(self, beam: int = 1) -> State:
        """The empty prefix, `beam` rows per utterance: forward variables `r^n`, `r^b` on a band."""
        utterance = torch.arange(self.frames.size(0), device=self.frames.device)
        utterance = utterance.repeat_interleave(beam)
        blanks = self._frames(utterance, self.blank, 0, self.num_frames)
        r_blank = F.pad(blanks.cumsum(-1), (1, 0))
        state = {
            "r_nonblank": torch.full_like(r_blank, NEG_INF),
            "r_blank": r_blank,
            "start": 0,  # the frame of the stored columns' first
            "end": torch.full_like(utterance, self.num_frames + 1),  # each row's band: < end
            "last": torch.full_like(utterance, -1),
            "utterance": utterance,
        }
        return self._trimmed(state)

    def score(
        self, state: State, tokens: Tensor | None = None, complete: bool | Tensor = False
    ) -> Tensor:
        """`(N, C)` log prefix scores `psi(h + c)` of candidates `tokens` (None: all V).

        `complete` (all rows, or an `(N,)` mask): where the band ends before the last frame,
        score eos by continuing it with blanks and repeats (-inf otherwise), as a hypothesis
        made to end at the length limit needs. A lower bound: the band was trimmed to where the
        prefix then could end.
        """
        utterance, last = state["utterance"], state["last"]
        if tokens is None:
            tokens = torch.arange(self.vocab_size, device=last.device).expand(last.size(0), -1)
        r_blank = state["r_blank"]
        phi_other = self._phi(state, consumable=True)
        column, inside = self._window(phi_other)
        frame = (state["start"] + column).clamp(max=self.num_frames - 1)
        x = self.frames[utterance[:, None, None], tokens[..., None], frame[:, None]]  # (N, C, K)
        repeat = (tokens == last[:, None])[..., None]
        blank_in_window, other_in_window = r_blank.gather(1, column), phi_other.gather(1, column)
        phi = torch.where(repeat, blank_in_window[:, None], other_in_window[:, None])  # (N, C, K)
        terms = (phi + x.to(self.dtype)).masked_fill(~inside[:, None], NEG_INF)
        psi = terms.logsumexp(-1).float()
        if self.eos is not None:
            complete = torch.as_tensor(complete, device=last.device).expand(last.size(0))
            ended = self._grown(state, self.num_frames, complete)
            psi = torch.where(tokens == self.eos, self.final_score(ended)[:, None], psi)
        return psi.masked_fill(tokens == self.blank, NEG_INF)

    def extend(self, state: State, tokens: Tensor) -> State:
        """The state of `h + c` for one token `c` `(N,)` per hypothesis."""
        utterance, start = state["utterance"], state["start"]
        phi_other = self._phi(state, consumable=True)
        repeat = (tokens == state["last"])[:, None]
        r_blank = state["r_blank"].masked_fill(phi_other.isneginf(), NEG_INF)
        phi = torch.where(repeat, r_blank, phi_other)
        # h + c has nothing significant before h's window
        skip = self._first_significant(phi_other)
        phi = phi.masked_fill(_columns(phi) < skip[:, None], NEG_INF)
        low = int(skip.min()) if len(skip) else 0
        begin = start + low
        end = torch.full_like(tokens, self.num_frames + 1)
        if self.window is not None:
            end = (state["end"] + BAND_GROWTH).clamp(max=self.num_frames + 1)
        inputs = _fit(phi[:, low:], (int(end.max()) if len(end) else begin + 1) - 1 - begin)
        r_nonblank, r_blank = self._recursions(utterance, tokens, inputs, begin)
        new = _cut(
            {**state, "r_nonblank": r_nonblank, "r_blank": r_blank, "start": begin, "end": end},
        )
        new["last"] = tokens
        growth = BAND_GROWTH
        while bool((growing := self._significant_at_end(new)).any()):
            new = self._grown(new, growth, growing)
            growth *= 2
        return self._trimmed(new)

    def _grown(self, state: State, frames: int, rows: Tensor) -> State:
        """`state` with the bands of `rows` `(N,)` continued by up to `frames` frames of
        repeats and blanks only, each from its own end."""
        start, end = state["start"], state["end"]
        wanted = torch.where(rows, (end + frames).clamp(max=self.num_frames + 1), end)
        changed = wanted > end
        if not bool(changed.any()):
            return state
        first, stop = int(end[changed].min()) - 1, int(wanted.max())  # frames of the new columns
        width = max(state["r_blank"].size(1), stop - start)
        # copies: the state given stays as it was (a score's forced end is not kept)
        r_nonblank, r_blank = (_fit(state[k], width).clone() for k in ("r_nonblank", "r_blank"))
        # the empty prefix (last -1) has no non-blank paths to continue: any label will do
        utterance, tokens = state["utterance"], state["last"].clamp(min=0)
        label = F.pad(self._frames(utterance, tokens, first, stop - 1).cumsum(-1), (1, 0))
        blank = F.pad(self._frames(utterance, self.blank, first, stop - 1).cumsum(-1), (1, 0))
        columns = slice(first - start, stop - start)
        kept_n, kept_b = r_nonblank[:, columns], r_blank[:, columns]
        base = (end - 1 - first).clamp(min=0)[:, None]  # each row's last column, continued
        at = _columns(label)
        n0, b0 = kept_n.gather(1, base), kept_b.gather(1, base)
        # r^n goes on repeating its label; r^b takes r^n's paths in and goes on with blanks
        quiet_n = n0 + label - label.gather(1, base)
        from_n = F.pad((quiet_n - blank)[:, :-1], (1, 0), value=NEG_INF)
        inflow = torch.where(at == base, b0 - blank.gather(1, base), NEG_INF)
        inflow = torch.logaddexp(inflow, from_n.masked_fill(at <= base, NEG_INF))
        quiet_b = inflow.logcumsumexp(-1) + blank
        filled = (at > base) & (at < (wanted - first)[:, None]) & changed[:, None]
        r_nonblank[:, columns] = torch.where(filled, quiet_n, kept_n)
        r_blank[:, columns] = torch.where(filled, quiet_b, kept_b)
        return {**state, "r_nonblank": r_nonblank, "r_blank": r_blank, "end": wanted}

    def final_score(self, state: State) -> Tensor:
        """`(N,)` `log p_ctc(h | x)`; -inf where the band ends before the last frame."""
        width = state["r_blank"].size(1)
        column = (self.lengths[state["utterance"]] - state["start"])[:, None]
        inside = (column >= 0) & (column < width)
        column = column.clamp(0, width - 1)
        last_frame = torch.logaddexp(
            state["r_nonblank"].gather(1, column), state["r_blank"].gather(1, column)
        )
        return last_frame.masked_fill(~inside, NEG_INF).squeeze(1).float()

    def _phi(self, state: State, consumable: bool) -> Tensor:
        """`(N, W)` `phi(h, c)` for `c != last(h)` on the band; -inf past the last frame."""
        r_nonblank, r_blank = state["r_nonblank"], state["r_blank"]
        consumed = state["start"] + torch.arange(r_blank.size(1), device=r_blank.device)
        limit = self.lengths[state["utterance"]][:, None] - int(consumable)
        return torch.logaddexp(r_nonblank, r_blank).masked_fill(consumed > limit, NEG_INF)

    def _significant(self, phi: Tensor) -> Tensor:
        return (phi >= phi.amax(-1, keepdim=True) - self.window) & (phi > NEG_INF)

    def _first_significant(self, phi: Tensor) -> Tensor:
        """`(N,)` each row's first significant column (0 where none)."""
        if self.window is None:
            return torch.zeros(phi.size(0), dtype=torch.long, device=phi.device)
        return _span(self._significant(phi))[0]

    def _significant_at_end(self, state: State) -> Tensor:
        """`(N,)` whether each row is still significant where its band stops before the last
        frame."""
        end = state["end"]
        if self.window is None:
            return torch.zeros_like(end, dtype=torch.bool)
        significant = self._significant(self._phi(state, consumable=True))
        last = (end - 1 - state["start"]).clamp(min=0)[:, None]
        return significant.gather(1, last).squeeze(1) & (end <= self.num_frames)

    def _trimmed(self, state: State) -> State:
        """Each row's band cut after its last significant column; storage to the longest."""
        if self.window is None:
            return state
        kept = self._significant(self._phi(state, consumable=False))
        width = _span(kept)[1].clamp(min=1)
        state = _cut({**state, "end": state["start"] + width})
        width = int(width.max()) if len(width) else 1
        return {
            **state,
            "r_nonblank": state["r_nonblank"][:, :width],
            "r_blank": state["r_blank"][:, :width],
        }

    def _recursions(
        self,
        utterance: Tensor,
        tokens: Tensor,
        inputs: Tensor,
        first: int,
        r_nonblank: Tensor | None = None,
        r_blank: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """`r^n`, `r^b` `(N, F + 1)` of `h + c` from `phi(h, c)` `(N, F)` at frames `first ..`."""
        stop = first + inputs.size(1)
        label = self._frames(utterance, tokens, first, stop)
        new_nonblank = log_linear_recurrence(inputs, label, r_nonblank)
        blank = self._frames(utterance, self.blank, first, stop)
        return new_nonblank, log_linear_recurrence(new_nonblank[:, :-1], blank, r_blank)

    def _window(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        """`(N, K)` columns to score per row of `phi` and whether each lies in the row's window."""
        columns = phi.size(1)
        if self.window is None:
            span = torch.arange(columns, device=phi.device).expand(phi.size(0), -1)
            return span, phi > NEG_INF
        start, end = _span(self._significant(phi))
        width = int((end - start).max()) if phi.size(0) else 0
        column = start[:, None] + torch.arange(width, device=phi.device)
        return column.clamp(max=columns - 1), column < end[:, None]

    def _frames(self, utterance: Tensor, tokens: Tensor | int, first: int, stop: int) -> Tensor:
        """`(..., stop - first)` log-posteriors of `tokens` at frames `first .. stop - 1`."""
        rows = utterance * self.vocab_size + tokens  # index_select is far cheaper than indexing
        picked = self.frames.flatten(0, 1)[:, first:stop].index_select(0, rows.flatten())
        return picked.view(*rows.shape, -1).to(self.dtype)

    def reorder_state(self, state: State, index: Tensor) -> State:
        return reorder_batch(state, index)


def _span(kept: Tensor) -> tuple[Tensor, Tensor]:
    """The first True along the last dim of `kept` and one past the last (0, 0 when none).

    >>> [t.tolist() for t in _span(torch.tensor([[False, True, True, False], [False] * 4]))]
    [[1, 0], [3, 0]]
    """
    start = kept.int().argmax(-1)
    end = torch.where(kept.any(-1), kept.size(-1) - kept.flip(-1).int().argmax(-1), start)
    return start, end


def _columns(values: Tensor) -> Tensor:
    """`(1, W)` the column indices of `(N, W)` `values`."""
    return torch.arange(values.size(1), device=values.device)[None]


def _cut(state: State) -> State:
    """`state` with each row's forward variables -inf from its band's `end` on."""
    past = _columns(state["r_blank"]) >= (state["end"] - state["start"])[:, None]
    return {
        **state,
        "r_nonblank": state["r_nonblank"].masked_fill(past, NEG_INF),
        "r_blank": state["r_blank"].masked_fill(past, NEG_INF),
    }


def _fit(values: Tensor, width: int) -> Tensor:
    if values.size(1) >= width:
        return values[:, :width]
    return F.pad(values, (0, width - values.size(1)), value=NEG_INF)


def _check_inputs(log_probs: Tensor, lengths: Tensor, blank: int) -> None:
    if log_probs.dim() != 3:
        raise ValueError(
            f"CTCPrefixScorer: log_probs must be (B, T, V), got {tuple(log_probs.shape)}"
        )
    batch, frames, vocab = log_probs.shape
    if lengths.shape != (batch,):
        raise ValueError(f"CTCPrefixScorer: lengths must be ({batch},), got {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > frames):
        raise ValueError(f"CTCPrefixScorer: lengths must lie in [0, {frames}]: {lengths.tolist()}")
    if not 0 <= blank < vocab:
        raise ValueError(f"CTCPrefixScorer: blank id {blank} is outside the vocabulary of {vocab}")
