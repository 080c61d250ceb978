"""`asr fit|validate|test` name a config's mistakes with their file and line before LightningCLI
parses it, and pass every config the project ships."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from asr.config_check import config_paths, config_problems, frontend_settings, option_problems

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "conf/an4/rnn_quick.yaml"


def refused(argv: list[str], capsys) -> list[str]:
    """What `asr ARGV` says, line by line, as it stops with status 2."""
    from asr.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err.splitlines()


def line_of(text: str, fragment: str) -> int:
    return text[: text.index(fragment)].count("\n") + 1


def edited(tmp_path: Path, old: str, new: str) -> tuple[Path, int]:
    """rnn_quick.yaml with `old` replaced by `new` once, and the line it is on."""
    text = QUICK.read_text()
    assert old in text
    path = tmp_path / "edited.yaml"
    path.write_text(text.replace(old, new, 1))
    return path, line_of(text, old)


@pytest.mark.parametrize(
    "config", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "conf").rglob("*.yaml"))
)
def test_every_shipped_config_passes(config) -> None:
    assert config_problems(ROOT / config) == []


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("max_epochs: 8", "max_epoch: 8",
         "trainer.max_epoch: the Trainer takes no argument 'max_epoch' (did you mean "
         "'max_epochs'?)"),
        ("embed_dim: 64", "embed_dims: 64",
         "model.init_args.decoder.init_args.embed_dims: asr.models.rnn.RNNAttentionDecoder "
         "takes no argument 'embed_dims' (did you mean 'embed_dim'?)"),
        ("asr.models.rnn.RNNEncoder", "asr.models.rnn.RNNEncoderX",
         "model.init_args.encoder.class_path: asr.models.rnn has no 'RNNEncoderX' (did you "
         "mean 'RNNEncoder'?)"),
        ("asr.models.rnn.RNNEncoder", "asr.model.rnn.RNNEncoder",
         "model.init_args.encoder.class_path: no module named 'asr.model'"),
        ("{lr: 0.002,", "{learning_rate: 0.002,",
         "model.init_args.optimizer.init_args.learning_rate: torch.optim.AdamW takes no "
         "argument 'learning_rate'"),
        ("seed_everything:", "seed_everyting:",
         "seed_everyting: no such key (did you mean 'seed_everything'?)"),
        ("monitor: val/acc", "monitr: val/acc",
         "checkpoint.monitr: RunCheckpoint takes no argument 'monitr' (did you mean "
         "'monitor'?)"),
        ("init_args:\n    train_manifest", "init_arg:\n    train_manifest",
         "data.init_arg: no such key beside class_path, init_args, dict_kwargs (did you mean "
         "'init_args'?)"),
    ],
)  # fmt: skip
def test_a_wrong_key_or_class_is_named_with_its_line(tmp_path, old, new, said) -> None:
    path, line = edited(tmp_path, old, new)
    assert config_problems(path) == [f"{path}:{line}: {said}"]


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("num_layers: 3,", "num_layers: three,",
         "model.init_args.encoder.init_args.num_layers: expected int, got 'three'"),
        ("embed_dim: 64", "embed_dim: 64.0",
         "model.init_args.decoder.init_args.embed_dim: expected int, got 64.0"),
        ("ctc_weight: 0.3", 'ctc_weight: "0.3x"',
         "model.init_args.ctc_weight: expected float, got '0.3x'"),
        ("fast_dropout: true", "fast_dropout: 1", "model.init_args.fast_dropout: expected bool, "
         "got 1"),
        ("max_epochs: 8", "max_epochs: eight", "trainer.max_epochs: expected int or null, got "
         "'eight'"),
        ("mode: max", "mode: [max]", "checkpoint.mode: expected str, got a list"),
        # YAML's number 221, where text or a list is taken: a page of usage from jsonargparse
        ('subsample: "2_2_1"', "subsample: 2_2_1", "model.init_args.encoder.init_args."
         "subsample: expected a string or a list, got 221 (quote it: YAML reads 2_2 as 22)"),
    ],
)  # fmt: skip
def test_a_value_its_plain_type_refuses_is_named_with_its_line(tmp_path, old, new, said) -> None:
    path, line = edited(tmp_path, old, new)
    assert config_problems(path) == [f"{path}:{line}: {said}"]


@pytest.mark.parametrize(
    ("value", "line", "said"),
    [("[{max_epochs: 3}]", 2, "a list"), ("\n  - max_epochs: 3", 3, "a list"), ("5", 2, "5"),
     ("true", 2, "true")],
)  # fmt: skip
def test_a_group_given_as_anything_but_a_mapping_is_named(tmp_path, value, line, said) -> None:
    path = tmp_path / "overlay.yaml"  # `checkpoint:` with no value gives no arguments: right
    path.write_text(f"seed_everything: 0\ntrainer: {value}\ncheckpoint:\n")
    expected = f"{path}:{line}: trainer: expected a mapping of the Trainer's arguments, got {said}"
    assert config_problems(path) == [expected]


def test_a_config_file_a_top_level_key_names_that_is_not_there_is_named(tmp_path) -> None:
    """jsonargparse took `model: nofile.yaml` for a class to import: a page of usage."""
    path = tmp_path / "overlay.yaml"
    path.write_text(f"seed_everything: 0\nmodel: nofile.yaml\ndata: {tmp_path}/gone.yml\n")
    assert config_problems(path) == [
        f"{path}:2: model: nofile.yaml: no such file in {tmp_path}",
        f"{path}:3: data: {tmp_path}/gone.yml: no such file",
    ]


def test_a_null_or_a_boolean_for_a_number_within_init_args_is_named(tmp_path) -> None:
    """jsonargparse takes null for a plain number within a class's `init_args`, and a boolean
    where it equals the default (`false` for 0): the class then failed on None far from the
    config, or jsonargparse refused it with no line."""
    text = QUICK.read_text()
    for old, new, said in [
        ("ctc_weight: 0.3", "ctc_weight: null", "model.init_args.ctc_weight: expected float, "
         "got null"),
        ("max_batch_seconds: 120", "max_batch_seconds: null", "data.init_args.max_batch_seconds: "
         "expected float, got null"),
    ]:  # fmt: skip
        assert old in text
        path, line = edited(tmp_path, old, new)
        assert config_problems(path) == [f"{path}:{line}: {said}"]
    from asr.config_check import _type_problem

    assert _type_problem(int, False, 0) == "expected int, got False"
    assert _type_problem(float, 0, 0.0) is None, "an int for a float"
    assert _type_problem(int, None, None) is None and _type_problem(int | None, None, 3) is None
    classes: dict = {}
    config_problems(QUICK, classes)
    argv = ["fit", "--config", str(QUICK), "--model.ctc_weight", "null"]
    assert option_problems(argv, classes) == ["--model.ctc_weight: expected float, got null"]


@pytest.mark.parametrize(
    ("old", "new"),
    [("num_layers: 3,", 'num_layers: "3",'),  # jsonargparse reads a number in a string
     ("ctc_weight: 0.3", "ctc_weight: 1"),  # and an int where a float is asked for
     ("ctc_weight: 0.3", "ctc_weight: 3e-1"),  # which its YAML loader reads, unlike PyYAML's
     ("fast_dropout: true", "fast_dropout: yes"),
     ("max_epochs: 8", "max_epochs: null"),
     ("mode: max", "mode: !!str 5")],
)  # fmt: skip
def test_values_jsonargparse_takes_pass(tmp_path, old, new) -> None:
    path, _ = edited(tmp_path, old, new)
    assert config_problems(path) == []


SCALARS = ["3", '"3"', "3.0", "1e3", "-2", "yes", "true", "null", "abc", '"0.3x"', "''", "[1]",
           "{a: 1}", "!!str 5"]  # fmt: skip


@pytest.mark.parametrize("annotation", [int, float, bool, str, int | None, float | None])
def test_a_value_refused_before_parsing_is_one_jsonargparse_refuses(annotation) -> None:
    """Soundness against jsonargparse itself: the pre-check may let a bad value through (then
    jsonargparse says it), but never refuses one jsonargparse would take."""
    from jsonargparse import ArgumentParser

    from asr.config_check import _type_problem, _value

    flagged, refused = [], []
    for text in SCALARS:
        parser = ArgumentParser(exit_on_error=False)
        parser.add_argument("--x", type=annotation)
        try:
            parser.parse_string(f"x: {text}")
        except Exception:  # its ArgumentError, or a TypeError on the way
            refused.append(text)
        node = yaml.compose(f"x: {text}", Loader=yaml.SafeLoader).value[0][1]
        if _type_problem(annotation, _value(node), None) is not None:  # its default: None
            flagged.append(text)
    assert set(flagged) <= set(refused), f"flagged though jsonargparse takes them: {flagged}"
    assert flagged, "the check refuses nothing of this type at all"


def test_merge_keys_are_read_as_yaml_reads_them(tmp_path) -> None:
    """`<<: *x` takes a mapping's entries: no key of its own, and those it merges in checked."""
    good = tmp_path / "good.yaml"
    good.write_text("checkpoint: {<<: {save_top_k: 3}, mode: max}\n"
                    "trainer:\n  <<: {max_steps: 2}\n  max_steps: 3\n")  # fmt: skip
    assert config_problems(good) == []
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  <<: {max_stepz: 2}\n")
    assert config_problems(bad) == [
        f"{bad}:2: trainer.max_stepz: the Trainer takes no argument 'max_stepz' (did you mean "
        "'max_steps'?)"
    ]
    shared = tmp_path / "shared.yaml"  # a class's arguments shared with another's
    shared.write_text(
        "model:\n  init_args:\n    encoder:\n"
        "      class_path: asr.models.transformer.TransformerEncoder\n"
        "      init_args: &shared {d_model: 144, num_heads: 4, ffn_dim: 576}\n"
        "    decoder:\n      class_path: asr.models.transformer.TransformerDecoder\n"
        "      init_args:\n        <<: *shared\n        num_layers: 1\n        d_model: 96\n"
    )
    assert config_problems(shared) == []
    shared.write_text(shared.read_text().replace("ffn_dim", "fnn_dim"))
    assert [p.split(": ", 1)[1] for p in config_problems(shared)] == [
        f"model.init_args.{part}.init_args.fnn_dim: asr.models.transformer.Transformer"
        f"{kind} takes no argument 'fnn_dim' (did you mean 'ffn_dim'?)"
        for part, kind in (("encoder", "Encoder"), ("decoder", "Decoder"))
    ]


