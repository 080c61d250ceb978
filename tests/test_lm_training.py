"""Language model training with the `asr fit` tooling: the text data module, the loss, and a
tiny end-to-end run on AN4 transcripts whose checkpoint `load_lm` turns into a search LM."""

from __future__ import annotations

import csv
import json
import logging
import math
import shutil
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, corpus_path

from asr.checkpoint import CheckpointError
from asr.cli import main
from asr.data.manifest import Utterance, read_manifest, write_manifest
from asr.data.prepare import prepare_corpus
from asr.lm import LMModule, TextDataModule, collate_text
from asr.loading import load_lm
from asr.models.lm import LSTMLM
from asr.models.transformer import TransformerDecoder
from asr.search import SearchOptions, beam_search
from asr.text import SOS_EOS_ID, CharTokenizer, train_tokenizer

TRAIN = ["YES", "NO NO", "GO", "ONE TWO THREE", "SEVEN", "ENTER", "NINE", "YES YES NO"]
DEV = ["ONE", "NO GO"]


@pytest.fixture
def text_data(tmp_path) -> dict[str, str]:
    """Manifests (audio is never read), an extra text file and a character tokenizer."""

    def manifest(name: str, texts: list[str]) -> str:
        utts = [
            Utterance(f"/none/{name}{i}.wav", 1.0, t, id=f"{name}{i}") for i, t in enumerate(texts)
        ]
        write_manifest(tmp_path / f"{name}.jsonl", utts)
        return str(tmp_path / f"{name}.jsonl")

    (tmp_path / "extra.txt").write_text("THREE TWO ONE\n\n  ENTER NINE  \n", encoding="utf-8")
    CharTokenizer.train(TRAIN + DEV + ["THREE"]).save(tmp_path / "tokenizer")
    return {
        "train_manifest": manifest("train", TRAIN),
        "val_manifest": manifest("dev", DEV),
        "tokenizer": str(tmp_path / "tokenizer"),
        "extra": str(tmp_path / "extra.txt"),
    }


def batches_of(data: TextDataModule, split: str) -> list:
    loader = data.train_dataloader() if split == "train" else data.val_dataloader()
    return list(loader)


def test_a_missing_tokenizer_is_named_by_its_option(text_data, tmp_path) -> None:
    """As the recognizer's data: a bare `[Errno 2]` and a path named no option."""
    with pytest.raises(FileNotFoundError, match=rf"^data.tokenizer: {tmp_path}: no tokenizer"):
        TextDataModule(text_data["train_manifest"], text_data["val_manifest"], tmp_path)


def test_train_batches_hold_every_sentence_once_within_the_budget(text_data) -> None:
    data = TextDataModule(
        text_data["train_manifest"],
        text_data["val_manifest"],
        text_data["tokenizer"],
        extra_text=[text_data["extra"]],
        max_batch_tokens=24,
    )
    data.setup("fit")
    seen = Counter()
    for batch in batches_of(data, "train"):
        assert batch.inputs.shape == batch.targets.shape
        if len(batch) > 1:
            assert batch.inputs.numel() <= 24, "padded tokens stay within max_batch_tokens"
        for inputs, targets, n in zip(batch.inputs, batch.targets, batch.lens.tolist()):
            assert inputs[0] == SOS_EOS_ID and targets[n - 1] == SOS_EOS_ID
            assert torch.equal(inputs[1:n], targets[: n - 1]), "targets are inputs shifted by one"
            assert (inputs[n:] == data.tokenizer.pad_id).all()
            seen[data.tokenizer.decode(targets[: n - 1])] += 1
    expected = Counter(TRAIN + ["THREE TWO ONE", "ENTER NINE"])  # blank lines skipped
    assert seen == expected
    assert data.vocab_size == data.tokenizer.vocab_size
    one = TextDataModule(
        *(text_data[k] for k in ("train_manifest", "val_manifest", "tokenizer")),
        extra_text=text_data["extra"],
    )  # one file, as `--data.extra_text F`
    one.setup("fit")
    assert one.datasets["train"] == data.datasets["train"]


