import itertools
import random

import numpy as np
import pytest
import torch
from scipy import ndimage

from asr.models.transformer import TransformerDecoder
from asr.plotting import plot_attention, plot_attention_grid, save_figure
from asr.search import greedy_search
from asr.text import CharTokenizer, SentencePieceTokenizer
from asr.timing import (
    TokenTimes,
    Word,
    attention_matrix,
    attention_timestamps,
    boundary_error_ms,
    ctc_forced_alignment,
    ctc_token_probabilities,
    dtw,
    encoder_frame_seconds,
    median_filter,
    word_timestamps,
)

SPACE = "\u2581"
SPF = 0.04  # 10 ms frames, x4 subsampling


def _block_attention(
    bounds: list[int], num_maps: int = 1, blur: float = 0.0, noise: float = 0.0, seed: int = 0
) -> torch.Tensor:
    """`(K, L, T)` softmax-like maps where token i attends to frames `[bounds[i], bounds[i+1])`,
    optionally blurred along time (Gaussian, in frames) and with uniform noise added."""
    gen = torch.Generator().manual_seed(seed)
    num_tokens, num_frames = len(bounds) - 1, bounds[-1]
    att = torch.full((num_maps, num_tokens, num_frames), 1e-3)
    for i in range(num_tokens):
        att[:, i, bounds[i] : bounds[i + 1]] = 1.0
    if blur:
        att = torch.from_numpy(ndimage.gaussian_filter1d(att.numpy(), blur, axis=-1))
    att = att + noise * torch.rand(att.shape, generator=gen)
    return att / att.sum(-1, keepdim=True)


def _brute_force_dtw_cost(cost: np.ndarray) -> float:
    """Textbook O(L T) dynamic programme with Python loops."""
    num_tokens, num_frames = cost.shape
    acc = np.full((num_tokens + 1, num_frames + 1), np.inf)
    acc[0, 0] = 0.0
    for i in range(1, num_tokens + 1):
        for j in range(1, num_frames + 1):
            best = min(acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1])
            acc[i, j] = cost[i - 1, j - 1] + best
    return float(acc[-1, -1])


# --------------------------------------------------------------------------- frame times


def test_encoder_frame_seconds():
    assert encoder_frame_seconds(0.01, 4) == pytest.approx(0.04)
    assert encoder_frame_seconds(0.01, [1, 2, 2, 1]) == pytest.approx(0.04)
    assert encoder_frame_seconds(0.02) == pytest.approx(0.02)
    for frame_shift, factors in [(0.0, 4), (0.01, 0), (0.01, [])]:
        with pytest.raises(ValueError, match="encoder_frame_seconds"):
            encoder_frame_seconds(frame_shift, factors)


def test_token_times_checks_and_slices():
    times = TokenTimes((0, 2, 2), (2, 2, 5), 5, 0.5)
    np.testing.assert_allclose(times.start, [0.0, 1.0, 1.0])
    np.testing.assert_allclose(times.end, [1.0, 1.0, 2.5])
    assert times.duration == 2.5
    head = times[:2]
    assert (head.start_frames, head.end_frames, head.num_frames) == ((0, 2), (2, 2), 5)
    bad = [((0, 3), (4, 3)), ((2,), (1,)), ((1, 0), (2, 2)), ((0,), (6,)), ((0, 1), (2,))]
    for starts, ends in bad:  # ends decrease, end < start, starts decrease, past T, unequal
        with pytest.raises(ValueError, match="TokenTimes"):
            TokenTimes(starts, ends, 5, 0.5)
    with pytest.raises(ValueError, match="TokenTimes"):
        times[::-1]


# --------------------------------------------------------------------------- DTW


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (6, 1), (5, 9), (9, 5), (12, 12)])
@pytest.mark.parametrize("seed", range(3))
def test_dtw_path_is_monotone_covers_all_and_optimal(shape, seed):
    cost = np.random.default_rng(seed).normal(size=shape)
    tokens, frames = dtw(cost)
    assert (tokens[0], frames[0]) == (0, 0)
    assert (tokens[-1], frames[-1]) == (shape[0] - 1, shape[1] - 1)
    steps = set(zip(np.diff(tokens).tolist(), np.diff(frames).tolist(), strict=True))
    assert steps <= {(1, 1), (1, 0), (0, 1)}
    assert set(tokens.tolist()) == set(range(shape[0]))
    assert set(frames.tolist()) == set(range(shape[1]))
    path_cost = cost[tokens, frames].sum()
    assert path_cost == pytest.approx(_brute_force_dtw_cost(cost), abs=1e-9)


