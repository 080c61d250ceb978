"""Text normalisation and tokenizers (characters, SentencePiece BPE/unigram), all sharing the
special ids 0 `<blank>`, 1 `<pad>`, 2 `<unk>`, 3 `<sos/eos>`."""

from __future__ import annotations

import abc
import io
import json
import operator
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import sentencepiece as spm

from asr.files import write_atomically

if TYPE_CHECKING:
    import torch

BLANK_ID = 0
PAD_ID = 1
UNK_ID = 2
SOS_EOS_ID = 3
SOS_ID = EOS_ID = SOS_EOS_ID
NUM_SPECIAL = 4
SPECIAL_PIECES = ("<blank>", "<pad>", "<unk>", "<sos/eos>")
SPACE_PIECE = "\u2581"  # `▁`
CASES = ("upper", "lower", "keep")
PUNCTUATION = ("remove", "keep")
TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE_MODEL = "tokenizer.model"

_APOSTROPHES = frozenset("'\u2019\u02bc")  # ', right single quote, modifier apostrophe
# Format characters that change nothing a reader sees: the soft hyphen, direction marks,
# embeddings and isolates, word joiner, invisible operators, deprecated format characters,
# annotation anchors, and the BOM. (The zero-width space marks a word break, as in Thai: a space.)
INVISIBLE = frozenset(
    "\u00ad\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062\u2063\u2064"
    "\u2066\u2067\u2068\u2069\u206a\u206b\u206c\u206d\u206e\u206f\ufeff\ufff9\ufffa\ufffb"
)
ZERO_WIDTH_SPACE = "\u200b"


@dataclass(frozen=True)
class TextNormalizer:
    r"""Unicode NFKC, case folding, punctuation removal and whitespace collapsing; `▁`
    (SentencePiece's space) and the zero-width space are spaces, and control and invisible
    characters (`INVISIBLE`) go.

    >>> TextNormalizer()("  Don\u2019t   stop, \u201cNOW\u201d! ")
    "DON'T STOP NOW"
    >>> TextNormalizer(case="lower")("U.S.A. 'quoted'")
    'u s a quoted'
    >>> TextNormalizer(case="keep", punctuation="keep")("\uff21bc,\tdef ")
    'Abc, def'
    """

    case: str = "upper"
    punctuation: str = "remove"

    def __post_init__(self) -> None:
        if self.case not in CASES:
            raise ValueError(f"TextNormalizer.case must be upper|lower|keep, got {self.case!r}")
        if self.punctuation not in PUNCTUATION:
            raise ValueError(
                f"TextNormalizer.punctuation must be remove|keep, got {self.punctuation!r}"
            )

    def __call__(self, text: str) -> str:
        text = unicodedata.normalize("NFKC", text).replace(SPACE_PIECE, " ")
        text = text.replace(ZERO_WIDTH_SPACE, " ")
        # control characters (NUL...) and invisible ones (a soft hyphen, a BOM, direction
        # marks) no tokenizer trains on, nor does a reader see; those that are spaces split.
        # ZWNJ and ZWJ stay: they spell Persian and Indic words, and emoji.
        text = "".join(
            c
            for c in text
            if c.isspace() or not (unicodedata.category(c) == "Cc" or c in INVISIBLE)
        )
        if self.case == "upper":
            text = text.upper()
        elif self.case == "lower":
            text = text.lower()
        if self.punctuation == "remove":
            text = _remove_punctuation(text)
        # Case mapping can decompose a character; recompose so that normalising is idempotent.
        return " ".join(unicodedata.normalize("NFKC", text).split())

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TextNormalizer:
        """Inverse of `to_dict`; unknown keys raise `ValueError`."""
        if not isinstance(data, dict):
            raise ValueError(f"TextNormalizer options must be a dict, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown TextNormalizer options: {sorted(unknown)}")
        return cls(**data)