def test_out_of_vocabulary_text_is_rejected_with_its_line_or_skipped(text_data) -> None:
    Path(text_data["extra"]).write_text("YES\nYES QUIZ\n", encoding="utf-8")
    args = (text_data["train_manifest"], text_data["val_manifest"], text_data["tokenizer"])
    strict = TextDataModule(*args, extra_text=[text_data["extra"]])
    with pytest.raises(ValueError, match=r"extra\.txt:2: 'QUZ'"):
        strict.setup("fit")
    lenient = TextDataModule(*args, extra_text=[text_data["extra"]], skip_bad=True)
    lenient.setup("fit")
    assert len(lenient.datasets["train"]) == len(TRAIN) + 1


def test_extra_text_lines_are_those_an_editor_counts(text_data) -> None:
    """A line separator (U+2028) or form feed within a line ends no sentence, and errors
    name the line as `wc -l` counts it."""
    Path(text_data["extra"]).write_text("YES\u2028YES\x0cYES\nYES QUIZ\n", encoding="utf-8")
    args = (text_data["train_manifest"], text_data["val_manifest"], text_data["tokenizer"])
    with pytest.raises(ValueError, match=r"extra\.txt:2: 'QUZ'"):
        TextDataModule(*args, extra_text=[text_data["extra"]]).setup("fit")
    lenient = TextDataModule(*args, extra_text=[text_data["extra"]], skip_bad=True)
    lenient.setup("fit")
    assert len(lenient.datasets["train"]) == len(TRAIN) + 1


def test_extra_text_reads_past_a_byte_order_mark_and_leaves_out_punctuation(text_data, caplog):
    """A BOM read as text made the first line out of vocabulary; a line of punctuation alone
    became an empty sentence, teaching the LM to end at once."""
    Path(text_data["extra"]).write_bytes("\ufeffYES\r\n* * *\r\n".encode())
    args = (text_data["train_manifest"], text_data["val_manifest"], text_data["tokenizer"])
    data = TextDataModule(*args, extra_text=[text_data["extra"]])
    with caplog.at_level(logging.WARNING):
        data.setup("fit")
    assert len(data.datasets["train"]) == len(TRAIN) + 1 and all(data.datasets["train"])
    assert "skipping 1 train sentences with no tokens after normalisation" in caplog.text
    Path(text_data["val_manifest"]).write_text(
        json.dumps({"audio_filepath": "/none/q.wav", "duration": 1.0, "text": "* * *"}) + "\n"
    )
    with pytest.raises(ValueError, match=r"no val sentences left after skipping bad or empty"):
        TextDataModule(*args).setup("fit")


def test_a_split_without_sentences_is_refused(text_data, tmp_path) -> None:
    """fit ended at once without batches and said where its checkpoints were (none); without
    validation text no best checkpoint is kept."""
    (tmp_path / "empty.jsonl").write_text("")
    args = (text_data["train_manifest"], text_data["val_manifest"], text_data["tokenizer"])
    empty = str(tmp_path / "empty.jsonl")
    for train, val in ((empty, args[1]), (args[0], empty)):
        with pytest.raises(ValueError, match=r"empty\.jsonl: no (train|val) sentences: no text"):
            TextDataModule(train, val, args[2]).setup("fit")
    Path(text_data["val_manifest"]).write_text(
        json.dumps({"audio_filepath": "/none/q.wav", "duration": 1.0, "text": "QUIZ"}) + "\n"
    )
    with pytest.raises(ValueError, match=r"no val sentences left after skipping bad or empty"):
        TextDataModule(*args, skip_bad=True).setup("fit")
    with pytest.raises(ValueError, match=r"max_batch_tokens \(0\) and max_batch_size"):
        TextDataModule(*args, max_batch_tokens=0)
    from lightning.pytorch.trainer.states import TrainerFn

    with pytest.raises(ValueError, match=r"^data.test_manifest is required for 'test'$"):
        TextDataModule(*args).setup(TrainerFn.TESTING)


def test_unreadable_extra_text_names_the_file(text_data, tmp_path) -> None:
    (tmp_path / "latin1.txt").write_bytes(b"CAF\xc9\n")
    (tmp_path / "marked.txt").write_bytes(b"\xef\xbb\xbfCAF\xc9\n")  # the file's byte, BOM too
    args = (text_data["train_manifest"], text_data["val_manifest"], text_data["tokenizer"])
    cases = {
        tmp_path / "missing.txt": "cannot read",
        tmp_path / "latin1.txt": "not valid UTF-8",
        tmp_path / "marked.txt": r"not valid UTF-8 \(invalid continuation byte at byte 6\)",
    }
    for path, reason in cases.items():
        with pytest.raises(ValueError, match=f"{path.name}: {reason}"):
            TextDataModule(*args, extra_text=[str(path)]).setup("fit")


