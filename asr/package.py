"""The model package: a recognizer checkpoint as a folder of files to share on the Hub
(model.safetensors, config.json, tokenizer/, assets, README.md), and reading either form
(`.ckpt`, package folder or `hf://owner/name[@rev]`) without unpickling."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from asr.checkpoint import (
    RECOGNIZER_KEY,
    CheckpointError,
    payload_tokenizer,
    read_payload,
    refuse_non_finite,
    replace_assets,
    submodule_weights,
    weights_digest,
    write_embedded_files,
)
from asr.text import Tokenizer

log = logging.getLogger(__name__)

PACKAGE_FORMAT = "asr-model-package"
PACKAGE_VERSION = 1  # readers refuse newer ones
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizer"
MAX_SIDE_FILE = 256 * 2**20  # bytes: tokenizers and CMVN statistics are far smaller
CARD_FILE = "README.md"
ONNX_DIR = "onnx"  # the ONNX Runtime graphs of `asr export --format onnx`
HUB_TIMEOUT = 10.0  # seconds the Hub has to say which commit a name is, before the cache
RESERVED = (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_DIR, CARD_FILE)
# Loading a pickle can run code, so packages never hold these.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
FILE_ENTRIES = ("model_config", "tokenizer", "assets")
HF_PREFIX = "hf://"
HF_ADDRESS = re.compile(r"hf://([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)(?:@([\w./-]+))?")  # the Hub's
ALIASES = "asr.aliases"  # safetensors metadata: {name: kept name} of tied weights


def is_package(path: str | os.PathLike) -> bool:
    """Whether `path` names a package (a folder, or `hf://...`) rather than a checkpoint file."""
    return str(path).startswith(HF_PREFIX) or (str(path) != "" and Path(path).is_dir())


def folder_refusal(path: str | os.PathLike, package_advice: str) -> str | None:
    """Why `path` names no checkpoint file (None where it may): a package, then
    `package_advice`, or another folder, such as a training run's."""
    if not is_package(path):
        return None
    if str(path).startswith(HF_PREFIX) or _holds_package(Path(path)):
        return f"{path}: a model package; {package_advice}"
    return f"{path}: a folder, not a checkpoint (give its .ckpt file) or model package"


