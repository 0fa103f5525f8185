"""Assembling a run: which variants it compares (`variants`), the engine of each with its
typed options and the memory policy M (`build`, `memory_split`), and the host it runs on:
dtypes, vLLM's model runner, this machine's device profile (`host`). The run loop that
drives them (store, resume, trace, logging) is `tts.bench`."""
