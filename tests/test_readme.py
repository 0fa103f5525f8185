"""Every `tts` command in the README's code blocks composes and validates, through the CLI
itself (`--cfg`: the same argv parsing, sweep expansion and checks as a run, then the
composed config printed instead of run)."""

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

README = Path(__file__).resolve().parents[1] / "README.md"
COMPOSING = ("bench", "eval", "profile-memory")  # the verbs that compose a run config
PATH_VERBS = ("models", "report", "replay")  # they take model keys or run folders, not a config
# Hydra's launchers run a sweep's jobs elsewhere (tts.hydra_app) and are not installed by
# default; each job composes the same overrides, so those are composed here without them.
LAUNCHER = re.compile(r"^hydra/(launcher|sweeper)=|^hydra\.(launcher|sweeper)\.")


def readme_commands() -> list[str]:
    """Each `tts ...` command of the README's fenced code blocks, continuation lines joined,
    comments, environment assignments and `cmd &&` prefixes removed."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", README.read_text(), flags=re.M | re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # not shell (a pseudo-code block)
                continue
            segment: list[str] = []
            for word in words + ["&&"]:
                if word not in ("&&", ";", "||"):
                    segment.append(word)
                    continue
                while segment and re.match(r"^[A-Z_]+=", segment[0]):
                    segment.pop(0)
                if segment and Path(segment[0]).name == "tts":
                    commands.append(shlex.join(["tts", *segment[1:]]))
                segment = []
    return commands


COMMANDS = readme_commands()


def test_the_readme_has_the_commands_a_user_types_first():
    assert "tts bench" in COMMANDS
    assert "tts bench --config-name=compare generator=qwen2.5-math-1.5b verifier=skywork_1.5b memory=gpu" in COMMANDS
    assert any(c.startswith("tts bench -m ") for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_command_composes(command):
    argv = shlex.split(command)[1:]
    if argv[0] in PATH_VERBS:
        pytest.skip(f"`tts {argv[0]}` takes model keys or run folders, not a run config")
    assert argv[0] in COMPOSING, command
    if argv[0] == "eval" and len(argv) > 1 and not argv[1].startswith("-") and "=" not in argv[1]:
        pytest.skip("`tts eval RUN_DIR` re-grades a saved run folder")
    args = [a for a in argv if not LAUNCHER.match(a)]
    result = CliRunner().invoke(app, args + ["--cfg"])
    assert result.exit_code == 0, f"{command}\n{result.output}"
    jobs = max(1, result.output.count("# overrides:"))
    assert result.output.count("generator:") >= jobs, result.output  # each job's composed config
