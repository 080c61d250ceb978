"""Search written once for every decoder, through the step interface
(`init_state`, `step`, `reorder_state`) of `asr.models.interfaces.Decoder`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

SOS_EOS_ID = 3


@dataclass
class Hypothesis:
    """One decoded utterance."""

    tokens: list[int]  # output ids, without sos/eos
    score: float  # total log-probability, eos included
    attention: Tensor  # (K, len(tokens) + 1, T_enc) cross-attention, the eos step last


def max_output_length(enc_lens: Tensor, ratio: float, minimum: int = 1) -> Tensor:
    """Per-utterance step limit: `ceil(ratio * enc_len)`, at least `minimum`.

    >>> max_output_length(torch.tensor([10, 3]), 0.5).tolist()
    [5, 2]
    """
    return torch.clamp(torch.ceil(enc_lens.float() * ratio).long(), min=minimum)


@torch.no_grad()
def greedy_search(
    decoder: nn.Module, enc: Tensor, enc_lens: Tensor, max_len_ratio: float = 1.0
) -> list[Hypothesis]:
    """Batched greedy decoding: every utterance advances one token per step.

    Args:
        decoder: a decoder with the step interface.
        enc: `(B, T, D)` encoder output; enc_lens `(B,)`.
        max_len_ratio: at most `ceil(ratio * enc_len)` output tokens (eos included).

    Returns:
        One `Hypothesis` per utterance, in batch order.
    """
    batch = enc.size(0)
    limits = max_output_length(enc_lens, max_len_ratio)
    state = decoder.init_state(enc, enc_lens)
    prev = torch.full((batch,), SOS_EOS_ID, dtype=torch.long, device=enc.device)
    done = torch.zeros(batch, dtype=torch.bool, device=enc.device)
    scores = torch.zeros(batch, device=enc.device)
    steps: list[Tensor] = []
    attns: list[Tensor] = []
    for t in range(int(limits.max())):
        logp, state, attn = decoder.step(prev, state)
        best_logp, best = logp.float().max(dim=-1)
        best = torch.where(t + 1 >= limits, torch.full_like(best, SOS_EOS_ID), best)
        best_logp = logp.float().gather(1, best[:, None]).squeeze(1)
        scores += torch.where(done, torch.zeros_like(best_logp), best_logp)
        steps.append(torch.where(done, torch.full_like(best, SOS_EOS_ID), best))
        attns.append(attn.float())
        done |= best == SOS_EOS_ID
        prev = best
        if bool(done.all()):
            break
    return _collect(torch.stack(steps, 1), torch.stack(attns, 2), scores, enc_lens)


def _collect(ids: Tensor, attn: Tensor, scores: Tensor, enc_lens: Tensor) -> list[Hypothesis]:
    """Cut each row at its first eos. ids `(B, S)`, attn `(B, K, S, T)`."""
    hyps = []
    for b, row in enumerate(ids.tolist()):
        n = row.index(SOS_EOS_ID) if SOS_EOS_ID in row else len(row)
        att = attn[b, :, : n + 1, : int(enc_lens[b])].cpu()
        hyps.append(Hypothesis(row[:n], float(scores[b]), att))
    return hyps

