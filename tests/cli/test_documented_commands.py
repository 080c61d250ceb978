"""Every `asr COMMAND --option` the README, docs/ and the recipes' RESULTS show is an option
that command takes: documentation that names a removed or misspelt option fails here. `--help`
describes every command and argument, and names the training commands too."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from asr.cli import LIGHTNING_COMMANDS, _parser, main

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("recipes/*/RESULTS.md")]
)
COMMAND = re.compile(r"^(?:\w+=\S*\s+)*(?:\S*/)?asr\s+([a-z][a-z-]*)(\s.*)?$")


def shell_lines(text: str) -> list[str]:
    """The lines of a document's shell code blocks (continuations joined) and its inline
    `asr ...` spans, each split at pipes and `&&`."""
    lines, inside, shell = [], False, False
    for line in text.splitlines():
        fence = re.match(r"\s*```(\w*)", line)
        if fence:
            inside = not inside
            shell = inside and fence.group(1) in ("", "bash", "sh", "console", "shell")
            continue
        if shell:
            lines.append(line)
    code = re.sub(r"\\\n\s*", " ", "\n".join(lines)).splitlines()
    code += re.findall(r"`(asr [^`]+)`", text)
    return [part.strip() for line in code for part in re.split(r"\|(?!\|)|&&", line)]


def documented_commands() -> list[tuple[str, str, str]]:
    """(document, command, its arguments) of every `asr` command line shown."""
    found = []
    for path in DOCUMENTS:
        for line in shell_lines(path.read_text(encoding="utf-8")):
            match = COMMAND.match(line.split(" #")[0].strip())
            if match and match.group(1) not in LIGHTNING_COMMANDS:
                found.append((str(path.relative_to(ROOT)), match.group(1), match.group(2) or ""))
    return found


def options_of(command: str) -> set[str]:
    subparsers = _parser(command)._subparsers._group_actions[0]
    return {option for action in subparsers.choices[command]._actions
            for option in action.option_strings}  # fmt: skip


def test_the_documents_show_commands() -> None:
    assert len(documented_commands()) > 100


@pytest.mark.parametrize("document", sorted({d for d, _, _ in documented_commands()}))
def test_every_documented_option_exists(document: str) -> None:
    wrong = []
    for where, command, arguments in documented_commands():
        if where != document:
            continue
        try:
            words = shlex.split(arguments)  # a quoted "... --quick" is one word, not an option
        except ValueError:  # a quote closed on a later line
            words = arguments.split()
        known = options_of(command)
        wrong += [
            f"asr {command} {word}"
            for word in words
            if re.fullmatch(r"--[a-z][a-z0-9-]*", word.split("=")[0])
            and word.split("=")[0] not in known
        ]
    assert not wrong, f"{document} shows options the commands do not take: {wrong}"


def test_every_command_and_argument_has_help() -> None:
    commands = _parser()._subparsers._group_actions[0].choices
    bare = []
    for command in sorted(set(commands) - set(LIGHTNING_COMMANDS)):
        parser = _parser(command)._subparsers._group_actions[0].choices[command]
        bare += [f"asr {command}"] if not parser.description else []
        bare += [f"asr {command} {action.dest}" for action in parser._actions if not action.help]
    assert not bare, f"without help text: {bare}"


def test_an_unknown_command_is_told_the_training_commands_too(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["trainn"])
    err = capsys.readouterr().err
    assert all(f"'{command}'" in err.split("choose from")[1] for command in LIGHTNING_COMMANDS)


def test_the_training_commands_usage_names_the_program_and_no_predict(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["fit"])
    err = capsys.readouterr().err
    assert "usage: asr [-c CONFIG] {fit} ..." in err, "the command's own parser alone"
