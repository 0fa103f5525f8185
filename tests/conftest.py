"""What every test shares: one made-up host, so that no test depends on the machine it runs on.

The CPU's name lands in every host line a test prints or records (`tts.results.host`), and
CPU names differ by more than three times in length between the hosts this suite runs on
("AMD EPYC" against "Intel(R) Xeon(R) Processor"); a line-length test once passed on one and
failed on the other. Every test in this process therefore sees the same long name; tests that
run `tts` in a subprocess see the real host, and assert nothing of its length.
"""

from __future__ import annotations

import pytest

# longer than any CPU name this project has met, in the form /proc/cpuinfo gives
TEST_CPU = "Intel(R) Xeon(R) Platinum 8592+ Processor @ 1.90GHz (a made-up test host)"


@pytest.fixture(autouse=True)
def _made_up_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from tts.results import host

    monkeypatch.setattr(host, "cpu_model", lambda: TEST_CPU)