def read_recognizer(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The `Seq2Seq` weights and the payload of a checkpoint, package folder or `hf://` name."""
    if not str(path):  # Path("") is ".", which would read as the working folder
        raise FileNotFoundError("no model named: give a checkpoint, package folder or hf:// name")
    if is_package(path):
        return read_package(path)
    state, payload = read_payload(path, RECOGNIZER_KEY)
    weights = submodule_weights(state, "model.")
    refuse_non_finite(weights, path)
    return weights, payload


@dataclass(frozen=True)
class ModelCard:
    """What the model card says beyond what the checkpoint holds."""

    repo_id: str | None = None  # "owner/name" on the Hub
    license: str = "other"
    data: str | None = None  # None: the manifests the run read
    training_command: str | None = None
    metrics: Sequence[str | os.PathLike] = ()  # `asr evaluate` metrics.json files
    parameters: int | None = None
    onnx: bool = False  # the package holds ONNX Runtime graphs too (asr export --format onnx)


def check_repo_id(repo_id: str) -> None:
    """ValueError unless `repo_id` is an owner/name the Hub, and so hf://, takes."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not HF_ADDRESS.fullmatch(f"hf://{repo_id}"):
        raise ValueError(f"{repo_id!r} is not owner/name")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(str(err)) from None


def _remove(path: Path) -> None:
    """`path` gone: a folder with its files, a file, or a link (never what it leads to)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def write_package(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    decoding: dict[str, Any] | None = None,
    card: ModelCard | None = None,
) -> list[str]:
    """Write `checkpoint` as a package into `out_dir`; return the files written."""
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise NotADirectoryError(f"{out_dir}: a file; a package is a folder (give a new name)")
    state, payload = read_payload(checkpoint, RECOGNIZER_KEY)
    if decoding is not None:
        payload = payload | {"decoding": dict(decoding)}
    out = Path(out_dir)
    assets = _asset_names(payload.get("assets", {}))
    config = _package_config(payload, assets)
    # Fail (bad metrics file, shared weights) before writing any file.
    card = card or ModelCard()
    if card.repo_id is not None:
        check_repo_id(card.repo_id)  # else the card's hf:// examples would be refused
    card_text = model_card(config, payload, state, card, out.resolve().name, checkpoint)
    weights = _safetensors_bytes(submodule_weights(state, "model."))
    graphs, tokenizer_dir = out / ONNX_DIR, out / TOKENIZER_DIR
    written = [graphs, tokenizer_dir, *(out / name for name in (*assets.values(), *RESERVED))]
    there = [path for path in dict.fromkeys(written) if path.exists() or path.is_symlink()]
    if there and not _holds_package(out):  # an earlier export's are replaced, others' kept
        raise ValueError(
            f"{', '.join(map(str, there))} there, and {out} holds no package: export into "
            "another folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    _remove(graphs)  # of other weights
    for original, name in assets.items():
        _write_atomic(out / name, base64.b64decode(payload["assets"][original]))
    _remove(tokenizer_dir)  # a link to another folder's tokenizer too: this one's is written
    tokenizer_dir.mkdir()
    write_embedded_files(payload["tokenizer"], tokenizer_dir)
    _write_atomic(out / CONFIG_FILE, (json.dumps(config, indent=1) + "\n").encode())
    _write_atomic(out / WEIGHTS_FILE, weights)
    _write_atomic(out / CARD_FILE, card_text.encode())
    tokenizer_files = sorted(f"{TOKENIZER_DIR}/{p.name}" for p in tokenizer_dir.iterdir())
    return [WEIGHTS_FILE, CONFIG_FILE, *tokenizer_files, *assets.values(), CARD_FILE]


def _asset_names(assets: dict[str, str]) -> dict[str, str]:
    """Original path -> the file name in the package: its base name, made unique."""
    names: dict[str, str] = {}
    for i, original in enumerate(assets):
        name = Path(original).name
        if name in RESERVED or name in names.values():
            name = f"asset{i}_{name}"
        names[original] = name
    return names


def _package_config(payload: dict[str, Any], assets: dict[str, str]) -> dict[str, Any]:
    config = {"format": PACKAGE_FORMAT, "format_version": PACKAGE_VERSION}
    config["model_config"] = replace_assets(payload["model_config"], assets)
    config["assets"] = list(assets.values())
    config.update({k: v for k, v in payload.items() if k not in FILE_ENTRIES})
    return config


def _safetensors_bytes(weights: dict[str, torch.Tensor]) -> bytes:
    """The weights as safetensors; tied tensors are stored once, with aliases."""
    from safetensors.torch import save

    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in weights.items():
        view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape)
        view += (tensor.stride(), tensor.dtype)
        if view in seen:
            aliases[name] = seen[view]
            continue
        seen[view] = name
        kept[name] = tensor
    # Tensors that overlap without being the same view are copied: safetensors shares nothing.
    storages = [t.untyped_storage().data_ptr() for t in kept.values()]
    kept = {
        k: t.clone() if storages.count(s) > 1 else t.contiguous()
        for (k, t), s in zip(kept.items(), storages)
    }
    return save(kept, metadata={"format": "pt", ALIASES: json.dumps(aliases)})


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_package(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The weights and payload of a package folder or `hf://owner/name[@revision]`."""
    folder = resolve_package(path)
    config = _read_config(folder)
    tokenizer = folder / TOKENIZER_DIR
    if not tokenizer.is_dir():
        raise CheckpointError(f"{folder}: no {TOKENIZER_DIR}/ folder in the model package")
    payload = {k: v for k, v in config.items() if k not in ("format", "format_version")}
    files = [p for p in tokenizer.iterdir() if not p.is_dir()]  # not Jupyter's checkpoints
    for file in files:  # a SentencePiece model is stored in LFS too
        refuse_lfs_pointer(file)
    payload["tokenizer"] = {p.name: _encoded(p) for p in files}
    payload["assets"] = {name: _encoded_asset(folder, name) for name in config.get("assets", [])}
    Tokenizer.load(tokenizer)  # a damaged file named as the package holds it
    return read_safetensors(_weights_file(folder)), payload


def resolve_package(path: str | os.PathLike) -> Path:
    """The local folder of a package: `path`, or the Hub snapshot (cached when offline)."""
    text = str(path)
    if not text.startswith(HF_PREFIX):
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"{path}: no such model package folder")
        return folder
    from huggingface_hub import HfApi, constants, snapshot_download

    match = HF_ADDRESS.fullmatch(text)
    named = "a Hub model is named hf://owner/name or hf://owner/name@revision"
    if not match:
        raise ValueError(f"{text}: {named}")
    repo_id, revision = match.groups()
    try:
        check_repo_id(repo_id)
    except ValueError as err:
        raise ValueError(f"{text}: {named} ({err})") from None
    fetch = partial(snapshot_download, repo_id, ignore_patterns=_pickle_patterns())
    if constants.HF_HUB_OFFLINE:
        error: Exception = OSError("HF_HUB_OFFLINE is set and the cache does not hold it")
    else:
        try:  # huggingface_hub asks this with no time limit: a silent network hung for good
            commit = HfApi().repo_info(repo_id, revision=revision, timeout=HUB_TIMEOUT).sha
            snapshot = Path(fetch(revision=commit))
            _remember_revision(snapshot, revision or "main", commit)
            return snapshot
        except Exception as err:  # noqa: BLE001 - unreachable, silent or refusing: try the cache
            error = err
    try:
        return Path(fetch(revision=revision, local_files_only=True))
    except OSError:
        raise CheckpointError(
            f"{text}: cannot fetch the model package ({error}); fetched once with network access "
            "it is found in the Hugging Face cache (HF_HUB_OFFLINE=1 too), or give a local "
            "package folder"
        ) from None