def test_a_key_given_twice_is_named_with_both_lines(tmp_path) -> None:
    """YAML keeps the last value of a key given twice, and says nothing."""
    (tmp_path / "top").mkdir()
    (tmp_path / "inner").mkdir()
    path, line = edited(tmp_path / "top", "trainer:\n", "trainer:\n  max_steps: 1\ntrainer:\n")
    inner, at = edited(
        tmp_path / "inner", "embed_dim: 64\n", "embed_dim: 64\n        embed_dim: 32\n"
    )
    assert config_problems(path) == [
        f"{path}:{line + 2}: duplicate key 'trainer' (first at line {line}): YAML keeps only "
        "the last"
    ]
    assert config_problems(inner) == [
        f"{inner}:{at + 1}: duplicate key 'model.init_args.decoder.init_args.embed_dim' (first "
        f"at line {at}): YAML keeps only the last"
    ]


@pytest.mark.parametrize(
    ("new", "key"),
    [("    tokenizer: data/an4/tokenizer\n", "model.init_args.tokenizer"),
     ("    vocab_size: 50\n", "model.init_args.vocab_size")],
)  # fmt: skip
def test_a_setting_a_link_overrides_is_named(tmp_path, new, key) -> None:
    path, line = edited(tmp_path, "    ctc_weight: 0.3\n", f"    ctc_weight: 0.3\n{new}")
    assert config_problems(path) == [
        f"{path}:{line + 1}: {key}: set from data.tokenizer (a link, which overrides it); set "
        "that instead"
    ]