def test_dtw_follows_a_cheap_staircase():
    cost = np.ones((3, 6))
    cost[0, :2] = cost[1, 2:5] = cost[2, 5] = 0.0
    tokens, frames = dtw(cost)
    assert tokens.tolist() == [0, 0, 1, 1, 1, 2]
    assert frames.tolist() == [0, 1, 2, 3, 4, 5]


def test_dtw_rejects_bad_input():
    for cost in [np.zeros((0, 3)), np.zeros(4), np.array([[0.0, np.nan]])]:
        with pytest.raises(ValueError, match="dtw"):
            dtw(cost)


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("width", [1, 3, 5, 7])
def test_median_filter_equals_scipy(width):
    x = torch.randn(3, 4, 20)
    expected = ndimage.median_filter(x.numpy(), size=(1, 1, width), mode="nearest")
    torch.testing.assert_close(median_filter(x, width), torch.from_numpy(expected))


def test_median_filter_width_must_be_odd():
    for width in (0, 2, -1):
        with pytest.raises(ValueError, match="odd"):
            median_filter(torch.zeros(1, 5), width)


def test_attention_matrix_is_the_selected_maps_averaged():
    att = torch.rand(3, 5, 11)
    torch.testing.assert_close(attention_matrix(att), att.mean(0))
    torch.testing.assert_close(attention_matrix(att, heads=[2]), att[2])
    torch.testing.assert_close(
        attention_matrix(att, median_filter_width=3), median_filter(att.mean(0), 3)
    )


BOUNDS = [0, 6, 13, 15, 27, 31, 44, 52]


def test_block_attention_gives_the_known_boundaries():
    times = attention_timestamps(_block_attention(BOUNDS, num_maps=2), SPF)
    assert list(times.start_frames) == BOUNDS[:-1]
    assert list(times.end_frames) == BOUNDS[1:]
    np.testing.assert_allclose(times.start, np.array(BOUNDS[:-1]) * SPF)
    assert times.duration == pytest.approx(BOUNDS[-1] * SPF)


@pytest.mark.parametrize("blur", [1.0, 3.0])
@pytest.mark.parametrize("seed", range(3))
def test_blurred_noisy_attention_is_within_a_frame(seed, blur):
    # Blocks of similar width: blurring a short block next to a long one moves the frames'
    # owner (each token's weights sum to one), so their boundary is not "known" any more.
    bounds = [0, 6, 12, 17, 23, 29, 34, 40]
    att = _block_attention(bounds, num_maps=4, blur=blur, noise=0.05, seed=seed)
    times = attention_timestamps(att, SPF)
    error = np.abs(np.array(times.start_frames) - np.array(bounds[:-1]))
    assert error.max() <= 1


def test_head_selection_ignores_unaligned_heads():
    aligned = _block_attention(BOUNDS, num_maps=2)
    diffuse = torch.rand(6, *aligned.shape[1:], generator=torch.Generator().manual_seed(0))
    att = torch.cat([diffuse[:3], aligned, diffuse[3:]])  # heads 3 and 4 are aligned
    times = attention_timestamps(att, SPF, heads=[3, 4])
    assert list(times.start_frames) == BOUNDS[:-1]
    assert times == attention_timestamps(aligned, SPF)


def test_words_in_silence_with_weak_rows_keep_the_sharp_rows_times():
    """Speech in frames 30-90 of 120, silence around it; the tokens of frames 40-62 attend
    weakly (a low peak on their frames and the rest spread over the whole speech), as an RNN
    decoder's attention does on the later letters of a word. The sharp tokens' spans must be
    their frames exactly: neither the silence nor the weak rows may drag them."""
    bounds = [30, 40, 48, 55, 62, 75, 82, 90]
    att = torch.full((1, len(bounds) - 1, 120), 1e-4)
    weak = (1, 2, 3)
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        att[0, i, start:end] += 0.02 if i in weak else 1.0
        if i in weak:
            att[0, i, 30:90] += 0.01
    times = attention_timestamps(att / att.sum(-1, keepdim=True), SPF)
    sharp = [i for i in range(len(bounds) - 1) if i not in weak]
    assert [times.start_frames[i] for i in sharp] == [bounds[i] for i in sharp]
    assert [times.end_frames[i] for i in sharp] == [bounds[i + 1] for i in sharp]


