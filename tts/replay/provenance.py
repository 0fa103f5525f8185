"""Which code and which engine options recorded a trace, and whether a replay runs the same.

A replay is only as good as its replay of the variant it is about. Through the code and
options that recorded it, a variant sends the requests it sent and its own recording
answers each; through other code (today's engine on an older trace) or other options it
may take other decisions on the same outputs, and what the trace never held is borrowed
or drawn. So a run writes, each time it opens its trace, its code identity and each
variant's resolved options (`recorded`), and a replay compares them with its own
(`compare`): its first line and its summary say whether it replays through the same code
and options, other ones (named), or a trace from before they were recorded; and name each
variant's first divergence (`tts.replay.served.Divergence`), whatever the provenance.
Before all that, the card and pair the trace was recorded for (`bench.record_for`, in its
header, `card_line`): this replay's, another's, or none (decided on the recording host).

The code identity and the options recorded are `tts.trace.provenance`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

from tts.replay.served import divergence_line, recording_of
from tts.trace.provenance import recorded

UNKNOWN = "provenance unknown (recorded before tts recorded it)"


def compare(provenance: list[dict], cfg) -> dict:
    """The trace's provenance (`Trace.provenance`) against the replay's (`cfg`'s variants on
    this code): `status` same, other or unknown; `code` the same; the recorded and
    replaying code; per variant the options that differ ({field: [recorded, replaying]});
    the replayed variants the trace holds no options of; and the lines that say it."""
    now = recorded(cfg)
    out = {"status": "unknown", "code": "unknown", "recorded": [p.get("code") for p in provenance],
           "replaying": now["code"], "options": {}, "unrecorded": [], "lines": [UNKNOWN]}
    if not provenance:
        return out
    ids = list(dict.fromkeys((p.get("code") or {}).get("id") for p in provenance))
    out["code"] = "same" if ids == [now["code"]["id"]] else "other"
    for name, mine in now["variants"].items():
        theirs = next((p["variants"][name] for p in provenance if name in (p.get("variants") or {})), None)
        if theirs is None:
            out["unrecorded"].append(name)
            continue
        differ = {k: [theirs.get(k), mine.get(k)] for k in sorted({*theirs, *mine}) if theirs.get(k) != mine.get(k)}
        if differ:
            out["options"][name] = differ
    out["status"] = "same" if out["code"] == "same" and not out["options"] and not out["unrecorded"] else "other"
    lines = []
    if out["code"] == "other":
        lines.append(f"replayed through other code (recorded by {', '.join(map(str, ids))}, "
                     f"replaying with {now['code']['id']})")
    for name, differ in out["options"].items():
        lines.append(f"{name} replayed with other options: "
                     + ", ".join(f"{k} {_v(a)} recorded, {_v(b)} replaying" for k, (a, b) in differ.items()))
    if out["unrecorded"]:
        lines.append(f"not recorded in this trace (replayed on other variants' recordings): {', '.join(out['unrecorded'])}")
    out["lines"] = lines or ["replayed through the code and options that recorded it"]
    return out


def _v(value) -> str:
    return "absent" if value is None else json.dumps(value)


def card_line(recorded_for: dict | None, cfg) -> str:
    """What the trace was recorded for (`bench.record_for`, its header's) against the card
    and pair this replay simulates (`cfg`'s device and models)."""
    if not recorded_for:
        return "recorded for no card (decided as its recording host would)"
    models = recorded_for.get("models") or {}
    what = f"{recorded_for.get('device')} with {models.get('generator')} + {models.get('verifier')}"
    if (recorded_for.get("device"), models.get("generator"), models.get("verifier")) == (
            cfg.device.name, cfg.generator.model, cfg.verifier.model):
        return f"recorded for this card and pair ({what})"
    return (f"recorded for another card or pair ({what}; replayed on {cfg.device.name} with "
            f"{cfg.generator.model} + {cfg.verifier.model})")


def brief(compared: dict, divergence: dict, tree: str = "") -> str:
    """The provenance and the first divergences in a few words, for the replay's first line
    (`tree`: the variant whose recording served every variant first, `replay.tree`)."""
    parts = [f"every variant served {tree}'s recording first (replay.tree)"] if tree else []
    if compared["status"] == "unknown":
        parts.append(UNKNOWN)
    elif compared["code"] == "other":
        parts.append(compared["lines"][0])
    if compared["options"]:
        parts.append("other options (" + "; ".join(f"{n}: {', '.join(d)}" for n, d in compared["options"].items()) + ")")
    if compared["unrecorded"]:
        parts.append(f"{', '.join(compared['unrecorded'])} not recorded")
    if compared["status"] == "same":
        parts.append("same code and options as recorded")
    for name, first in divergence.items():
        parts.append(f"{name} left {recording_of(first)} at problem {first['problem']}, iteration {first['iteration']}")
    if (compared["status"] != "same" or tree) and not divergence:
        whose, yet = f"{tree}'s" if tree else "its", "yet " if compared["status"] != "same" else ""
        parts.append(f"{yet}every variant kept to {whose} recording")
    return "; ".join(parts)


class ReplayProvenance:
    """A replay's provenance: compared before it runs (`compare`), and as it runs, each
    variant's first divergence (the backends note it, `Divergence`; this tells them the
    search iteration each problem is in)."""

    def __init__(self, provenance: list[dict], cfg, problems: list, backends,
                 recorded_for: dict | None = None, tree: str = "") -> None:
        self.compared = compare(provenance, cfg)
        self.tree = tree  # `replay.tree`: every variant served this one's recording first
        self.card = card_line(recorded_for, cfg)  # the trace header's `record_for`
        self.backends = backends
        self.ids = {p.problem: p.id for p in problems}
        self.texts = {p.id: p.problem for p in problems}

    def on_iteration(self, variant: str, problem_id: str, iterations: int) -> None:
        """The replay's `on_iteration`: the backends' (host time), and the iteration count."""
        self.backends.on_iteration(variant, problem_id, iterations)
        reader = self.backends.readers.get(variant)
        if reader is not None:
            reader.divergence.iterations[self.texts.get(problem_id, problem_id)] = iterations

    def divergence(self) -> dict:
        """Each variant's first divergence, its problem by id, with its drawn shares."""
        out = {}
        for name, reader in self.backends.readers.items():
            first = reader.divergence.first
            if first is not None:
                shares = self.backends.counts[name].to_dict()
                out[name] = {**first, "problem": self.ids.get(first["problem"], first["problem"][:80]),
                             "drawn_token_share": shares["drawn_token_share"],
                             "drawn_score_share": shares["drawn_score_share"]}
        return out

    def host(self, divergence: dict | None = None) -> dict:
        """What the replay's host record says of it (`simulated_line` prints `note`)."""
        return {"status": self.compared["status"], "card": self.card,
                "note": f"{self.card}; {brief(self.compared, divergence or {}, self.tree)}"}

    def summary(self) -> dict:
        divergence = self.divergence()
        kept = [] if divergence else [
            f"every replayed variant kept to {self.tree}'s recording (replay.tree): it answered each request and "
            "score it sent" if self.tree else
            "every replayed variant kept to its recording: its own answered each request and score it sent"]
        return {"provenance": self.compared, "divergence": divergence,
                "provenance_lines": [self.card, *self.compared["lines"], *map(_line, divergence.values()), *kept]}


def _line(first: dict) -> str:
    share = f" ({first['drawn_token_share']:.1%} of its tokens drawn, {first['drawn_score_share']:.1%} of its scores)"
    return divergence_line(first) + share


def write_markdown(path: Path, summary: dict) -> None:
    """summary.md with the replay's own section after the run's tables: its provenance,
    first divergences, what it drew and the recorded run beside it."""
    from tts.results.headline import summary_markdown
    from tts.results.store import SUMMARY_MD

    replay = (summary.get("simulated") or {}).get("against_recorded_md")
    (Path(path) / SUMMARY_MD).write_text(summary_markdown(summary) + (f"\n## Replay\n\n{replay}\n" if replay else ""))
