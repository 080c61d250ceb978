"""Greedy and beam search contracts on tiny random decoders of both families: beam 1 is greedy,
batching changes nothing, a beam as wide as the hypothesis space finds the exhaustive best
under every scoring option, CTC-only search finds the CTC best, and LM fusion takes effect."""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asr import search
from asr.models.attention import LocationAwareAttention
from asr.models.interfaces import State, lengths_to_mask, reorder_batch
from asr.models.rnn import RNNAttentionDecoder
from asr.models.transformer import TransformerDecoder
from asr.search import Hypothesis, SearchOptions, beam_search, greedy_search

ENC_DIM, VOCAB, EOS = 8, 9, 3
LENS = torch.tensor([12, 7, 4])


def make_decoder(family: str, vocab: int = VOCAB, seed: int = 0) -> nn.Module:
    """A tiny random decoder in eval mode, its output sharpened so searches disagree."""
    torch.manual_seed(seed)
    if family == "transformer":
        decoder = TransformerDecoder(
            vocab,
            ENC_DIM,
            d_model=16,
            num_heads=2,
            ffn_dim=32,
            num_layers=2,
            dropout=0.0,
            tie_embeddings=False,  # tied, a random decoder mostly repeats its input token
        )
    else:
        attention = functools.partial(
            LocationAwareAttention, attention_dim=8, conv_channels=2, conv_kernel=2
        )
        decoder = RNNAttentionDecoder(vocab, ENC_DIM, attention, embed_dim=8, hidden_size=12)
    with torch.no_grad():
        decoder.output.weight.mul_(3.0)
        decoder.output.bias[EOS] -= 1.5  # fewer empty outputs
    return decoder.eval()


def encoder_output(lens: torch.Tensor = LENS, seed: int = 0) -> torch.Tensor:
    """`(B, T, ENC_DIM)` random frames with junk in the padding."""
    generator = torch.Generator().manual_seed(seed)
    enc = torch.randn(len(lens), int(lens.max()), ENC_DIM, generator=generator)
    return torch.where(lengths_to_mask(lens)[..., None], enc, 1e3)


