import logging
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from asr.checkpoint import (
    RECOGNIZER_KEY,
    TRAINING_ONLY,
    CheckpointError,
    atomic_save,
    average_checkpoints,
    best_checkpoints,
    load_checkpoint,
    read_payload,
)
from asr.cli import main


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_an_hf_name_where_a_checkpoint_file_is_read_says_so():
    """`--lm hf://me/lm` said `hf:/me/lm: no such checkpoint`, one slash gone."""
    with pytest.raises(FileNotFoundError, match=r"^hf://me/lm: hf:// names a model package"):
        load_checkpoint("hf://me/lm")


def test_crafted_pickle_is_refused(tmp_path):
    path = tmp_path / "evil.ckpt"
    with open(path, "wb") as f:
        pickle.dump({"state_dict": {}, "x": _RunsCode()}, f)
    with pytest.raises(CheckpointError, match="evil.ckpt: refused to load"):
        load_checkpoint(path)


def test_garbage_file_names_the_file(tmp_path):
    path = tmp_path / "bad.ckpt"
    path.write_bytes(b"\x00not a checkpoint")
    with pytest.raises(CheckpointError, match="bad.ckpt"):
        load_checkpoint(path)


@pytest.mark.parametrize("content", [b"RIFF\x24\x00\x00\x00WAVEfmt ", b"epoch,step\n1,2\n", b""])
def test_a_file_that_is_no_checkpoint_is_named_as_such(content, tmp_path):
    path = tmp_path / "recording.wav"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=r"recording.wav: not a checkpoint"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError, match=r": a folder, not a checkpoint file"):
        load_checkpoint(tmp_path)


def _malformed(state: dict, edit: str) -> object:
    """`state`, a recognizer checkpoint, as another tool's file or with a payload entry gone
    or of another type."""
    payload = dict(state[RECOGNIZER_KEY])
    if edit in ("list", "tensor"):
        return [1, 2, 3] if edit == "list" else torch.zeros(3)
    if edit == "no state_dict":
        return {RECOGNIZER_KEY: payload}
    if edit == "no tokenizer":
        payload.pop("tokenizer")
    else:
        payload[edit] = "hello" if edit == "model_config" else []
    return state | {RECOGNIZER_KEY: payload}


@pytest.mark.parametrize(
    "edit, said",
    [
        ("list", "no recognizer config inside (not written by `asr fit`?)"),
        ("tensor", "no recognizer config inside (not written by `asr fit`?)"),
        ("no state_dict", "no state_dict inside (not written by `asr fit`?)"),
        ("model_config", "its model_config is a str, not a mapping of settings"),
        ("no tokenizer", "no tokenizer files inside (not written by `asr fit`?)"),
        ("assets", "its assets entry is not files by name (base64 text)"),
    ],
)
def test_a_checkpoint_not_shaped_as_asr_writes_it_is_refused_naming_the_file(
    edit, said, tiny_checkpoint, tmp_path, capsys
):
    """Each was a traceback (AttributeError, KeyError) in every command that reads a model."""
    path = tmp_path / "bad.ckpt"
    torch.save(_malformed(load_checkpoint(tiny_checkpoint["checkpoint"]), edit), path)
    with pytest.raises(CheckpointError) as refused:
        read_payload(path, RECOGNIZER_KEY)
    assert str(refused.value) == f"{path}: {said}"
    for command in (
        ["transcribe", str(tmp_path / "a.wav"), "--model", str(path)],
        ["evaluate", "--model", str(path), "--manifest", "m.jsonl", "--out", str(tmp_path)],
        ["finalize", "--model", str(path), "--manifest", "m.jsonl"],
        ["export", "--checkpoint", str(path), "--out", str(tmp_path / "pkg")],
    ):
        assert main(command) == 2
        assert capsys.readouterr().err.strip() == f"asr {command[0]}: error: {path}: {said}"


