"""CTC prefix scorer: whole-sequence scores equal -CTC loss, prefix probabilities decompose
exactly over their extensions, and batching, padding and reordering change nothing."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from asr import ctc_prefix
from asr.ctc_prefix import CTCPrefixScorer, log_linear_recurrence

VOCAB, BLANK, EOS = 5, 0, 3
LENS = torch.tensor([9, 4, 6])


def log_posteriors(lens: torch.Tensor = LENS, vocab: int = VOCAB, seed: int = 0, sharp=1.0):
    """`(B, T, V)` log-softmax outputs with junk (large values) in the padded frames."""
    generator = torch.Generator().manual_seed(seed)
    logits = sharp * torch.randn(len(lens), int(lens.max()), vocab, generator=generator)
    log_probs = logits.log_softmax(-1)
    padded = torch.arange(log_probs.size(1))[None, :] >= lens[:, None]
    return log_probs.masked_fill(padded[..., None], 50.0)


def ctc_log_likelihood(log_probs, lens, sequences) -> torch.Tensor:
    """`(N,)` -ctc_loss(reduction='sum') of one sequence per utterance row (float64)."""
    width = max(1, max(len(s) for s in sequences))
    targets = torch.tensor([s + [1] * (width - len(s)) for s in sequences])  # pad: ignored
    losses = F.ctc_loss(
        log_probs.double().transpose(0, 1),
        targets,
        lens,
        torch.tensor([len(s) for s in sequences]),
        blank=BLANK,
        reduction="none",
    )
    return -losses


def extend_all(scorer: CTCPrefixScorer, sequences: list[list[int]], beam: int = 1):
    """The state of rows `b * beam + k` extended by `sequences[row]` (all of one length)."""
    state = scorer.init_state(beam)
    for step in range(len(sequences[0])):
        state = scorer.extend(state, torch.tensor([s[step] for s in sequences]))
    return state


def test_linear_recurrence_matches_the_loop() -> None:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(3, 6, generator=generator, dtype=torch.float64)
    inputs[0, :2] = float("-inf")
    factors = -torch.rand(3, 6, generator=generator, dtype=torch.float64) * 3
    expected = [torch.full((3,), float("-inf"), dtype=torch.float64)]
    for i in range(6):
        expected.append(torch.logaddexp(expected[-1], inputs[:, i]) + factors[:, i])
    torch.testing.assert_close(log_linear_recurrence(inputs, factors), torch.stack(expected, 1))


@pytest.mark.parametrize("length", [0, 1, 2, 3, 4])
def test_final_score_equals_minus_ctc_loss(length: int) -> None:
    log_probs = log_posteriors()
    scorer = CTCPrefixScorer(log_probs, LENS)
    labels = [1, 2, 4]  # eos (3) is no CTC label here
    sequences = [[labels[(row + i * i) % 3] for i in range(length)] for row in range(3)]
    sequences[0] = [4] * length  # repeats need a blank between them
    state = extend_all(scorer, sequences)
    expected = ctc_log_likelihood(log_probs, LENS, sequences)
    torch.testing.assert_close(scorer.final_score(state).double(), expected, atol=1e-4, rtol=0)
    eos_column = scorer.score(state, torch.full((3, 1), EOS))[:, 0]
    torch.testing.assert_close(eos_column, scorer.final_score(state))


def test_long_utterance_stays_exact() -> None:
    """1000 peaky frames: the closed-form recurrences must not lose precision (unwindowed: a
    random label sequence is far below the best alignment, so the windowed band drops it)."""
    lens = torch.tensor([1000])
    log_probs = log_posteriors(lens, sharp=6.0, seed=3)
    scorer = CTCPrefixScorer(log_probs, lens, window=None)
    sequence = [[1, 2, 4, 4, 2] * 4]
    state = extend_all(scorer, sequence)
    expected = ctc_log_likelihood(log_probs, lens, sequence)
    torch.testing.assert_close(scorer.final_score(state).double(), expected, atol=1e-4, rtol=1e-6)


def test_prefix_probability_decomposes_over_extensions() -> None:
    """psi(h) = p(h) + sum over non-blank c of psi(h + c), exactly; psi(empty) = 1."""
    log_probs = log_posteriors()
    scorer = CTCPrefixScorer(log_probs, LENS, eos=None)
    for prefix in [[], [2], [4, 4], [1, 2, 1]]:
        state = extend_all(scorer, [prefix] * 3)
        psi_next = scorer.score(state)  # (3, V), every id a label
        assert torch.isneginf(psi_next[:, BLANK]).all()
        total = torch.logaddexp(scorer.final_score(state), psi_next[:, 1:].logsumexp(-1))
        psi = torch.zeros(3)
        if prefix:
            psi = scorer.score(extend_all(scorer, [prefix[:-1]] * 3))[:, prefix[-1]]
        torch.testing.assert_close(total, psi, atol=1e-5, rtol=0)


def test_prefix_score_bounds_every_extension() -> None:
    log_probs = log_posteriors()
    scorer = CTCPrefixScorer(log_probs, LENS)
    labels = [1, 2, 4]
    for prefix in [[], [2], [4, 1]]:
        psi = scorer.score(extend_all(scorer, [prefix] * 3))  # (3, V)
        for c, tail in itertools.product(labels, [[], [1], [4], [2, 2]]):
            full = scorer.final_score(extend_all(scorer, [prefix + [c] + tail] * 3))
            assert (full <= psi[:, c] + 1e-5).all()


def test_candidate_scores_equal_full_vocabulary_scores() -> None:
    scorer = CTCPrefixScorer(log_posteriors(), LENS)
    state = extend_all(scorer, [[2], [4], [1]], beam=1)
    candidates = torch.tensor([[4, 3, 0], [2, 4, 1], [1, 1, 2]])
    full = scorer.score(state)
    torch.testing.assert_close(scorer.score(state, candidates), full.gather(1, candidates))
    torch.testing.assert_close(full[:, EOS], scorer.final_score(state))


def test_batched_with_beams_equals_each_utterance_alone() -> None:
    """Rows `b * beam + k` of a padded batch score as the utterance does on its own."""
    log_probs, beam = log_posteriors(), 2
    sequences = [[2, 4], [4, 4], [1, 2], [2, 2], [4, 1], [1, 1]]
    batched = CTCPrefixScorer(log_probs, LENS)
    state = extend_all(batched, sequences, beam)
    for b, n in enumerate(LENS.tolist()):
        alone = CTCPrefixScorer(log_probs[b : b + 1, :n], LENS[b : b + 1])
        rows = slice(b * beam, (b + 1) * beam)
        alone_state = extend_all(alone, sequences[rows], beam)
        torch.testing.assert_close(batched.score(state)[rows], alone.score(alone_state))
        torch.testing.assert_close(batched.final_score(state)[rows], alone.final_score(alone_state))


def test_a_prefix_scores_the_same_whatever_is_batched_with_it() -> None:
    """The windowed band is each row's own: a long prefix of peaky posteriors, whose band a
    narrow window cuts below the exact score, scores the same alone, beside other utterances
    and beside other hypotheses of its own utterance."""
    narrow = 40.0
    generator = torch.Generator().manual_seed(26)
    log_probs = (6.0 * torch.randn(3, 40, 7, generator=generator)).log_softmax(-1)
    lens = torch.tensor([40, 39, 3])
    prefix = [2, 5, 2, 5, 4] + [5] * 13

    def scores(scorer, rows, last):
        state = scorer.init_state()
        for token in prefix:
            state = scorer.extend(state, torch.full((rows,), token))
        state = scorer.extend(state, last)
        return scorer.score(state), scorer.final_score(state)

    alone = CTCPrefixScorer(log_probs[1:2, :39], lens[1:2], window=narrow)
    expected = scores(alone, 1, torch.tensor([4]))
    assert expected[1] < ctc_log_likelihood(log_probs[1:2], lens[1:2], [prefix + [4]]) - 1
    batched = scores(CTCPrefixScorer(log_probs, lens, window=narrow), 3, torch.tensor([4, 4, 4]))
    for ours, theirs in zip(batched, expected, strict=True):
        torch.testing.assert_close(ours[1:2], theirs)
    rivals = scores(
        CTCPrefixScorer(log_probs[[1, 1]], lens[[1, 1]], window=narrow), 2, torch.tensor([4, 6])
    )
    for ours, theirs in zip(rivals, expected, strict=True):
        torch.testing.assert_close(ours[:1], theirs)
    # eos made to end one hypothesis continues that one's band alone
    quiet = torch.full((40, 7), 0.1 / 6).index_fill(1, torch.tensor([BLANK]), 0.9).log()
    log_probs[0] = quiet  # mostly blank: the band of the first runs to the last frame
    scorer = CTCPrefixScorer(log_probs, lens, window=narrow)
    forced, state = torch.tensor([False, True, False]), extend_all(scorer, [[2, 5, 2]] * 3)
    assert state["end"][0] == 41 and state["end"][1] < 41
    untouched = {key: value.clone() for key, value in state.items() if torch.is_tensor(value)}
    eos = scorer.score(state, complete=forced)[:, EOS]
    for key, value in untouched.items():  # the state scored is not changed by it
        torch.testing.assert_close(state[key], value, rtol=0, atol=0)
    one = CTCPrefixScorer(log_probs[1:2, :39], lens[1:2], window=narrow)
    unforced = torch.tensor([0, 2])
    torch.testing.assert_close(eos[unforced], scorer.final_score(state)[unforced])
    torch.testing.assert_close(
        eos[1:2], one.score(extend_all(one, [[2, 5, 2]]), complete=True)[:, EOS]
    )


def test_reorder_then_score_equals_score_then_index() -> None:
    scorer = CTCPrefixScorer(log_posteriors(), LENS)
    state = extend_all(scorer, [[2, 4], [4, 1], [1, 1], [2, 2], [4, 4], [1, 2]], beam=2)
    index = torch.tensor([1, 1, 0, 3, 5, 4])
    reordered = scorer.reorder_state(state, index)
    torch.testing.assert_close(scorer.score(reordered), scorer.score(state)[index])
    extended = scorer.extend(reordered, torch.tensor([4, 2, 2, 1, 4, 4]))
    assert extended["last"].tolist() == [4, 2, 2, 1, 4, 4]
    assert extended["utterance"].tolist() == [0, 0, 0, 1, 2, 2]


def test_float32_working_precision_is_close_on_short_inputs() -> None:
    log_probs = log_posteriors()
    sequences = [[2, 4, 4], [1, 2, 1], [4, 2, 1]]
    exact = CTCPrefixScorer(log_probs, LENS)
    single = CTCPrefixScorer(log_probs, LENS, dtype=torch.float32)
    torch.testing.assert_close(
        single.final_score(extend_all(single, sequences)),
        exact.final_score(extend_all(exact, sequences)),
        atol=1e-4,
        rtol=0,
    )


def test_bad_inputs_raise() -> None:
    log_probs = log_posteriors()
    with pytest.raises(ValueError, match="log_probs must be"):
        CTCPrefixScorer(log_probs[0], LENS)
    with pytest.raises(ValueError, match="lengths must be"):
        CTCPrefixScorer(log_probs, LENS[:2])
    with pytest.raises(ValueError, match="lie in"):
        CTCPrefixScorer(log_probs, torch.tensor([9, 4, 10]))
    with pytest.raises(ValueError, match="blank id"):
        CTCPrefixScorer(log_probs, LENS, blank=VOCAB)


def peaky_utterance(
    frames: int = 600, seed: int = 5, every: int = 12
) -> tuple[torch.Tensor, torch.Tensor, list]:
    """`(1, T, V)` CTC-like posteriors: mostly blank, a label every `every` frames; and the
    labels."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, frames, VOCAB, generator=generator)
    logits[..., BLANK] += 8.0
    labels = []
    for t in range(6, frames - 6, every):
        label = [1, 2, 4][len(labels) % 3]
        logits[0, t, label] += 16.0
        labels.append(label)
    return logits.log_softmax(-1), torch.tensor([frames]), labels


