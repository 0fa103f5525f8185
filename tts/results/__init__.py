"""One run's results as it is written: its folder (`store.py`), records, summary, ratio table,
host and headline; verbs on saved runs live in `tts/saved/`."""
