"""load_model and the decoding defaults: one source of truth for the API and the CLI."""

from __future__ import annotations

import copy
import re
import shutil
import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile
import torch
from conftest import TINY_MODEL_CONFIG
from test_transcribe import GREEDY, WAV, _overfit_recognizer

import asr.recognizer
import asr.timing
from asr.audio import AudioError
from asr.checkpoint import CheckpointError, instantiate, load_checkpoint
from asr.cli import main
from asr.data.manifest import Utterance, write_manifest
from asr.loading import load_lm
from asr.models.seq2seq import build_seq2seq
from asr.recognizer import Recognizer, load_model
from asr.search import DEFAULT_CTC_WEIGHT, SearchOptions, fastest_speech, max_output_length
from asr.segment import SegmenterOptions
from asr.streaming import StreamingEngine, StreamOptions
from asr.text import SOS_EOS_ID, CharTokenizer


@pytest.fixture
def checkpoint(tiny_checkpoint, tmp_path):
    path = tmp_path / "model.ckpt"
    shutil.copy(tiny_checkpoint["checkpoint"], path)
    return path


def test_without_stored_settings_the_api_decodes_as_search_options_say(checkpoint):
    recognizer = load_model(checkpoint)
    assert recognizer.decoding is None
    assert recognizer.default_options == SearchOptions(ctc_weight=DEFAULT_CTC_WEIGHT)