def ctc_posteriors(lens: torch.Tensor = LENS, vocab: int = VOCAB, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(len(lens), int(lens.max()), vocab, generator=generator)
    return logits.log_softmax(-1)


class TinyLM(nn.Module):
    """A random LSTM language model with the `search.LanguageModel` interface."""

    def __init__(self, vocab: int = VOCAB, dim: int = 8, seed: int = 2) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, dim)
        self.cell = nn.LSTMCell(dim, dim)
        self.output = nn.Linear(dim, vocab)

    def init_state(self, batch_size: int, device: torch.device) -> State:
        zeros = torch.zeros(batch_size, self.cell.hidden_size, device=device)
        return {"hidden": zeros, "cell": zeros}

    def step(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        hidden, cell = self.cell(self.embed(tokens), (state["hidden"], state["cell"]))
        return self.output(hidden).log_softmax(-1), {"hidden": hidden, "cell": cell}

    def reorder_state(self, state: State, index: torch.Tensor) -> State:
        return reorder_batch(state, index)


@torch.no_grad()
def sequence_scores(decoder, enc, enc_len, tokens, ctc_log_probs=None, lm=None):
    """Teacher-forced per-position log-probs of `tokens + [eos]`: attention `(n + 1, V)`,
    LM `(n + 1,)` and the CTC log-likelihood of `tokens`."""
    inputs = torch.tensor([[EOS] + tokens])
    logits, _ = decoder(enc[None, :enc_len], torch.tensor([enc_len]), inputs)
    attention = logits[0].log_softmax(-1)
    targets = torch.tensor(tokens + [EOS])
    lm_logp = torch.zeros(len(targets))
    if lm is not None:
        state = lm.init_state(1, enc.device)
        for i, token in enumerate(inputs[0].tolist()):
            step_logp, state = lm.step(torch.tensor([token]), state)
            lm_logp[i] = step_logp[0, targets[i]]
    ctc = torch.tensor(0.0)
    if ctc_log_probs is not None:
        ctc = -F.ctc_loss(
            ctc_log_probs[:enc_len, None].double(),
            torch.tensor([tokens or [1]]),
            torch.tensor([enc_len]),
            torch.tensor([len(tokens)]),
            reduction="sum",
        ).float()
    return attention, lm_logp, ctc


def exhaustive(decoder, enc, enc_len, options, ctc_log_probs=None, lm=None):
    """Every allowed output of `beam_search` with its score, best first."""
    limit = int(search.max_output_length(torch.tensor([enc_len]), options.max_len_ratio))
    min_len = int(enc_len * options.min_len_ratio)
    outputs = [2] + list(range(4, decoder.vocab_size))  # unk and the real tokens
    scored = []
    for n in range(limit):
        for tokens in itertools.product(outputs, repeat=n):
            att, lm_logp, ctc = sequence_scores(
                decoder, enc, enc_len, list(tokens), ctc_log_probs, lm
            )
            if n < limit - 1 and not eos_allowed(att[n], n, min_len, options.eos_threshold):
                continue
            att_sum = att.gather(1, torch.tensor(list(tokens) + [EOS])[:, None]).sum()
            score = (1 - options.ctc_weight) * att_sum + options.ctc_weight * ctc
            score = score + options.lm_weight * lm_logp.sum() + options.length_bonus * (n + 1)
            if options.length_normalization:
                score = score / (n + 1)
            scored.append((float(score), list(tokens)))
    return sorted(scored, key=lambda pair: -pair[0])


def eos_allowed(att: torch.Tensor, n: int, min_len: int, threshold: float | None) -> bool:
    if n < min_len:
        return False
    best = att[[2] + list(range(3, att.numel()))].max()
    return threshold is None or bool(att[EOS] >= threshold * best)


def assert_same_nbest(got: list[Hypothesis], expected: list[tuple[float, list[int]]]) -> None:
    assert [h.tokens for h in got] == [tokens for _, tokens in expected]
    torch.testing.assert_close(
        torch.tensor([h.score for h in got]),
        torch.tensor([s for s, _ in expected]),
        atol=1e-4,
        rtol=0,
    )


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_beam_of_one_is_greedy(family: str) -> None:
    decoder, enc = make_decoder(family), encoder_output()
    greedy = greedy_search(decoder, enc, LENS, max_len_ratio=0.8)
    beam = beam_search(decoder, enc, LENS, SearchOptions(beam_size=1, max_len_ratio=0.8))
    assert any(h.tokens for h in greedy)  # the comparison is not between empty outputs
    for one, nbest in zip(greedy, beam, strict=True):
        assert len(nbest) == 1
        assert nbest[0].tokens == one.tokens
        assert nbest[0].score == pytest.approx(one.score, abs=1e-5)
        torch.testing.assert_close(nbest[0].attention, one.attention)


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_greedy_drops_ended_rows_and_changes_nothing(family: str, monkeypatch) -> None:
    decoder, enc = make_decoder(family), encoder_output()
    rows: list[int] = []
    step = decoder.step
    monkeypatch.setattr(
        decoder, "step", lambda prev, state: rows.append(len(prev)) or step(prev, state)
    )
    compacted = greedy_search(decoder, enc, LENS)
    compacted_rows, rows[:] = rows[:], []
    monkeypatch.setattr(search, "COMPACT_FINISHED", 2.0)  # never
    full = greedy_search(decoder, enc, LENS)
    assert set(rows) == {3} and min(compacted_rows) < 3 and len(compacted_rows) == len(rows)
    for ours, theirs in zip(compacted, full, strict=True):
        assert ours.tokens == theirs.tokens
        assert ours.score == pytest.approx(theirs.score, abs=1e-5)
        torch.testing.assert_close(ours.attention, theirs.attention)


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_beam_search_drops_ended_utterances_and_changes_nothing(family: str, monkeypatch) -> None:
    decoder, enc, ctc, lm = make_decoder(family), encoder_output(), ctc_posteriors(), TinyLM()
    options = SearchOptions(beam_size=3, ctc_weight=0.3, lm_weight=0.4, max_len_ratio=0.9)
    rows: list[int] = []
    step = decoder.step
    monkeypatch.setattr(
        decoder, "step", lambda prev, state: rows.append(len(prev)) or step(prev, state)
    )
    compacted = beam_search(decoder, enc, LENS, options, ctc, lm)
    compacted_rows, rows[:] = rows[:], []
    monkeypatch.setattr(search, "COMPACT_FINISHED", 2.0)  # never
    full = beam_search(decoder, enc, LENS, options, ctc, lm)
    assert set(rows) == {9} and set(compacted_rows) == {9, 6, 3}
    for ours, theirs in zip(compacted, full, strict=True):
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-5)
        for mine, want in zip(ours, theirs, strict=True):
            torch.testing.assert_close(mine.attention, want.attention)


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_batched_search_equals_one_utterance_at_a_time(family: str, monkeypatch) -> None:
    monkeypatch.setattr(search, "FEWEST_PRE_BEAM", 1)  # a pre-beam of this tiny vocabulary
    decoder, enc, ctc, lm = make_decoder(family), encoder_output(), ctc_posteriors(), TinyLM()
    options = SearchOptions(beam_size=3, ctc_weight=0.3, lm_weight=0.4, max_len_ratio=0.9)
    assert options.pre_beam_size(VOCAB) == 4  # CTC sees a pre-beam, not every token
    batched = beam_search(decoder, enc, LENS, options, ctc, lm)
    for b, n in enumerate(LENS.tolist()):
        alone = beam_search(
            decoder, enc[b : b + 1, :n], LENS[b : b + 1], options, ctc[b : b + 1, :n], lm
        )[0]
        assert [h.tokens for h in batched[b]] == [h.tokens for h in alone]
        for ours, theirs in zip(batched[b], alone, strict=True):
            assert ours.score == pytest.approx(theirs.score, abs=1e-4)
            torch.testing.assert_close(ours.attention, theirs.attention, atol=1e-4, rtol=0)


