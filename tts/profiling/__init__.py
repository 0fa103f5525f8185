"""`tts profile-memory`: the verb's orchestration, above the runner.

- ``verb``: `profile_memory` (the breakdown, the split sweep, the folder and its table).
- ``sweep``: one run per generator share of the KV budget, and the KV blocks per step.
- ``modelled``: the roofline model's view of the same sweep, beside the measured one.
- ``plots``: the sweep's and the breakdown's figures.
- ``calibrate``: measures this CPU (matmul rate, bandwidth) into `conf/device/cpu.yaml`.
- ``gpu``: this host's CUDA card as a profile (datasheet, calibration or estimate), and its
  calibration.
- ``step_fit``: a GPU's measured step efficiencies (the `efficiency:` of its
  `conf/device` profile), fitted to the steps `docs/gpu/roofline_check.py` timed on it.

The memory model it measures against is `tts.memory`; the engine instrumentation it reads
is `tts.backends.vllm` (`memory_breakdown`, `thrash`).
"""