def test_loss_is_the_per_token_nll_of_each_sentence_alone(text_data) -> None:
    """Summed over a padded batch, the NLL equals that of every sentence scored on its own:
    padding adds nothing, and eos is predicted."""
    torch.manual_seed(0)
    module = LMModule(lambda v: LSTMLM(v, 8, 16, 1), vocab_size=12).eval()
    sentences = [[4, 5, 6, 7], [8], [9, 10]]
    expected = 0.0
    with torch.no_grad():
        nll, tokens = module.token_nll(collate_text(sentences))
        for seq in sentences:
            logp = module(torch.tensor([[SOS_EOS_ID, *seq]]))[0].log_softmax(-1)
            expected -= float(logp.gather(1, torch.tensor([*seq, SOS_EOS_ID])[:, None]).sum())
    assert tokens == 4 + 1 + 2 + 3
    assert float(nll) == pytest.approx(expected, rel=1e-5)


def test_load_lm_refuses_a_checkpoint_without_an_lm(tmp_path, monkeypatch) -> None:
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(CheckpointError, match="other.ckpt: no language model"):
        load_lm(tmp_path / "other.ckpt")
    monkeypatch.setenv("HOME", str(tmp_path))  # "~" read as the shell would: the same file
    with pytest.raises(CheckpointError, match=f"{tmp_path}/other.ckpt: no language model"):
        load_lm("~/other.ckpt")


def test_load_lm_refuses_weights_with_non_finite_values(tmp_path) -> None:
    from asr.checkpoint import checkpoint_payload, instantiate
    from asr.models.lm import build_lm

    tokenizer = CharTokenizer.train(["AB"])
    lstm = {"class_path": "asr.models.lm.LSTMLM", "init_args": {"embed_dim": 4, "hidden_size": 4}}
    config = {"lm": lstm, "vocab_size": tokenizer.vocab_size}
    weights = {f"lm.{k}": v for k, v in instantiate(build_lm, config).state_dict().items()}
    weights["lm.embedding.weight"][1, 2] = float("inf")
    payload = checkpoint_payload(config, tokenizer)
    torch.save({"state_dict": weights, "lm": payload}, tmp_path / "lm.ckpt")
    with pytest.raises(CheckpointError) as refused:
        load_lm(tmp_path / "lm.ckpt")
    said = f"{tmp_path / 'lm.ckpt'}: embedding.weight: non-finite values (a damaged file)"
    assert str(refused.value) == said


TINY_LM_CONFIG = """
seed_everything: 0
model:
  class_path: asr.lm.LMModule
  init_args:
    lm:
      class_path: asr.models.lm.LSTMLM
      init_args: {embed_dim: 16, hidden_size: 32, num_layers: 1, dropout: 0.0}
    optimizer:
      class_path: torch.optim.Adam
      init_args: {lr: 0.01}
data:
  class_path: asr.lm.TextDataModule
  init_args: {max_batch_tokens: 300}
checkpoint:
  monitor: val/loss
  filename: "epoch{epoch:03d}-loss{val/loss:.3f}"
trainer:
  max_epochs: 3
  accelerator: cpu
  log_every_n_steps: 1
  enable_model_summary: false
  enable_progress_bar: false
"""


@pytest.fixture(scope="module")
def tiny_an4_text(tmp_path_factory) -> dict[str, str]:
    """40 AN4 training transcripts, 10 for validation, a character tokenizer, the config."""
    out = tmp_path_factory.mktemp("tiny_an4_text")
    prepare_corpus("an4", corpus_path("an4"), out / "full")
    write_manifest(out / "train.jsonl", read_manifest(out / "full" / "train.jsonl")[:40])
    write_manifest(out / "dev.jsonl", read_manifest(out / "full" / "dev.jsonl")[:10])
    train_tokenizer(out / "full" / "train.jsonl", "char", None, out / "tokenizer")
    (out / "lm.yaml").write_text(TINY_LM_CONFIG)
    return {name: str(out / name) for name in ("train.jsonl", "dev.jsonl", "tokenizer", "lm.yaml")}