def test_the_links_and_groups_are_those_of_the_cli() -> None:
    """LINKED and GROUPS name what `ASRCLI.add_arguments_to_parser` links and adds."""
    from asr.config_check import GROUPS, LINKED, _plain, _resolve
    from asr.train import ASRCLI

    class Recorder:
        def __init__(self) -> None:
            self.links: set[str] = set()
            self.groups: dict[str, type] = {}

        def link_arguments(self, source, target, **kwargs) -> None:
            self.links.add(_plain(target))

        def add_lightning_class_args(self, target, key, **kwargs) -> None:
            self.groups[key] = target

        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    parser = Recorder()
    ASRCLI.add_arguments_to_parser(ASRCLI.__new__(ASRCLI), parser)
    assert parser.links == set(LINKED)
    named = {key: _resolve(path) for key, (path, _) in GROUPS.items() if key != "trainer"}
    assert parser.groups == named


def test_a_file_named_for_a_top_level_key_is_checked_with_its_lines(tmp_path) -> None:
    """`model: model.yaml` in a config, or `--model model.yaml`: jsonargparse reads that file
    (relative to the config) as the value of `model`."""
    from lightning.pytorch import Trainer

    (tmp_path / "model.yaml").write_text(
        "class_path: asr.lightning.ASRModule\ninit_args:\n  ctc_weigth: 0.3\n"
    )
    (tmp_path / "trainer.yaml").write_text("max_steps: two\n")
    config = tmp_path / "config.yaml"
    config.write_text("model: model.yaml\ntrainer: trainer.yaml\n")
    model = (
        f"{tmp_path}/model.yaml:3: model.init_args.ctc_weigth: asr.lightning.ASRModule takes no "
        "argument 'ctc_weigth' (did you mean 'ctc_weight'?)"
    )
    trainer = f"{tmp_path}/trainer.yaml:1: trainer.max_steps: expected int, got 'two'"
    assert config_problems(config) == [model, trainer]
    argv = ["fit", "--config", str(QUICK), "--model", f"{tmp_path}/model.yaml"]
    assert option_problems(argv, {}, {"trainer": Trainer}) == [model]


def test_the_frontend_of_a_model_in_its_own_file_is_found(tmp_path) -> None:
    config = yaml.safe_load(QUICK.read_text())
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(config.pop("model")))
    (tmp_path / "main.yaml").write_text(yaml.safe_dump({**config, "model": "model.yaml"}))
    assert frontend_settings(tmp_path / "main.yaml") == frontend_settings(QUICK)
    assert "features" in frontend_settings(QUICK)


