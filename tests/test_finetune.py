"""`init_from`: what a new model takes from a trained one, and fine-tuning with `asr fit`."""

from __future__ import annotations

import logging
import sys

import pytest
import torch
import yaml
from conftest import TINY_MODEL_CONFIG
from test_lightning import _fit_args, refused, tiny_an4  # noqa: F401

from asr.checkpoint import CheckpointError, instantiate, load_checkpoint, submodule_weights
from asr.cli import main
from asr.data.manifest import read_manifest
from asr.finetune import (
    check_same_settings,
    decoder_differences,
    init_from,
    setting_differences,
    shared_tokens,
    transfer_weights,
    vocabulary_tensors,
)
from asr.models.seq2seq import build_seq2seq
from asr.text import CharTokenizer, Tokenizer

VOCAB_TENSORS = {"decoder.embedding.weight", "decoder.output.weight", "decoder.output.bias",
                 "ctc.proj.weight", "ctc.proj.bias"}  # fmt: skip


def _model(tokenizer, seed: int):
    torch.manual_seed(seed)
    return instantiate(build_seq2seq, TINY_MODEL_CONFIG | {"vocab_size": tokenizer.vocab_size})


def test_the_same_vocabulary_copies_every_tensor():
    tokenizer = CharTokenizer.train(["YES NO GO"])
    trained, fresh = _model(tokenizer, 0), _model(tokenizer, 1)
    report = transfer_weights(fresh, trained.state_dict(), tokenizer, tokenizer)
    assert report.copied == list(fresh.state_dict()) and not report.remapped
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, trained.state_dict()[name]), name


@pytest.mark.parametrize("texts", [["YES NO GOQ"], ["YES NX GX"]], ids=["larger", "same size"])
def test_a_new_vocabulary_keeps_the_rows_of_shared_tokens(texts):
    """Output layers, embedding and CTC head are remapped token by token (also where the sizes
    agree but the tokens do not); the new tokens' rows keep their fresh values."""
    old, new = CharTokenizer.train(["YES NO GO"]), CharTokenizer.train(texts)
    trained, fresh = _model(old, 0), _model(new, 1)
    initial = {k: v.clone() for k, v in fresh.state_dict().items()}
    report = transfer_weights(fresh, trained.state_dict(), old, new)
    assert set(report.remapped) == VOCAB_TENSORS == set(vocabulary_tensors(fresh))
    assert set(report.copied) == set(fresh.state_dict()) - VOCAB_TENSORS
    shared = shared_tokens(old, new)
    assert new.pieces(list(shared)) == old.pieces(list(shared.values()))  # same pieces
    for name in VOCAB_TENSORS:
        now, was = fresh.state_dict()[name], trained.state_dict()[name]
        for t in range(new.vocab_size):
            expected = was[shared[t]] if t in shared else initial[name][t]
            assert torch.equal(now[t], expected), (name, new.pieces([t]))
    assert "remapped decoder.output.weight" in report.summary()


def _wider(tokenizer, part: str):
    """The tiny model with a wider feed-forward layer in its `part` (encoder or decoder)."""
    config = TINY_MODEL_CONFIG | {"vocab_size": tokenizer.vocab_size}
    wider = config[part]["init_args"] | {"ffn_dim": 48}
    return instantiate(build_seq2seq, config | {part: config[part] | {"init_args": wider}})


def test_a_different_architecture_is_reinitialised_and_named():
    tokenizer = CharTokenizer.train(["YES NO GO"])
    trained, fresh = _model(tokenizer, 0), _wider(tokenizer, "decoder")
    report = transfer_weights(fresh, trained.state_dict(), tokenizer, tokenizer)
    assert report.reinitialised and all(n.startswith("decoder.") for n in report.reinitialised)
    assert set(report.copied) >= {n for n in fresh.state_dict() if not n.startswith("decoder.")}
    assert "re-initialised decoder." in report.summary()


def test_a_decoder_tied_here_but_not_in_the_trained_model_names_the_weight_it_holds():
    """Embedding and output layer share one tensor here: the output layer's copy writes over
    the embedding's, which was said to be copied."""
    tokenizer = CharTokenizer.train(["YES NO GO"])
    config = TINY_MODEL_CONFIG | {"vocab_size": tokenizer.vocab_size}
    untied = config["decoder"] | {"init_args": config["decoder"]["init_args"] | {
        "tie_embeddings": False}}  # fmt: skip
    torch.manual_seed(0)
    trained = instantiate(build_seq2seq, config | {"decoder": untied}).state_dict()
    fresh = _model(tokenizer, 1)
    report = transfer_weights(fresh, trained, tokenizer, tokenizer)
    assert report.overwritten == {"decoder.embedding.weight": "decoder.output.weight"}
    assert "decoder.embedding.weight" not in report.copied
    assert "decoder.output.weight" in report.copied
    assert torch.equal(fresh.state_dict()["decoder.embedding.weight"],
                       trained["decoder.output.weight"])  # fmt: skip
    assert ("decoder.embedding.weight is tied to decoder.output.weight here: it holds the "
            "trained decoder.output.weight") in report.summary()  # fmt: skip
    tied = transfer_weights(_model(tokenizer, 2), fresh.state_dict(), tokenizer, tokenizer)
    assert not tied.overwritten, "tied in both: one tensor, copied"