@pytest.mark.needs_corpus
def test_fit_lm_then_load_it_for_shallow_fusion(tiny_an4_text, tmp_path, capsys) -> None:
    data = tmp_path / "data"
    shutil.copytree(
        Path(tiny_an4_text["lm.yaml"]).parent, data, ignore=shutil.ignore_patterns("full")
    )
    main([
        "fit", "--config", str(data / "lm.yaml"),
        "--data.train_manifest", str(data / "train.jsonl"),
        "--data.val_manifest", str(data / "dev.jsonl"),
        "--data.tokenizer", str(data / "tokenizer"),
        "--trainer.default_root_dir", str(tmp_path),
    ])  # fmt: skip
    rows = list(csv.DictReader((tmp_path / "logs" / "version_0" / "metrics.csv").open()))
    val = [(float(r["val/loss"]), float(r["val/ppl"])) for r in rows if r.get("val/loss")]
    assert len(val) == 3 and val[-1][0] < val[0][0], f"validation loss must fall: {val}"
    assert all(ppl == pytest.approx(math.exp(loss), rel=1e-5) for loss, ppl in val)
    ckpts = {p.name for p in (tmp_path / "checkpoints").iterdir()}
    assert "last.ckpt" in ckpts and any(n.startswith("epoch002-loss") for n in ckpts)

    # A new run (another lr, more text) starts from its weights, of this LM and tokenizer.
    last, vocab = tmp_path / "checkpoints" / "last.ckpt", CharTokenizer.load(data / "tokenizer")
    tiny = partial(LSTMLM, embed_dim=16, hidden_size=32, num_layers=1, dropout=0.0)
    started = LMModule(tiny, vocab.vocab_size, str(data / "tokenizer"), init_from=str(last))
    trained, _ = load_lm(last)
    assert started.lm.state_dict().keys() == trained.state_dict().keys()
    assert all(map(torch.equal, started.lm.state_dict().values(), trained.state_dict().values()))
    wider = partial(LSTMLM, embed_dim=16, hidden_size=48, num_layers=1)
    with pytest.raises(ValueError, match=r"last.ckpt: its weights are not this config's LM"):
        LMModule(wider, vocab.vocab_size, str(data / "tokenizer"), init_from=str(last))
    other = CharTokenizer.train(["ABC"])
    other.save(tmp_path / "other")
    with pytest.raises(ValueError, match=r"last.ckpt: trained with another tokenizer"):
        LMModule(tiny, other.vocab_size, str(tmp_path / "other"), init_from=str(last))
    with pytest.raises(SystemExit) as refused:  # nor is init_from offered as a way round it
        main(["validate", "--config", str(data / "lm.yaml"),
              "--data.train_manifest", str(data / "train.jsonl"),
              "--data.val_manifest", str(data / "dev.jsonl"),
              "--data.tokenizer", str(tmp_path / "other"), "--ckpt_path", str(last)])  # fmt: skip
    assert refused.value.code == 2
    said = capsys.readouterr().err
    assert "give the config it was trained with\n" in said and "init_from" not in said

    dev_texts = [u.text for u in read_manifest(data / "dev.jsonl")]
    shutil.rmtree(data)  # the checkpoint alone must do
    lm, tokenizer = load_lm(tmp_path / "checkpoints" / "last.ckpt")
    assert not lm.training and tokenizer.vocab_size == lm.vocab_size
    assert lm.vocabulary == tuple(tokenizer.pieces(range(tokenizer.vocab_size)))  # checked

    # The loaded LM scores the dev text exactly as the last validation did.
    module = LMModule(lambda v: lm, vocab_size=lm.vocab_size)
    nll, tokens = module.token_nll(collate_text([tokenizer.encode(t) for t in dev_texts]))
    assert float(nll.detach()) / tokens == pytest.approx(val[-1][0], rel=1e-4)

    # It drives shallow fusion: each hypothesis scores log p_att + lm_weight * log p_lm.
    torch.manual_seed(0)
    decoder = TransformerDecoder(lm.vocab_size, 8, d_model=8, num_heads=2, ffn_dim=16,
                                 num_layers=1).eval()  # fmt: skip
    enc, enc_lens = torch.randn(2, 12, 8), torch.tensor([12, 7])
    options = SearchOptions(beam_size=3, lm_weight=0.7)
    results = beam_search(decoder, enc, enc_lens, options, lm=lm)
    for b, hyps in enumerate(results):
        for hyp in hyps:
            inputs = torch.tensor([[SOS_EOS_ID, *hyp.tokens]])
            targets = torch.tensor([*hyp.tokens, SOS_EOS_ID])[:, None]
            with torch.no_grad():
                att = decoder(enc[b : b + 1], enc_lens[b : b + 1], inputs)[0][0].log_softmax(-1)
                lm_logp = lm(inputs)[0].log_softmax(-1)
            expected = att.gather(1, targets).sum() + 0.7 * lm_logp.gather(1, targets).sum()
            assert hyp.score == pytest.approx(float(expected), abs=1e-4)


