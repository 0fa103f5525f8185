"""A run's configuration: the typed schema of each Hydra config group (`schema.py`), composing
it (`compose.py`), and what a saved run's config means today (`saved_run.py`, `replaced.py`)."""
