"""Trace replay: a run's recorded model outputs replayed through the engine's own scheduling
on a simulated clock (`tts replay`)."""