@pytest.mark.parametrize("content", [[1, 2], torch.zeros(2)])
def test_another_tools_checkpoint_is_refused_by_average_and_resume(
    content, tmp_path, capsys, monkeypatch
):
    """A list or a tensor saved by torch gave an AttributeError traceback."""
    config = str(Path("conf/an4/transformer_quick.yaml").resolve())
    monkeypatch.chdir(tmp_path)  # no data/: refused before any is read
    path = tmp_path / "other.ckpt"
    torch.save(content, path)
    said = f"{path}: no state_dict inside (not written by `asr fit`?)"
    assert main(["average", "--last", str(path), "--best", "2", "--out", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err.strip() == f"asr average: error: {said}"
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", config, "--ckpt_path", str(path)])
    assert stopped.value.code == 2 and f"asr fit: error: {said}" in capsys.readouterr().err


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_save({"step": 1}, path)

    def torn_save(obj, f):
        f.write(b"partial")
        raise KeyboardInterrupt  # a kill in the middle of the write

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(KeyboardInterrupt):
        atomic_save({"step": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"], "no temp file left"


def test_average_is_the_mean_of_float_weights(tmp_path):
    paths = []
    for i in range(3):
        state = {"state_dict": {"w": torch.full((2,), float(i)), "n": torch.tensor(i)}, "epoch": i}
        paths.append(tmp_path / f"{i}.ckpt")
        atomic_save(state, paths[-1])
    out = average_checkpoints(paths, tmp_path / "avg.ckpt")
    avg = load_checkpoint(out)
    torch.testing.assert_close(avg["state_dict"]["w"], torch.full((2,), 1.0))
    assert avg["state_dict"]["n"] == 0 and avg["epoch"] == 0


def test_saving_through_a_link_writes_its_target_only_when_asked_and_keeps_the_mode(tmp_path):
    """asr finalize through link.ckpt made it a file of its own, 0644, the target unchanged;
    Lightning's last.ckpt link must be replaced, its target (a kept checkpoint) left alone."""
    target, link = tmp_path / "target.ckpt", tmp_path / "link.ckpt"
    atomic_save({"v": 1}, target)
    target.chmod(0o600)
    link.symlink_to(target.name)
    atomic_save({"v": 2}, link, follow_link=True)
    assert link.is_symlink() and load_checkpoint(target) == {"v": 2}
    assert target.stat().st_mode & 0o777 == 0o600
    atomic_save({"v": 3}, link)
    assert not link.is_symlink() and load_checkpoint(target) == {"v": 2}


@pytest.mark.parametrize("key", [*sorted(TRAINING_ONLY), "attention_dropout", "mean"])
def test_what_a_resume_may_change_leaves_one_model_to_average(key, tmp_path):
    """`asr fit --ckpt_path last` and `asr average` read one list of settings: a run resumed
    with other scheduled sampling (say) left checkpoints `asr average` refused to mix."""
    from asr.finetune import setting_differences

    runs = [{"decoder": {"class_path": "D", "init_args": {"size": 4, key: v}}} for v in (1, 2)]
    resumable = not setting_differences(*runs, ["decoder"], fine_tune=False)
    assert resumable == (key != "mean"), "inline CMVN statistics make another model"
    for name, config in zip("ab", runs):
        payload = {"state_dict": {"w": torch.zeros(1)}, "asr": {"model_config": config}}
        atomic_save(payload, tmp_path / f"{name}.ckpt")
    paths = [tmp_path / "a.ckpt", tmp_path / "b.ckpt"]
    if resumable:
        average_checkpoints(paths, tmp_path / "o.ckpt")
    else:
        with pytest.raises(CheckpointError, match=r"b.ckpt: its model config \(decoder\)"):
            average_checkpoints(paths, tmp_path / "o.ckpt")


def test_average_rejects_different_models(tmp_path):
    atomic_save({"state_dict": {"a": torch.zeros(1)}}, tmp_path / "a.ckpt")
    atomic_save({"state_dict": {"b": torch.zeros(1)}}, tmp_path / "b.ckpt")
    with pytest.raises(CheckpointError, match="parameters differ"):
        average_checkpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt"], tmp_path / "o.ckpt")
    for other in ({"weights": {"a": torch.zeros(1)}}, torch.zeros(1)):  # torch.save of others
        atomic_save(other, tmp_path / "w.ckpt")
        with pytest.raises(CheckpointError, match=r"w.ckpt: no state_dict inside"):
            average_checkpoints([tmp_path / "a.ckpt", tmp_path / "w.ckpt"], tmp_path / "o.ckpt")
    other = {"state_dict": {"a": torch.zeros(1)}, "asr": {"tokenizer": {"tokens.txt": "A B"}}}
    atomic_save(other, tmp_path / "d.ckpt")  # same shapes, another tokenizer
    with pytest.raises(CheckpointError, match=r"d.ckpt: its tokenizer is not that of .*a.ckpt"):
        average_checkpoints([tmp_path / "a.ckpt", tmp_path / "d.ckpt"], tmp_path / "o.ckpt")
    config = {"encoder": {"num_heads": 4}, "frontend": {"hop": 160}, "ctc": True}
    for name, change in [("e", {"num_heads": 8}), ("f", {"hop": 320})]:  # same shapes
        changed = config | {"encoder" if name == "e" else "frontend": change}
        other = {"state_dict": {"a": torch.zeros(1)}, "asr": {"model_config": changed}}
        atomic_save(other, tmp_path / f"{name}.ckpt")
    atomic_save({"state_dict": {"a": torch.zeros(1)}, "asr": {"model_config": config}},
                tmp_path / "g.ckpt")  # fmt: skip
    with pytest.raises(CheckpointError, match=r"e.ckpt: its model config \(encoder\) is not"):
        average_checkpoints([tmp_path / "g.ckpt", tmp_path / "e.ckpt"], tmp_path / "o.ckpt")
    with pytest.raises(CheckpointError, match=r"f.ckpt: its model config \(frontend, encoder\)"):
        average_checkpoints([tmp_path / "e.ckpt", tmp_path / "f.ckpt"], tmp_path / "o.ckpt")
    resumed = {  # a run resumed with other training settings and the statistics' path spelt
        "encoder": {"num_heads": 4, "dropout": 0.2}, "frontend": {"hop": 160},  # otherwise
        "ctc": False, "plot_every_n_epochs": 5,
    }  # fmt: skip
    for name, (settings, path) in {
        "i": (config, "cmvn.json"),
        "j": (resumed, "./cmvn.json"),
    }.items():
        payload = {"model_config": settings, "assets": {path: "e30="}}
        atomic_save(
            {"state_dict": {"a": torch.zeros(1)}, "asr": payload}, tmp_path / f"{name}.ckpt"
        )
    average_checkpoints([tmp_path / "i.ckpt", tmp_path / "j.ckpt"], tmp_path / "o.ckpt")
    for name, heads in (("k", 4), ("l", 8)):  # language models: their own network part
        lm = {"lm": {"class_path": "asr.models.lm.TransformerLM", "num_heads": heads}}
        atomic_save({"state_dict": {"a": torch.zeros(1)}, "lm": {"model_config": lm}},
                    tmp_path / f"{name}.ckpt")  # fmt: skip
    with pytest.raises(CheckpointError, match=r"l.ckpt: its model config \(lm\) is not"):
        average_checkpoints([tmp_path / "k.ckpt", tmp_path / "l.ckpt"], tmp_path / "o.ckpt")
    assets = {
        "state_dict": {"a": torch.zeros(1)},
        "asr": {"model_config": config, "assets": {"cmvn.json": "e30="}},
    }
    atomic_save(assets, tmp_path / "h.ckpt")  # fmt: skip
    with pytest.raises(CheckpointError, match=r"h.ckpt: its asset file \(CMVN statistics\)"):
        average_checkpoints([tmp_path / "g.ckpt", tmp_path / "h.ckpt"], tmp_path / "o.ckpt")
    atomic_save({"state_dict": {"a": torch.zeros(3, 2)}}, tmp_path / "c.ckpt")  # other vocab
    with pytest.raises(CheckpointError, match=r"c.ckpt: a is \(3, 2\), \(1,\) in .*a.ckpt"):
        average_checkpoints([tmp_path / "a.ckpt", tmp_path / "c.ckpt"], tmp_path / "o.ckpt")


def _run_with_best(folder, scores):
    """A run folder: one checkpoint per score, and last.ckpt recording them as Lightning does."""
    folder.mkdir()
    best = {}
    for name, score in scores.items():
        atomic_save({"state_dict": {}}, folder / name)
        best[str(folder / name)] = torch.tensor(score)
    key = "ModelCheckpoint{'monitor': 'val/wer', 'mode': 'min'}"
    atomic_save(
        {"state_dict": {}, "callbacks": {key: {"best_k_models": best}}}, folder / "last.ckpt"
    )
    return folder / "last.ckpt"


def test_best_checkpoints_ranks_by_score(tmp_path):
    last = _run_with_best(tmp_path / "run", {"a.ckpt": 30.0, "b.ckpt": 10.0, "c.ckpt": 20.0})
    assert [p.name for p in best_checkpoints(last, 2)] == ["b.ckpt", "c.ckpt"]


def test_best_checkpoints_follow_a_moved_or_copied_run_folder(tmp_path):
    last = _run_with_best(tmp_path / "run", {"a.ckpt": 30.0, "b.ckpt": 10.0})
    copy = tmp_path / "copy"  # reads its own, while the originals are still there
    shutil.copytree(last.parent, copy)
    assert best_checkpoints(copy / "last.ckpt", 2) == [copy / "b.ckpt", copy / "a.ckpt"]
    moved = tmp_path / "elsewhere"
    last.parent.rename(moved)
    assert best_checkpoints(moved / "last.ckpt", 2) == [moved / "b.ckpt", moved / "a.ckpt"]


def test_a_step_checkpoint_folders_last_reads_the_best_where_they_are(tmp_path):
    """With --step_checkpoint.dirpath, that folder's last.ckpt (the later of the two after a
    mid-epoch stop) was taken for a moved run's, and the run's best refused as missing. Its
    record of the folder it wrote to tells it from a copy, which still reads its own."""
    last = _run_with_best(tmp_path / "run", {"a.ckpt": 30.0, "b.ckpt": 10.0})
    state = load_checkpoint(last)
    next(iter(state["callbacks"].values()))["dirpath"] = str(last.parent)
    steps = tmp_path / "steps"
    steps.mkdir()
    state["callbacks"]["StepCheckpoint"] = {"dirpath": str(steps)}
    atomic_save(state, steps / "last.ckpt")
    best = [last.parent / "b.ckpt", last.parent / "a.ckpt"]
    assert best_checkpoints(steps / "last.ckpt", 2) == best
    copy = tmp_path / "copy"
    shutil.copytree(steps, copy)
    with pytest.raises(FileNotFoundError, match="in another folder"):
        best_checkpoints(copy / "last.ckpt", 2)
    # the run went on to its end: its own last.ckpt, written later, records a better one
    ran_on = load_checkpoint(last) | {"global_step": 18}
    record = next(iter(ran_on["callbacks"].values()))
    record |= {"dirpath": str(last.parent), "last_model_path": str(last)}
    record["best_k_models"][str(last.parent / "c.ckpt")] = torch.tensor(5.0)
    atomic_save({"state_dict": {}}, last.parent / "c.ckpt")
    atomic_save(ran_on, last)
    older = load_checkpoint(steps / "last.ckpt") | {"global_step": 16}
    next(iter(older["callbacks"].values()))["last_model_path"] = str(last)
    atomic_save(older, steps / "last.ckpt")
    assert best_checkpoints(steps / "last.ckpt", 2) == [last.parent / "c.ckpt", best[0]]


def test_average_never_writes_over_what_it_reads(tmp_path, capsys):
    last = _run_with_best(tmp_path / "run", {"a.ckpt": 30.0, "b.ckpt": 10.0})
    a = last.parent / "a.ckpt"
    with pytest.raises(ValueError, match="a.ckpt is one of the checkpoints averaged"):
        average_checkpoints([a, last.parent / "b.ckpt"], last.parent / "." / "a.ckpt")
    before = last.read_bytes()
    assert main(["average", "--last", str(last), "--out", str(last)]) == 2
    assert (
        "is the --last this command reads: writing it would overwrite it" in capsys.readouterr().err
    )
    assert main(["average", "--checkpoints", str(a), str(a), "--best", "2", "--out", "x"]) == 2
    assert last.read_bytes() == before
    assert main(["average", "--last", str(last), "--best", "4", "--out", str(tmp_path / "o")]) == 0
    assert "records 2 best checkpoints, not 4" in capsys.readouterr().err
    for out, said in [  # before any checkpoint is read, not as an OSError of a temporary file
        (tmp_path, f"--out {tmp_path} is a folder: name the file to write"),
        ("", "--out '' is a folder: name the file to write"),
        (last / "avg.ckpt", f"--out {last / 'avg.ckpt'}: {last} is a file, not a folder"),
    ]:
        assert main(["average", "--checkpoints", str(a), "--out", str(out)]) == 2
        assert said in capsys.readouterr().err
    assert main(["average", "--checkpoints", str(a), "--out", str(tmp_path / "one")]) == 0
    assert f"averaged 1 checkpoint into {tmp_path / 'one'}:" in capsys.readouterr().out


def test_a_checkpoint_given_twice_by_any_name_is_refused(tmp_path, capsys):
    """A A ./A B averaged four checkpoints, A weighing three times as much."""
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    atomic_save({"state_dict": {"w": torch.zeros(1)}}, a)
    atomic_save({"state_dict": {"w": torch.ones(1)}}, b)
    (tmp_path / "link.ckpt").symlink_to(a.name)
    with pytest.raises(ValueError, match=rf"{re.escape(str(a))}: given twice; each checkpoint"):
        average_checkpoints([a, b, a], tmp_path / "o.ckpt")
    for again in (f"{tmp_path}/./a.ckpt", tmp_path / "link.ckpt"):  # pathlib drops "."
        said = rf"{re.escape(str(again))}: given twice \(as {re.escape(str(a))} too\)"
        with pytest.raises(ValueError, match=said):
            average_checkpoints([a, b, again], tmp_path / "o.ckpt")
    args = ["average", "--checkpoints", str(a), str(a), str(b), "--out", str(tmp_path / "o")]
    assert main(args) == 2 and "given twice" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_an_average_leaves_out_what_finalize_fitted_on_one_of_its_checkpoints(tmp_path, caplog):
    """Search settings, confidence scaling and alignment heads of the first are not the
    average's: it is finalized anew, or decodes with the defaults."""
    finalized = {
        "decoding": {"beam_size": 3},
        "confidence_scaling": {"a": 1.0, "b": 0.0},
        "alignment_heads": [1, 2],
        "segment_seconds": 5.0,  # of the training data, not of the weights: kept
    }
    paths = [tmp_path / "a.ckpt", tmp_path / "b.ckpt"]
    for path, payload in zip(paths, (finalized, {})):
        atomic_save({"state_dict": {"w": torch.zeros(1)}, "asr": payload}, path)
    with caplog.at_level(logging.INFO, logger="asr.checkpoint"):
        average = load_checkpoint(average_checkpoints(paths, tmp_path / "avg.ckpt"))
    assert average["asr"] == {"segment_seconds": 5.0}
    assert "a.ckpt: its decoding, confidence_scaling, alignment_heads (of `asr finalize`)" in (
        caplog.text
    )


def test_a_moved_run_missing_a_best_checkpoint_never_reads_the_originals(tmp_path):
    """A copy of a run with one best checkpoint deleted averaged the original run's file."""
    last = _run_with_best(tmp_path / "run", {"a.ckpt": 30.0, "b.ckpt": 10.0})
    copy = tmp_path / "copy"
    shutil.copytree(last.parent, copy)
    (copy / "b.ckpt").unlink()
    missing, original = (re.escape(str(folder / "b.ckpt")) for folder in (copy, last.parent))
    said = rf"{missing}: no such checkpoint.* {original}, in another folder .* is not read in"
    with pytest.raises(FileNotFoundError, match=said):
        best_checkpoints(copy / "last.ckpt", 2)
    (last.parent / "b.ckpt").unlink()  # where the run was not moved: as recorded
    assert best_checkpoints(last, 2) == [last.parent / "b.ckpt", last.parent / "a.ckpt"]