def test_a_first_token_not_heard_at_frame_0_does_not_start_the_pause_before_it():
    """Silence in frames 0-9; the second token's row draws the path through it (a glance at
    frame 10, its frames 22-27), the first's peak lies later, where no monotone path goes. The
    path starts at frame 0 whatever: the first token's only frame was that one, the first word
    starting in the pause (it did not move when silence was added before it)."""
    att = torch.full((1, 3, 60), 1e-4)
    att[0, 0, 20:22], att[0, 0, 30:32] = 0.2, 1.0
    att[0, 1, 10], att[0, 1, 22:28] = 0.6, 0.5
    att[0, 2, 40:50] = 1.0
    times = attention_timestamps(att, SPF)
    assert times.start_frames[:2] == (9, 10) and times.end_frames[:2] == (10, 28)
    # a first token whose run is longer keeps the frame it is heard at, however weak there
    att = torch.full((1, 3, 50), 1e-4)
    att[0, 0, 3], att[0, 0, 40] = 0.3, 1.0
    att[0, 1, 5:16], att[0, 2, 20:31] = 1.0, 1.0
    times = attention_timestamps(att, SPF)
    assert times.start_frames == (3, 5, 20) and times.end_frames == (4, 16, 31)


@pytest.mark.parametrize(
    "shape", [(1, 1, 1), (2, 1, 9), (3, 8, 40), (4, 30, 12), (1, 25, 25), (8, 17, 200)]
)
def test_random_attention_gives_monotone_disjoint_times(shape):
    att = torch.rand(shape, generator=torch.Generator().manual_seed(sum(shape))).softmax(-1)
    times = attention_timestamps(att, SPF)
    duration = shape[-1] * SPF
    assert len(times) == shape[1]
    assert np.all(np.diff(times.start) >= 0) and np.all(np.diff(times.end) >= 0)
    assert np.all(times.start >= 0) and np.all(times.end <= duration + 1e-12)
    assert np.all(times.start <= times.end)
    assert np.all(times.start[1:] >= times.end[:-1]), "a token's span ends before the next's"
    starts, ends = np.array(times.start_frames), np.array(times.end_frames)
    following = np.append(starts[1:], shape[-1])
    assert np.all((ends > starts) | (starts == following)), "no free frame left unused"


@pytest.mark.parametrize(
    ("runs", "spans"),
    [  # (start, end) of each token's DTW run -> its span
        ([(0, 5), (4, 5), (7, 10)], [(0, 5), (5, 6), (7, 10)]),  # takes the free frame after
        ([(0, 5), (4, 5), (5, 10)], [(0, 4), (4, 5), (5, 10)]),  # or the last of the one before
        ([(0, 1), (0, 1), (1, 3)], [(0, 1), (1, 2), (2, 3)]),  # or the first of the one after
        # several on one frame push on into the first with frames to spare
        (
            [(2, 3), (2, 3), (2, 3), (2, 3), (2, 8), (8, 10)],
            [(2, 3), (3, 4), (4, 5), (5, 6), (6, 8), (8, 10)],
        ),  # fmt: skip
        ([(0, 8), (8, 9), (8, 9), (9, 10)], [(0, 7), (7, 8), (8, 9), (9, 10)]),  # or back
        ([(0, 1), (0, 1), (0, 1)], [(0, 1), (1, 2), (2, 3)]),
        # or back into the one before, where that moves fewer: not the tokens after
        (
            [(0, 10), (9, 10), (9, 10), (9, 10), (9, 10), (10, 11), (11, 12), (13, 30)],
            [(0, 6), (6, 7), (7, 8), (8, 9), (9, 10), (10, 11), (11, 12), (13, 30)],
        ),  # fmt: skip
    ],
)
def test_a_token_whose_frames_went_to_the_one_before_gets_one(runs, spans):
    """Where a token's run lies within the one before, it is pushed past it: it then takes a
    free frame, else one from the token before if that has more, else tokens move on (or back
    from the last frame) into those with frames to spare."""
    from asr.timing import _half_peak_spans

    starts, ends = zip(*runs)
    frames = max(10, *ends)
    got = _half_peak_spans(np.ones((len(runs), frames)), np.array(starts), np.array(ends))
    assert list(zip(*got)) == spans


