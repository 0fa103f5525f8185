"""A run's trace (`trace.jsonl.gz`): the format and reading it (`format`), writing it as a
run goes (`recorder`), and the code and options that recorded it (`provenance`). Below both
`tts.results` (a run's sampling drift, a merge's trace) and `tts.replay` (which serves it
back); it imports neither."""