def _remember_revision(snapshot: Path, revision: str, commit: str) -> None:
    """Record in the cache that `revision` is `commit` (refs/<revision>), as a fetch by name
    does: huggingface_hub records nothing for a fetch by commit, and the model was then not
    found offline by its name."""
    ref = snapshot.parent.parent / "refs" / revision
    if revision == commit or (ref.is_file() and ref.read_text() == commit):
        return
    scratch = ref.with_name(f".{ref.name}.{os.getpid()}")
    try:  # whole or not at all: other processes may be reading it
        ref.parent.mkdir(parents=True, exist_ok=True)
        scratch.write_text(commit)
        os.replace(scratch, ref)
    except OSError:  # a cache this user cannot write: the model still loads online
        scratch.unlink(missing_ok=True)


def refuse_lfs_pointer(path: Path) -> None:
    """CheckpointError where `path` is the pointer file of a Hub repository cloned without
    git-lfs (weights, ONNX graphs and SentencePiece models are stored in LFS), not the file."""
    if path.is_file():  # else said as missing, where it is read
        with open(path, "rb") as f:
            if f.read(64).startswith(b"version https://git-lfs"):
                raise CheckpointError(
                    f"{path}: a Git LFS pointer, not the file: fetch it (`git lfs pull` in the "
                    "clone, or load the model as hf://owner/name)"
                )


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, tied names restored; pickles and non-finite values
    are refused."""
    from safetensors import SafetensorError, safe_open

    with open(path, "rb") as f:
        head = f.read(9)
    # safetensors: an 8-byte little-endian header length, then the JSON header. Only when the
    # file is not that are its first bytes read as pickle protocol >= 2 or torch.save's zip
    # (the length's low byte can be 0x80 too). safe_open never unpickles; this names the file.
    safetensors = len(head) == 9 and head[8:] == b"{"
    refuse_lfs_pointer(path)
    if not safetensors and (head[:1] == b"\x80" or head[:4] == b"PK\x03\x04"):
        raise CheckpointError(
            f"{path}: refused to load: it is a pickle (torch.save) file, not safetensors, and "
            "loading a pickle can run code"
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get(ALIASES, "{}"))
            weights = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, ValueError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
    if not isinstance(aliases, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k not in weights for k, v in aliases.items()
    ):
        raise CheckpointError(
            f"{path}: its {ALIASES} metadata is not a mapping of tied names to stored ones"
        )
    gone = sorted(set(aliases.values()) - set(weights))
    if gone:
        raise CheckpointError(f"{path}: its tied weights name tensors it does not hold: {gone}")
    refuse_non_finite(weights, path)  # before the tied names: each tensor once
    weights.update({name: weights[kept] for name, kept in aliases.items()})
    return weights


def _holds_package(folder: Path) -> bool:
    """Whether `folder` holds a package's config (of any format version)."""
    try:
        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and config.get("format") == PACKAGE_FORMAT


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{folder}: no {CONFIG_FILE}, so not a model package (`asr export --checkpoint CKPT "
            "--out DIR` writes one); a checkpoint is given as its .ckpt file"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(config, dict) or config.get("format") != PACKAGE_FORMAT:
        raise CheckpointError(
            f"{path}: not an asr model package config (no format: asr-model-package)"
        )
    version = config.get("format_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise CheckpointError(f"{path}: format_version {version!r} is not a whole number")
    if version > PACKAGE_VERSION:
        raise CheckpointError(
            f"{path}: package format {config['format_version']} is newer than this asr reads "
            f"({PACKAGE_VERSION}): upgrade asr"
        )
    if not isinstance(config.get("model_config"), dict):
        raise CheckpointError(f"{path}: no model_config, which builds the network")
    if not isinstance(config.get("assets", []), list):
        raise CheckpointError(f"{path}: assets is {config['assets']!r}, not a list of file names")
    return config


def _weights_file(folder: Path) -> Path:
    path = folder / WEIGHTS_FILE
    if path.is_file():
        return path
    if path.is_symlink():  # an hf:// snapshot's file links into the cache's blobs
        raise CheckpointError(f"{path}: missing (a broken link)")
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"{folder}: refused to load {', '.join(pickles)}: pickled weights can run code when "
            f"loaded; a model package holds its weights as {WEIGHTS_FILE} only"
        )
    raise CheckpointError(f"{folder}: no {WEIGHTS_FILE} in the model package")


