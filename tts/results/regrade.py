"""`tts eval RUN`: a saved run's candidates re-graded and its summary rewritten, without
generating (answer extraction may have improved since the run)."""

from __future__ import annotations

from pathlib import Path

from eval.extract import extract_answer
from tts.results.records import grade_candidates
from tts.results.store import RECORDS, RunStore
from tts.results.summary import write_summary


def regrade_run(path: Path | str) -> None:
    """Re-extract every candidate's answer from its saved text, grade the records again and
    rewrite them (`RunStore.rewrite_records`) and the summary. FileNotFoundError for a path
    that holds no run, ValueError for records that do not parse or a run with none whole."""
    given, path = path, Path(path)  # named as the user wrote it
    if not path.is_dir():
        what = "not a folder" if path.exists() else "no such run folder"
        raise FileNotFoundError(f"{given}: {what} (give a tts run folder, or Hydra overrides such as dataset=aime24)")
    store = RunStore(path)
    if not (path / RECORDS).exists():
        raise FileNotFoundError(f"{path} has no {RECORDS}: not a tts run folder")
    records = store.records()  # a torn last line (a kill mid-write) is left out, as --resume does
    step_logs = store.step_logs()  # the run's step statistics: batch use, bounds, block pools
    if not records:
        raise ValueError(f"{path / RECORDS} holds no complete record to grade (a run killed before its first "
                         f"record was whole); `tts bench bench.run_name={path.name} --resume` continues it")
    for r in records:
        for candidate in r["candidates"]:
            candidate["answer"] = extract_answer(candidate["text"])
        r.update(grade_candidates(r["gold"], r["candidates"]))
    store.rewrite_records(records)
    write_summary(store, list(dict.fromkeys(r.get("variant", "") for r in records)), step_logs)