def test_windowed_scores_equal_exact_scores_where_they_matter() -> None:
    """Each hypothesis along the true labels: the windowed scores never exceed the exact ones
    and equal them for every token within 20 nats of the best candidate."""
    log_probs, lens, labels = peaky_utterance()
    windowed, exact = (
        CTCPrefixScorer(log_probs, lens),
        CTCPrefixScorer(log_probs, lens, window=None),
    )
    state_w, state_e = windowed.init_state(), exact.init_state()
    for label in labels[:20] + [1, 1]:  # then two wrong labels: a hypothesis off the path
        fast, full = windowed.score(state_w), exact.score(state_e)
        assert (fast <= full + 1e-5).all()
        matters = full > full.amax(-1, keepdim=True) - 20.0
        torch.testing.assert_close(fast[matters], full[matters], atol=1e-5, rtol=1e-6)
        token = torch.tensor([label])
        state_w, state_e = windowed.extend(state_w, token), exact.extend(state_e, token)


def test_windowed_final_score_is_exact_on_the_spoken_labels() -> None:
    """Along the true labels of long peaky utterances (one padded), the banded states give
    the exact whole-sequence score; hypotheses missing their last labels score exactly where
    they are within the window's reach of the best alignment and -inf far below it."""
    first, _, labels = peaky_utterance(frames=600, seed=5)
    second, _, other = peaky_utterance(frames=400, seed=6, every=8)
    log_probs = torch.cat([first, F.pad(second, (0, 0, 0, 200), value=50.0)])
    lens = torch.tensor([600, 400])
    expected = ctc_log_likelihood(log_probs, lens, [labels, other])
    for window in (ctc_prefix.WINDOW_NATS, None):
        scorer = CTCPrefixScorer(log_probs, lens, window=window)
        score = scorer.final_score(extend_all(scorer, [labels, other])).double()
        torch.testing.assert_close(score, expected, atol=1e-4, rtol=1e-7)
    windowed, exact = (
        CTCPrefixScorer(log_probs, lens),
        CTCPrefixScorer(log_probs, lens, window=None),
    )
    dropped = []
    reach = -(ctc_prefix.WINDOW_NATS - 20)  # the best alignment's score is ~0
    for missing in range(1, 31, 3):
        short = [labels[:-missing], other[:-missing]]
        fast = windowed.final_score(extend_all(windowed, short))
        full = exact.final_score(extend_all(exact, short))
        assert (fast <= full + 1e-5).all()
        torch.testing.assert_close(fast[full > reach], full[full > reach], atol=1e-4, rtol=1e-7)
        dropped += fast.isneginf().tolist()
    assert any(dropped)
    assert windowed.init_state()["r_blank"].size(1) < 400