def _encoded_asset(folder: Path, name: str) -> str:
    """The asset file `name` (a file name, never a path) of the package, base64."""
    if not isinstance(name, str) or Path(name).name != name or name in RESERVED + ("", ".."):
        raise CheckpointError(f"{folder / CONFIG_FILE}: {name!r} is not an asset file name")
    path = folder / name
    if not path.exists():
        raise CheckpointError(f"{path}: missing from the model package (config.json names it)")
    return _encoded(path)


def _encoded(path: Path) -> str:
    """A tokenizer or asset file of a package, base64; CheckpointError where it is no regular
    file (a pipe would hang the read, a device never end it) or is larger than such files are."""
    if not path.exists():  # links are followed: an hf:// snapshot's files link into its cache
        raise CheckpointError(f"{path}: missing (a broken link)")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a regular file (a folder, pipe or device)")
    if path.stat().st_size > MAX_SIDE_FILE:
        raise CheckpointError(
            f"{path}: {path.stat().st_size} bytes, more than a tokenizer or statistics file holds"
        )
    return base64.b64encode(path.read_bytes()).decode()


def _pickle_patterns() -> list[str]:
    return [f"*{suffix}" for suffix in PICKLE_SUFFIXES]


def model_card(
    config: dict[str, Any],
    payload: dict[str, Any],
    state: dict[str, Any],
    card: ModelCard,
    folder_name: str,
    checkpoint: str | os.PathLike | None = None,
) -> str:
    """The package's README.md: Hub metadata, then use, decoding, data, results, training;
    `checkpoint`: the one exported, which the results are to score."""
    where = f"hf://{card.repo_id}" if card.repo_id else f"{folder_name}/"
    weights = weights_digest(submodule_weights(state, "model."))
    sections = [
        _front_matter(card.license),
        f"# {card.repo_id or folder_name}\n\n{_summary(config, payload, card.parameters)}",
        _usage(where),
        _decoding_section(config),
        "## Data\n\n" + (card.data or _recorded_data(state)),
        "## Results\n\n" + _results(card.metrics, checkpoint, weights),
        "## Training\n\n" + _training(card.training_command, state),
        f"## Licence\n\n`{card.license}`. The licence of the training data applies too.",
        _files_section(config, card.onnx),
    ]
    return "\n\n".join(sections) + "\n"


def _front_matter(licence: str) -> str:
    tags = "\n".join(f"- {tag}" for tag in ("automatic-speech-recognition", "asr", "pytorch"))
    return (
        f"---\nlicense: {licence}\nlibrary_name: asr\npipeline_tag: automatic-speech-recognition"
        f"\ntags:\n{tags}\n---"
    )


def _summary(config: dict[str, Any], payload: dict[str, Any], parameters: int | None) -> str:
    model = config["model_config"]
    parts = [_class_name(model.get(k)) for k in ("encoder", "decoder")]
    ctc = " with joint CTC" if model.get("ctc_weight", 0) > 0 else ""
    tokenizer = payload_tokenizer(payload)
    size = f" ({parameters / 1e6:.2f} M parameters)" if parameters is not None else ""
    return (
        f"An attention-based speech recognizer trained with the `asr` toolkit: a {parts[0]} "
        f"and a {parts[1]}{ctc}{size}, and a {tokenizer.kind} tokenizer of "
        f"{tokenizer.vocab_size} tokens."
    )