def test_a_check_within_the_frontend_names_its_problems_alone_and_builds_nothing_else(
    tmp_path,
) -> None:
    """`asr cmvn --config` builds the frontend alone: the other parts' classes are neither
    judged nor imported (the model's would bring in Lightning), merge keys on the way
    included."""
    import subprocess
    import sys

    text = QUICK.read_text()
    for old, new in (("embed_dim: 64", "embed_dims: 64"), ("n_mels: 80", "n_mel: 80")):
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / "edited.yaml"
    path.write_text(text)
    said = (f"{path}:{line_of(text, 'n_mel: 80')}: model.init_args.frontend.init_args."
            "features.init_args.n_mel: asr.frontends.LogMelFilterbank takes no argument "
            "'n_mel' (did you mean 'n_mels'?)")  # fmt: skip
    assert len(config_problems(path)) == 2
    code = ("import sys; from asr.config_check import config_problems; "
            f"print(config_problems({str(path)!r}, within='model.init_args.frontend')); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightning'))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [repr([said]), "[]"]
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        "defaults: &d\n  frontend:\n    class_path: asr.frontends.NoSuchFrontend\n"
        "model:\n  init_args:\n    <<: *d\n"
    )
    no_such = (
        "model.init_args.frontend.class_path: asr.frontends has no 'NoSuchFrontend' (did you "
        "mean 'Frontend'?)"
    )
    assert config_problems(merged, within="model.init_args.frontend") == [f"{merged}:3: {no_such}"]
    # the keys on the way are read as YAML reads them: a second `frontend` is the one kept
    twice = tmp_path / "twice.yaml"
    twice.write_text(
        "model:\n  init_args:\n    frontend: {}\n    frontend: {}\n    encoder: {}\n"
        "    encoder: {}\ntrainer: t.yaml\ntrainer: t.yaml\n"  # beside it: fit's to judge
    )
    (tmp_path / "t.yaml").write_text("[not: a, trainer")  # beside the frontend: not read
    assert config_problems(twice, within="model.init_args.frontend") == [
        f"{twice}:4: duplicate key 'model.init_args.frontend' (first at line 3): YAML keeps only "
        "the last"
    ]


def test_yaml_that_does_not_parse_is_named_with_its_line_and_column(tmp_path) -> None:
    path, line = edited(tmp_path, "init_args: {n_mels: 80}", "init_args: {n_mels: 80")
    (problem,) = config_problems(path)
    assert problem.startswith(f"{path}:{line + 1}:")
    assert "not valid YAML: expected ',' or '}'" in problem
    assert problem.endswith(f"(while parsing a flow mapping from line {line})")


def test_arguments_that_may_go_on_to_a_parent_are_left_to_jsonargparse(tmp_path) -> None:
    """A class taking **kwargs may pass them to its parent: its keys are not judged here."""
    path = tmp_path / "kwargs.yaml"
    path.write_text(
        "model:\n  class_path: collections.OrderedDict\n  init_args: {anything: 1}\n"
        "data:\n  class_path: NameWithoutModule\n  init_args: {anything: 1}\n"
    )
    assert config_problems(path) == []
    assert config_problems(tmp_path / "missing.yaml") == []  # LightningCLI says so itself


@pytest.mark.parametrize(
    ("base", "overlay"),
    [("conf/an4/transformer.yaml", "conf/an4/augment.yaml"),
     ("conf/an4/conformer.yaml", "conf/an4/augment_strong.yaml")],
)  # fmt: skip
def test_the_shipped_overlays_pass_over_their_base(base, overlay) -> None:
    classes: dict = {}
    assert config_problems(ROOT / base, classes) + config_problems(ROOT / overlay, classes) == []


def test_a_config_laid_over_another_is_checked_against_its_classes(tmp_path) -> None:
    """`--config base --config overlay`: the overlay's init_args alone are checked against the
    classes the base named, and a dataclass of options (augment) key by key."""
    overlay = tmp_path / "augment.yaml"
    overlay.write_text(
        "data:\n  init_args:\n    augment:\n      nosie: {prob: 0.3}\n      reverb: {porb: 0.1}\n"
        "      narrowband: 0.1\n      noise: [0.3]\n      gain: {}\n"
    )
    classes: dict = {}
    assert config_problems(QUICK, classes) == []
    assert config_problems(overlay, classes) == [
        f"{overlay}:4: data.init_args.augment.nosie: WaveAugment takes no argument 'nosie' "
        "(did you mean 'noise'?)",
        f"{overlay}:5: data.init_args.augment.reverb.porb: ReverbAugment takes no argument "
        "'porb' (did you mean 'prob'?)",
        # not a mapping: jsonargparse failed in instantiation, three tracebacks, no line
        f"{overlay}:6: data.init_args.augment.narrowband: expected a mapping of "
        "NarrowbandAugment's arguments, got 0.1",
        f"{overlay}:7: data.init_args.augment.noise: expected a mapping of NoiseAugment's "
        "arguments, got a list",
    ]
    assert config_problems(overlay) == []  # alone, it does not say what `data` is


