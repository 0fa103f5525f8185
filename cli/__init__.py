"""The `tts` command line (`main.py`): a thin Typer layer over the library."""
