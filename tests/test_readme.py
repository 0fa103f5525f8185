"""Every `tts` command a user can read composes and validates: in the code blocks and
prose of README.md and of every Markdown file under docs/ and results/, and in the comments
of conf/. `tts bench|eval|profile-memory` go through the CLI itself (`--cfg`: the same argv
parsing, sweep expansion and checks as a run, then the composed config printed instead of
run); `tts replay` and `tts rescore` compose their overrides onto a recorded run's config as
a replay does; `tts models pull KEY` names a registry key; `tts report`, `tts merge` and
`tts eval RUN` run, on run folders made on the fake backend or copied from docs/runs/
(placeholders such as `results/<run>` mapped to them). Every relative link points at a
file of the repository, and at a heading of it where it names one; no doc names a path
outside the repository."""

import json
import re
import shlex
import shutil
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
    from tts.config.saved_run import replay_config

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


def on_run_folders(command: str) -> bool:
    """`tts report`, `tts merge` and `tts eval RUN` take run folders, not a config."""
    argv = shlex.split(command)[1:]
    return argv[0] in PATH_VERBS or (argv[0] == "eval" and len(argv) > 1 and "=" not in argv[1]
                                     and not argv[1].startswith("-"))


CONFIG_CASES = [(doc, c) for doc, c in CASES if not on_run_folders(c)]
RUN_DOCS: dict[str, list[str]] = {}  # a command that runs takes seconds: once, for every doc that names it
for doc, c in CASES:
    if on_run_folders(c):
        RUN_DOCS.setdefault(c, []).append(doc)
RUN_CASES = [pytest.param(c, docs, id=c) for c, docs in RUN_DOCS.items()]


@pytest.mark.parametrize(("doc", "command"), CONFIG_CASES)
def test_every_documented_command_composes(doc, command):
    argv = shlex.split(command)[1:]
    assert argv[0] in VERBS, command
    if argv[0] == "models":
        return check_pull(argv)
    if argv[0] in ON_A_RUN:
        return compose_on_a_run(argv)
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


# `tts report`, `tts merge` and `tts eval RUN` run for real: in a temporary folder that is
# their working directory (a report goes to results/report-<stamp>/ there), on run folders
# made once for the module on the fake backend: a sweep of two shards, the run merged from
# them, and a sweep of replays of that run. A committed run a doc names (docs/runs/NAME) is
# copied there first, cut to two problems of two variants so that a re-grade takes seconds.
FAKE = ["generator=fake", "verifier=fake", "logger=none", "dataset.first_k=4", "search.n=4",
        "search.beam_width=2", "search.max_iterations=4"]
# each placeholder of the docs, and the folder of `doc_runs` it stands for
PLACEHOLDERS = {
    "RUN": "run", "results/<run>": "run", "results/<n=512 run>": "run",
    "results/<stamp>-sweep": "sweep", "results/<sweep>": "sweep",
    "results/<stamp>-sweep/0": "shard 0", "results/<stamp>-sweep/1": "shard 1",
    "results/<stamp>-sweep/*": "sweep/*",
    "results/<replay sweep>": "replays", "results/<replay sweeps>": "replays",
}
# a verb named alone stands for its synopsis (README's commands table)
SYNOPSES = {"report": ["RUN"], "merge": ["results/<stamp>-sweep/0", "results/<stamp>-sweep/1", "--out", "RUN"]}


def tts_adds(*args: str) -> Path:
    """Run `tts ARGS` in the working directory; the one folder it adds under results/."""
    results = Path("results")
    before = set(results.iterdir()) if results.exists() else set()
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, f"tts {shlex.join(args)}\n{result.output}"
    (added,) = set(results.iterdir()) - before
    return added


