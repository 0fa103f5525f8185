"""Writing a run's trace (`tts.trace.format`) as the run goes: the runner flushes with each
record, so a killed run keeps the trace of everything it finished, and `--resume` appends
to it (after dropping a last member a kill cut off).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path

from tts.backends.base import FinishReason, GenDelta, Generator, GenRequest, ScoreRequest, StepStats, Verifier
from tts.trace.format import VERSION, complete_members, score_key


class TraceRecorder:
    """Records the requests and scores of one run's models; `flush` appends what it holds."""

    def __init__(self, path: Path, header: dict, provenance: dict | None = None) -> None:
        self.path = Path(path)
        self._sent = 0  # requests sent so far: each request's place in the order sent
        if self.path.exists():  # a resume: a member a kill cut off goes, so what follows reads
            text, _, whole = complete_members(self.path.read_bytes())
            with open(self.path, "r+b") as f:
                f.truncate(whole)
            self._sent = text.count(b'"t":"g"')  # a resume's requests come after the recorded ones
        fresh = not self.path.exists() or not self.path.stat().st_size
        self._lines: list[dict] = [{"t": "h", "version": VERSION, **header}] if fresh else []
        if provenance is not None:  # the code and options that record what follows (a resume's too)
            self._lines.append({"t": "p", **provenance})
        self._live: dict[str, dict] = {}
        self.variant = ""

    def attach(self, variant: str, generator: Generator, verifier: Verifier | None):
        """Record `variant`'s requests and scores on these backends; returns the detacher."""
        self.variant = variant
        if self._lines and self._lines[0]["t"] == "h":  # the header, not written yet
            self._lines[0].setdefault("eos", sorted(generator.eos_token_ids))
        removers = [generator.add_request_observer(self._added, self._aborted),
                    generator.add_step_observer(self._stepped)]
        if verifier is not None:
            removers.append(verifier.add_result_observer(self._scored))

        def detach() -> None:
            for remove in removers:
                remove()

        return detach

    def _added(self, request: GenRequest) -> None:
        self._live[request.request_id] = {
            "t": "g", "v": self.variant, "seed": request.seed, "h": request.key(),
            "p": len(request.prompt_token_ids), "max": request.max_tokens,
            "spec": request.speculative, "n": self._sent, "o": []}
        self._sent += 1

    def _stepped(self, deltas: list[GenDelta], stats: StepStats, wall_s: float) -> None:
        for d in deltas:
            live = self._live.get(d.request_id)
            if live is None:
                continue
            live["o"].extend(d.new_token_ids)
            if d.finished:
                self._end(d.request_id, d.finish_reason.value)

    def _aborted(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._end(rid, FinishReason.ABORTED.value)

    def _end(self, request_id: str, finish: str) -> None:
        live = self._live.pop(request_id, None)
        if live is not None:
            self._lines.append({**live, "f": finish})

    def _scored(self, requests: Sequence[ScoreRequest], scores: list[tuple[float, ...]]) -> None:
        for req, values in zip(requests, scores):
            for i, value in zip(req.indices, values):
                self._lines.append({"t": "s", "v": self.variant, "k": score_key(req.problem, req.steps[: i + 1]),
                                    "d": i, "r": float(value)})

    def flush(self) -> None:
        """Append what was recorded since the last flush, as one gzip member."""
        if not self._lines:
            return
        text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in self._lines)
        with open(self.path, "ab") as f:
            f.write(gzip.compress(text.encode()))
        self._lines = []