def _class_name(part: Any) -> str:
    """The class name of a config part: `{"class_path": "a.b.Name"}` -> `Name`."""
    if isinstance(part, dict) and "class_path" in part:
        return str(part["class_path"]).rsplit(".", 1)[-1]
    return "custom"


def _usage(where: str) -> str:
    return (
        "## Use\n\n```bash\n"
        f"asr transcribe audio.wav --model {shlex.quote(where)}   # prints [start --> end] text\n"
        "```\n\n```python\nimport asr\n\n"
        f"model = asr.load_model({json.dumps(where)})\n"
        'print(model.transcribe("audio.wav").text)\n```'
    )


def _decoding_section(config: dict[str, Any]) -> str:
    decoding = config.get("decoding")
    text = "## Decoding defaults\n\n"
    if decoding is None:
        text += "None stored: those of `asr.SearchOptions` and `asr.Recognizer.default_options`."
    else:
        rows = "\n".join(f"| {k} | {json.dumps(v)} |" for k, v in decoding.items())
        text += "| setting | value |\n|---|---|\n" + rows
    if config.get("segment_seconds") is not None:
        text += (
            f"\n\nLong audio is cut at silences into segments of at most "
            f"{config['segment_seconds']:g} s (95% of the training utterances are shorter)."
        )
    return text


def _recorded_data(state: dict[str, Any]) -> str:
    data = state.get("datamodule_hyper_parameters") or {}
    manifests = {k: data.get(f"{k}_manifest") for k in ("train", "val")}
    listed = [f"- {k}: `{v}`" for k, v in manifests.items() if v]
    if not listed:
        return "Not recorded (`asr export --data`)."
    return "The manifests the training run read:\n\n" + "\n".join(listed)


def _training(command: str | None, state: dict[str, Any]) -> str:
    text = f"```bash\n{command}\n```" if command else "Command not recorded."
    if state.get("averaged_from"):  # its step count is that of the first one averaged
        count = len(state["averaged_from"])
        return text + f"\n\nThe weights are the average of {count} checkpoints."
    if "global_step" in state:
        return text + f"\n\nThe checkpoint was saved after {state['global_step']} optimizer steps."
    return text


def _files_section(config: dict[str, Any], onnx: bool = False) -> str:
    files = [
        f"- `{WEIGHTS_FILE}`: the weights (safetensors: loading them runs no code)",
        f"- `{CONFIG_FILE}`: model config, decoding defaults",
        f"- `{TOKENIZER_DIR}/`: the tokenizer",
        *(
            f"- `{name}`: a file the model config names (CMVN statistics)"
            for name in config["assets"]
        ),
        *(
            [f"- `{ONNX_DIR}/`: the ONNX Runtime graphs (`--backend onnx`, `onnx-int8`)"]
            if onnx
            else []
        ),
    ]
    return "## Files\n\n" + "\n".join(files)


RESULTS_HEADER = (
    "| dataset | Snt | Wrd | Corr | Sub | Del | Ins | Err | S.Err |\n" + "|---" * 9 + "|"
)


def results_row(name: str, metrics: dict[str, Any], unit: str) -> str:
    """An ESPnet results row of `unit` ("word" or "char") from `asr evaluate`'s metrics.

    >>> m = {"utterances": 4, "sentence_errors": 1, "reference_words": 20, "substitutions": 1,
    ...      "deletions": 1, "insertions": 2}
    >>> results_row("decode_test", m, "word")
    '| decode_test | 4 | 20 | 90.0 | 5.0 | 5.0 | 10.0 | 20.0 | 25.0 |'
    """
    prefix = "" if unit == "word" else "char_"
    ref = metrics["reference_words" if unit == "word" else "reference_characters"]
    if not ref or not metrics["utterances"]:
        raise ValueError(f"{name}: no reference {unit}s scored")
    sub, dele, ins = (metrics[f"{prefix}{e}"] for e in ("substitutions", "deletions", "insertions"))
    pct = [100 * x / ref for x in (ref - sub - dele, sub, dele, ins, sub + dele + ins)]
    pct.append(100 * metrics["sentence_errors"] / metrics["utterances"])
    return (
        f"| {name} | {metrics['utterances']} | {ref} | "
        + " | ".join(f"{x:.1f}" for x in pct)
        + " |"
    )