def has_word_character(text: str) -> bool:
    """Whether `text` holds a letter or digit, which normalising never removes (U+02BC, a
    letter to Unicode, is an apostrophe here).

    >>> has_word_character("...\u02bc"), has_word_character("A.")
    (False, True)
    """
    return any(ch.isalnum() and ch not in _APOSTROPHES for ch in text)


def _remove_punctuation(text: str) -> str:
    """Replace punctuation by spaces, keeping apostrophes inside words.

    >>> _remove_punctuation("it's 'a' rock-n-roll")
    "it's  a  rock n roll"
    """
    out = []
    for i, ch in enumerate(text):
        # U+02BC is a letter (Lm) to unicodedata, an apostrophe to writers
        if not unicodedata.category(ch).startswith("P") and ch not in _APOSTROPHES:
            out.append(ch)
        elif ch in _APOSTROPHES and _inside_word(text, i):
            out.append("'")
        else:
            out.append(" ")
    return "".join(out)


def _inside_word(text: str, i: int) -> bool:
    def letter(ch: str) -> bool:
        return ch.isalnum() and ch not in _APOSTROPHES

    return 0 < i < len(text) - 1 and letter(text[i - 1]) and letter(text[i + 1])


class Tokenizer(abc.ABC):
    """Text <-> token ids with the fixed special ids; subclasses map the regular tokens."""

    kind: str
    blank_id: ClassVar[int] = BLANK_ID
    pad_id: ClassVar[int] = PAD_ID
    unk_id: ClassVar[int] = UNK_ID
    sos_id: ClassVar[int] = SOS_ID
    eos_id: ClassVar[int] = EOS_ID

    def __init__(self, normalizer: TextNormalizer) -> None:
        self.normalizer = normalizer

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special ones included."""

    @property
    def word_break(self) -> int | None:
        """The id of a token that is the space between words, where one is (SentencePiece
        marks a word's first piece instead): what joins two token lists as two texts."""
        return None

    @abc.abstractmethod
    def _encode_normalized(self, text: str) -> list[int]: ...

    @abc.abstractmethod
    def _decode_regular(self, ids: list[int]) -> str:
        """Text of regular (non-special) ids."""

    @abc.abstractmethod
    def _regular_piece(self, i: int) -> str: ...

    @abc.abstractmethod
    def _can_represent(self, ch: str) -> bool: ...

    @abc.abstractmethod
    def _save_files(self, out_dir: Path) -> dict[str, Any]:
        """Write any model files to `out_dir`; return the kind-specific JSON fields."""

    @classmethod
    @abc.abstractmethod
    def _from_json(cls, data: dict[str, Any], path: Path, normalizer: TextNormalizer) -> Tokenizer:
        """Build from the parsed fields of the tokenizer.json at `path`."""

    def encode(self, text: str) -> list[int]:
        """Normalise `text` and map it to ids (no sos/eos); unknown characters give `unk_id`."""
        return self._encode_normalized(self.normalizer(text))

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Text of `ids` (a list or a 1-D tensor), skipping every special id."""
        regular = [i for i in self._checked_ids(ids) if i >= NUM_SPECIAL]
        return " ".join(self._decode_regular(regular).split())

    def id_to_piece(self, i: int) -> str:
        """Printable piece of id `i`: `<blank>` etc. for special ids, `▁` for a space."""
        (i,) = self._checked_ids([i])
        return SPECIAL_PIECES[i] if i < NUM_SPECIAL else self._regular_piece(i)

    def pieces(self, ids: Sequence[int] | torch.Tensor) -> list[str]:
        """Pieces of every id, special ones included (labels for plots)."""
        return [self.id_to_piece(i) for i in self._checked_ids(ids)]

    def oov(self, text: str) -> list[str]:
        """Distinct characters of the normalised `text` that encode to `unk_id`, in order (the
        space too, where the vocabulary has none)."""
        chars = dict.fromkeys(self.normalizer(text))
        return [ch for ch in chars if not self._can_represent(ch)]

    def save(self, out_dir: str | os.PathLike) -> Path:
        """Write `tokenizer.json` (and model files) into `out_dir`; return the JSON path."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        data = {
            "kind": self.kind,
            "specials": list(SPECIAL_PIECES),
            "normalizer": self.normalizer.to_dict(),
            **self._save_files(out_dir),
        }
        path = out_dir / TOKENIZER_JSON
        encoded = (json.dumps(data, ensure_ascii=False, indent=1) + "\n").encode()  # fails first
        write_atomically(path, lambda partial: partial.write_bytes(encoded))
        return path

    @staticmethod
    def load(path: str | os.PathLike, option: str | None = None) -> Tokenizer:
        """Read a tokenizer saved by `save`; ValueError names a malformed file. `option`: the
        one that named `path`, said where nothing is there."""
        given = path
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_JSON
        try:
            data = _read_json_object(path)
        except FileNotFoundError as err:
            if option is None:
                raise
            raise FileNotFoundError(
                f"{option}: {given}: no tokenizer there (`asr tokenizer` writes one)"
            ) from err
        kind = data.get("kind")
        if kind not in _KINDS:
            raise ValueError(f"{path}: 'kind' must be one of {sorted(_KINDS)}, got {kind!r}")
        if data.get("specials") != list(SPECIAL_PIECES):
            raise ValueError(f"{path}: 'specials' must be {list(SPECIAL_PIECES)}")
        try:
            normalizer = TextNormalizer.from_dict(data.get("normalizer"))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: bad 'normalizer': {err}") from err
        return _KINDS[kind]._from_json(data, path, normalizer)

    def _checked_ids(self, ids: Sequence[int] | torch.Tensor) -> list[int]:
        if hasattr(ids, "ndim"):  # a tensor or array: tokenizing needs no torch import
            if ids.ndim != 1:
                raise ValueError(f"expected a 1-D tensor of ids, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        try:
            ids = [operator.index(i) for i in ids]
        except TypeError as err:
            raise ValueError(f"ids must be integers: {err}") from err
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids {bad[:5]} outside the vocabulary 0..{self.vocab_size - 1}")
        return ids

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, vocab_size={self.vocab_size})"