def test_a_config_that_is_not_utf8_is_named_with_its_line(tmp_path, capsys) -> None:
    """An editor's Latin-1 in a comment stopped `asr fit` with a traceback naming no file."""
    path = tmp_path / "latin1.yaml"
    path.write_bytes("trainer:\n  max_epochs: 1 # café\n".encode("latin-1"))
    assert refused(["fit", "--config", str(QUICK), "--config", str(path)], capsys) == [
        f"asr fit: error: {path}:2: not UTF-8 text (byte 0xe9 at column 22; save the file as UTF-8)"
    ]


@pytest.mark.parametrize("text", ["", "# overlay: nothing yet\n"])
def test_an_overlay_that_holds_no_settings_changes_nothing(
    tmp_path, capsys, monkeypatch, recwarn, text
) -> None:
    """YAML reads an empty or comment-only file as no document, which jsonargparse refused
    with a page of usage and `Unexpected config: `, naming no file."""
    from asr.train import run_lightning_cli

    path = tmp_path / "overlay.yaml"
    path.write_text(text)
    printed = []
    for overlay in ([], ["--config", str(path)], [f"--config={path}"]):
        argv = ["fit", "--print_config", "--config", str(QUICK), *overlay]
        monkeypatch.setattr(sys, "argv", ["asr", *argv])  # as the command runs it
        with pytest.raises(SystemExit) as stopped:
            run_lightning_cli(argv)
        assert not stopped.value.code, capsys.readouterr().err[-300:]
        printed.append(capsys.readouterr().out)
    assert printed[0] and printed[1] == printed[0] == printed[2]
    assert not [w for w in recwarn if "args parameter" in str(w.message)], "no caution"


def test_a_null_document_is_an_overlay_that_holds_no_settings(tmp_path) -> None:
    """`---` or `null` alone is YAML's null document: refused unnamed as the empty file was."""
    from asr.config_check import without_empty_configs

    for k, text in enumerate(["---\n# overlay: nothing yet\n", "null\n", "{}\n", "a: 1\n"]):
        path = tmp_path / f"{k}.yaml"
        path.write_text(text)
        kept = without_empty_configs(["fit", "--config", str(path)])
        assert kept == (["fit"] if k < 2 else ["fit", "--config", str(path)]), text


def test_the_config_options_are_found_in_every_spelling() -> None:
    argv = ["fit", "--config", "a.yaml", "-c", "b.yaml", "--config=c.yaml", "--trainer.x", "1"]
    assert config_paths(argv) == ["a.yaml", "b.yaml", "c.yaml"]


def test_asr_fit_stops_on_them_before_training(tmp_path, capsys) -> None:
    path, line = edited(tmp_path, "max_epochs: 8", "max_epoch: 8")
    assert refused(["fit", "--config", str(QUICK), "--config", str(path)], capsys) == [
        f"asr fit: error: {path}:{line}: trainer.max_epoch: the Trainer takes no argument "
        "'max_epoch' (did you mean 'max_epochs'?)"
    ]


@pytest.mark.parametrize("given", ["overlay", "file", "option"])
def test_a_value_a_class_of_options_refuses_is_named_with_its_line(
    tmp_path, capsys, monkeypatch, given
) -> None:
    """What the augmentation options check when built (a range the wrong way round) is said
    with the file and line that set it; set by an option, as said."""
    monkeypatch.chdir(tmp_path)  # the config's data files are not needed to refuse
    setting = "reverb: {prob: 0.1, rt60: [0.9, 0.2]}"
    overlay, where = tmp_path / "augment.yaml", ""
    if given == "overlay":
        overlay.write_text(f"data:\n  augment:\n    {setting}\n")
        where = f"{overlay}:3: "
    elif given == "file":  # the data's own file, named by the overlay
        (tmp_path / "data.yaml").write_text(f"init_args:\n  augment:\n    {setting}\n")
        overlay.write_text("data: data.yaml\n")
        where = f"{tmp_path / 'data.yaml'}:3: "
    else:  # set in the overlay, and over it by an option: the option's value is refused
        overlay.write_text("data:\n  augment:\n    reverb: {prob: 0.1}\n")
    argv = ["fit", "--config", str(QUICK), "--config", str(overlay)]
    if given == "option":
        argv += ["--data.augment.reverb.rt60", "[0.9, 0.2]"]
    assert refused(argv, capsys)[-1] == (
        f"asr fit: error: {where}augment.reverb.rt60 must be [low, high] with low <= high, "
        "got [0.9, 0.2]"
    )