@pytest.fixture(scope="module")
def doc_runs(tmp_path_factory):
    """The working directory, and its run folders by the names PLACEHOLDERS use."""
    home = tmp_path_factory.mktemp("doc_runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(home)
        sweep = tts_adds("bench", "-m", "bench.shard=0/2,1/2", *FAKE)
        shards = sorted(p for p in sweep.iterdir() if p.is_dir())
        run = tts_adds("merge", *map(str, shards), "--out", "results/math500-compare")
        replays = tts_adds("replay", str(run), "-m", "replay.host=recorded,none", "--out", "results")
    folders = {"sweep": sweep, "shard 0": shards[0], "shard 1": shards[1], "run": run, "replays": replays}
    return home, {name: path.as_posix() for name, path in folders.items()}


def committed_copy(home: Path, name: str) -> None:
    """docs/runs/NAME under `home`, its records cut to two problems of two variants."""
    source, copy = ROOT / "docs" / "runs" / name, home / "docs" / "runs" / name
    if copy.exists():
        return
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("records.jsonl", "plots"))
    lines = (source / "records.jsonl").read_text().splitlines(keepends=True)
    rows = [json.loads(line) for line in lines]
    variants = list(dict.fromkeys(r["variant"] for r in rows))[:2]
    problems = list(dict.fromkeys(r["problem_id"] for r in rows))[:2]
    (copy / "records.jsonl").write_text("".join(
        line for line, r in zip(lines, rows) if r["variant"] in variants and r["problem_id"] in problems))


def on_doc_runs(argv: list[str], home: Path, folders: dict[str, str], out: Path) -> list[str]:
    """The documented command's words with each placeholder named as its folder, globs
    expanded as a shell does, committed runs copied under `home`, and `--out` a new folder
    under `out`, so that nothing is written into the repository."""
    words = argv[1:] or SYNOPSES.get(argv[0], [])
    for i in range(len(words) - 1, 0, -1):  # shlex split `results/<replay sweep>` at its space
        if ">" in words[i] and "<" not in words[i] and "<" in words[i - 1] and ">" not in words[i - 1]:
            words[i - 1 : i + 1] = [f"{words[i - 1]} {words[i]}"]
    args, after_out = [argv[0]], False
    for word in words:
        if after_out:
            args.append(str(out / Path(word).name))
        elif word in PLACEHOLDERS:
            name, _, pattern = PLACEHOLDERS[word].partition("/")
            path = folders[name] + (f"/{pattern}" if pattern else "")
            args += sorted(p.relative_to(home).as_posix() for p in home.glob(path)) if pattern else [path]
        else:
            assert "<" not in word and word != "RUN", f"{word}: a placeholder that PLACEHOLDERS does not map"
            if word.startswith("docs/runs/"):
                committed_copy(home, Path(word).name)
            args.append(word)
        after_out = word == "--out"
    return args


def report_runs(home: Path, args: list[str]) -> list[str]:
    """The runs a report on `args` compares: each folder, a sweep's jobs in its stead."""
    names = []
    for arg in args:
        folder = home / arg
        jobs = sorted(p.name for p in folder.iterdir() if (p / "summary.json").exists())
        names += jobs if (folder / "sweep.json").exists() else [folder.name]
    return names


@pytest.mark.parametrize(("command", "docs"), RUN_CASES)
def test_every_documented_command_on_run_folders_runs(command, docs, doc_runs, tmp_path, monkeypatch):
    home, folders = doc_runs
    argv = on_doc_runs(shlex.split(command)[1:], home, folders, tmp_path)
    monkeypatch.chdir(home)
    before = (home / argv[1] / "records.jsonl").read_bytes() if argv[0] == "eval" else None
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, f"{', '.join(docs)}: {command}\nran: tts {shlex.join(argv)}\n{result.output}"
    if argv[0] == "report":
        written = home / re.search(r"report written to (\S+)", result.output).group(1)
        report = json.loads((written.parent / "report.json").read_text())
        assert list(report["runs"]) == report_runs(home, argv[1:]) and report["rows"]
    elif argv[0] == "merge":
        given = [home / a for a in argv[1:argv.index("--out")]]  # shard folders, or their sweep folder
        shards = [f for g in given for f in ([g] if (g / "records.jsonl").exists()
                                             else sorted(j for j in g.iterdir() if (j / "records.jsonl").exists()))]
        merged = json.loads((Path(argv[-1]) / "summary.json").read_text())
        records = (Path(argv[-1]) / "records.jsonl").read_text().splitlines()
        assert len(records) == sum(len((s / "records.jsonl").read_text().splitlines()) for s in shards)
        assert {v["num_problems"] for v in merged["variants"].values()} == {4}  # both shards' problems
    else:  # a re-grade: the recorded grades stand, the summary is recomputed from the records
        assert (home / argv[1] / "records.jsonl").read_bytes() == before
        summary = json.loads((home / argv[1] / "summary.json").read_text())
        assert {v["num_problems"] for v in summary["variants"].values()} == {2}


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
