"""The attention-failure guard: what counts as a failure, and what the recognizer does."""

from __future__ import annotations

import copy
import random
import re
from dataclasses import replace

import pytest
import torch
from test_transcribe import WAV, _overfit_recognizer

from asr.guard import CTC_MISMATCH, REPETITION, RUNAWAY, cut_loop, failure, repeated_ngram
from asr.recognizer import load_model
from asr.search import SearchOptions
from asr.text import BLANK_ID, CharTokenizer

NEVER = 10**9  # a length bound no hypothesis reaches


@pytest.mark.parametrize("seed", range(20))
def test_a_planted_loop_is_found_where_it_starts(seed):
    rng = random.Random(seed)
    n, repeats = rng.randint(1, 6), rng.randint(4, 7)
    head = [rng.randint(10, 20) for _ in range(rng.randint(0, 10))]  # no loop: distinct range
    gram = [rng.randint(1, 9) for _ in range(n)]
    while len(set(gram)) < n:  # a gram that is itself no shorter loop
        gram = [rng.randint(1, 9) for _ in range(n)]
    tokens = head + gram * repeats + [30]
    start, size = repeated_ngram(tokens)
    assert tokens[start : start + size * 4] == (tokens[start : start + size]) * 4
    assert start <= len(head) and failure(tokens, NEVER) == REPETITION
    assert cut_loop(tokens) == head + gram


def test_three_copies_are_no_loop_and_bounds_are_checked():
    assert repeated_ngram([1, 2] * 3) is None and failure([1, 2] * 3, NEVER) is None
    assert failure([1, 2, 3], limit=4) == RUNAWAY  # three tokens and eos: the bound
    assert failure([1, 2, 3], limit=5) is None
    assert failure([], NEVER, ctc_length=12) is None  # shorter: in noise CTC runs on, not it
    assert failure(list(range(1, 30)), NEVER, ctc_length=12) == CTC_MISMATCH  # hallucinated


def test_no_an4_transcript_counts_as_a_failure(an4_dir):
    """Spelled letters and digits repeat ("C Q Q F"), but never four times in a row."""
    lines = []
    for name in ("an4_train.transcription", "an4_test.transcription"):
        lines += (an4_dir / "etc" / name).read_text().splitlines()
    texts = [re.sub(r"\s*\([^)]*\)\s*$", "", line).replace("<s>", "").replace("</s>", "")
             for line in lines]  # fmt: skip
    tokenizer = CharTokenizer.train(texts)
    flagged = [t for t in texts if failure(tokenizer.encode(t), NEVER) is not None]
    assert len(texts) > 900 and flagged == []


@pytest.fixture(scope="module")
def overfit():
    return _overfit_recognizer(str(WAV))


def _looping(recognizer):
    """The recognizer with a decoder that says token 5 forever."""
    model = copy.deepcopy(recognizer.model)
    with torch.no_grad():
        model.decoder.output.weight.zero_()
        model.decoder.output.bias.fill_(0.0)
        model.decoder.output.bias[5] = 5.0  # p = 0.8: confident, not certain
    return replace(recognizer, model=model)


def test_a_looping_decoder_is_repaired_by_the_ctc_head(overfit):
    recognizer, waves = overfit
    looping = _looping(recognizer)
    options = SearchOptions(beam_size=2, ctc_weight=0.0)
    broken = looping.search(waves[:2], replace(options, repair=False))
    assert all(repeated_ngram(d.hypothesis.tokens) for d in broken)
    fixed = looping.search(waves[:2], options)
    assert [d.repaired for d in fixed] == [REPETITION, REPETITION]
    right = recognizer.search(waves[:2], replace(options, ctc_weight=1.0))
    ctc_texts = [recognizer.tokenizer.decode(d.hypothesis.tokens) for d in right]
    for decoded, text in zip(fixed, ctc_texts):
        assert failure(decoded.hypothesis.tokens, NEVER) is None
        assert recognizer.tokenizer.decode(decoded.hypothesis.tokens) == text  # CTC decides
        assert len(decoded.token_log_probs) == len(decoded.hypothesis.tokens) + 1
    as_json = looping.transcript(fixed[0]).to_dict()
    assert as_json["segments"][0]["repaired"] == REPETITION


def test_without_a_ctc_head_a_loop_is_cut_after_its_first_copy(overfit):
    recognizer, waves = overfit
    looping = _looping(recognizer)
    looping.model.ctc = None
    [decoded] = looping.search(waves[:1], SearchOptions(beam_size=1, ctc_weight=0.0))
    assert decoded.hypothesis.tokens == [5] and decoded.repaired == REPETITION
    assert decoded.hypothesis.attention.shape[1] == 2  # the token and eos
    # its score is of the tokens kept, not of the loop cut away
    assert decoded.hypothesis.score == pytest.approx(float(decoded.token_log_probs.sum()))


def test_what_the_model_recognises_is_left_alone(overfit):
    recognizer, waves = overfit
    for options in (SearchOptions(beam_size=1, ctc_weight=0.0), SearchOptions(beam_size=4)):
        decoded = recognizer.search(waves, options)
        assert [d.repaired for d in decoded] == [None] * len(waves)
        plain = recognizer.search(waves, replace(options, repair=False))
        assert [d.hypothesis.tokens for d in decoded] == [d.hypothesis.tokens for d in plain]


def test_no_speech_is_the_ctc_probability_of_blank_everywhere(tiny_checkpoint):
    recognizer = load_model(tiny_checkpoint["checkpoint"])
    with torch.no_grad():
        recognizer.model.ctc.proj.weight.zero_()
        recognizer.model.ctc.proj.bias.fill_(0.0)
        recognizer.model.ctc.proj.bias[BLANK_ID] = 3.0
    [decoded] = recognizer.search([torch.zeros(16000)], SearchOptions(beam_size=1))
    frames = len(decoded.ctc_log_probs)
    vocab = recognizer.model.vocab_size
    blank = torch.tensor(3.0).exp() / (torch.tensor(3.0).exp() + vocab - 1)
    assert decoded.no_speech_prob == pytest.approx(float(blank**frames), rel=1e-4)
