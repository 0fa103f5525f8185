"""Verbs that work on saved run folders, beside `tts/replay/`: `tts merge` (`merge.py`: a
sharded run's folders joined into one) and `tts rescore` (`rescore.py`: a run's candidates
scored by another verifier). `tts/results/` summarises one run; these read finished runs."""