def test_two_dimensional_attention_is_one_map():
    att = _block_attention(BOUNDS)
    assert attention_timestamps(att[0], SPF) == attention_timestamps(att, SPF)


def test_attention_timestamps_rejects_bad_input():
    att = torch.rand(2, 3, 10)
    with pytest.raises(ValueError, match="heads"):
        attention_timestamps(att, SPF, heads=[2])
    with pytest.raises(ValueError, match="heads"):
        attention_timestamps(att, SPF, heads=[])
    with pytest.raises(ValueError, match="seconds_per_frame"):
        attention_timestamps(att, 0.0)
    with pytest.raises(ValueError, match=r"\(K, L, T\)"):
        attention_timestamps(torch.rand(2, 0, 10), SPF)
    with pytest.raises(ValueError, match="finite"):
        attention_timestamps(torch.full((1, 2, 3), float("nan")), SPF)


def test_decoded_transformer_attention_aligns_and_plots(tmp_path):
    torch.manual_seed(0)
    decoder = TransformerDecoder(
        vocab_size=12, encoder_dim=16, d_model=16, num_heads=4, ffn_dim=32, num_layers=2
    ).eval()
    enc, enc_lens = torch.randn(2, 30, 16), torch.tensor([30, 21])
    for hyp, frames in zip(greedy_search(decoder, enc, enc_lens, 0.3), (30, 21), strict=True):
        assert hyp.attention.shape == (8, len(hyp.tokens) + 1, frames)
        times = attention_timestamps(hyp.attention, SPF)
        assert len(times) == len(hyp.tokens) + 1 and times.end[-1] == pytest.approx(frames * SPF)
    labels = [str(t) for t in hyp.tokens] + ["<eos>"]
    save_figure(plot_attention_grid(hyp.attention, 2, labels, SPF), str(tmp_path / "grid.png"))
    assert (tmp_path / "grid.png").stat().st_size > 10_000


# --------------------------------------------------------------------------- CTC


def _spiky_log_probs(spans: list[tuple[int, int, int]], num_frames: int, vocab: int = 8):
    """`(T, V)` log-probs: blank everywhere except token `k` on frames `[start, end)`."""
    logits = torch.zeros(num_frames, vocab)
    logits[:, 0] = 8.0
    for token, start, end in spans:
        logits[start:end, 0] = 0.0
        logits[start:end, token] = 8.0
    return logits.log_softmax(-1)


def test_ctc_forced_alignment_finds_the_spikes():
    spans = [(4, 3, 5), (6, 8, 9), (6, 12, 13), (5, 13, 16), (7, 19, 20)]
    log_probs = _spiky_log_probs(spans, num_frames=24)
    times = ctc_forced_alignment(log_probs, [4, 6, 6, 5, 7], SPF)
    assert list(times.start_frames) == [start for _, start, _ in spans]
    assert list(times.end_frames) == [end for _, _, end in spans]
    assert times.num_frames == 24
    np.testing.assert_allclose(times.end, [5 * SPF, 9 * SPF, 13 * SPF, 16 * SPF, 20 * SPF])


def test_ctc_token_probabilities_are_the_mean_posterior_of_each_tokens_frames():
    spans = [(4, 3, 5), (6, 8, 9), (5, 13, 16)]
    log_probs = _spiky_log_probs(spans, num_frames=20)
    log_probs[4] = torch.tensor([0.2, 0, 0, 0, 0.8, 0, 0, 0]).clamp(min=1e-9).log()
    probs = ctc_token_probabilities(log_probs, [4, 6, 5])
    peak = float(log_probs[3, 4].exp())  # the spiky frames' posterior
    assert probs == pytest.approx([(peak + 0.8) / 2, peak, peak])
    # The transcript decides, not the argmax: a token CTC never emits scores low.
    assert ctc_token_probabilities(log_probs, [4, 7, 5])[1] < 0.01
    with pytest.raises(ValueError, match="CTC alignment impossible"):
        ctc_token_probabilities(log_probs[:2], [4, 6, 5])


def test_ctc_forced_alignment_follows_the_transcript_not_the_argmax():
    log_probs = _spiky_log_probs([(4, 2, 4), (5, 6, 7)], num_frames=10)
    times = ctc_forced_alignment(log_probs, [4, 6, 5], SPF)  # 6 never peaks
    assert len(times) == 3 and times.start_frames[0] == 2 and times.end_frames[-1] <= 10
    assert times.start_frames[1] >= times.end_frames[0]