class CharTokenizer(Tokenizer):
    """One token per character; `chars[k]` gets id `4 + k` and the space is a token."""

    kind = "char"

    def __init__(self, chars: Sequence[str], normalizer: TextNormalizer = TextNormalizer()):
        super().__init__(normalizer)
        if any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise ValueError("CharTokenizer tokens must be single characters")
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer tokens must be distinct")
        self.chars = list(chars)
        self._ids = {c: NUM_SPECIAL + k for k, c in enumerate(self.chars)}

    @classmethod
    def train(
        cls, texts: Iterable[str], normalizer: TextNormalizer = TextNormalizer()
    ) -> CharTokenizer:
        """Vocabulary = the sorted characters of the normalised `texts`, plus the space."""
        chars = {" "}
        for text in texts:
            chars.update(normalizer(text))
        return cls(sorted(chars), normalizer)

    @property
    def vocab_size(self) -> int:
        return NUM_SPECIAL + len(self.chars)

    @property
    def word_break(self) -> int | None:
        return self._ids.get(" ")

    def _encode_normalized(self, text: str) -> list[int]:
        return [self._ids.get(ch, UNK_ID) for ch in text]

    def _decode_regular(self, ids: list[int]) -> str:
        return "".join(self.chars[i - NUM_SPECIAL] for i in ids)

    def _regular_piece(self, i: int) -> str:
        ch = self.chars[i - NUM_SPECIAL]
        return SPACE_PIECE if ch == " " else ch

    def _can_represent(self, ch: str) -> bool:
        return ch in self._ids

    def _save_files(self, out_dir: Path) -> dict[str, Any]:
        return {"vocab": self.chars}

    @classmethod
    def _from_json(cls, data: dict[str, Any], path: Path, normalizer: TextNormalizer) -> Tokenizer:
        vocab = data.get("vocab")
        if not isinstance(vocab, list):
            raise ValueError(f"{path}: 'vocab' must be a list of characters")
        try:
            return cls(vocab, normalizer)
        except ValueError as err:
            raise ValueError(f"{path}: bad 'vocab': {err}") from err


