"""Decoding a batch of waveforms with a `Seq2Seq`: search, repair, teacher forcing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import torch
from torch import Tensor, nn

from asr.guard import REPAIR_CTC_WEIGHT, ctc_greedy_length, cut_loop, failure
from asr.models.seq2seq import Seq2Seq
from asr.precision import BF16_STEP_ROWS, autocast
from asr.results import Decoded
from asr.search import (
    Hypothesis,
    LanguageModel,
    SearchOptions,
    beam_search,
    greedy_search,
    max_output_length,
)
from asr.text import BLANK_ID, PAD_ID, SOS_EOS_ID


@torch.no_grad()
def decode_batch(
    model: Seq2Seq,
    waves: Tensor,
    wave_lens: Tensor,
    options: SearchOptions,
    lm: LanguageModel | None = None,
    precision: str = "fp32",
) -> list[Decoded]:
    """Decode padded waveforms `(B, S)` with lengths `(B,)`, each as one utterance."""
    with torch.inference_mode(), autocast(waves.device, precision):
        enc, enc_lens = model.encode(waves, wave_lens)
        ctc = model.ctc(enc).float() if model.ctc is not None else None  # (B, T, V)
    search = partial(search_encoded, model.decoder, options=options, lm=lm, precision=precision)
    nbests, token_logp, eos_first = search(enc, enc_lens, ctc)
    repaired: list[str | None] = [None] * len(waves)
    if options.repair and options.ctc_weight == 0:  # joint decoding is CTC-bound already
        _repair(search, model.decoder, nbests, token_logp, repaired, (enc, enc_lens, ctc))
    no_speech = eos_first if ctc is None else empty_ctc_log_prob(ctc, enc_lens)
    return [
        Decoded(
            nbest[0],
            None if ctc is None else ctc[b, : int(enc_lens[b])].cpu(),
            int(wave_lens[b]),
            token_logp[b],
            float(no_speech[b].exp()),
            nbest[1:],
            repaired[b],
        )
        for b, nbest in enumerate(nbests)
    ]


def at_least_float32(x: Tensor) -> Tensor:
    """Half precision made float32 for the decoder's steps; a float64 model's stays float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def search_encoded(
    decoder: nn.Module,
    enc: Tensor,
    enc_lens: Tensor,
    ctc: Tensor | None,
    options: SearchOptions,
    lm: LanguageModel | None = None,
    precision: str = "fp32",
) -> tuple[list[list[Hypothesis]], list[Tensor], Tensor]:
    """The n-best lists of encoded utterances `(B, T, D)` (CTC log-probabilities `(B, T, V)`
    where `ctc_weight` > 0), the best's `token_log_probs`, and log p(eos first)."""
    # greedy_search knows the length limit only; other rules and score terms need the beam
    greedy = options.beam_size == 1 and not (
        options.ctc_weight or options.lm_weight or options.min_len_ratio
        or options.length_bonus or options.length_normalization
    )  # fmt: skip
    rows = len(enc) * (1 if greedy else options.beam_size)
    bf16_steps = precision == "bf16" and rows >= BF16_STEP_ROWS
    # Autocast reuses its bf16 weight copies across steps only outside inference mode.
    with autocast(enc.device, "bf16") if bf16_steps else torch.inference_mode():
        enc = enc if bf16_steps else at_least_float32(enc)
        if greedy:
            bound = options.max_len_ratio, options.max_len_extra
            nbests = [[h] for h in greedy_search(decoder, enc, enc_lens, *bound)]
        else:
            kept = replace(options, nbest=options.nbest or 1)  # backtrack only those kept
            nbests = beam_search(decoder, enc, enc_lens, kept, ctc, lm)
            nbests = [n or [_empty_hypothesis(decoder, int(t))] for n, t in zip(nbests, enc_lens)]
        token_logp, eos_first = token_log_probs(decoder, enc, enc_lens, [n[0] for n in nbests])
    return nbests, token_logp, eos_first