def test_ctc_forced_alignment_rejects_bad_input():
    log_probs = _spiky_log_probs([], num_frames=4)
    with pytest.raises(ValueError, match="need at least 5 frames"):
        ctc_forced_alignment(log_probs, [4, 4, 4], SPF)
    with pytest.raises(ValueError, match="blank"):
        ctc_forced_alignment(log_probs, [4, 0], SPF)
    with pytest.raises(ValueError, match="outside"):
        ctc_forced_alignment(log_probs, [8], SPF)
    with pytest.raises(ValueError, match=r"\(T, V\)"):
        ctc_forced_alignment(log_probs[None], [4], SPF)
    assert len(ctc_forced_alignment(log_probs, [], SPF)) == 0


def test_attention_and_ctc_agree_on_word_boundaries():
    # "AB CD": tokens A B ▁ C D own blocks of frames; CTC spikes sit inside the blocks.
    bounds = [0, 8, 14, 18, 26, 33, 40]  # the last row is the eos step
    pieces = ["A", "B", SPACE, "C", "D"]
    att_times = attention_timestamps(_block_attention(bounds, num_maps=4), SPF)
    att_words = word_timestamps(pieces, att_times[: len(pieces)])
    spans = [(4, 0, 8), (5, 8, 14), (6, 14, 18), (7, 18, 26), (9, 26, 33)]
    ctc_times = ctc_forced_alignment(_spiky_log_probs(spans, 40, vocab=10), [4, 5, 6, 7, 9], SPF)
    ctc_words = word_timestamps(pieces, ctc_times)
    assert [w.text for w in att_words] == ["AB", "CD"]
    assert att_words == ctc_words
    assert boundary_error_ms(att_words, ctc_words) == 0.0


# --------------------------------------------------------------------------- words


def _unit_times(n: int) -> TokenTimes:
    return TokenTimes(tuple(range(n)), tuple(range(1, n + 1)), n, 0.1)


def test_char_pieces_split_at_space():
    pieces = list("HI") + [SPACE] + list("YOU")
    words = word_timestamps(pieces, _unit_times(6))
    assert [w.text for w in words] == ["HI", "YOU"]
    assert (words[0].start, words[0].end) == pytest.approx((0.0, 0.2))
    assert (words[1].start, words[1].end) == pytest.approx((0.3, 0.6))


def test_sentencepiece_pieces_start_words():
    pieces = [f"{SPACE}HEL", "LO", f"{SPACE}W", SPACE, "ORLD", f"{SPACE}A"]
    words = word_timestamps(pieces, _unit_times(6))
    assert [w.text for w in words] == ["HELLO", "W", "ORLD", "A"]
    assert [w.start for w in words] == pytest.approx([0.0, 0.2, 0.4, 0.5])
    assert [w.end for w in words] == pytest.approx([0.2, 0.3, 0.5, 0.6])


def test_leading_trailing_and_repeated_spaces():
    pieces = [SPACE, "A", SPACE, SPACE, "B", SPACE]
    assert [w.text for w in word_timestamps(pieces, _unit_times(6))] == ["A", "B"]
    assert word_timestamps([SPACE], _unit_times(1)) == []
    assert word_timestamps([], _unit_times(0)) == []


def test_word_ctc_probability_is_the_product_of_its_tokens():
    times = TokenTimes((0, 1, 2, 3), (1, 2, 3, 4), 4, 0.5)
    words = word_timestamps(["A", "B", SPACE, "C"], times, [0.5, 0.5, 1.0, 0.9],
                            [0.8, 0.5, 1.0, 0.7])  # fmt: skip
    assert [w.ctc_probability for w in words] == pytest.approx([0.4, 0.7])
    assert [w.probability for w in words] == pytest.approx([0.25, 0.9])
    assert word_timestamps(["A"], times[:1], [0.5])[0].ctc_probability is None
    with pytest.raises(ValueError, match="1 pieces but 2 token probabilities"):
        word_timestamps(["A"], times[:1], None, [0.5, 0.5])


def test_word_timestamps_needs_one_time_per_piece():
    with pytest.raises(ValueError, match="3 pieces but 2"):
        word_timestamps(["A", "B", "C"], _unit_times(2))