def results_tables(
    paths: Sequence[str | os.PathLike],
    checkpoint: str | os.PathLike | None = None,
    weights: str | None = None,
) -> str:
    """The decoding settings, scored checkpoint and WER/CER tables of `asr evaluate`
    metrics.json files, each named by its folder (`decode_test`); a warning for those that
    scored another model than `checkpoint`, the one exported, whose `weights_digest` is
    `weights` (else told by the checkpoint's name)."""
    settings, rows = [], {"word": [], "char": []}
    for path in map(Path, paths):
        try:
            metrics = json.loads(path.read_text(encoding="utf-8"))
            name = path.absolute().parent.name  # metrics.json in the working folder has one too
            search = metrics["search"]
            decoding = f"beam {search['beam_size']}, ctc {search['ctc_weight']}"
            if search.get("lm_weight"):  # the LM is not in the package: named, to be found
                lm = f" (`{metrics['lm']}`)" if metrics.get("lm") else ""
                decoding += f", LM {search['lm_weight']}{lm}"
            decoding += _not_as_trained(metrics)
            line = f"- {name}: {decoding}; `{metrics.get('manifest', '?')}`"
            scored = metrics.get("checkpoint"), metrics.get("weights")
            settings.append(line + _scored(path, *scored, checkpoint, weights))
            for unit in rows:
                rows[unit].append(results_row(name, metrics, unit))
        except (OSError, ValueError, KeyError, TypeError) as err:  # JSONDecodeError included
            raise ValueError(f"{path}: not an `asr evaluate` metrics.json ({err!r})") from None
    return (
        "\n".join(settings)
        + f"\n\n### WER\n\n{RESULTS_HEADER}\n"
        + "\n".join(rows["word"])
        + f"\n\n### CER\n\n{RESULTS_HEADER}\n"
        + "\n".join(rows["char"])
    )


def _not_as_trained(metrics: dict[str, Any]) -> str:
    """The card's words for how an `asr evaluate` ran the model other than as trained (fp32
    PyTorch at full context), each of which changes its WER: `, onnx-int8, chunks of 160 ms`."""
    said = [metrics.get("backend"), metrics.get("precision")]
    said = [str(x) for x in said if x not in (None, "torch", "fp32")]
    if metrics.get("chunk_ms"):
        said.append(f"chunks of {metrics['chunk_ms']} ms")
    return "".join(f", {x}" for x in said)


def _scored(
    path: Path,
    scored: str | None,
    scored_weights: str | None,
    exported: str | os.PathLike | None,
    weights: str | None,
) -> str:
    """The card's words for the checkpoint that metrics file `path` scored; a warning where it
    is not the one `exported` (a WER of other weights would be claimed for this model): told
    by the weights' digests where both are known, else by name."""
    if not isinstance(scored, str) or not scored:
        return ""  # not recorded
    if isinstance(scored_weights, str) and weights is not None:
        same = scored_weights == weights
    else:
        same = exported is None or _same_model(scored, exported, path)
    if same:
        return f", scored on `{scored}`"
    log.warning(
        "%s: scored %s, not %s, the checkpoint exported: its WER is another model's",
        path,
        scored,
        exported,
    )
    return f", scored on `{scored}`, not on the checkpoint exported (`{exported}`)"


def _same_model(scored: str, exported: str | os.PathLike, metrics: Path) -> bool:
    """Whether `scored`, the model a metrics file names (a file, package folder or hf://
    name), is `exported`. A relative name is of the folder `asr evaluate` ran in: this one, or
    one above the metrics file."""
    if scored.startswith(HF_PREFIX) or str(exported).startswith(HF_PREFIX):
        return scored == str(exported)
    recorded, target = Path(scored).expanduser(), Path(exported).expanduser()
    places = [recorded]
    if not recorded.is_absolute():
        places += [folder / recorded for folder in metrics.resolve().parents]
    there = [place for place in places if place.exists()]
    if there and target.exists():
        return any(os.path.samefile(place, target) for place in there)
    if not there:  # gone from where it was scored (a run moved): taken for the same by name
        return recorded.name == target.name
    return recorded.resolve() == target.resolve()


def _results(
    metrics: Sequence[str | os.PathLike],
    checkpoint: str | os.PathLike | None = None,
    weights: str | None = None,
) -> str:
    if not metrics:
        return "None given (`asr export --metrics exp/.../decode_test/metrics.json`)."
    return results_tables(metrics, checkpoint, weights)
