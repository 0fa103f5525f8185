"""What a run measures: the engine's events (`events.py`), their one collector, the per-problem
and per-run measures, and the step cost model fitted on the run's own steps."""
