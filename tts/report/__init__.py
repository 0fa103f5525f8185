"""`tts report`: compare result folders and W&B runs as a Markdown table with PNG plots.

- ``sources``: reading a run (local folder or ``wandb:entity/project/run_id``), ``ReportError``.
- ``tables``: the columns, the baseline, the metric and config tables.
- ``scaling``, ``ablation``: a sweep over search.n, measured and replayed, and its gain taken apart.
- ``plots``: goodput/latency by N, accuracy, prefix-cache hits, the memory split sweep.
- ``build``: :func:`build_report` (and :func:`write_report`), which puts them together.
"""

from tts.report.build import build_report, write_report
from tts.report.sources import ReportError

__all__ = ["ReportError", "build_report", "write_report"]