@pytest.mark.parametrize("where", ["option", "overlay"])
def test_a_top_level_setting_refused_is_placed_only_where_a_file_set_it(
    tmp_path, capsys, monkeypatch, where
) -> None:
    """rnn_quick.yaml sets data.num_workers 0: -1 given as an option is not that line's."""
    from asr.cli import main

    monkeypatch.chdir(tmp_path)
    overlay = tmp_path / "workers.yaml"
    overlay.write_text("data:\n  num_workers: -1\n")
    given = ["--data.num_workers", "-1"] if where == "option" else ["--config", str(overlay)]
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(QUICK), *given])
    placed = f"{overlay}:2: " if where == "overlay" else ""
    said = capsys.readouterr().err.splitlines()[-1]
    assert said == f"asr fit: error: {placed}data.num_workers is -1: must be at least 0"


@pytest.mark.parametrize(
    ("value", "said"),
    [("snr_db: 10", "snr_db: expected a list of 2 numbers, got 10"),
     ("snr_db: [5, 10, 30]", "snr_db: expected a list of 2 numbers, got a list of 3"),
     ("snr_db: [5, x]", "snr_db: expected a list of 2 numbers, got 'x' among them"),
     ("kinds: white", "kinds: expected a list of strings, got 'white'"),
     ("babble_talkers: [2.5, 3]", "babble_talkers: expected a list of 2 whole numbers, got 2.5 "),
     ('snr_db: ["5", 30], babble_talkers: ["3", 7], kinds: [white, !!str x]', None)],
)  # fmt: skip
def test_a_range_or_list_of_the_wrong_shape_is_named_with_its_line(tmp_path, value, said) -> None:
    """jsonargparse refused these with its usage and a page of union subtypes, no line."""
    path = tmp_path / "augment.yaml"
    path.write_text(f"data:\n  init_args:\n    augment:\n      noise: {{prob: 0.3, {value}}}\n")
    classes: dict = {}
    assert config_problems(QUICK, classes) == []  # the classes the overlay's keys go to
    if said is None:  # spellings jsonargparse takes: quoted numbers, a tagged item
        assert config_problems(path, classes) == []
        return
    [problem] = config_problems(path, classes)
    assert problem.startswith(f"{path}:4: data.init_args.augment.noise.{said}")


FEATURES = "model:\n  init_args:\n    frontend:\n      init_args:\n        features:\n"


@pytest.mark.parametrize("given", ["overlay", "class", "option"])
def test_a_value_a_frontend_refuses_is_named_with_its_line(
    tmp_path, capsys, monkeypatch, given
) -> None:
    """A frontend's refusal as it is built names its class, not a key: it is placed at the
    argument it names, of the class that refused it (an MFCC for the filterbank it holds),
    in the config that set it; set by an option, as said."""
    from asr.text import CharTokenizer

    monkeypatch.chdir(tmp_path)  # the model is built after its tokenizer, before reading data
    CharTokenizer.train(["YES NO"]).save(tmp_path / "data/an4/tokenizer")
    overlay = tmp_path / "features.yaml"
    argv = ["fit", "--config", str(QUICK), "--config", str(overlay)]
    if given == "overlay":  # init_args alone, laid over the LogMelFilterbank of rnn_quick.yaml
        overlay.write_text(FEATURES + "          init_args:\n            f_min: 9000\n")
        where = f"{overlay}:7: "
    elif given == "class":
        overlay.write_text(
            FEATURES + "          class_path: asr.frontends.MFCC\n"
            "          init_args:\n            n_mels: 80\n            f_min: 9000\n"
        )
        where = f"{overlay}:9: "
    else:
        overlay.write_text("trainer:\n  max_steps: 1\n")
        argv += ["--model.init_args.frontend.init_args.features.init_args.f_min", "9000"]
        where = ""
    assert refused(argv, capsys)[-1] == (
        f"asr fit: error: {where}LogMelFilterbank: need 0 <= f_min < f_max <= 8000 Hz (half "
        "the 16000 Hz sample rate), got f_min=9000.0, f_max=None"
    )


def test_a_value_refused_within_a_class_is_placed_at_that_class(tmp_path, capsys, monkeypatch):
    """An encoder's attention refuses its heads as the encoder builds it, the encoder as the
    model builds it: the encoder is the class the config built, whose `num_heads` it names."""
    from asr.text import CharTokenizer

    monkeypatch.chdir(tmp_path)
    CharTokenizer.train(["YES NO"]).save(tmp_path / "data/an4/tokenizer")
    overlay = tmp_path / "heads.yaml"
    overlay.write_text(
        "model:\n  init_args:\n    frontend:\n      init_args: {normalize: null}\n"
        "    encoder:\n      init_args:\n        num_heads: 5\n"
    )
    quick = str(ROOT / "conf/an4/transformer_quick.yaml")
    said = refused(["fit", "--config", quick, "-c", str(overlay)], capsys)[-1]
    assert said == f"asr fit: error: {overlay}:7: d_model=144 is not divisible by num_heads=5"