def test_batched_search_with_ctc_equals_alone_where_the_length_limit_ends_hypotheses() -> None:
    """Peaky CTC posteriors and hypotheses made to end at the length limit: the windowed CTC
    bands and the forced ends are each hypothesis' own, so batching changes nothing."""
    lens = torch.tensor([17, 35, 35])
    decoder, enc = make_decoder("transformer", vocab=9, seed=55), encoder_output(lens, seed=55)
    generator = torch.Generator().manual_seed(55)
    ctc = (12.0 * torch.randn(3, 35, 9, generator=generator)).log_softmax(-1)
    options = SearchOptions(
        beam_size=5, nbest=2, ctc_weight=0.3, length_normalization=True, max_len_ratio=0.3
    )
    batched = beam_search(decoder, enc, lens, options, ctc)
    for b, n in enumerate(lens.tolist()):
        alone = beam_search(
            decoder, enc[b : b + 1, :n], lens[b : b + 1], options, ctc[b : b + 1, :n]
        )
        assert [h.tokens for h in batched[b]] == [h.tokens for h in alone[0]], b
        for ours, theirs in zip(batched[b], alone[0], strict=True):
            assert ours.score == pytest.approx(theirs.score, abs=1e-5)


EXHAUSTIVE_OPTIONS = {
    "attention": dict(),
    "ctc": dict(ctc_weight=0.4),
    "ctc only": dict(ctc_weight=1.0),
    "ctc+lm+bonus": dict(ctc_weight=0.4, lm_weight=0.5, length_bonus=0.3),
    "lm+normalised": dict(lm_weight=0.7, length_normalization=True),
    "min length+eos threshold": dict(min_len_ratio=0.2, eos_threshold=1.2, length_bonus=-0.2),
}