class SentencePieceTokenizer(Tokenizer):
    """SentencePiece BPE or unigram pieces, with the special ids built into the model."""

    def __init__(
        self,
        model: bytes,
        kind: str,
        normalizer: TextNormalizer = TextNormalizer(),
        source: str = "<memory>",
    ) -> None:
        super().__init__(normalizer)
        if kind not in ("bpe", "unigram"):
            raise ValueError(f"{source}: SentencePiece kind must be bpe|unigram, got {kind!r}")
        self.kind = kind
        self.model = model
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=model)
        except (RuntimeError, OSError, TypeError) as err:
            raise ValueError(f"{source}: not a SentencePiece model ({err})") from err
        specials = [self._sp.id_to_piece(i) for i in range(min(NUM_SPECIAL, self.vocab_size))]
        roles = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id())
        if specials != list(SPECIAL_PIECES) or roles != (PAD_ID, UNK_ID, SOS_ID):
            raise ValueError(f"{source}: model's first pieces {specials} are not {SPECIAL_PIECES}")

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        kind: str,
        vocab_size: int,
        normalizer: TextNormalizer = TextNormalizer(),
    ) -> SentencePieceTokenizer:
        """Train deterministically to exactly `vocab_size` ids, the special ones included."""
        sentences = [s for s in map(normalizer, texts) if s]
        if not sentences:
            raise ValueError("no non-empty training text for the tokenizer")
        # SentencePiece drops its reserved pieces from the texts it trains on.
        reserved = [p for p in SPECIAL_PIECES if any(p in sentence for sentence in sentences)]
        if reserved:
            raise ValueError(
                f"texts hold {', '.join(reserved)}, the name of a special token, which "
                f"SentencePiece cannot train on: remove or replace it in the texts (or train "
                "a char tokenizer)"
            )
        for k, sentence in enumerate(sentences):  # SentencePiece leaves them out unsaid
            if len(sentence.encode("utf-8")) > LONGEST_SENTENCE_BYTES:
                raise ValueError(
                    f"text {k + 1} ({sentence[:20]}...) is over {LONGEST_SENTENCE_BYTES} bytes, "
                    "more than SentencePiece trains on: split it, or train a char tokenizer"
                )
        minimum = NUM_SPECIAL + len(set("".join(sentences)) | {" "})
        if vocab_size > 2**31 - 1:  # SentencePiece's own error names no option
            raise ValueError(
                f"{kind} vocab_size {vocab_size} is too large: SentencePiece takes a 32-bit "
                f"size, at most {2**31 - 1}"
            )
        if vocab_size < minimum:
            raise ValueError(
                f"{kind} vocab_size {vocab_size} is too small for these texts: "
                f"{minimum - NUM_SPECIAL} characters (space included) + {NUM_SPECIAL} special ids "
                f"need at least {minimum}"
            )
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_writer=model,
                **_sentencepiece_options(kind, vocab_size),
            )
        except RuntimeError as err:
            raise _training_error(kind, vocab_size, err) from err
        return cls(model.getvalue(), kind, normalizer)

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def _encode_normalized(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def _decode_regular(self, ids: list[int]) -> str:
        return self._sp.decode(ids)

    def _regular_piece(self, i: int) -> str:
        return self._sp.id_to_piece(i)

    def _can_represent(self, ch: str) -> bool:
        return UNK_ID not in self._sp.encode(ch)

    def _save_files(self, out_dir: Path) -> dict[str, Any]:
        write_atomically(
            out_dir / SENTENCEPIECE_MODEL, lambda partial: partial.write_bytes(self.model)
        )
        return {"model": SENTENCEPIECE_MODEL, "vocab_size": self.vocab_size}

    @classmethod
    def _from_json(cls, data: dict[str, Any], path: Path, normalizer: TextNormalizer) -> Tokenizer:
        name = data.get("model")
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"{path}: 'model' must be a file name next to it, got {name!r}")
        model_path = path.parent / name
        if not model_path.is_file():
            raise ValueError(f"{path}: model file {model_path} not found")
        tokenizer = cls(model_path.read_bytes(), data["kind"], normalizer, source=str(model_path))
        if data.get("vocab_size") != tokenizer.vocab_size:
            raise ValueError(
                f"{path}: 'vocab_size' {data.get('vocab_size')!r} differs from the model's "
                f"{tokenizer.vocab_size}"
            )
        return tokenizer


