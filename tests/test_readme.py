"""Every `tts` command a user can read composes and validates: in the code blocks and
prose of README.md and of every Markdown file under docs/ and results/, and in the comments
of conf/. `tts bench|eval|profile-memory` go through the CLI itself (`--cfg`: the same argv
parsing, sweep expansion and checks as a run, then the composed config printed instead of
run); `tts replay` and `tts rescore` compose their overrides onto a recorded run's config as
a replay does; `tts models pull KEY` names a registry key. Every relative link points at a
file of the repository, and at a heading of it where it names one; no doc names a path
outside the repository."""

import re
import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "results").glob("*.md"))]
CONFS = sorted((ROOT / "conf").rglob("*.yaml"))
VERBS = ("bench", "eval", "profile-memory", "replay", "rescore", "models", "report", "merge")
COMPOSING = ("bench", "eval", "profile-memory")  # the verbs that compose a run config
ON_A_RUN = ("replay", "rescore")  # a run folder, then overrides onto its config
PATH_VERBS = ("report", "merge")  # they take run folders only
# Hydra's launchers run a sweep's jobs elsewhere (tts.hydra_app) and are not installed by
# default; each job composes the same overrides, so those are composed here without them.
LAUNCHER = re.compile(r"^hydra/(launcher|sweeper)=|^hydra\.(launcher|sweeper)\.")
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", flags=re.M | re.S)
ENV = re.compile(r"^[A-Z_]+=")
# a synopsis, not a command: placeholders such as [OVERRIDES], [-m], <run>, KEY=VALUE, ...
SYNOPSIS = re.compile(r"\[-|\[[A-Z]|<|\.\.\.|\bKEY\b|\bNAME\b|=VALUE\b")


def doc_commands(text: str) -> list[str]:
    """Each `tts ...` command of a Markdown text's fenced code blocks, continuation lines
    joined, comments, environment assignments and `cmd &&` prefixes removed."""
    commands = []
    for block in FENCE.findall(text):
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
                while segment and ENV.match(segment[0]):
                    segment.pop(0)
                if segment and Path(segment[0]).name == "tts":
                    commands.append(shlex.join(["tts", *segment[1:]]))
                segment = []
    return commands


def inline_commands(text: str) -> list[str]:
    """Each whole `tts VERB ...` command quoted inline in prose, environment assignments
    removed; a synopsis with placeholders is not a command."""
    commands = []
    for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", FENCE.sub("", text)):
        words = " ".join(span.split())
        match = re.match(rf"^(?:[A-Z_]+=\S+ )*(tts (?:{'|'.join(VERBS)})\b.*)$", words)
        if match and not SYNOPSIS.search(match.group(1)):
            commands.append(shlex.join(shlex.split(match.group(1))))
    return commands


def conf_comments(path: Path) -> str:
    """The comments of a YAML file, one line each."""
    lines = []
    for line in path.read_text().splitlines():
        match = re.search(r"(?:^|\s)#(.*)$", line)
        if match:
            lines.append(match.group(1))
    return "\n".join(lines)


def bare_commands(comments: str) -> list[str]:
    """`tts VERB` named in comments outside backquotes: a command a test could not read."""
    prose = re.sub(r"`[^`]*`", "", comments)
    return re.findall(rf"\btts (?:{'|'.join(VERBS)})\b[^\n]*", prose)


COMMANDS = doc_commands(README.read_text())
CASES = [
    (path.relative_to(ROOT).as_posix(), c)
    for path in DOCS
    for c in dict.fromkeys(doc_commands(path.read_text()) + inline_commands(path.read_text()))
] + [
    (path.relative_to(ROOT).as_posix(), c)
    for path in CONFS
    for c in dict.fromkeys(inline_commands(conf_comments(path)))
]


def test_the_readme_has_the_commands_a_user_types_first():
    assert "tts bench" in COMMANDS
    assert any(c.startswith("tts bench -m ") for c in COMMANDS)
    assert "docs/gpu.md" in README.read_text().split("## The two commands")[0]  # the GPU guide, on the first screen
    gpu = doc_commands((ROOT / "docs" / "gpu.md").read_text())
    assert ("tts bench --config-name=compare generator=qwen2.5-math-1.5b verifier=skywork_1.5b memory=gpu "
            "generator.max_total_tokens=2048") in gpu  # a GPU run at the models' own path length


def test_the_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the details go to docs/"
    assert [n for n, line in enumerate(lines, 1) if len(line) > 200] == []


