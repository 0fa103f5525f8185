"""Every `tts` command in the code blocks of the README and of docs/*.md composes and
validates, through the CLI itself (`--cfg`: the same argv parsing, sweep expansion and
checks as a run, then the composed config printed instead of run); and every relative link
in them points at a file of the repository, and at a heading of it where it names one."""

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
COMPOSING = ("bench", "eval", "profile-memory")  # the verbs that compose a run config
PATH_VERBS = ("models", "report", "replay", "merge")  # they take model keys or run folders, not a config
# Hydra's launchers run a sweep's jobs elsewhere (tts.hydra_app) and are not installed by
# default; each job composes the same overrides, so those are composed here without them.
LAUNCHER = re.compile(r"^hydra/(launcher|sweeper)=|^hydra\.(launcher|sweeper)\.")
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", flags=re.M | re.S)


def doc_commands(path: Path) -> list[str]:
    """Each `tts ...` command of a Markdown file's fenced code blocks, continuation lines
    joined, comments, environment assignments and `cmd &&` prefixes removed."""
    commands = []
    for block in FENCE.findall(path.read_text()):
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


def inline_commands(path: Path) -> list[str]:
    """Each whole `tts bench|eval|profile-memory ...` command quoted inline in a Markdown
    file's prose (the studies name their commands there), environment assignments removed;
    a synopsis with placeholders (`[OVERRIDES]`, `<run>`, `...`) is not a command."""
    commands = []
    for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", FENCE.sub("", path.read_text())):
        words = " ".join(span.split())
        match = re.match(r"^(?:[A-Z_]+=\S+ )*(tts (?:bench|eval|profile-memory)\b.*)$", words)
        if match and not re.search(r"\[-|\[[A-Z]|<|\.\.\.", match.group(1)):
            commands.append(shlex.join(shlex.split(match.group(1))))
    return commands


COMMANDS = doc_commands(README)
CASES = [
    (path.relative_to(ROOT).as_posix(), c)
    for path in DOCS
    for c in dict.fromkeys(doc_commands(path) + inline_commands(path))
]


def test_the_readme_has_the_commands_a_user_types_first():
    assert "tts bench" in COMMANDS
    assert "tts bench --config-name=compare generator=qwen2.5-math-1.5b verifier=skywork_1.5b memory=gpu" in COMMANDS
    assert any(c.startswith("tts bench -m ") for c in COMMANDS)


def test_the_studies_commands_are_composed_too():
    assert {"README.md", "docs/results.md"} <= {doc for doc, _ in CASES}


@pytest.mark.parametrize(("doc", "command"), CASES)
def test_every_documented_command_composes(doc, command):
    argv = shlex.split(command)[1:]
    if argv[0] in PATH_VERBS:
        pytest.skip(f"`tts {argv[0]}` takes model keys or run folders, not a run config")
    assert argv[0] in COMPOSING, command
    if argv[0] == "eval" and len(argv) > 1 and not argv[1].startswith("-") and "=" not in argv[1]:
        pytest.skip("`tts eval RUN_DIR` re-grades a saved run folder")
    args = [a for a in argv if not LAUNCHER.match(a)]
    result = CliRunner().invoke(app, args + ["--cfg"])
    assert result.exit_code == 0, f"{doc}: {command}\n{result.output}"
    jobs = max(1, result.output.count("# overrides:"))
    assert result.output.count("generator:") >= jobs, result.output  # each job's composed config


def anchors(path: Path) -> set[str]:
    """The ids GitHub gives a Markdown file's headings: lower case, punctuation but `-` and
    `_` dropped, spaces as `-`, a repeated one suffixed `-1`, `-2`, ..."""
    text = FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    ids = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


LINKS = [
    (path.relative_to(ROOT).as_posix(), target)
    for path in DOCS
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", path.read_text()))
    if not re.match(r"^[a-z]+:", target)  # http:, https:, mailto:, wandb:
]


def test_the_docs_link_to_each_other():
    assert {"docs/design.md", "docs/measurement.md", "docs/results.md"} <= {
        (ROOT / target.split("#")[0]).resolve().relative_to(ROOT).as_posix()
        for doc, target in LINKS
        if doc == "README.md" and not target.startswith("#")
    }


@pytest.mark.parametrize(("doc", "target"), LINKS)
def test_every_relative_link_resolves(doc, target):
    file, _, anchor = target.partition("#")
    dest = (ROOT / doc).parent / file if file else ROOT / doc
    assert dest.exists(), f"{doc}: ({target}): no such file {dest.relative_to(ROOT)}"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{doc}: ({target}): no heading #{anchor} in {file or doc}"
