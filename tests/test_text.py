"""Contracts of asr.text: the normaliser, the fixed special ids and every tokenizer."""

from __future__ import annotations

import functools
import json
import random
import re
import unicodedata
from pathlib import Path

import pytest
import torch

from asr.text import (
    BLANK_ID,
    EOS_ID,
    PAD_ID,
    SOS_ID,
    SPECIAL_PIECES,
    UNK_ID,
    CharTokenizer,
    SentencePieceTokenizer,
    TextNormalizer,
    Tokenizer,
    read_manifest_texts,
    train_tokenizer,
)

# (kind, vocab_size) trained on AN4: characters, the smallest BPE (pure characters, as
# ESPnet's "BPE 30", which has one special id fewer), a larger BPE, and a unigram model.
AN4_SPECS = [("char", None), ("bpe", 31), ("bpe", 100), ("unigram", 60)]
SMALL_TEXTS = ["hello world", "yes no yes", "Don't stop, NOW!", "the quick brown fox"]


# --------------------------------------------------------------------------- normaliser

NORMALIZERS = [
    TextNormalizer(),
    TextNormalizer(case="lower"),
    TextNormalizer(case="keep", punctuation="keep"),
]
TRICKY = (
    "abcXYZ019 \t\n\u00a0\u3000,.;:!?\"'\u2019\u02bc-\u2014()[]\u00ab\u00bb$+_/"
    "\ufb01\uff21\u0301\u00df\u0130\u01f0\u03c2\u0149\u2105\u00bd\U0001f600\u1e9e"
)


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(TRICKY, k=rng.randint(0, 25))) for _ in range(n)]


@pytest.mark.parametrize("normalizer", NORMALIZERS, ids=str)
def test_normalizer_idempotent_and_whitespace_collapsed(normalizer):
    for text in random_texts(2000):
        once = normalizer(text)
        assert normalizer(once) == once, repr(text)
        assert once == " ".join(once.split())
        assert unicodedata.normalize("NFKC", once) == once


def test_normalizer_removes_punctuation_except_inner_apostrophes():
    normalizer = TextNormalizer(case="keep")
    for text in random_texts(2000, seed=1):
        out = normalizer(text)
        for i, ch in enumerate(out):
            if unicodedata.category(ch).startswith("P"):
                assert ch == "'" and out[i - 1].isalnum() and out[i + 1].isalnum(), repr(out)


def test_every_apostrophe_inside_a_word_becomes_one_and_the_rest_go():
    """U+02BC is a letter to unicodedata: it stayed, and DON\u02bcT did not match DON'T."""
    normalizer = TextNormalizer()
    for mark in ("'", "\u2019", "\u02bc"):
        assert normalizer(f"don{mark}t {mark}quote{mark} dogs{mark}") == "DON'T QUOTE DOGS"


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_invisible_characters_go_and_joiners_stay(normalizer):
    """A soft hyphen, a BOM or a direction mark inside a reference looked like nothing and
    scored as a substitution of the word it sat in, and entered a tokenizer's vocabulary.
    A zero-width space marks a word break (Thai writes no spaces); ZWNJ and ZWJ are spelling:
    a Persian word without its ZWNJ is another way to write it."""
    marks = "\u00ad\ufeff\u200e\u200f\u061c\u202a\u202e\u2060\u2066\u2069\u206a\ufff9"
    for mark in marks:
        said = normalizer(f"{mark}en{mark}ter nine{mark} don{mark}'t")
        assert said == normalizer("enter nine don't"), (repr(mark), said)
        assert normalizer(said) == said
    thai = "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u200b\u0e04\u0e23\u0e31\u0e1a"
    assert normalizer(thai) == normalizer(thai.replace("\u200b", " "))
    assert len(normalizer("one\u200btwo\u200b").split()) == 2
    for kept in ("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645", "\u0915\u094d\u200d"):
        assert normalizer(kept) == kept


def test_normalizer_case():
    text = "MiXeD \u00c9t\u00e9"
    assert TextNormalizer(case="upper")(text) == "MIXED \u00c9T\u00c9"
    assert TextNormalizer(case="lower")(text) == "mixed \u00e9t\u00e9"
    assert TextNormalizer(case="keep")(text) == text


