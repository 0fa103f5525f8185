"""The bench loop: engine variants over problems, every variant × round × seed, each
problem recorded as it finishes, in a run folder with its summary (`loop.run_problems`).
Below the two verbs that run it: `tts bench` (`tts.runner`: pre-flight, the problems, the
raw generator) on real or fake models, and `tts replay` (`tts.replay.run`) on a trace's.
(`tts.benchmarks` holds the ceiling and allocator timings, which run no engine.)"""