@pytest.mark.parametrize("family", ["transformer", "rnn"])
@pytest.mark.parametrize("case", EXHAUSTIVE_OPTIONS)
def test_wide_beam_finds_the_exhaustive_nbest(family: str, case: str) -> None:
    """Vocabulary: specials + 3 tokens; at most 2 tokens + eos: 21 outputs, beam 21."""
    lens = torch.tensor([6, 4])  # step limits 3 and 2
    decoder, enc = make_decoder(family, vocab=7), encoder_output(lens)
    ctc, lm = ctc_posteriors(lens, vocab=7), TinyLM(vocab=7)
    options = SearchOptions(beam_size=21, max_len_ratio=0.5, **EXHAUSTIVE_OPTIONS[case])
    found = beam_search(decoder, enc, lens, options, ctc, lm)
    for b, n in enumerate(lens.tolist()):
        use_lm = lm if options.lm_weight else None
        use_ctc = ctc[b] if options.ctc_weight else None
        expected = exhaustive(decoder, enc[b], n, options, use_ctc, use_lm)
        assert_same_nbest(found[b], expected)


def test_hypotheses_carry_their_attention() -> None:
    decoder, enc = make_decoder("transformer"), encoder_output()
    for b, nbest in enumerate(beam_search(decoder, enc, LENS, SearchOptions(beam_size=3))):
        assert len(nbest) == 3
        assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
        for hyp in nbest:
            assert hyp.attention.shape == (4, len(hyp.tokens) + 1, int(LENS[b]))
            torch.testing.assert_close(hyp.attention.sum(-1), torch.ones(4, len(hyp.tokens) + 1))
            tokens = torch.tensor([[EOS] + hyp.tokens])
            _, teacher = decoder(enc[b : b + 1, : LENS[b]], LENS[b : b + 1], tokens)
            torch.testing.assert_close(hyp.attention, teacher[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("nbest", [1, 2])
def test_nbest_returns_the_head_of_the_full_nbest(nbest: int) -> None:
    decoder, enc, ctc = make_decoder("transformer"), encoder_output(), ctc_posteriors()
    options = SearchOptions(beam_size=3, ctc_weight=0.3)
    full = beam_search(decoder, enc, LENS, options, ctc)
    head = beam_search(decoder, enc, LENS, replace(options, nbest=nbest), ctc)
    for ours, theirs in zip(head, full, strict=True):
        assert len(ours) == nbest
        for mine, want in zip(ours, theirs[:nbest], strict=True):
            assert (mine.tokens, mine.score) == (want.tokens, want.score)
            assert torch.equal(mine.attention, want.attention)


def test_pruning_by_ended_hypotheses_saves_steps_and_changes_nothing(monkeypatch) -> None:
    decoder, enc, lm = make_decoder("transformer"), encoder_output(), TinyLM()
    steps = []
    step = decoder.step
    monkeypatch.setattr(decoder, "step", lambda *args: steps.append(1) or step(*args))
    options = SearchOptions(beam_size=3, lm_weight=0.3, max_len_ratio=3.0)  # no CTC length cap
    pruned = beam_search(decoder, enc, LENS, options, lm=lm)
    pruned_steps = len(steps)
    monkeypatch.setattr(search, "_can_prune", lambda options: False)
    full = beam_search(decoder, enc, LENS, options, lm=lm)
    assert pruned_steps < len(steps) - pruned_steps == 3 * int(LENS.max())
    for ours, theirs in zip(pruned, full, strict=True):
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-5)


def test_ctc_only_search_returns_the_ctc_best() -> None:
    """Peaky CTC frames spell 4 5 5 6; the attention decoder alone says otherwise."""
    lens = torch.tensor([10])
    decoder, enc = make_decoder("transformer", vocab=7), encoder_output(lens)
    path = [0, 4, 4, 0, 5, 0, 5, 5, 6, 0]  # blank between the repeated 5s
    ctc = torch.full((1, 10, 7), -6.0)
    ctc[0, torch.arange(10), torch.tensor(path)] = -0.05
    ctc = ctc.log_softmax(-1)
    best = beam_search(decoder, enc, lens, SearchOptions(beam_size=3, ctc_weight=1.0), ctc)[0][0]
    assert greedy_search(decoder, enc, lens)[0].tokens != [4, 5, 5, 6]
    assert best.tokens == [4, 5, 5, 6]
    _, _, expected = sequence_scores(decoder, enc[0], 10, [4, 5, 5, 6], ctc[0])
    assert best.score == pytest.approx(float(expected), abs=1e-4)


def test_lm_fusion_changes_the_result() -> None:
    """An LM sure that every sentence ends now turns a non-empty output into the empty one."""
    decoder, enc, lm = make_decoder("transformer"), encoder_output(), TinyLM()
    with torch.no_grad():
        lm.output.bias[EOS] += 20.0
    plain = beam_search(decoder, enc, LENS, SearchOptions(beam_size=2))
    fused = beam_search(decoder, enc, LENS, SearchOptions(beam_size=2, lm_weight=1.0), lm=lm)
    assert all(nbest[0].tokens for nbest in plain)
    assert all(nbest[0].tokens == [] for nbest in fused)


def test_greedy_never_emits_blank_or_pad() -> None:
    decoder, enc = make_decoder("rnn"), encoder_output()
    with torch.no_grad():
        decoder.output.bias[:2] += 50.0  # blank and pad would win every step
    for hyp in greedy_search(decoder, enc, LENS):
        assert not {0, 1} & set(hyp.tokens)
        assert hyp.attention.size(1) == len(hyp.tokens) + 1


@pytest.mark.parametrize(
    "field, value",
    [
        ("beam_size", 0),
        ("ctc_weight", 1.5),
        ("lm_weight", -0.1),
        ("max_len_ratio", 0.0),
        ("min_len_ratio", -1.0),
        ("min_len_ratio", 1.5),  # above the bound (1.0): no hypothesis could end
        ("eos_threshold", 0.5),
        ("pre_beam_ratio", 0.5),
        ("nbest", 0),
        ("nbest", 11),  # more than the beam (10)
        ("beam_size", 2.5),  # a count
        ("nbest", True),
        ("length_bonus", float("nan")),  # inf and nan scored every hypothesis -inf: text ""
        ("lm_weight", float("inf")),
        ("lm_weight", 1000.0),  # 1e38 overflowed float32 scores to -inf: text ""
        ("max_len_ratio", float("inf")),
        ("length_bonus", float("-inf")),
        ("length_normalization", "false"),  # any string was taken as True
        ("repair", "no"),
        ("repair", None),
        ("ctc_weight", None),  # a TypeError naming no field
        ("ctc_weight", "0.3"),
        ("min_len_ratio", True),
    ],
)
def test_bad_options_raise(field: str, value: float) -> None:
    """The message names the field, its rule and the value given (not the whole options)."""
    with pytest.raises(ValueError, match=rf"^SearchOptions: {field} must .*, got {value!r}$"):
        SearchOptions(**{field: value})


def test_numpy_numbers_are_kept_as_pythons(tmp_path) -> None:
    """A sweep's np.linspace value passed the checks and stayed numpy's: metrics.json failed
    to write after a whole decode, and `asr finalize` stored it in a checkpoint that the
    weights-only loader then refused."""
    import json
    from dataclasses import asdict

    import numpy as np

    options = SearchOptions(beam_size=np.int64(4), nbest=np.int32(2), ctc_weight=np.float64(0.4),
                            lm_weight=np.float32(0.5), eos_threshold=np.float16(1.5))  # fmt: skip
    fields = asdict(options)
    assert {type(fields[k]) for k in ("beam_size", "nbest")} == {int}
    assert {type(fields[k]) for k in ("ctc_weight", "lm_weight", "eos_threshold")} == {float}
    json.dumps(fields)
    torch.save(fields, tmp_path / "s.pt")
    assert torch.load(tmp_path / "s.pt", weights_only=True) == fields
    assert type(SearchOptions(beam_size=3, ctc_weight=0).ctc_weight) is int  # as given


def test_missing_or_mismatched_scorers_raise() -> None:
    decoder, enc = make_decoder("transformer"), encoder_output()
    with pytest.raises(ValueError, match="no ctc_log_probs"):
        beam_search(decoder, enc, LENS, SearchOptions(ctc_weight=0.5))
    with pytest.raises(ValueError, match="ctc_log_probs must be"):
        beam_search(decoder, enc, LENS, SearchOptions(ctc_weight=0.5), ctc_posteriors(vocab=5))
    with pytest.raises(ValueError, match="no lm"):
        beam_search(decoder, enc, LENS, SearchOptions(lm_weight=0.5))
    with pytest.raises(ValueError, match="lm log-probs"):
        beam_search(decoder, enc, LENS, SearchOptions(lm_weight=0.5), lm=TinyLM(vocab=5))
    with pytest.raises(ValueError, match="enc must be"):
        beam_search(decoder, enc, LENS[:2])


def test_empty_batch_gives_no_hypotheses() -> None:
    decoder = make_decoder("rnn")
    assert beam_search(decoder, torch.zeros(0, 5, ENC_DIM), torch.zeros(0, dtype=torch.long)) == []


@pytest.mark.parametrize("beam", [1, 2])
def test_every_utterance_ends_under_ctc_when_attention_ranks_eos_low(
    beam: int, monkeypatch
) -> None:
    """CTC scores the pre-beam by attention only; eos is scored with it always, or an
    attention decoder that ranks eos low leaves the utterance with no ended hypothesis."""
    monkeypatch.setattr(search, "FEWEST_PRE_BEAM", 1)  # a pre-beam of this tiny vocabulary
    lens = torch.tensor([12, 7, 4])
    decoder, enc = make_decoder("transformer", vocab=14), encoder_output(lens)
    with torch.no_grad():
        decoder.output.bias[EOS] -= 30.0  # eos last by attention at every step
    ctc = ctc_posteriors(lens, vocab=14)
    options = SearchOptions(beam_size=beam, ctc_weight=0.5, max_len_ratio=3.0)
    assert options.pre_beam_size(14) is not None, "the pre-beam must be on for this test"
    for b, nbest in enumerate(beam_search(decoder, enc, lens, options, ctc)):
        assert nbest and all(h.score > -1e30 for h in nbest)
        att, _, joint_ctc = sequence_scores(decoder, enc[b], int(lens[b]), nbest[0].tokens, ctc[b])
        targets = torch.tensor([*nbest[0].tokens, EOS])[:, None]
        expected = 0.5 * att.gather(1, targets).sum() + 0.5 * joint_ctc
        assert nbest[0].score == pytest.approx(float(expected), abs=1e-3)


def test_a_hypothesis_made_to_end_at_the_length_limit_keeps_its_ctc_score() -> None:
    """At the limit eos is forced; its CTC score continues the prefix's trimmed band to the
    last frame (a lower bound of the exact score) instead of -inf, which ended nothing."""
    lens = torch.tensor([60, 45])
    decoder, enc, ctc = make_decoder("rnn"), encoder_output(lens), ctc_posteriors(lens)
    with torch.no_grad():
        decoder.output.bias[EOS] -= 30.0  # nothing ends before the limit
    options = SearchOptions(beam_size=3, ctc_weight=0.3, max_len_ratio=0.05)  # 2-3 tokens + eos
    for b, nbest in enumerate(beam_search(decoder, enc, lens, options, ctc)):
        assert nbest, "the cut-off hypotheses are returned"
        best = nbest[0]
        assert len(best.tokens) == int(search.max_output_length(lens[b : b + 1], 0.05)) - 1
        att, _, joint_ctc = sequence_scores(decoder, enc[b], int(lens[b]), best.tokens, ctc[b])
        targets = torch.tensor([*best.tokens, EOS])[:, None]
        expected = float(0.7 * att.gather(1, targets).sum() + 0.3 * joint_ctc)
        assert expected - 0.3 * 10 < best.score <= expected + 1e-3


def test_hypotheses_made_to_end_at_the_limit_are_listed_once() -> None:
    """At a forced step every score but eos is -inf, and the pre-beam's ties could take eos
    besides the eos always added: each ended hypothesis was listed twice."""
    lens, vocab = torch.tensor([60, 45]), 1000
    decoder, enc = make_decoder("rnn", vocab=vocab), encoder_output(lens)
    with torch.no_grad():
        decoder.output.bias[EOS] -= 30.0  # nothing ends before the limit
    options = SearchOptions(beam_size=10, ctc_weight=0.3, max_len_ratio=0.05)
    for nbest in beam_search(decoder, enc, lens, options, ctc_posteriors(lens, vocab=vocab)):
        assert len(nbest) == 10 and len({tuple(h.tokens) for h in nbest}) == 10


def test_a_language_model_of_other_pieces_is_refused_though_as_many() -> None:
    """`asr.load_lm` gives the model its vocabulary: one of the same size from a tokenizer of
    other pieces (lower case) was fused without a word through the Python API."""
    lm = nn.Module()
    lm.vocab_size, lm.vocabulary = 3, ("<pad>", "a", "b")
    lm.init_state = lm.step = lm.reorder_state = None  # what a search calls
    lm.eval()
    search.check_language_model(0.3, lm, 3, ("<pad>", "a", "b"))
    with pytest.raises(ValueError, match=r"vocabulary differs .*\(id 1: 'a' for 'A'\)"):
        search.check_language_model(0.3, lm, 3, ("<pad>", "A", "b"))
    with pytest.raises(ValueError, match=r"\(3 pieces for 4\)"):
        search.check_language_model(0.3, lm, None, ("<pad>", "a", "b", "c"))
    del lm.vocabulary  # a module of one's own: its size alone is known
    search.check_language_model(0.3, lm, 3, ("<pad>", "A", "b"))


def test_an_eos_threshold_under_ctc_leaves_every_utterance_a_hypothesis() -> None:
    """With eos ranked low by attention, the eos threshold kept eos back while the beam used
    up the frames CTC allows: every continuation -inf, nothing ended, and each utterance came
    back empty. Where nothing can go on, eos is let through; the result is the search's
    without the threshold."""
    lens = torch.tensor([12, 7, 4])
    decoder, enc = make_decoder("transformer", vocab=14), encoder_output(lens)
    with torch.no_grad():
        decoder.output.bias[EOS] -= 30.0
    ctc = ctc_posteriors(lens, vocab=14)
    plain = SearchOptions(beam_size=4, ctc_weight=0.5, max_len_ratio=3.0)
    for options in (replace(plain, eos_threshold=1.5),
                    replace(plain, eos_threshold=1.5, pre_beam_ratio=None)):  # fmt: skip
        held = beam_search(decoder, enc, lens, options, ctc)
        free = beam_search(decoder, enc, lens, replace(options, eos_threshold=None), ctc)
        assert [[h.tokens for h in n] for n in held] == [[h.tokens for h in n] for n in free]
        assert all(n and all(h.score > -1e30 for h in n) for n in held)