def test_a_refusal_of_an_argument_is_placed_at_the_overlay_that_set_it(
    tmp_path, capsys, monkeypatch
) -> None:
    """Said in a part's words (`unknown window`, `norm=`, `grid ratio`), a refusal was placed
    at the class's line in the first config, naming no setting the configs have."""
    from asr.text import CharTokenizer

    monkeypatch.chdir(tmp_path)
    CharTokenizer.train(["YES NO"]).save(tmp_path / "data/an4/tokenizer")
    overlay = tmp_path / "window.yaml"
    overlay.write_text(FEATURES + "          init_args:\n            window: hanning\n")
    said = refused(["fit", "--config", str(QUICK), "--config", str(overlay)], capsys)[-1]
    assert said.startswith(f"asr fit: error: {overlay}:7: window must be one of [")
    overlay.write_text("data:\n  init_args:\n    shape_grid: 0.9\n")
    said = refused(["fit", "--config", str(QUICK), "--config", str(overlay)], capsys)[-1]
    assert said == f"asr fit: error: {overlay}:3: shape_grid must be finite and > 1, got 0.9"


def test_where_built_prefers_the_argument_named_to_the_class(tmp_path) -> None:
    from asr.config_check import where_built

    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(FEATURES + "          class_path: asr.frontends.MFCC\n")
    second.write_text(FEATURES + "          init_args: {n_mfcc: 99}\n")
    said = "n_mfcc (99) must be in [1, n_mels = 80]"
    keys = ["model", "frontend", "features"]
    assert where_built([first], "MFCC", said) == (f"{first}:6", [*keys, "class_path"])
    assert where_built([first, second], "MFCC", said) == (f"{second}:6", [*keys, "n_mfcc"])
    assert where_built([second, first], "MFCC", said) == (f"{second}:6", [*keys, "n_mfcc"])
    assert where_built([first, second], "LogMelFilterbank", said) is None
    # a word of the message's prose that names another argument (a mapping) is not it
    weight = tmp_path / "weight.yaml"
    weight.write_text("model:\n  class_path: asr.lightning.ASRModule\n  init_args:\n"
                      "    ctc_weight: 1.0\n")  # fmt: skip
    second.write_text("model:\n  init_args:\n    decoder:\n      init_args: {embed_dim: 32}\n")
    said = "ctc_weight must lie in [0, 1), got 1.0: at 1 the attention decoder, which ... "
    assert where_built([weight, second], "ASRModule", said) == (
        f"{weight}:4",
        ["model", "ctc_weight"],
    )
    # the argument a refusal is about, after its class: not one its advice names later
    layers = tmp_path / "layers.yaml"
    layers.write_text("model:\n  init_args:\n    encoder:\n      class_path: x.TransformerEncoder\n"
                      "      init_args:\n        num_layers: 0\n        d_model: 4\n")  # fmt: skip
    said = "TransformerEncoder: num_layers must be >= 1, got 0"
    assert where_built([layers], "TransformerEncoder", said)[0] == f"{layers}:6"
    weight.write_text("model:\n  class_path: asr.lightning.ASRModule\n  init_args:\n"
                      "    inter_ctc_layers: []\n    inter_ctc_weight: 0.3\n")  # fmt: skip
    said = "inter_ctc_layers names no block: name some, or set inter_ctc_weight 0 to train ..."
    assert where_built([weight], "ASRModule", said)[0] == f"{weight}:4"