def test_windowed_scores_are_exact_for_hypotheses_a_search_can_choose() -> None:
    """Confident posteriors (labels 40-80 nats above the rest) and hypotheses one edit away from
    the spoken labels, as a joint search weighs them: every prefix and whole-sequence score
    above -100 nats is exact, and none exceeds the exact one."""
    checked = 0
    for seed in range(60):
        generator = torch.Generator().manual_seed(seed)
        frames, vocab, peak = 30, 12, (40.0, 60.0, 80.0)[seed % 3]
        logits = 3.0 * torch.randn(1, frames, vocab, generator=generator)
        logits[..., BLANK] += peak
        spoken = torch.randperm(frames - 2, generator=generator)[: frames // 5] + 1
        labels = torch.randint(4, vocab, (len(spoken),), generator=generator)
        logits[0, spoken, BLANK] -= peak
        logits[0, spoken, labels] += peak
        hypothesis = labels.tolist()
        k = seed % len(hypothesis)
        if seed % 3 == 0:
            hypothesis.insert(k, hypothesis[k])  # a repeat
        elif seed % 3 == 1:
            hypothesis[k] = 4 + (hypothesis[k] - 3) % (vocab - 4)  # a substitution
        else:
            del hypothesis[k]  # a deletion
        scores = []
        for window in (ctc_prefix.WINDOW_NATS, None):
            scorer = CTCPrefixScorer(logits.log_softmax(-1), torch.tensor([frames]), window=window)
            state, row = scorer.init_state(), []
            for token in hypothesis:
                row.append(scorer.score(state, torch.tensor([[token]]))[0, 0])
                state = scorer.extend(state, torch.tensor([token]))
            scores.append(torch.stack([*row, scorer.final_score(state)[0]]).double())
        fast, full = scores
        assert (fast <= full + 1e-4).all()
        torch.testing.assert_close(fast[full > -100], full[full > -100], atol=1e-4, rtol=1e-6)
        checked += int((full > -100).sum())
    assert checked > 100


def test_window_width_does_not_grow_with_the_utterance() -> None:
    """The frames scored and kept per step cover the hypothesis' alignment, not the
    utterance: after 40 labels (the 40th at frame 474) the window and the band are the same in
    a 1200- and a 2400-frame utterance."""
    windows, bands = [], []
    for frames in (1200, 2400):
        log_probs, lens, labels = peaky_utterance(frames=frames)
        scorer = CTCPrefixScorer(log_probs, lens)
        state = extend_all(scorer, [labels[:40]])
        column, inside = scorer._window(scorer._phi(state, consumable=True))
        windows.append((state["start"] + column[inside]).tolist())
        bands.append((state["start"], state["r_blank"].size(1)))
    assert windows[0] == windows[1] and bands[0] == bands[1]
    assert 474 in windows[0] and len(windows[0]) < 800 and bands[0][1] < 800