@pytest.mark.needs_corpus
def test_an_lm_trains_in_bf16_weights(tiny_an4_text, tmp_path) -> None:
    """An LM has no frontend, whose float32 features half-precision weights refuse."""
    main([
        "fit", "--config", tiny_an4_text["lm.yaml"],
        "--data.train_manifest", tiny_an4_text["train.jsonl"],
        "--data.val_manifest", tiny_an4_text["dev.jsonl"],
        "--data.tokenizer", tiny_an4_text["tokenizer"],
        "--trainer.default_root_dir", str(tmp_path), "--trainer.precision", "bf16-true",
        "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1",
    ])  # fmt: skip
    lm, _ = load_lm(tmp_path / "checkpoints" / "last.ckpt")  # loaded as float32
    assert all(torch.equal(p, p.bfloat16().float()) for p in lm.parameters()), "trained in bf16"


@pytest.mark.needs_corpus
def test_an_lm_resumed_mid_epoch_ends_as_the_uninterrupted_run(tiny_an4_text, tmp_path) -> None:
    """The batches it had left and the dropout it would have drawn: not the epoch's first
    batches again, with its last ones never trained."""
    data = tiny_an4_text
    common = ["fit", "--config", data["lm.yaml"], "--data.train_manifest", data["train.jsonl"],
              "--data.val_manifest", data["dev.jsonl"], "--data.tokenizer", data["tokenizer"],
              "--trainer.max_epochs", "1"]  # fmt: skip
    common += ["--model.init_args.lm.init_args.dropout", "0.3"]  # its draws resumed too
    main([*common, "--trainer.default_root_dir", str(tmp_path / "whole")])
    stopped = [*common, "--trainer.default_root_dir", str(tmp_path / "stopped")]
    main([*stopped, "--trainer.max_steps", "2"])
    main([*stopped, "--ckpt_path", "last"])
    whole, resumed = (torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)
                      for run in ("whole", "stopped"))  # fmt: skip
    assert resumed["global_step"] == whole["global_step"] > 2
    for name, tensor in whole["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], tensor), name


@pytest.mark.parametrize(
    "config", sorted(str(p.relative_to(REPO / "conf")) for p in (REPO / "conf").glob("*/*.yaml"))
)
def test_every_config_parses_with_its_module_classes(config: str, capsys) -> None:
    """Configs name the model and data modules by class_path; recognizers keep checkpoints by
    greedy dev WER unless the config chooses (Mini LibriSpeech: token accuracy), LMs by loss.
    A config without a model (an overlay such as conf/an4/augment.yaml) is parsed as a second
    --config on top of its corpus's Transformer config, and all its settings must show."""
    path = REPO / "conf" / config
    own = yaml.safe_load(path.read_text()) or {}
    overlay = "model" not in own
    configs = [path.parent / "transformer.yaml", path] if overlay else [path]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *(a for c in configs for a in ("--config", str(c))), "--print_config"])
    assert exit_info.value.code in (0, None)
    resolved = yaml.safe_load(capsys.readouterr().out)
    if overlay:
        for section, settings in own.items():
            assert _subset(settings, resolved[section]), section
    family = "lm" if config.endswith("lm.yaml") else "lightning"
    assert resolved["model"]["class_path"].startswith(f"asr.{family}.")
    assert resolved["data"]["class_path"].startswith(f"asr.{family}.")
    monitor = own.get("checkpoint", {}).get("monitor", "val/loss" if family == "lm" else "val/wer")
    assert resolved["checkpoint"]["monitor"] == monitor
    assert "{" + monitor in resolved["checkpoint"]["filename"], "names show the monitored value"


def _subset(given, resolved) -> bool:
    """Whether every setting in `given` (YAML values) is in `resolved` (lists may be tuples)."""
    if isinstance(given, dict):
        return all(k in resolved and _subset(v, resolved[k]) for k, v in given.items())
    if isinstance(given, list):
        return list(resolved) == given
    return given == resolved