_KINDS: dict[str, type[Tokenizer]] = {
    "char": CharTokenizer,
    "bpe": SentencePieceTokenizer,
    "unigram": SentencePieceTokenizer,
}
TOKENIZER_KINDS = tuple(_KINDS)


LONGEST_SENTENCE_BYTES = 1 << 20  # of one transcript, as SentencePiece trains on them


def _sentencepiece_options(kind: str, vocab_size: int) -> dict[str, Any]:
    """SentencePiece trainer options: our special ids, full coverage, deterministic."""
    return {
        "model_type": kind,
        "vocab_size": vocab_size,
        "character_coverage": 1.0,
        "normalization_rule_name": "identity",  # TextNormalizer has already run
        "control_symbols": [SPECIAL_PIECES[BLANK_ID]],  # fills the free id 0
        "pad_id": PAD_ID,
        "pad_piece": SPECIAL_PIECES[PAD_ID],
        "unk_id": UNK_ID,
        "unk_piece": SPECIAL_PIECES[UNK_ID],
        "bos_id": SOS_ID,
        "bos_piece": SPECIAL_PIECES[SOS_ID],
        "eos_id": -1,  # sos and eos are one token
        "hard_vocab_limit": True,
        "input_sentence_size": 0,  # use every sentence: no sampling
        "max_sentence_length": LONGEST_SENTENCE_BYTES,  # longer ones are refused first
        "num_threads": 1,
        "minloglevel": 2,
    }


def _training_error(kind: str, vocab_size: int, err: RuntimeError) -> ValueError:
    """Turn SentencePiece's "vocabulary size too high" into a ValueError naming the maximum."""
    found = re.search(r"value <= (\d+)", str(err))
    if found:
        return ValueError(
            f"{kind} vocab_size {vocab_size} is too large for these texts: "
            f"SentencePiece can build at most {found.group(1)}"
        )
    return ValueError(f"SentencePiece {kind} training failed: {err}")


def train_tokenizer(
    texts_or_manifests: str | os.PathLike | Iterable[str | os.PathLike],
    kind: str,
    vocab_size: int | None,
    out_dir: str | os.PathLike | None,
    normalizer: TextNormalizer = TextNormalizer(),
) -> Tokenizer:
    """Train a tokenizer on texts (`str`) or manifests (`os.PathLike`); save it unless None."""
    if kind not in _KINDS:
        raise ValueError(f"tokenizer kind must be one of {sorted(_KINDS)}, got {kind!r}")
    if isinstance(texts_or_manifests, (str, os.PathLike)):  # one manifest
        sources = [Path(texts_or_manifests)]
    else:
        sources = list(texts_or_manifests)
    texts = list(_iter_texts(sources))
    if not any(normalizer(text).strip() for text in texts):
        names = [str(item) for item in sources if isinstance(item, os.PathLike)]
        where = f"{', '.join(names)}: " if names else ""
        raise ValueError(f"{where}no text left after normalisation to train a tokenizer on")
    if kind == "char":
        tokenizer: Tokenizer = CharTokenizer.train(texts, normalizer)
    elif vocab_size is None:
        raise ValueError(f"a {kind} tokenizer needs a vocab_size")
    else:
        tokenizer = SentencePieceTokenizer.train(texts, kind, vocab_size, normalizer)
    if out_dir is not None:
        tokenizer.save(out_dir)
    return tokenizer


def _iter_texts(sources: Iterable[str | os.PathLike]) -> Iterable[str]:
    for item in sources:
        if isinstance(item, os.PathLike):
            yield from read_manifest_texts(item)
        elif isinstance(item, str):
            yield item
        else:
            raise ValueError(f"expected a text or a manifest path, got {type(item).__name__}")