def test_where_set_finds_the_last_config_to_set_a_key(tmp_path) -> None:
    from asr.config_check import where_set

    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("data:\n  init_args:\n    augment:\n      noise: {prob: 2}\n")
    second.write_text("trainer:\n  max_epochs: 1\n")
    assert where_set([first, second], "augment.noise.prob") == f"{first}:4"
    second.write_text("data:\n  augment:\n    noise:\n      prob: 3\n")
    assert where_set([first, second], "augment.noise.prob") == f"{second}:4"
    assert where_set([first, second], "augment.gain.prob") is None
    assert where_set([first, tmp_path / "missing.yaml"], "noise.prob") == f"{first}:4"


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test"])
def test_the_top_level_keys_are_those_each_subcommand_takes(tmp_path, capsys, subcommand) -> None:
    """As each prints them in the config.yaml it saves, which is given again as a config."""
    from asr.config_check import EVALUATION_KEYS, TOP_LEVEL_KEYS
    from asr.train import run_lightning_cli

    with pytest.raises(SystemExit):
        run_lightning_cli([subcommand, "--print_config", "--config", str(QUICK)])
    printed = capsys.readouterr().out.splitlines()
    keys = {line.split(":")[0] for line in printed if line[:1].isalpha()}
    assert keys == set(TOP_LEVEL_KEYS + (EVALUATION_KEYS if subcommand != "fit" else ()))
    (tmp_path / "printed.yaml").write_text("\n".join(printed) + "\n")
    assert not config_problems(tmp_path / "printed.yaml", subcommand=subcommand)
    if subcommand == "fit":
        (tmp_path / "verbose.yaml").write_text("verbose: true\n")
        assert "verbose: no such key" in config_problems(tmp_path / "verbose.yaml")[0]


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("--trainer.max_epohcs", "Trainer takes no argument 'max_epohcs' (did you mean "
         "'max_epochs'?)"),
        ("--data.init_args.max_batch_siz=3", "asr.lightning.ASRDataModule takes no argument "
         "'max_batch_siz' (did you mean 'max_batch_size'?)"),
        ("--model.optimizer.init_args.lrr", "torch.optim.AdamW takes no argument 'lrr' (did you "
         "mean 'lr'?)"),
        ("--data.augment.nosie.prob", "WaveAugment takes no argument 'nosie' (did you mean "
         "'noise'?)"),
        ("--model.lr", "asr.lightning.ASRModule takes no argument 'lr'"),
        ("--trainer.max_steps=abc", "expected int, got 'abc'"),
        ("--model.encoder.init_args.num_layers=2.5", "expected int, got '2.5'"),
        ("--data.augment.noise.prob=often", "expected float, got 'often'"),
        ("--data.init_args.augment.noise=[0.3]", "expected a mapping of NoiseAugment's "
         "arguments, got a list"),
        ("--data.augment=3", "expected a mapping of WaveAugment's arguments, got 3"),
        ("--data.augment.gain=null", "expected a mapping of GainAugment's arguments, got null"),
        ("--data.augment.gain=true", "expected a mapping of GainAugment's arguments, got true"),
        ("--data.augment.gain=1", "expected a mapping of GainAugment's arguments, got 1"),
        ("--model.init_args.vocab_size=50", "set from data.tokenizer (a link, which overrides "
         "it); set that instead"),
        ("--model.tokenizer", "set from data.tokenizer (a link, which overrides it); set that "
         "instead"),
        ("--model.init_args.frontend.init_args.augment=null", "a part is not removed on the "
         "command line (jsonargparse takes no null for it there): lay a config over this one, "
         "with `augment: null` under its place (asr fit --config CONFIG --config WITHOUT.yaml)"),
    ],
)  # fmt: skip
def test_a_wrong_option_is_named_against_the_class_it_goes_to(option, said) -> None:
    from lightning.pytorch import Trainer

    classes: dict = {}
    assert config_problems(QUICK, classes) == []
    argv = ["fit", "--config", str(QUICK), option, "1"]
    assert option_problems(argv, classes, {"trainer": Trainer}) == [
        f"{option.split('=')[0]}: {said}"
    ]


@pytest.mark.parametrize(
    "options",
    [
        ["--trainer.max_epochs", "2", "--data.max_batch_size=3", "--model.init_args.ctc_weight"],
        ["--trainer.max_epoch", "2"],  # argparse expands the Trainer's own options
        ["--model", "other.Module", "--model.lr", "3"],  # jsonargparse judges a new class
        ["--model.encoder", "other.Encoder", "--model.encoder.init_args.width", "3"],
        ["--trainer.callbacks+=x.Y", "--trainer.logger.init_args.save_dir", "d"],
        ["--model.dict_kwargs.anything", "1", "--unknown.key", "1"],
        ["--model.help", "asr.lightning.ASRModule", "--data.help", "asr.lightning.ASRDataModule",
         "--model.encoder.help", "asr.models.rnn.RNNEncoder"],  # jsonargparse's help on a class
        ["--trainer.max_steps=3", "--model.ctc_weight", "1", "--trainer.enable_progress_bar",
         "yes", "--model.encoder.num_layers", " 2", "--trainer.max_epochs", "-1"],
        ["--data.augment.noise", "{prob: 0.5}", "--data.augment=null", "--data.augment.gain",
         "gain.yaml"],  # a mapping, null where allowed, a file
    ],
)  # fmt: skip
def test_options_it_cannot_judge_or_that_are_right_pass(options) -> None:
    from lightning.pytorch import Trainer

    classes: dict = {}
    config_problems(QUICK, classes)
    argv = ["fit", "--config", str(QUICK), *options]
    assert option_problems(argv, classes, {"trainer": Trainer}) == []


def test_asr_fit_stops_on_a_wrong_option_before_training(capsys) -> None:
    assert refused(["fit", "--config", str(QUICK), "--checkpoint.monitr", "val/cer"], capsys) == [
        "asr fit: error: --checkpoint.monitr: RunCheckpoint takes no argument 'monitr' (did you "
        "mean 'monitor'?)"
    ]


def test_asr_fit_gives_help_on_a_class_with_a_config(capsys) -> None:
    from asr.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(QUICK), "--model.help", "asr.lightning.ASRModule"])
    assert stopped.value.code == 0
    assert "--model.ctc_weight CTC_WEIGHT" in capsys.readouterr().out
