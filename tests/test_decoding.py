"""How `asr.decoding` routes a search: the greedy shortcut only where it equals the beam."""

from __future__ import annotations

import pytest
import torch
from test_search import EOS, encoder_output, make_decoder

from asr.decoding import search_encoded
from asr.search import SearchOptions, beam_search

LENS = torch.tensor([12, 7, 4])


@pytest.mark.parametrize(
    "rule",
    [
        {"min_len_ratio": 0.9},
        {"length_bonus": 1.0},
        {"length_normalization": True},
        {"length_bonus": -0.5, "length_normalization": True},
    ],
)
def test_beam_of_one_keeps_the_length_rules_and_score_terms(rule) -> None:
    decoder, enc = make_decoder("transformer"), encoder_output(LENS)
    with torch.no_grad():
        decoder.output.bias[EOS] += 3.0  # short outputs, so a minimum length bites
    options = SearchOptions(beam_size=1, max_len_ratio=1.0, **rule)
    nbests, _, _ = search_encoded(decoder, enc, LENS, None, options)
    expected = beam_search(decoder, enc, LENS, options)
    for got, want in zip(nbests, expected, strict=True):
        assert got[0].tokens == want[0].tokens
        assert got[0].score == pytest.approx(want[0].score, abs=1e-4)