def read_manifest_texts(path: str | os.PathLike) -> list[str]:
    """The "text" field of every line of a JSON Lines manifest."""
    texts = []
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()  # \n, \r\n or \r, as manifests are read for training
    except OSError as error:
        raise ValueError(f"{path}: {unreadable(error, 'manifest')}") from None
    for lineno, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}:{lineno}: not valid UTF-8 ({err.reason})") from None
        if not line.strip():
            continue
        try:
            entry = json_line(line)
        except ValueError as err:
            raise ValueError(f"{path}:{lineno}: {err}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str):
            raise ValueError(f'{path}:{lineno}: expected an object with a string "text"')
        problem = surrogate_problem(entry["text"])
        if problem:
            raise ValueError(f"{path}:{lineno}: {problem}")
        texts.append(entry["text"])
    return texts


def unreadable(error: OSError, what: str) -> str:
    """Why a file (`what`: "manifest"...) cannot be read, for a message that names it."""
    if isinstance(error, FileNotFoundError):
        return f"{what} not found"
    if isinstance(error, IsADirectoryError):
        return f"is a directory, not a {what}"
    return f"cannot read {what} ({error.strerror})"


def json_line(line: str) -> Any:
    """A manifest line's JSON value; ValueError `invalid JSON: why` for any line Python's
    reader refuses (a number past 4300 digits, nesting past its depth too)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"invalid JSON: {error.msg} (column {error.colno})") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise ValueError(f"invalid JSON: {error}") from None
    except RecursionError:
        raise ValueError("invalid JSON: nested deeper than the reader goes") from None


def surrogate_problem(text: str, key: str = "text") -> str | None:
    r"""What is wrong with a text (the field `key`) holding a lone surrogate (JSON's `"\ud800"`
    escape), which is no character and cannot be written as UTF-8; None for a good text.

    >>> surrogate_problem("ok"), surrogate_problem("A\ud800")
    (None, "'text' holds \\ud800 at 2, half of a surrogate pair and not a character")
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        code = f"\\u{ord(text[err.start]):04x}"
        where = f"at {err.start + 1}, half of a surrogate pair and not a character"
        return f"{key!r} holds {code} {where}"
    return None


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        hint = f" (a tokenizer is its folder, or its {TOKENIZER_JSON})"
        raise ValueError(f"{path}: not UTF-8 text{hint * (path.name != TOKENIZER_JSON)}") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: invalid JSON: {err.msg}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def first_difference(ours: Sequence[str], theirs: Sequence[str]) -> int | None:
    """The first token id whose pieces differ in two vocabularies (the shorter one's size where
    it is the start of the other), or None where they are the same.

    >>> first_difference(["<pad>", "A"], ["<pad>", "a"]), first_difference(["x"], ["x", "y"])
    (1, 1)
    """
    for index, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return index
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def tokenizer_difference(saved: Tokenizer, given: Tokenizer) -> str | None:
    """How `given` encodes otherwise than `saved`, or None where they encode alike.

    >>> tokenizer_difference(CharTokenizer.train(["AB"]), CharTokenizer.train(["BA"]))
    >>> tokenizer_difference(CharTokenizer.train(["AB"]), CharTokenizer.train(["AC"]))
    "id 6 is 'B' there, 'C' here"
    """
    if saved.kind != given.kind:
        return f"{saved.kind} there, {given.kind} here"
    if saved.vocab_size != given.vocab_size:
        return f"{saved.vocab_size} ids there, {given.vocab_size} here"
    then, now = saved.pieces(range(saved.vocab_size)), given.pieces(range(given.vocab_size))
    i = first_difference(then, now)  # the sizes are equal
    if i is not None:
        return f"id {i} is {then[i]!r} there, {now[i]!r} here"
    then, now = saved.normalizer.to_dict(), given.normalizer.to_dict()
    if then != now:
        return f"text normalised as {then} there, {now} here"
    return None