def _repair(
    search: partial,
    decoder: nn.Module,
    nbests: list[list[Hypothesis]],
    token_logp: list[Tensor],
    repaired: list[str | None],
    encoded: tuple[Tensor, Tensor, Tensor | None],
) -> None:
    """Decode again, in place, the utterances whose best hypothesis shows an attention failure."""
    enc, enc_lens, ctc = encoded
    options: SearchOptions = search.keywords["options"]
    limits = max_output_length(enc_lens, options.max_len_ratio, options.max_len_extra)
    failed = {}
    for b, nbest in enumerate(nbests):
        ctc_length = None if ctc is None else ctc_greedy_length(ctc[b, : int(enc_lens[b])])
        why = failure(nbest[0].tokens, int(limits[b]), ctc_length)
        if why is not None:
            failed[b] = why
    if not failed:
        return
    rows = torch.tensor(sorted(failed), device=enc_lens.device)
    if ctc is not None:
        # Every token is CTC-scored: a pre-beam by attention would keep the loop's.
        again = replace(options, ctc_weight=max(options.ctc_weight, REPAIR_CTC_WEIGHT))
        again = replace(again, pre_beam_ratio=None)
        fixed, fixed_logp, _ = search(enc[rows], enc_lens[rows], ctc[rows], options=again)
    else:
        cut = [_cut_loop(nbests[b][0]) for b in rows.tolist()]
        fixed_logp, _ = token_log_probs(decoder, at_least_float32(enc[rows]), enc_lens[rows], cut)
        # scored as the tokens kept, eos included: the loop's score was of tokens dropped
        fixed = [[replace(h, score=float(logp.sum()))] for h, logp in zip(cut, fixed_logp)]
    for k, b in enumerate(rows.tolist()):
        ended = math.isfinite(fixed[k][0].score)  # not the empty stand-in of no hypothesis
        if ended and fixed[k][0].tokens != nbests[b][0].tokens:
            nbests[b], token_logp[b], repaired[b] = fixed[k], fixed_logp[k], failed[b]


@torch.inference_mode()
def token_log_probs(
    decoder: nn.Module, enc: Tensor, enc_lens: Tensor, hyps: Sequence[Hypothesis]
) -> tuple[list[Tensor], Tensor]:
    """Teacher-forced log-probabilities of tokens and eos `(L_b + 1,)`, and of eos first `(B,)`."""
    token_logp, eos_first, _ = teacher_forced(decoder, enc, enc_lens, [h.tokens for h in hyps])
    return token_logp, eos_first


def teacher_forced(
    decoder: nn.Module, enc: Tensor, enc_lens: Tensor, token_lists: Sequence[Sequence[int]]
) -> tuple[list[Tensor], Tensor, Tensor]:
    """`token_log_probs` and the cross-attention `(B, K, L + 1, T)`."""
    lens = [len(tokens) for tokens in token_lists]
    ys = torch.full((len(token_lists), max(lens) + 1), PAD_ID, device=enc.device)
    ys[:, 0] = SOS_EOS_ID
    targets = torch.full_like(ys, PAD_ID)
    for b, tokens in enumerate(token_lists):
        ids = torch.tensor(list(tokens), dtype=torch.long, device=enc.device)
        ys[b, 1 : lens[b] + 1] = ids
        targets[b, : lens[b]] = ids
        targets[b, lens[b]] = SOS_EOS_ID
    logits, attention = decoder(enc, enc_lens, ys)
    logp = logits.float().log_softmax(-1)
    picked = logp.gather(2, targets[..., None]).squeeze(2).cpu()
    token_logp = [picked[b, : n + 1] for b, n in enumerate(lens)]
    return token_logp, logp[:, 0, SOS_EOS_ID].cpu(), attention


def _empty_hypothesis(decoder: nn.Module, num_frames: int) -> Hypothesis:
    """What an utterance gets when no hypothesis ended (eos step only, flat attention)."""
    attention = torch.full((decoder.num_attention_maps, 1, num_frames), 1.0 / num_frames)
    return Hypothesis([], float("-inf"), attention)


def _cut_loop(hyp: Hypothesis) -> Hypothesis:
    """`hyp` with its loop cut after the first copy (`asr.guard.cut_loop`)."""
    tokens = cut_loop(hyp.tokens)
    if len(tokens) == len(hyp.tokens):
        return hyp
    attention = torch.cat([hyp.attention[:, : len(tokens)], hyp.attention[:, -1:]], dim=1)
    return Hypothesis(tokens, hyp.score, attention)


def empty_ctc_log_prob(ctc_log_probs: Tensor, enc_lens: Tensor) -> Tensor:
    """`(B,)` the CTC log-probability of the empty transcript: blank at every valid frame."""
    blank = ctc_log_probs[..., BLANK_ID]  # (B, T)
    valid = torch.arange(blank.size(1), device=blank.device)[None, :] < enc_lens[:, None]
    return (blank * valid).sum(1).cpu()