def test_ci_runs_exactly_the_readmes_test_command_and_shows_every_skip():
    """`.ci/run` calls the README's second command, which names every skip's reason (`-rs`)."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text().split("## The two commands")[1], re.S)
    command = blocks[1].strip()
    assert "pytest" in command and " -rs" in command
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == command


def test_the_studies_and_the_configs_commands_are_composed_too():
    docs = {doc for doc, _ in CASES}
    assert {"README.md", "docs/results.md", "docs/gpu.md"} <= docs
    assert any(doc.startswith("conf/") for doc in docs)
    assert {c.split()[1] for _, c in CASES} >= {"bench", "replay", "models"}


@pytest.mark.parametrize("path", CONFS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_config_quotes_the_commands_it_names(path):
    assert not bare_commands(conf_comments(path)), f"quote the command in backquotes: {bare_commands(conf_comments(path))}"


def compose_on_a_run(argv: list[str]) -> None:
    """`tts replay|rescore RUN [OVERRIDES] [-m] [--out DIR]`: the overrides onto the default
    run's config, as the command puts them onto the recorded run's, each sweep job alike."""
    from tts.config.compose import compose, expand_sweep, validate
    from tts.replay.run import replay_config

    words, multirun, skip = [], False, False
    for word in argv[2:]:
        if skip or word in ("-m", "--multirun"):
            multirun, skip = multirun or word in ("-m", "--multirun"), False
        elif word == "--out":
            skip = True
        elif not word.startswith("--out="):
            words.append(word)
    saved = OmegaConf.to_container(compose("config", []), resolve=True)
    for combo in expand_sweep(words) if multirun else [words]:
        validate(replay_config(saved, combo)[0])


def check_pull(argv: list[str]) -> None:
    from tts.models.registry import find_spec
    from tts.models.tiny import tiny_keys

    if argv[1] != "pull" or len(argv) < 3:
        return
    key = argv[2]
    assert find_spec(key) or key in tiny_keys(), f"`tts models pull {key}`: no such model key"


@pytest.mark.parametrize(("doc", "command"), CASES)
def test_every_documented_command_composes(doc, command):
    argv = shlex.split(command)[1:]
    assert argv[0] in VERBS, command
    if argv[0] in PATH_VERBS:
        pytest.skip(f"`tts {argv[0]}` takes run folders, not a config")
    if argv[0] == "models":
        return check_pull(argv)
    if argv[0] in ON_A_RUN:
        return compose_on_a_run(argv)
    if argv[0] == "eval" and len(argv) > 1 and not argv[1].startswith("-") and "=" not in argv[1]:
        pytest.skip("`tts eval RUN_DIR` re-grades a saved run folder")
    args = [a for a in argv if not LAUNCHER.match(a)]
    result = CliRunner().invoke(app, args + ["--cfg"])
    assert result.exit_code == 0, f"{doc}: {command}\n{result.output}"
    jobs = max(1, result.output.count("# overrides:"))
    assert result.output.count("generator:") >= jobs, result.output  # each job's composed config


def test_a_wrong_replay_override_or_model_key_fails_the_check():
    from tts.config.compose import ConfigError

    with pytest.raises((ConfigError, ValueError)):
        compose_on_a_run(["replay", "results/run", "replay.cost=guess"])
    with pytest.raises(AssertionError, match="no such model key"):
        check_pull(["models", "pull", "qwen9-math"])


# Paths of the machine a doc was written on: a relative path that climbs out of the
# repository, or an absolute one under a home, scratch or work folder.
UP = re.compile(r"(?<![\w./-])((?:\.\./)+[\w.-]+(?:/[\w.-]+)*)")
ABSOLUTE = re.compile(r"(?<![\w.~/:-])(/(?:home|root|work|tmp|mnt|scratch|data|shared|Users)(?:/[\w.-]+)+)")


def outside_paths(text: str, folder: Path) -> list[str]:
    """The paths a text names outside the repository: a link's target read from its file's
    folder, any other relative path from the repository root (where commands run)."""
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    prose = re.sub(r"\]\([^)\s]+\)", "]", text)
    found = [p for base, texts in ((folder, links), (ROOT, [prose])) for t in texts
             for p in UP.findall(t) if ROOT not in (base / p).resolve().parents]
    return found + ABSOLUTE.findall(text)


def test_the_path_check_finds_a_path_outside_the_repository():
    folder = ROOT / "docs"
    assert outside_paths("[data](../../shared/x.md), TTS_DATA_DIR=../shared/data, /work/x/y, "
                         "/root/.cache/tts", folder) == [
        "../../shared/x.md", "../shared/data", "/work/x/y", "/root/.cache/tts"]
    assert outside_paths("[the README](../README.md), results/x, ~/.cache/tts, https://a.org/work/x, "
                         "TTS_DATA_DIR=/path/to/data, tok/s, 1/8", folder) == []


@pytest.mark.parametrize("path", DOCS + CONFS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_doc_names_a_path_outside_the_repository(path):
    text = conf_comments(path) if path.suffix == ".yaml" else path.read_text()
    assert not outside_paths(text, path.parent), f"{path.relative_to(ROOT)}: {outside_paths(text, path.parent)}"


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
    assert {"docs/design.md", "docs/measurement.md", "docs/results.md", "docs/gpu.md"} <= {
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


def contents(path: Path) -> tuple[list[str], list[str]]:
    """A doc's table of contents (the `- [..](#..)` lines before its first section) and the
    anchors of its sections (`## ` headings)."""
    text = FENCE.sub("", path.read_text())
    head = text.split("\n## ", 1)[0]
    listed = re.findall(r"^\s*- \[[^\]]*\]\(#([^)]+)\)", head, flags=re.M)
    sections = [re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^## +(.+?) *#*$", text, flags=re.M)]
    return listed, sections


@pytest.mark.parametrize("path", [p for p in DOCS if contents(p)[0]], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_table_of_contents_lists_every_section(path):
    listed, sections = contents(path)
    assert [s for s in sections if s not in listed] == [], f"{path.relative_to(ROOT)}: sections missing from its contents"