def test_another_decoder_head_count_is_warned_of():
    """Its tensors have the same shapes, so all are copied: the log says they compute
    otherwise than they learnt to."""
    config = {"decoder": TINY_MODEL_CONFIG["decoder"]}
    assert decoder_differences(config, config) is None
    heads = {"decoder": config["decoder"] | {"init_args": config["decoder"]["init_args"] | {
        "num_heads": 1, "dropout": 0.3}}}  # fmt: skip
    rnn = {"decoder": {"class_path": "asr.models.rnn.RNNAttentionDecoder",
                       "init_args": {"scheduled_sampling": 0.0}}}  # fmt: skip
    sampled = {"decoder": rnn["decoder"] | {"init_args": {"scheduled_sampling": 0.2}}}
    assert decoder_differences(rnn, sampled) is None, "a training setting alone"
    assert decoder_differences(config, heads) == (
        "init_from: the trained model's decoder has other settings (decoder.num_heads is 2 "
        "there, 1 here): its tensors of the same shapes were copied, and compute otherwise "
        "than they learnt to"
    )


def test_a_config_of_another_encoder_is_refused():
    """A config for another model (a wider encoder, or one without the trained CMVN) re-
    initialised nearly everything and trained on as a fine-tune: it is refused, named."""
    tokenizer = CharTokenizer.train(["YES NO GO"])
    trained, other = _model(tokenizer, 0), _wider(tokenizer, "encoder")
    initial = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match=r"init_from: the trained model's frontend or encoder is "
                       r"not this config's: encoder\..* is \(\d+, \d+\) there, \(\d+, \d+\) "
                       r"here \(and \d+ more\); give the config it was trained with"):  # fmt: skip
        transfer_weights(other, trained.state_dict(), tokenizer, tokenizer)
    assert all(torch.equal(v, initial[k]) for k, v in other.state_dict().items()), "untouched"
    without = {k: v for k, v in trained.state_dict().items() if not k.startswith("encoder.")}
    with pytest.raises(ValueError, match="is not there"):
        transfer_weights(_model(tokenizer, 1), without, tokenizer, tokenizer)


def test_fit_from_a_trained_model_with_its_encoder_frozen(tiny_an4, tmp_path, caplog, capsys):  # noqa: F811
    """`--model.init_from` on the command line: the run starts from the trained weights
    (logged), and with the encoder frozen for all its steps, the encoder ends as it began."""
    main(_fit_args(tiny_an4, tmp_path / "scratch") + ["--trainer.max_epochs", "1"])
    trained = tmp_path / "scratch" / "checkpoints" / "last.ckpt"
    other = tmp_path / "tokenizer"
    texts = [u.text for u in read_manifest(tiny_an4["train"])]
    CharTokenizer.train([*texts, "QZ"]).save(other)  # two characters more
    data = tiny_an4 | {"tokenizer": str(other)}
    with caplog.at_level(logging.INFO):
        main(_fit_args(data, tmp_path / "tuned") + [
            "--trainer.max_epochs", "1", "--model.init_from", str(trained),
            "--model.freeze_encoder_steps", "1000",
        ])  # fmt: skip
    assert "remapped decoder.output.weight" in caplog.text
    before = submodule_weights(load_checkpoint(trained), "model.")
    after = submodule_weights(load_checkpoint(tmp_path / "tuned" / "checkpoints" / "last.ckpt"),
                              "model.")  # fmt: skip
    for name, value in after.items():
        if name.startswith(("encoder.", "frontend.")):
            assert torch.equal(value, before[name]), f"{name} trained while frozen"
    assert not torch.equal(after["decoder.output.weight"][:4], before["decoder.output.weight"][:4])

    # resuming takes the weights from its checkpoint: the model it started from may be gone
    trained.rename(tmp_path / "moved.ckpt")
    again = _fit_args(data, tmp_path / "tuned") + [
        "--trainer.max_epochs", "1", "--model.init_from", str(trained), "--ckpt_path", "last",
    ]  # fmt: skip
    said = refused(again, capsys)  # the same command but one setting: it would train on unsaid
    assert "model.init_args.freeze_encoder_steps: 0 now, 1000 when trained" in said
    main([*again, "--model.freeze_encoder_steps", "1000"])
    saved = yaml.safe_load((tmp_path / "tuned" / "logs" / "version_1" / "config.yaml").read_text())
    assert saved["model"]["init_args"]["init_from"] == str(trained), "the run's record keeps it"
    # tensors of the same shapes that compute otherwise: features of another frame rate
    hop = "--model.init_args.frontend.init_args.features.init_args.hop_length"
    caplog.clear()
    with caplog.at_level(logging.INFO):
        said = refused(_fit_args(data, tmp_path / "hop") + [
            "--model.init_from", str(tmp_path / "moved.ckpt"), hop, "320",
        ], capsys)  # fmt: skip
    assert "init_from: the trained model's frontend.features.hop_length is 160, this " in said
    assert "tensors copied" not in caplog.text, "a refused fine-tune said what it copied first"
    heads = "--model.init_args.decoder.init_args.num_heads"
    with pytest.warns(UserWarning, match=r"decoder has other settings \(decoder.num_heads is 2 "):
        main(_fit_args(data, tmp_path / "heads") + [
            "--model.init_from", str(tmp_path / "moved.ckpt"), heads, "1",
            "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
        ])  # fmt: skip