def test_normalizer_dict_round_trip():
    for normalizer in NORMALIZERS:
        data = json.loads(json.dumps(normalizer.to_dict()))
        assert TextNormalizer.from_dict(data) == normalizer


@pytest.mark.parametrize(
    "bad", [{"case": "title"}, {"punctuation": "drop"}, {"casing": "upper"}], ids=str
)
def test_normalizer_rejects_bad_options(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        TextNormalizer.from_dict(bad)


# --------------------------------------------------------------------------- AN4 contracts


def read_an4_transcripts(an4_dir: Path, split: str) -> list[str]:
    """Transcripts of etc/an4_<split>.transcription without `<s>`, `</s>` and `(id)`."""
    lines = (an4_dir / "etc" / f"an4_{split}.transcription").read_text().splitlines()
    texts = [re.sub(r"\([^()]*\)\s*$", "", line) for line in lines if line.strip()]
    return [" ".join(t.replace("<s>", " ").replace("</s>", " ").split()) for t in texts]


@functools.cache
def an4_texts(an4_dir: Path) -> tuple[list[str], list[str]]:
    return read_an4_transcripts(an4_dir, "train"), read_an4_transcripts(an4_dir, "test")


@functools.cache
def an4_tokenizer(an4_dir: Path, kind: str, vocab_size: int | None) -> Tokenizer:
    train, _ = an4_texts(an4_dir)
    return train_tokenizer(train, kind, vocab_size, out_dir=None)


@pytest.fixture(params=AN4_SPECS, ids=lambda spec: f"{spec[0]}{spec[1] or ''}")
def an4(request, an4_dir):
    """(tokenizer trained on AN4 train, every AN4 transcript)."""
    train, test = an4_texts(an4_dir)
    assert len(train) == 948 and len(test) == 130
    return an4_tokenizer(an4_dir, *request.param), train + test


def test_special_ids_are_fixed():
    assert (BLANK_ID, PAD_ID, UNK_ID, SOS_ID, EOS_ID) == (0, 1, 2, 3, 3)
    assert SPECIAL_PIECES == ("<blank>", "<pad>", "<unk>", "<sos/eos>")


@pytest.mark.needs_corpus
def test_an4_special_ids_and_vocab_size(an4):
    tokenizer, _ = an4
    ids = (tokenizer.blank_id, tokenizer.pad_id, tokenizer.unk_id)
    assert ids + (tokenizer.sos_id, tokenizer.eos_id) == (0, 1, 2, 3, 3)
    assert tokenizer.pieces(range(4)) == list(SPECIAL_PIECES)
    pieces = tokenizer.pieces(range(tokenizer.vocab_size))
    assert len(set(pieces)) == tokenizer.vocab_size  # contiguous, no duplicate piece
    if isinstance(tokenizer, SentencePieceTokenizer):
        assert (tokenizer.kind, tokenizer.vocab_size) in AN4_SPECS
    else:
        assert tokenizer.vocab_size == 4 + 27  # space + A..Z


@pytest.mark.needs_corpus
def test_an4_round_trip_every_transcript(an4):
    tokenizer, texts = an4
    for text in texts:
        ids = tokenizer.encode(text)
        assert ids and all(4 <= i < tokenizer.vocab_size for i in ids), text
        expected = tokenizer.normalizer(text)
        assert tokenizer.decode(ids) == expected
        assert tokenizer.decode(torch.tensor(ids)) == expected
        assert tokenizer.decode([SOS_ID, *ids, EOS_ID, PAD_ID, BLANK_ID]) == expected
        assert "".join(tokenizer.pieces(ids)).replace("\u2581", " ").strip() == expected
        assert tokenizer.oov(text) == []


@pytest.mark.needs_corpus
def test_an4_save_load_gives_identical_encodings(an4, tmp_path):
    tokenizer, texts = an4
    json_path = tokenizer.save(tmp_path)
    for source in (tmp_path, json_path, str(json_path)):
        loaded = Tokenizer.load(source)
        assert type(loaded) is type(tokenizer) and loaded.kind == tokenizer.kind
        assert loaded.normalizer == tokenizer.normalizer
        assert loaded.vocab_size == tokenizer.vocab_size
        assert [loaded.encode(t) for t in texts] == [tokenizer.encode(t) for t in texts]
        every_id = range(tokenizer.vocab_size)
        assert loaded.pieces(every_id) == tokenizer.pieces(every_id)


@pytest.mark.needs_corpus
def test_an4_oov_and_unknown_characters(an4):
    tokenizer, _ = an4
    assert tokenizer.oov("ok \u00fcber 12 \u00dcber") == ["\u00dc", "1", "2"]
    ids = tokenizer.encode("A\u00dcB")
    assert UNK_ID in ids
    assert tokenizer.decode(ids) == "AB"


@pytest.mark.needs_corpus
def test_an4_bpe_30_is_too_small(an4_dir):
    train, _ = an4_texts(an4_dir)
    with pytest.raises(ValueError, match="at least 31"):
        train_tokenizer(train, "bpe", 30, out_dir=None)


@pytest.mark.needs_corpus
@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_an4_training_is_deterministic(an4_dir, kind):
    train, _ = an4_texts(an4_dir)
    first = SentencePieceTokenizer.train(train, kind, 50)
    second = SentencePieceTokenizer.train(train, kind, 50)
    assert first.model == second.model


# --------------------------------------------------------------------------- char tokenizer


def test_char_vocabulary_is_sorted_normalised_characters():
    tokenizer = CharTokenizer.train(["ba", "c\u00e0!"], TextNormalizer(case="upper"))
    assert tokenizer.chars == [" ", "A", "B", "C", "\u00c0"]
    assert tokenizer.pieces(range(4, 9)) == ["\u2581", "A", "B", "C", "\u00c0"]
    assert tokenizer.encode("cab xyz") == [7, 5, 6, 4, 2, 2, 2]


def test_char_unknown_characters_encode_to_unk():
    tokenizer = CharTokenizer.train(SMALL_TEXTS)
    text = "HELLO \u00dcBER 42"
    ids = tokenizer.encode(text)
    unknown = [i for i, ch in enumerate(tokenizer.normalizer(text)) if ch in "\u00dc42"]
    assert [k for k, i in enumerate(ids) if i == UNK_ID] == unknown
    assert tokenizer.oov(text) == ["\u00dc", "4", "2"]
    assert CharTokenizer(["A", "B"]).oov("A B") == [" "]  # the space is a token too


@pytest.mark.parametrize("kind, size", [("char", None), ("bpe", 12)])
def test_sentencepieces_space_in_a_text_is_a_space(kind, size):
    """`▁` marks spaces in pieces: as a character it would be a second space."""
    assert TextNormalizer()("A\u2581B \u2581") == "A B"
    tokenizer = train_tokenizer(["a\u2581b", "ab ba"], kind, size, out_dir=None)
    assert tokenizer.decode(tokenizer.encode("a\u2581b")) == "A B"
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    assert len(set(pieces)) == len(pieces)


# --------------------------------------------------------------------------- SentencePiece


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_sentencepiece_vocab_size_limits(kind):
    minimum = 4 + len(set(" ".join(TextNormalizer()(t) for t in SMALL_TEXTS)))
    with pytest.raises(ValueError, match=f"at least {minimum}"):
        SentencePieceTokenizer.train(SMALL_TEXTS, kind, minimum - 1)
    with pytest.raises(ValueError, match=r"at most \d+") as err:
        SentencePieceTokenizer.train(SMALL_TEXTS, kind, 5000)
    maximum = int(re.search(r"at most (\d+)", str(err.value)).group(1))
    for size in (minimum, maximum):  # both bounds are buildable, exactly
        assert SentencePieceTokenizer.train(SMALL_TEXTS, kind, size).vocab_size == size
    with pytest.raises(ValueError, match=f"{kind} vocab_size 99999999999 is too large"):
        SentencePieceTokenizer.train(SMALL_TEXTS, kind, 99999999999)  # past SentencePiece's int


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_sentencepiece_trains_on_every_character_of_every_line(kind):
    """A control character (NUL) is normalised away rather than left to SentencePiece, which
    drops it; a transcript over 1 MiB, which it would leave out without a word, is refused."""
    assert TextNormalizer()("HELLO X\x00QZ\tA") == "HELLO XQZ A"
    texts = ["HELLO X\x00QZ", "NO"]
    minimum = 4 + len(set(" ".join(TextNormalizer()(t) for t in texts)))
    tokenizer = SentencePieceTokenizer.train(texts, kind, minimum)
    assert tokenizer.oov("XQZ") == []
    assert tokenizer.decode(tokenizer.encode("HELLO X\x00QZ")) == "HELLO XQZ"
    with pytest.raises(ValueError, match=r"text 2 \(A B A B .*\) is over 1048576 bytes"):
        SentencePieceTokenizer.train(["NO", "A B " * (1 << 18) + "\u0416"], kind, minimum)


@pytest.mark.parametrize("piece", SPECIAL_PIECES)
def test_sentencepiece_refuses_texts_holding_a_special_pieces_name(piece):
    """SentencePiece would train without them, then meet characters it never saw."""
    keep = TextNormalizer("keep", "keep")
    with pytest.raises(ValueError, match=f"texts hold {re.escape(piece)}, the name of a special"):
        SentencePieceTokenizer.train([f"yes {piece} no", "no"], "bpe", 30, keep)
    tokenizer = CharTokenizer.train([f"yes {piece} no"], keep)
    assert tokenizer.decode(tokenizer.encode(f"{piece} no")) == f"{piece} no"


def test_sentencepiece_normalizes_once_with_our_normalizer():
    normalizer = TextNormalizer(case="lower")
    tokenizer = SentencePieceTokenizer.train(SMALL_TEXTS, "bpe", 40, normalizer)
    for text in SMALL_TEXTS:
        assert tokenizer.decode(tokenizer.encode(text.upper())) == normalizer(text)


# --------------------------------------------------------------------------- API errors


@pytest.fixture(params=["char", "bpe"])
def small(request):
    return train_tokenizer(SMALL_TEXTS, request.param, 40, out_dir=None)


@pytest.mark.parametrize(
    "ids", [[999], [-1], [1.5], "ab", torch.zeros(2, 2, dtype=torch.long)], ids=str
)
def test_decode_rejects_bad_ids(small, ids):
    with pytest.raises(ValueError):
        small.decode(ids)


def test_train_tokenizer_bad_arguments():
    with pytest.raises(ValueError, match="kind"):
        train_tokenizer(SMALL_TEXTS, "wordpiece", 40, out_dir=None)
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(SMALL_TEXTS, "unigram", None, out_dir=None)
    for kind in ("char", "bpe"):
        with pytest.raises(ValueError, match="^no text left after normalisation"):
            train_tokenizer(["", " ,"], kind, 40, out_dir=None)


def test_a_manifest_without_words_is_named(tmp_path):
    empty = write_manifest(tmp_path / "empty.jsonl", ["!!! ...", ""])
    for kind in ("char", "unigram"):
        with pytest.raises(ValueError, match=f"^{re.escape(str(empty))}: no text left"):
            train_tokenizer(empty, kind, 40, out_dir=None)


def test_manifest_texts_read_as_validation_does(tmp_path):
    """A byte-order mark is read past; a line that is not UTF-8 is named by file and line."""
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "yes"}\n{"text": "no"}\n')
    assert read_manifest_texts(path) == ["yes", "no"]
    path.write_bytes(b'{"text": "yes"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: not valid UTF-8"):
        read_manifest_texts(path)
    path.write_bytes(b'{"text": "yes"}\r{"text": "no"}\r')  # old Mac line ends
    assert read_manifest_texts(path) == ["yes", "no"]
    path.write_bytes(b'{"text": "yes"}\n{"text": "yes\\ud800"}\n')  # half a surrogate pair
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: 'text' holds \\ud800"):
        read_manifest_texts(path)
    for line, said in ((b"[" * 100_000, "nested deeper than"), (b"1" * 5000, "Exceeds the")):
        path.write_bytes(b'{"text": "yes"}\n' + line + b"\n")  # a traceback, no line said
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: invalid JSON: {said}"):
            read_manifest_texts(path)


def test_a_failed_save_keeps_the_tokenizer_saved_before(tmp_path):
    CharTokenizer.train(["yes"]).save(tmp_path)
    before = (tmp_path / "tokenizer.json").read_bytes()
    with pytest.raises(UnicodeEncodeError):
        CharTokenizer(["\ud800"]).save(tmp_path)
    assert (tmp_path / "tokenizer.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer.json").mkdir()  # named as asked for, its partial not left behind
    with pytest.raises(IsADirectoryError, match=f"{tmp_path / 'tokenizer.json'}'$"):
        CharTokenizer.train(["yes"]).save(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]


def write_manifest(path: Path, texts: list[str]) -> Path:
    lines = [json.dumps({"id": f"u{k}", "text": t}) for k, t in enumerate(texts)]
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return path


def test_train_from_manifests_equals_train_from_texts(tmp_path):
    first = write_manifest(tmp_path / "a.jsonl", SMALL_TEXTS[:2])
    second = write_manifest(tmp_path / "b.jsonl", SMALL_TEXTS[2:])
    assert read_manifest_texts(first) == SMALL_TEXTS[:2]
    from_texts = train_tokenizer(SMALL_TEXTS, "bpe", 40, tmp_path / "t")
    from_files = train_tokenizer([first, second], "bpe", 40, tmp_path / "m")
    assert from_files.model == from_texts.model
    assert (tmp_path / "m" / "tokenizer.json").is_file()
    from_one_path = train_tokenizer(str(first), "char", None, None)  # "hello world", "yes no yes"
    assert "".join(from_one_path.chars) == " DEHLNORSWY"


@pytest.mark.parametrize("line", ["{not json", '["a list"]', '{"txt": "hi"}', '{"text": 3}'])
def test_manifest_errors_name_file_and_line(tmp_path, line):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2")):
        train_tokenizer([path], "char", None, None)


# Ways to spoil a saved tokenizer.json `p` whose parsed content is `d`.
CORRUPTIONS = {
    "invalid_json": lambda d, p: p.write_text('{"kind": "char",\n oops}'),
    "not_object": lambda d, p: p.write_text("[1, 2]"),
    "not_utf8": lambda d, p: p.write_bytes(b"\xff\xfe{"),
    "unknown_kind": lambda d, p: _dump({**d, "kind": "pickle"}, p),
    "missing_specials": lambda d, p: _dump({k: v for k, v in d.items() if k != "specials"}, p),
    "bad_normalizer": lambda d, p: _dump({**d, "normalizer": {"case": "title"}}, p),
    "normalizer_not_dict": lambda d, p: _dump({**d, "normalizer": "upper"}, p),
}
CHAR_CORRUPTIONS = {
    "no_vocab": lambda d, p: _dump({k: v for k, v in d.items() if k != "vocab"}, p),
    "multichar_vocab": lambda d, p: _dump({**d, "vocab": ["AB", "C"]}, p),
    "duplicate_vocab": lambda d, p: _dump({**d, "vocab": ["A", "A"]}, p),
}
SP_CORRUPTIONS = {
    "model_path_escapes": lambda d, p: _dump({**d, "model": "../tokenizer.model"}, p),
    "model_missing": lambda d, p: _dump({**d, "model": "other.model"}, p),
    "vocab_size_mismatch": lambda d, p: _dump({**d, "vocab_size": d["vocab_size"] + 1}, p),
    "model_garbage": lambda d, p: (p.parent / d["model"]).write_bytes(b"garbage"),
}


def _dump(data: dict, path: Path) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.mark.parametrize(
    "kind, name",
    [("char", n) for n in [*CORRUPTIONS, *CHAR_CORRUPTIONS]]
    + [("bpe", n) for n in [*CORRUPTIONS, *SP_CORRUPTIONS]],
)
def test_malformed_tokenizer_json_names_the_file(tmp_path, kind, name):
    json_path = train_tokenizer(SMALL_TEXTS, kind, 40, tmp_path).save(tmp_path)
    data = json.loads(json_path.read_text(encoding="utf-8"))
    {**CORRUPTIONS, **CHAR_CORRUPTIONS, **SP_CORRUPTIONS}[name](data, json_path)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path))):
        Tokenizer.load(tmp_path)


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(tmp_path)