def test_loading_a_model_leaves_the_callers_random_numbers_alone(checkpoint):
    """Seed, load, sample: as without the load (its initial weights are thrown away)."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    load_model(checkpoint)
    assert torch.equal(torch.rand(3), expected)


def test_finalize_stores_settings_that_api_and_cli_decode_with(checkpoint, monkeypatch):
    wave = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    audio = checkpoint.parent / "a.wav"
    soundfile.write(audio, wave, 16000)
    dev = checkpoint.parent / "dev.jsonl"
    write_manifest(dev, [Utterance(str(audio), 1.0, "YES", "a")])
    assert main(["finalize", "--checkpoint", str(checkpoint), "--manifest", str(dev),
                 "--beam-size", "3", "--ctc-weight", "0.6", "--max-len-ratio", "2",
                 "--quiet"]) == 0  # fmt: skip
    expected = replace(SearchOptions(), beam_size=3, ctc_weight=0.6, max_len_ratio=2.0)
    assert load_model(checkpoint).default_options == expected

    used = []
    search = asr.recognizer.Recognizer.search

    def spy(self, waves, options=None, lm=None):
        used.append(options or self.default_options)
        return search(self, waves, options, lm)

    monkeypatch.setattr(asr.recognizer.Recognizer, "search", spy)
    load_model(checkpoint).transcribe(str(audio))
    out = checkpoint.parent / "out"
    assert main(["transcribe", str(audio), "--checkpoint", str(checkpoint),
                 "--output-dir", str(out), "--quiet"]) == 0  # fmt: skip
    assert main(["transcribe", str(audio), "--checkpoint", str(checkpoint), "--beam-size", "2",
                 "--output-dir", str(out), "--quiet"]) == 0  # fmt: skip
    assert used == [expected, expected, replace(expected, beam_size=2)]


def test_finalize_refuses_settings_the_model_cannot_decode_with(checkpoint, tmp_path):
    state = load_checkpoint(checkpoint)
    state["asr"]["model_config"]["ctc_weight"] = 0.0  # a model without a CTC head
    state["state_dict"] = {k: v for k, v in state["state_dict"].items() if ".ctc." not in k}
    import torch

    torch.save(state, tmp_path / "no_ctc.ckpt")
    args = ["--manifest", str(tmp_path / "dev.jsonl"), "--ctc-weight", "0.5"]
    assert main(["finalize", "--checkpoint", str(tmp_path / "no_ctc.ckpt"), *args]) == 2


def test_finalize_on_an_empty_manifest_keeps_what_was_stored(checkpoint, tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    before = checkpoint.read_bytes()
    argv = ["--checkpoint", str(checkpoint), "--manifest", str(tmp_path / "empty.jsonl")]
    for command in ("finalize", "calibrate"):
        assert main([command, *argv, "--quiet"]) == 2
        assert "empty.jsonl: no utterances to fit word confidences on" in capsys.readouterr().err
    assert checkpoint.read_bytes() == before


def test_an_empty_model_path_is_refused_not_read_as_the_working_folder(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # a folder, so "" read as "." would look for a package there
    with pytest.raises(FileNotFoundError, match="no model named"):
        load_model("")
    for command in (["export", "--checkpoint", "", "--out", "pkg"],  # not "a package already"
                    ["finalize", "--checkpoint", "", "--manifest", "dev.jsonl"]):  # fmt: skip
        assert main(command) == 2
        assert "no model named" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA device")
def test_a_cuda_device_that_is_not_there_is_said(checkpoint):
    with pytest.raises(ValueError, match=r"device='cuda:1': no CUDA device is available"):
        load_model(checkpoint, device="cuda:1")


def _lm_like(**fields) -> SimpleNamespace:
    """What a search calls of a language model, and `fields`."""
    return SimpleNamespace(init_state=None, step=None, reorder_state=None, **fields)


def test_a_language_model_is_given_alone_and_with_a_weight(checkpoint):
    recognizer, lm = load_model(checkpoint), _lm_like()
    with pytest.raises(TypeError, match=r"lm= takes the model alone: recognizer.load_lm"):
        recognizer.check_options(SearchOptions(lm_weight=0.3), (lm, recognizer.tokenizer))
    path = "exp/lm/avg.ckpt"  # as `--lm` takes it: it crashed the batch, a stream mid-audio
    said = r"lm= takes a language model, got str 'exp/lm/avg.ckpt': recognizer.load_lm\(path\)"
    with pytest.raises(TypeError, match=said):
        recognizer.check_options(SearchOptions(lm_weight=0.3), path)
    with pytest.raises(TypeError, match=said):
        StreamingEngine(recognizer, StreamOptions(lm_weight=0.3), path)
    with pytest.raises(ValueError, match="a language model was given with lm_weight=0"):
        recognizer.check_options(SearchOptions(), lm)
    with pytest.raises(ValueError, match=r"lm= is in training mode, .* call lm.eval\(\)"):
        recognizer.check_options(SearchOptions(lm_weight=0.3), _lm_like(training=True))
    other = _lm_like(vocab_size=recognizer.tokenizer.vocab_size + 9)  # another tokenizer
    said = f"the language model has {other.vocab_size} tokens and the recognizer "
    with pytest.raises(ValueError, match=said):  # before any audio, not as each file's error
        recognizer.check_options(SearchOptions(lm_weight=0.3), other)
    with pytest.raises(ValueError, match=said):  # a stream's finals too, rescored or searched
        StreamingEngine(recognizer, StreamOptions(lm_weight=0.3), other)
    with pytest.raises(CheckpointError, match="recognizer checkpoint"):
        recognizer.load_lm(checkpoint)


def test_load_lm_names_a_recognizer_checkpoint_for_what_it_is(checkpoint):
    with pytest.raises(CheckpointError, match="recognizer checkpoint"):
        load_lm(checkpoint)


# --------------------------------------------------------------------------- keyword options


@pytest.fixture(scope="module")
def overfit():
    """A tiny Transformer + CTC that recognises four AN4 utterances (test_transcribe's)."""
    return _overfit_recognizer(str(WAV))


def test_search_keywords_decode_as_the_search_options_they_set(overfit, monkeypatch):
    recognizer, waves = overfit
    used = []
    search = asr.recognizer.Recognizer.search

    def spy(self, waves, options=None, lm=None):
        used.append(options)
        return search(self, waves, options, lm)

    monkeypatch.setattr(asr.recognizer.Recognizer, "search", spy)
    options = SearchOptions(beam_size=3, ctc_weight=0.5, length_bonus=0.5, max_len_ratio=0.5)
    ways = [
        {"options": options},
        {"beam_size": 3, "ctc_weight": 0.5, "length_bonus": 0.5, "max_len_ratio": 0.5},
        {"options": SearchOptions(beam_size=3), "ctc_weight": 0.5, "length_bonus": 0.5,
         "max_len_ratio": 0.5},  # keywords set over the options given
    ]  # fmt: skip
    results = [[r.transcript for r in recognizer.transcribe_batch(waves, **w)] for w in ways]
    assert used == [options] * len(ways)  # one batch each
    for other in results[1:]:
        assert [t.tokens for t in other] == [t.tokens for t in results[0]]
        assert [t.score for t in other] == [t.score for t in results[0]]
    assert recognizer.transcribe(waves[0], beam_size=3).tokens == results[0][0].tokens
    assert used[-1] == replace(recognizer.default_options, beam_size=3)  # over the defaults


def test_a_float64_model_decodes_as_its_float32_self(overfit):
    """`model.double()` (exact checks, property tests): the waves and the decoder's steps
    follow the weights' precision, not float32's."""
    import copy

    recognizer, waves = overfit
    wide = copy.deepcopy(recognizer)
    wide.model.double()
    assert wide.pad(waves)[0].dtype == torch.float64, "a frontend's float64 filters take them"
    for options in (GREEDY, SearchOptions(beam_size=3, ctc_weight=0.3, length_bonus=0.5)):
        narrow = recognizer.transcribe_batch(waves, options=options)
        for a, b in zip(narrow, wide.transcribe_batch(waves, options=options), strict=True):
            assert b.transcript.tokens == a.transcript.tokens
            assert b.transcript.score == pytest.approx(a.transcript.score, abs=1e-4)
            assert [w.start for w in b.transcript.words] == pytest.approx(
                [w.start for w in a.transcript.words], abs=1e-3
            )


def test_unknown_keywords_are_named_and_bad_values_refused(overfit):
    recognizer, waves = overfit
    with pytest.raises(TypeError, match=r"'beam' \(did you mean 'beam_size'\?\)"):
        recognizer.transcribe(waves[0], beam=3)
    with pytest.raises(TypeError, match=r"'timestamps' \(did you mean 'word_timestamps'\?\)"):
        recognizer.transcribe_batch(waves, timestamps="ctc")
    with pytest.raises(TypeError):  # everything after the audio is a keyword
        recognizer.transcribe(waves[0], 16000)
    with pytest.raises(ValueError, match="word_timestamps must be one of"):
        recognizer.transcribe(waves[0], word_timestamps=True)
    with pytest.raises(ValueError, match="beam_size must be >= 1"):
        recognizer.transcribe(waves[0], beam_size=0)


def test_word_timestamps_choose_how_words_are_timed(overfit):
    recognizer, waves = overfit
    ctc = recognizer.transcribe(waves[0], options=GREEDY, word_timestamps="ctc")
    attention = recognizer.transcribe(waves[0], options=GREEDY)
    decoded = recognizer.search([waves[0]], GREEDY)[0]
    assert ctc.words == recognizer.words(decoded, "ctc")
    assert attention.words == recognizer.words(decoded, "attention") != ctc.words


def test_ctc_times_and_ctc_confidences_share_one_forced_alignment(overfit, monkeypatch):
    recognizer, waves = overfit
    calls = []
    forced_align = asr.timing.AF.forced_align

    def counted(*args, **kwargs):
        calls.append(1)
        return forced_align(*args, **kwargs)

    monkeypatch.setattr(asr.timing.AF, "forced_align", counted)
    transcript = recognizer.transcribe(waves[0], options=GREEDY, word_timestamps="ctc")
    assert len(calls) == 1
    assert all(w.ctc_probability is not None for w in transcript.words)


def test_a_bad_input_of_a_batch_fails_alone_and_named(overfit, tmp_path):
    recognizer, waves = overfit
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF not really a wave file")
    stereo, tiny = np.zeros((2, 16000), dtype=np.float32), np.zeros(80, dtype=np.float32)
    results = recognizer.transcribe_batch([waves[0], corrupt, stereo, tiny, waves[1]])
    names = ["<waveform 0>", str(corrupt), "<waveform 2>", "<waveform 3>", "<waveform 4>"]
    assert [r.name for r in results] == names
    assert [r.transcript.text for r in (results[0], results[3], results[4])] == ["YES", "", "GO"]
    assert results[0].error is None and results[0].transcript_or_raise() is results[0].transcript
    reasons = ["unreadable or corrupt audio", "mono waveform"]  # 5 ms (3): too short for words
    for result, reason in zip(results[1:3], reasons):
        assert result.transcript is None and re.search(reason, result.error.reason)
        with pytest.raises(AudioError, match=f"^{re.escape(result.name)}: .*{reason}"):
            result.transcript_or_raise()
    with pytest.raises(AudioError, match=f"^{re.escape(str(corrupt))}: unreadable"):
        recognizer.transcribe(corrupt)  # one input: its error is raised


# Isolated spoken digits as a folder corpus gives them (0.3-0.8 s at 8 kHz), and read speech at
# 18 characters a second: (seconds, tokens without eos).
FAST_CLIPS = [(0.30, 5), (0.35, 5), (0.50, 5), (0.80, 4), (3.0, 54)]
RNN_ENCODER = {  # 8x subsampling: the fewest frames per second of our encoders
    "class_path": "asr.models.rnn.RNNEncoder",
    "init_args": {"hidden_size": 16, "projection_dim": 16, "num_layers": 3, "subsample": "2_2_2"},
}


def _model_at_8khz(encoder: dict | None):
    config = TINY_MODEL_CONFIG | {"vocab_size": 12}
    frontend = config["frontend"]["init_args"]["features"]["init_args"]
    config["frontend"]["init_args"]["features"]["init_args"] = frontend | {"sample_rate": 8000}
    config |= {"encoder": encoder} if encoder else {}
    if encoder:
        config["decoder"] = {"class_path": "asr.models.rnn.RNNAttentionDecoder",
                             "init_args": {"hidden_size": 16}}  # fmt: skip
    torch.manual_seed(0)
    return instantiate(build_seq2seq, config).eval()


@pytest.mark.parametrize("encoder", [None, RNN_ENCODER], ids=["transformer", "rnn"])
def test_outputs_as_fast_as_the_fastest_trained_speech_are_never_cut(encoder):
    """With the training set's fastest speech stored, the output bound fits every clip of that
    rate however few encoder frames it has; `max_len_ratio` alone cuts the short ones."""
    model = _model_at_8khz(encoder)
    durations, counts = zip(*FAST_CLIPS)
    rate = fastest_speech(counts, durations)
    tokenizer = CharTokenizer.train(["ONE TWO"])
    recognizer = Recognizer(model, tokenizer, 8000, "fast.ckpt", tokens_per_second=rate)
    lens = torch.tensor([round(d * 8000) for d in durations])
    _, enc_lens = model.encode(torch.zeros(len(lens), int(lens.max())), lens)
    needed = torch.tensor(counts) + 1
    for ratio in (0.5, 1.0):
        bounded = recognizer.bounded(SearchOptions(max_len_ratio=ratio))
        limits = max_output_length(enc_lens, bounded.max_len_ratio, bounded.max_len_extra)
        assert (limits >= needed).all()
        assert (max_output_length(enc_lens, ratio) < needed).any()  # what the bound fixes

    # Search uses the bound: a decoder that never ends runs to it.
    with torch.no_grad():
        model.decoder.output.bias[SOS_EOS_ID] = -1e4
    clip = torch.zeros(round(0.3 * 8000)).uniform_(-0.1, 0.1)
    plain = replace(recognizer, tokens_per_second=None)
    for beam in (1, 3):  # greedy and beam search
        options = SearchOptions(beam_size=beam, ctc_weight=0.0, repair=False)  # it runs away
        [decoded] = recognizer.search([clip], options)
        assert len(decoded.hypothesis.tokens) >= FAST_CLIPS[0][1]
        [cut] = plain.search([clip], options)
        assert len(cut.hypothesis.tokens) < FAST_CLIPS[0][1]


def test_nbest_keeps_alternatives_best_first(overfit):
    recognizer, waves = overfit
    options = {"beam_size": 4, "ctc_weight": 0.0}
    three = recognizer.transcribe(waves[0], nbest=3, **options)
    [segment] = three.segments
    scores = [segment.score] + [a.score for a in segment.alternatives]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    tokens = [three.tokens] + [a.tokens for a in segment.alternatives]
    assert len({tuple(t) for t in tokens}) == 3  # three different hypotheses
    assert [a.text for a in segment.alternatives] == [
        recognizer.tokenizer.decode(a.tokens) for a in segment.alternatives
    ]
    one = recognizer.transcribe(waves[0], **options)
    assert one.text == three.text and one.segments[0].alternatives == []
    as_json = three.to_dict()["segments"][0]["alternatives"]
    assert [a["text"] for a in as_json] == [a.text for a in segment.alternatives]


def test_transcribe_refuses_several_inputs_and_a_segmenter_of_another_kind(overfit):
    """A list of paths (as NeMo's transcribe takes) was called a waveform; a dict for the
    segmenter raised a bare AttributeError."""
    recognizer, waves = overfit
    with pytest.raises(TypeError, match="transcribe takes one recording, got a list of 2: use "
                       "transcribe_batch for several"):  # fmt: skip
        recognizer.transcribe([waves[0], waves[1]])
    for call in (recognizer.transcribe, lambda *a, **k: recognizer.transcribe_batch([*a], **k)):
        with pytest.raises(TypeError, match="segmenter must be a SegmenterOptions .*got dict"):
            call(waves[0], segmenter={"max_segment_seconds": 3})


def test_options_of_another_kind_are_refused_by_name(overfit):
    """A dict or the other kind of options raised bare AttributeErrors from deep in a search
    or a stream, and an empty dict was passed over for the defaults unsaid."""
    recognizer, waves = overfit
    said = r"options must be a SearchOptions \(asr.search\), got {}: SearchOptions\(beam_size"
    for wrong in ({"beam_size": 1}, {}, StreamOptions(), SegmenterOptions()):
        with pytest.raises(TypeError, match=said.format(type(wrong).__name__)):
            recognizer.transcribe(waves[0], options=wrong)
        with pytest.raises(TypeError, match=said.format(type(wrong).__name__)):
            recognizer.search([waves[0]], options=wrong)
    with pytest.raises(TypeError, match=r"options must be a StreamOptions .*got SearchOptions"):
        recognizer.stream(options=SearchOptions())
    with pytest.raises(TypeError, match=r"endpoint must be an EndpointOptions .*got dict"):
        recognizer.stream(endpoint={"trailing_silence": 1.0})
    with pytest.raises(ValueError, match=r"StreamOptions: chunk_ms must be a number, got '640'"):
        recognizer.stream(chunk_ms="640")
    with pytest.raises(ValueError, match=r"StreamOptions: beam must be a whole number, got 2.5"):
        StreamOptions(beam=2.5)
    with pytest.raises(ValueError, match=r"trailing_silence must be a number, got '1'"):
        recognizer.stream(trailing_silence="1")


def test_a_model_in_training_mode_or_too_short_segments_are_refused(overfit):
    """Dropout and SpecAugment on: three transcripts of one file were three guesses. And a
    segment too short for the windows' overlap, refused here rather than at each transcribe."""
    recognizer, _ = overfit
    model = copy.deepcopy(recognizer.model)
    model.encoder.layers[0].dropout.train()  # a part of it is enough, and named
    said = r"model's encoder.layers.0.dropout \(Dropout\) is in training mode, .* model.eval\(\)"
    with pytest.raises(ValueError, match=said):
        Recognizer(model, recognizer.tokenizer, recognizer.sample_rate, "<in memory>")
    with pytest.raises(ValueError, match=r"the model is in training mode"):
        Recognizer(model.train(), recognizer.tokenizer, recognizer.sample_rate, "<in memory>")
    with pytest.raises(ValueError, match=r"segment_seconds is 2, not a number of at least 3 \("):
        Recognizer(
            model.eval(), recognizer.tokenizer, recognizer.sample_rate, "x", segment_seconds=2
        )


def test_transcribe_batch_refuses_one_input_for_a_sequence(overfit):
    """A path string is a sequence of characters: each was transcribed, and failed, alone."""
    recognizer, waves = overfit
    column = waves[0].numpy()[:, None]  # (S, 1), as soundfile reads one channel: S inputs
    stereo = np.stack([waves[0].numpy()] * 2, axis=1)  # (S, 2)
    for one in ("audio.wav", Path("audio.wav"), waves[0], waves[0].numpy(), column, stereo):
        with pytest.raises(TypeError, match="transcribe_batch takes a sequence of inputs, got"):
            recognizer.transcribe_batch(one)
    with pytest.raises(TypeError, match=r"one recording of 2 channels \(\d+, 2\): mix them or"):
        recognizer.transcribe_batch(stereo)
    rows = torch.stack([waves[0], waves[0]])  # a (B, S) batch: one input a row
    texts = [r.transcript.text for r in recognizer.transcribe_batch(rows, beam_size=1)]
    assert texts == [recognizer.transcribe(waves[0], beam_size=1).text] * 2
    generated = recognizer.transcribe_batch((w for w in rows), beam_size=1)  # read once
    assert [r.transcript.text for r in generated] == texts
    # an array of paths (a data frame's column) is a sequence of inputs, not one waveform
    paths = [str(f) for f in sorted(WAV.rglob("*.wav"))[:2]]
    texts = [r.transcript.text for r in recognizer.transcribe_batch(paths, beam_size=1)]
    for column in (np.array(paths), np.array(paths, dtype=object), np.array(paths)[:, None]):
        results = recognizer.transcribe_batch(column, beam_size=1)
        assert [r.transcript.text for r in results] == texts
    assert recognizer.transcribe_batch(paths, beam_size=1, batch_size=np.int64(2))[0].transcript
    ragged = np.empty(2, dtype=object)  # waveforms of two lengths, as a data frame holds them
    ragged[:] = [waves[0].numpy(), waves[1].numpy()]
    texts = [r.transcript.text for r in recognizer.transcribe_batch(list(ragged), beam_size=1)]
    assert [r.transcript.text for r in recognizer.transcribe_batch(ragged, beam_size=1)] == texts
    for numbers in (np.zeros(20, dtype=object), np.array([b"a.wav"] * 20)):  # no paths: one input
        with pytest.raises(TypeError, match="transcribe_batch takes a sequence of inputs, got"):
            recognizer.transcribe_batch(numbers)
    with pytest.raises(ValueError, match="sample_rate must be a whole number of Hz, got -5"):
        recognizer.align(paths[0], "YES", sample_rate=-5)
    for rate in (-5, "abc", 16000.5):  # files read their own rate: a bad one is still said
        with pytest.raises(
            ValueError, match=f"sample_rate must be a whole number of Hz, got {rate!r}"
        ):
            recognizer.transcribe_batch(paths, sample_rate=rate)
    for size in (None, "4", 2.5, True, 0):
        with pytest.raises(
            ValueError, match=f"batch_size must be a whole number >= 1, got {size!r}"
        ):
            recognizer.transcribe(waves[0], batch_size=size)


def test_read_only_samples_are_taken_without_a_warning(overfit):
    """np.frombuffer(pcm_bytes, np.int16), as sockets and stdin give audio, is read-only:
    torch warned of undefined behaviour."""
    recognizer, waves = overfit
    pcm = (waves[0].numpy() * 32767).astype(np.int16).tobytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert recognizer.transcribe(np.frombuffer(pcm, np.int16), beam_size=1).text


def test_alternatives_that_spell_a_text_already_listed_are_left_out(overfit):
    """A hypothesis with a leading space token decodes to the text of the same one without:
    the n-best listed the best's text again."""
    from asr import alignment

    recognizer, waves = overfit
    [decoded] = recognizer.search([waves[0]], SearchOptions(beam_size=3, nbest=3))
    best, other = decoded.hypothesis, decoded.alternatives[0]
    space = recognizer.tokenizer.encode("A B")[1]
    spaced = [replace(h, tokens=[space, *h.tokens]) for h in (best, other)]
    decoded = replace(decoded, alternatives=[spaced[0], other, spaced[1], best])
    segment = alignment.transcript(recognizer, decoded).segments[0]
    assert [a.tokens for a in segment.alternatives] == [other.tokens]
    assert recognizer.tokenizer.decode(spaced[1].tokens) == recognizer.tokenizer.decode(
        other.tokens
    )


def test_confidences_are_the_decoders_teacher_forced_probabilities(overfit):
    """Greedy search scores a hypothesis by the log-probabilities of its steps; the token
    probabilities, found afterwards by teacher forcing, add up to the same, and a word's is
    the product of its tokens'."""
    recognizer, waves = overfit
    greedy = SearchOptions(beam_size=1, ctc_weight=0.0)
    for decoded in recognizer.search(waves, greedy):
        lp = decoded.token_log_probs
        assert len(lp) == len(decoded.hypothesis.tokens) + 1  # eos last
        assert float(lp.sum()) == pytest.approx(decoded.hypothesis.score, abs=1e-3)
        assert decoded.avg_logprob == pytest.approx(float(lp.mean()))
        transcript = recognizer.transcript(decoded)
        assert transcript.token_probs == pytest.approx(lp[:-1].exp().tolist())
        pieces = transcript.pieces
        for word in transcript.words:
            assert 0.0 < word.probability <= 1.0
        product = np.prod([p for p, piece in zip(transcript.token_probs, pieces)
                           if piece != "\u2581"][: len(transcript.words[0].text)])  # fmt: skip
        assert transcript.words[0].probability == pytest.approx(product)
        assert transcript.segments[0].avg_logprob == pytest.approx(decoded.avg_logprob)


def test_no_speech_probability_is_high_for_silence_and_low_for_speech(overfit):
    recognizer, waves = overfit
    silence = torch.zeros(16000)
    decoded = recognizer.search([silence, waves[0]], SearchOptions(beam_size=1))
    quiet, speech = (d.no_speech_prob for d in decoded)
    assert speech < 0.01 < quiet and quiet <= 1.0
    as_json = recognizer.transcript(decoded[0]).to_dict()
    assert as_json["segments"][0]["no_speech_prob"] == pytest.approx(quiet, abs=1e-4)