def test_init_from_reads_packages_too(tiny_checkpoint, tmp_path, monkeypatch):
    from asr.package import write_package

    write_package(tiny_checkpoint["checkpoint"], tmp_path / "package")
    tokenizer = Tokenizer.load(tiny_checkpoint["tokenizer"])
    fresh = _model(tokenizer, 3)
    report = init_from(fresh, tmp_path / "package", tokenizer)
    assert report.copied == list(fresh.state_dict())
    monkeypatch.setenv("HOME", str(tmp_path))  # "~" as the shell would read it
    assert init_from(_model(tokenizer, 4), "~/package", tokenizer).copied == report.copied
    # a tokenizer folder replaced by one of another size: its rows would be the wrong tokens'
    CharTokenizer.train(["ABC"]).save(tmp_path / "package" / "tokenizer")
    said = rf"^{tmp_path / 'package'}: its tokenizer has 8 ids, its model \d+: not the tokenizer"
    with pytest.raises(CheckpointError, match=said):
        init_from(_model(tokenizer, 5), "~/package", tokenizer)


def test_init_from_refuses_weights_with_non_finite_values(tiny_checkpoint, tmp_path):
    """A fine-tune started from a NaN said no more than that its updates were skipped."""
    state = load_checkpoint(tiny_checkpoint["checkpoint"])
    state["state_dict"]["model.encoder.layers.0.ffn.0.weight"][0, 0] = float("nan")
    torch.save(state, tmp_path / "damaged.ckpt")
    tokenizer = Tokenizer.load(tiny_checkpoint["tokenizer"])
    said = r"damaged\.ckpt: encoder\.layers\.0\.ffn\.0\.weight: non-finite values \(a damaged"
    with pytest.raises(CheckpointError, match=said):
        init_from(_model(tokenizer, 3), tmp_path / "damaged.ckpt", tokenizer)


def test_settings_of_training_alone_or_unknown_to_one_model_may_change():
    trained = {
        "frontend": {"class_path": "F", "init_args": {"dither": 1.0, "level": None}},
        "encoder": {"init_args": {"max_len": 5000, "unpacked_on_cpu": True}},
    }
    tuned = {
        "frontend": {"class_path": "F", "init_args": {"dither": 0.0, "level": None}},
        "encoder": {"init_args": {"max_len": 9000, "unpacked_on_cpu": False, "new": 1}},
    }
    check_same_settings(trained, tuned)  # an asr newer than the model's has a new setting
    tuned["frontend"]["init_args"]["level"] = {"class_path": "L", "init_args": {"dbfs": -20}}
    with pytest.raises(ValueError, match="frontend.level is None, this config's 'L'"):
        check_same_settings(trained, tuned)


def test_a_class_is_compared_as_the_class_its_path_imports():
    """A re-export is the same class; another class of the same name is not."""

    def features(path: str) -> dict:
        return {"frontend": {"class_path": path, "init_args": {"n_mels": 80}}}

    home = features("asr.frontends.features.LogMelFilterbank")
    assert setting_differences(home, features("asr.frontends.LogMelFilterbank"), ["frontend"]) == []
    other = features("my_lab.frontends.LogMelFilterbank")
    assert setting_differences(home, other, ["frontend"]) == [
        ("frontend", "asr.frontends.features.LogMelFilterbank", "my_lab.frontends.LogMelFilterbank")
    ]
    assert "this" not in sys.modules  # a module a checkpoint names is not imported to compare
    assert setting_differences(home, features("this.LogMelFilterbank"), ["frontend"])
    assert "this" not in sys.modules
