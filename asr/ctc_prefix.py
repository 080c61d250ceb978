"""CTC prefix scoring for joint CTC/attention decoding (Watanabe et al. 2017, Algorithm 2).

For a hypothesis prefix `h` the scorer keeps the CTC forward variables over all frames, in
the log domain: `r^n_i(h)` and `r^b_i(h)`, the probability that the first `i` frames emit
exactly `h` with the last of them a non-blank (n) or a blank (b). From them, with
`x_t(c)` the CTC posterior of token `c` at frame `t` and, in probabilities,
`phi_i(h, c) = r^b_i(h) + [last(h) != c] r^n_i(h)`:

    psi(h + c)   = sum_{t < T} phi_t(h, c) x_t(c)    prefix probability of h + c
    psi(h + eos) = r^n_T(h) + r^b_T(h)               = p_ctc(h | x)

The prefix probability sums `p_ctc(y | x)` over every label sequence `y` that starts with the
prefix, so `psi(h) = p(h) + sum_c psi(h + c)` over the non-blank tokens `c`.

Both forward recursions over time are first-order linear in probabilities,
`y_{i+1} = (y_i + u_i) a_i`, so instead of a Python loop over frames they are solved in
closed form with cumulative sums (`log_linear_recurrence`). That subtracts large cumulative
log-probabilities, so the scorer works in float64 (float32 on MPS, which has no float64) and
returns float32 scores.

Scoring is windowed: `psi(h + c)` sums only the frames where `phi(h)` lies within `window`
nats of its maximum over time (the frames where `h` can end and `c` begin). Each dropped term
is below `exp(-window)` times the largest kept one, so the scores are exact to float precision
for every candidate that matters, and the work per step grows with the width of that region,
not with the utterance, which keeps decoding long inputs close to linear in their length.

A state covers `N = B * beam` hypotheses, utterance-major, as a dict of batch-first tensors,
so `reorder_state` (and `asr.models.interfaces.reorder_batch`) reorders it with the same flat
indices as a decoder state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from asr.models.interfaces import State, lengths_to_mask, reorder_batch

# Log-posteriors are floored here: exp(-1e4) is 0 in float64, yet cumulative sums of floored
# values stay small enough for float64 to difference them exactly.
LOG_FLOOR = -1e4

NEG_INF = float("-inf")

# Frames where phi(h) is more than this many nats below its maximum are left out of the
# prefix scores of h's extensions (exp(-40) ~ 4e-18, below float64 resolution).
WINDOW_NATS = 40.0


def log_linear_recurrence(inputs: Tensor, log_factors: Tensor) -> Tensor:
    """Solve `y_0 = 0, y_{i+1} = (y_i + u_i) * a_i` (in probabilities) for all `i` at once.

    In logs: `y_{i+1} = C_{i+1} + logsumexp_{j <= i}(u_j - C_j)` with `C_i = sum_{k < i} a_k`.

    Args:
        inputs: `(..., T)` log `u`.
        log_factors: `(..., T)` log `a`, finite.

    Returns:
        `(..., T + 1)` log `y`, `y_0 = -inf`.

    >>> u, a = torch.tensor([0.5, 0.25]).log(), torch.tensor([0.5, 0.5]).log()
    >>> log_linear_recurrence(u, a).exp().tolist()  # (0 + .5) * .5, (.25 + .25) * .5
    [0.0, 0.25, 0.25]
    """
    cumulative = F.pad(log_factors.cumsum(-1), (1, 0))  # (..., T + 1), C_0 = 0
    summed = torch.logcumsumexp(inputs - cumulative[..., :-1], dim=-1)  # (..., T)
    return F.pad(summed + cumulative[..., 1:], (1, 0), value=NEG_INF)


class CTCPrefixScorer:
    """Vectorised CTC prefix scores over utterances x beams x candidate tokens.

    Args:
        log_probs: `(B, T, V)` CTC log-posteriors (`asr.models.ctc.CTCHead` output).
        lengths: `(B,)` valid frames per utterance.
        blank: the blank id; it is never a label, so its prefix score is `-inf`.
        eos: the end-of-sentence id, whose score is the whole-sequence `log p_ctc(h | x)`;
            None scores every non-blank id as a label.
        dtype: working precision; None picks float64 (float32 on MPS).
        window: prefix scores sum the frames where `phi(h)` is within this many nats of its
            maximum; None: all frames.
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
        if dtype is None:
            dtype = torch.float32 if log_probs.device.type == "mps" else torch.float64
        self.dtype = dtype
        self.valid = lengths_to_mask(lengths, log_probs.size(1))  # (B, T)
        frames = log_probs.float().clamp(min=LOG_FLOOR)  # stored in float32, used in dtype
        frames = frames.masked_fill(~self.valid[..., None], 0.0)  # finite, never scored
        self.frames = frames.transpose(1, 2).contiguous()  # (B, V, T)
        self.lengths = lengths.to(log_probs.device)
        self.blank = blank
        self.eos = eos
        self.vocab_size = log_probs.size(2)

    def init_state(self, beam: int = 1) -> State:
        """The empty prefix for `beam` rows per utterance (rows `b * beam + k`).

        Returns:
            State: "r_nonblank", "r_blank" `(N, T + 1)` forward variables (index = frames
            consumed), "last" `(N,)` last token (-1: none), "utterance" `(N,)`.
        """
        utterance = torch.arange(self.frames.size(0), device=self.frames.device)
        utterance = utterance.repeat_interleave(beam)  # (N,)
        r_blank = F.pad(self._frames(utterance, self.blank).cumsum(-1), (1, 0))  # all blanks
        return {
            "r_nonblank": torch.full_like(r_blank, NEG_INF),
            "r_blank": r_blank,
            "last": torch.full_like(utterance, -1),
            "utterance": utterance,
        }

    def score(self, state: State, tokens: Tensor | None = None) -> Tensor:
        """Prefix scores `psi(h + c)` of candidate tokens.

        Args:
            state: N hypotheses `h`.
            tokens: `(N, C)` candidate ids per hypothesis; None scores all V ids (the work
                and memory grow as N * C * W, W the width of the scored frame window).

        Returns:
            `(N, C)` float32 log prefix probabilities; `log p_ctc(h | x)` at eos and `-inf`
            at blank.
        """
        utterance, last = state["utterance"], state["last"]
        if tokens is None:
            tokens = torch.arange(self.vocab_size, device=last.device).expand(last.size(0), -1)
        r_blank = state["r_blank"][:, :-1]  # (N, T)
        phi_other = torch.logaddexp(state["r_nonblank"][:, :-1], r_blank)  # phi for c != last
        phi_other = phi_other.masked_fill(~self.valid[utterance], NEG_INF)
        frame, inside = self._window(phi_other)  # (N, W)
        x = self.frames[utterance[:, None, None], tokens[..., None], frame[:, None]]  # (N, C, W)
        repeat = (tokens == last[:, None])[..., None]
        blank_in_window, other_in_window = r_blank.gather(1, frame), phi_other.gather(1, frame)
        phi = torch.where(repeat, blank_in_window[:, None], other_in_window[:, None])  # (N, C, W)
        terms = (phi + x.to(self.dtype)).masked_fill(~inside[:, None], NEG_INF)
        psi = terms.logsumexp(-1).float()
        if self.eos is not None:
            psi = torch.where(tokens == self.eos, self.final_score(state)[:, None], psi)
        return psi.masked_fill(tokens == self.blank, NEG_INF)

    def extend(self, state: State, tokens: Tensor) -> State:
        """The state of `h + c` for one token per hypothesis.

        Args:
            state: N hypotheses `h`.
            tokens: `(N,)` the token `c` appended to each.

        Returns:
            The state of the N extended hypotheses.
        """
        utterance = state["utterance"]
        r_nonblank, r_blank = state["r_nonblank"], state["r_blank"]
        repeat = (tokens == state["last"])[:, None]
        phi = torch.where(repeat, r_blank, torch.logaddexp(r_nonblank, r_blank))  # (N, T + 1)
        new_nonblank = log_linear_recurrence(phi[:, :-1], self._frames(utterance, tokens))
        blank = self._frames(utterance, self.blank)
        new_blank = log_linear_recurrence(new_nonblank[:, :-1], blank)
        return {**state, "r_nonblank": new_nonblank, "r_blank": new_blank, "last": tokens}

    def final_score(self, state: State) -> Tensor:
        """`(N,)` float32 `log p_ctc(h | x)` of each whole hypothesis."""
        end = self.lengths[state["utterance"]][:, None]  # (N, 1)
        last_frame = torch.logaddexp(
            state["r_nonblank"].gather(1, end), state["r_blank"].gather(1, end)
        )
        return last_frame.squeeze(1).float()

    def _window(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        """The frames to score for each row of `phi` `(N, T)`: `(N, W)` frame indices from the
        first to the last frame within `self.window` nats of the row's maximum, and whether
        each lies in that span (rows are padded to the widest; an all -inf row has none)."""
        frames = phi.size(1)
        if self.window is None:
            span = torch.arange(frames, device=phi.device).expand(phi.size(0), -1)
            return span, torch.ones_like(span, dtype=torch.bool)
        peak = phi.amax(-1, keepdim=True)
        kept = (phi >= peak - self.window) & (phi > NEG_INF)  # (N, T)
        start = kept.int().argmax(-1)  # first kept frame (0 when none)
        end = torch.where(kept.any(-1), frames - kept.flip(-1).int().argmax(-1), start)
        width = int((end - start).max()) if phi.size(0) else 0
        frame = start[:, None] + torch.arange(width, device=phi.device)  # (N, W)
        return frame.clamp(max=frames - 1), frame < end[:, None]

    def _frames(self, utterance: Tensor, tokens: Tensor | int) -> Tensor:
        """`(..., T)` log-posteriors of `tokens` in utterances `utterance` (broadcast), in
        the working precision."""
        rows = utterance * self.vocab_size + tokens  # index_select is far cheaper than indexing
        picked = self.frames.flatten(0, 1).index_select(0, rows.flatten())
        return picked.view(*rows.shape, -1).to(self.dtype)

    def reorder_state(self, state: State, index: Tensor) -> State:
        """Keep hypotheses `index` (flat row indices)."""
        return reorder_batch(state, index)


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