SENTENCES = ["YES NO YES", "GO TO THE STORE", "A", "NINE EIGHT SEVEN", "THE ONE WHO GOES"]


@pytest.fixture(scope="module")
def tokenizers():
    return [
        CharTokenizer.train(SENTENCES),
        SentencePieceTokenizer.train(SENTENCES * 20, "bpe", 40),
    ]


@pytest.mark.parametrize("seed", range(4))
def test_words_of_real_tokenizer_pieces_are_the_text_words(tokenizers, seed):
    rng = random.Random(seed)
    vocab = sorted({word for sentence in SENTENCES for word in sentence.split()})
    text = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 6)))
    for tokenizer in tokenizers:
        pieces = tokenizer.pieces(tokenizer.encode(text))
        words = word_timestamps(pieces, _unit_times(len(pieces)))
        assert [w.text for w in words] == text.split(), (tokenizer, pieces)
        assert all(a.end <= b.start for a, b in itertools.pairwise(words))


# --------------------------------------------------------------------------- boundary error


def test_boundary_error_ms():
    words = [Word("A", 0.0, 0.3), Word("B", 0.4, 0.9)]
    assert boundary_error_ms(words, words) == 0.0
    shifted = [Word(w.text, w.start + 0.05, w.end + 0.05) for w in words]
    assert boundary_error_ms(words, shifted) == pytest.approx(50.0)
    mixed = [Word("A", 0.1, 0.3), Word("B", 0.4, 0.88)]
    assert boundary_error_ms(words, mixed) == pytest.approx((100.0 + 0 + 0 + 20.0) / 4)


def test_boundary_error_needs_the_same_words():
    with pytest.raises(ValueError, match="word 1 differs"):
        boundary_error_ms([Word("A", 0, 1), Word("B", 1, 2)], [Word("A", 0, 1), Word("C", 1, 2)])
    with pytest.raises(ValueError, match="same non-empty"):
        boundary_error_ms([Word("A", 0, 1)], [])
    with pytest.raises(ValueError, match="same non-empty"):
        boundary_error_ms([], [])


# --------------------------------------------------------------------------- plots


def test_attention_plot_renders_in_seconds(tmp_path):
    att = _block_attention(BOUNDS, num_maps=4)  # 52 encoder frames
    features = torch.randn(4 * 52 + 3, 40)  # x4 subsampling, 3 frames lost at the edges
    labels = ["a", "b", "c", "d", "e", "f", "<eos>"]
    words = word_timestamps(list("ab") + [SPACE] + list("de"), attention_timestamps(att, SPF)[:5])
    fig = plot_attention(att, labels, features, 0.01, "utt1", seconds_per_frame=SPF, words=words)
    spectrogram, heatmap = fig.axes[0].images[0], fig.axes[1].images[0]
    assert spectrogram.get_extent()[:2] == pytest.approx((0.0, 2.11))
    assert heatmap.get_extent()[:2] == pytest.approx((0.0, 52 * SPF))
    path = tmp_path / "single.png"
    save_figure(fig, str(path))
    assert path.stat().st_size > 10_000


def test_attention_plot_without_encoder_rate_spans_the_features():
    fig = plot_attention(torch.rand(3, 10), ["a", "b", "c"], torch.randn(40, 8), 0.01)
    assert fig.axes[1].images[0].get_extent()[:2] == pytest.approx((0.0, 0.4))
    save_figure(fig, "/dev/null")


def test_attention_grid_renders_every_map(tmp_path):
    att = _block_attention(BOUNDS, num_maps=8, blur=1.0)
    words = [Word("x", 0.0, 0.5), Word("y", 0.6, 2.0)]
    fig = plot_attention_grid(att, 2, [str(i) for i in range(7)], SPF, "grid", words)
    assert len(fig.axes) == 8
    assert [ax.get_title() for ax in fig.axes][:5] == [
        "layer 0 head 0", "layer 0 head 1", "layer 0 head 2", "layer 0 head 3", "layer 1 head 0"
    ]  # fmt: skip
    path = tmp_path / "grid.png"
    save_figure(fig, str(path))
    assert path.stat().st_size > 20_000


def test_attention_grid_needs_whole_layers():
    with pytest.raises(ValueError, match="layers=3"):
        plot_attention_grid(torch.rand(8, 2, 5), 3, ["a", "b"])
