"""Every CUDA card gets a device profile (`tts.memory.gpus`, `tts.profiling.gpu`): its
`conf/device` profile or datasheet row by name, else its calibration, else an estimate from
its properties, labelled so. CUDA is mocked at torch (no GPU in these tests)."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import pytest

from tts.config.compose import compose, validate
from tts.memory.device import load_device
from tts.memory.gpus import DATASHEETS, GPU_PROFILES, CardProperties, estimate_profile, gpu_by_name

# A B200 as torch 2.x with CUDA 12 describes it (no datasheet row: estimated)
B200 = dict(name="NVIDIA B200", major=10, minor=0, multi_processor_count=148, total_memory=191_000_000_000,
            clock_rate=1_965_000, memory_clock_rate=3_996_000, memory_bus_width=8192)


@pytest.fixture
def cuda(monkeypatch):
    """A CUDA host whose card `cuda.props` describes (its name included)."""
    import torch

    state = SimpleNamespace(props=SimpleNamespace(**B200))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: state.props.name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: state.props)
    return state


def on_this_host(caplog, tmp_path, monkeypatch):
    """The device profile a vLLM run that names no device records here, and the lines it logs."""
    from tts.profiling.host_device import on_this_host as host

    monkeypatch.setattr("tts.profiling.calibrate.host_cache", lambda cache: tmp_path)  # no kept calibration
    with caplog.at_level(logging.WARNING):
        node = host(compose("config", []))
    return validate(node).device, [r.getMessage() for r in caplog.records]


def test_a_card_of_the_datasheet_table_gets_its_row(cuda, caplog, tmp_path, monkeypatch):
    cuda.props.name = "NVIDIA L4"
    device, lines = on_this_host(caplog, tmp_path, monkeypatch)
    assert (device.name, device.kind, device.peak_tflops, device.bandwidth_gbs, device.memory_gb) == (
        "l4", "gpu", 121.0, 300.0, 24.0)
    assert device.source.startswith("NVIDIA L4 Tensor Core GPU datasheet: BF16 Tensor Core 242 TFLOPS with sparsity")
    assert device.efficiency.compute == load_device("h100").efficiency.compute  # borrowed, and said so
    assert device.efficiency.source.startswith("borrowed from the h100 profile (no l4 measured)")
    assert lines == ["device=cpu: this host runs the models on a GPU (NVIDIA L4): using the l4 profile "
                     "(give device=... to choose another)"]


@pytest.mark.parametrize("card, profile, numbers", [
    ("NVIDIA H100 80GB HBM3", "h100", (989.0, 3350.0, 80.0)),  # SXM: conf/device/h100.yaml
    ("NVIDIA H100 PCIe", "h100_pcie", (756.5, 2000.0, 80.0)),  # 1,513 with sparsity, halved
    ("NVIDIA H100 NVL", "h100_nvl", (835.5, 3900.0, 94.0)),
    ("NVIDIA A100-SXM4-80GB", "a100", (312.0, 2039.0, 80.0)),
    ("NVIDIA A100-SXM4-40GB", "a100_40gb", (312.0, 1555.0, 40.0)),
    ("NVIDIA A100 80GB PCIe", "a100_pcie", (312.0, 1935.0, 80.0)),
    ("NVIDIA A100-PCIE-40GB", "a100_pcie_40gb", (312.0, 1555.0, 40.0)),
    ("NVIDIA L40", "l40", (181.05, 864.0, 48.0)),
    ("NVIDIA L40S", "l40s", (362.05, 864.0, 48.0)),
    ("NVIDIA A10G", "a10g", (70.0, 600.0, 24.0)),
    ("NVIDIA A10", "a10", (125.0, 600.0, 24.0)),
    ("NVIDIA GeForce RTX 3090", "rtx3090", (71.0, 936.0, 24.0)),  # FP32 accumulate: half the FP16 rate
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000_ada", (364.2, 960.0, 48.0)),
    ("Tesla V100-SXM2-32GB", "v100_sxm2_32gb", (125.0, 900.0, 32.0)),
])
def test_a_cards_name_variant_picks_its_own_variant(card, profile, numbers):
    got = gpu_by_name(card)
    assert (got.name, (got.peak_tflops, got.bandwidth_gbs, got.memory_gb)) == (profile, numbers)


@pytest.mark.parametrize("card", ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200",
                                  "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB",
                                  "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA A30", "NVIDIA A10",
                                  "NVIDIA A10G", "NVIDIA A40", "NVIDIA RTX A6000", "NVIDIA GeForce RTX 3090",
                                  "NVIDIA L4", "NVIDIA L40", "NVIDIA L40S", "NVIDIA RTX 6000 Ada Generation",
                                  "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB",
                                  "Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB", "Tesla T4"])
def test_each_card_name_matches_exactly_one_row(card):
    patterns = [p for p, _ in GPU_PROFILES] + [row.pattern for row in DATASHEETS]
    assert sum(bool(re.search(p, card, flags=re.IGNORECASE)) for p in patterns) == 1


@pytest.mark.parametrize("card", ["NVIDIA GH200 480GB", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4090 D",
                                  "Quadro RTX 6000", "NVIDIA B200"])
def test_a_card_the_table_lacks_or_a_variant_with_other_numbers_matches_no_row(card):
    assert gpu_by_name(card) is None


def test_the_table_quotes_dense_rates_and_cites_a_source():
    for row in DATASHEETS:
        assert 0 < row.peak_tflops < 1000 and row.bandwidth_gbs > 0 and row.memory_gb > 0, row.name
        assert "http" in row.source and "TFLOPS" in row.source, row.name
    names = [row.name for row in DATASHEETS] + [name for _, name in GPU_PROFILES]
    assert len(set(names)) == len(names)


def test_an_unknown_card_is_estimated_from_its_properties_and_labelled(cuda, caplog, tmp_path, monkeypatch):
    device, lines = on_this_host(caplog, tmp_path, monkeypatch)
    # 148 SMs x 8,192 FLOP/clock x 1.965 GHz; 3.996 GHz x 2 x 8,192 bits / 8
    assert (device.name, device.kind, device.peak_tflops, device.bandwidth_gbs, device.memory_gb) == (
        "b200_estimate", "gpu", 2382.4, 8183.8, 191.0)
    assert device.source.startswith("ESTIMATED from the card's own properties, not a datasheet: NVIDIA B200")
    assert device.source.endswith("Measure it with `tts profile-memory --calibrate`")
    assert len(lines) == 1 and "using an ESTIMATE from its properties (b200_estimate: 2382.4 TFLOP/s" in lines[0]
    assert "measure it with `tts profile-memory --calibrate`" in lines[0]


def test_what_torch_does_not_give_is_assumed_and_said():
    """A torch without the clocks (CUDA 13 dropped them from `cudaDeviceProp`): the clock is
    `ASSUMED_CLOCK_GHZ`, the bandwidth the lowest of the table's cards of its architecture."""
    card = CardProperties("NVIDIA GeForce RTX 3080", 8, 6, 68, 10_000_000_000)
    got = estimate_profile(card)
    assert (got.name, got.peak_tflops, got.bandwidth_gbs) == ("geforce_rtx_3080_estimate", 48.7, 600.0)  # 68 x 512 x 1.4
    assert "1.4 GHz ASSUMED (torch gives no clock)" in got.source and "halved on GeForce" in got.source
    assert "600 GB/s ASSUMED (torch gives no memory clock): the lowest of the datasheet table's compute " \
           "capability 8.6 cards (a10)" in got.source


def test_a_calibration_of_the_card_replaces_its_estimate(cuda, tmp_path, monkeypatch):
    import tts.profiling.gpu as gpu

    calls = []
    monkeypatch.setattr(gpu, "measure", lambda *a: calls.append(a[:2]) or (1800.0, 7000.0))
    monkeypatch.setattr("torch.cuda.empty_cache", lambda: None)
    measured, path = gpu.calibrate_gpu_and_keep(tmp_path)
    assert (measured.name, measured.peak_tflops, measured.bandwidth_gbs, measured.calibrated, measured.host) == (
        "b200_calibrated", 1800.0, 7000.0, True, "NVIDIA B200")
    assert calls == [("cuda", "bfloat16")] and measured.efficiency is None  # measured rates: no shares to apply
    got, note = gpu.gpu_profile(load_device("cpu"), tmp_path)
    assert got == measured and f"using its calibration (1800 TFLOP/s, 7000 GB/s; {path})" in note
    cuda.props.name = "NVIDIA L4"  # a datasheet card keeps its datasheet's numbers
    assert gpu.gpu_profile(load_device("cpu"), tmp_path)[0].name == "l4"


def test_profile_memory_calibrate_measures_the_card_where_the_models_run_on_one(cuda, monkeypatch):
    from rich.console import Console

    from tts.profiling.verb import _device

    measured = estimate_profile(CardProperties("NVIDIA B200", 10, 0, 148, 191_000_000_000))  # a stand-in
    monkeypatch.setattr("tts.profiling.gpu.calibrate_gpu_and_keep", lambda: (measured, "kept"))
    monkeypatch.setattr("tts.profiling.calibrate.calibrate_and_write", lambda: pytest.fail("the CPU is not measured"))
    assert _device(compose("config", []), True, Console(quiet=True)) == measured
    assert _device(compose("config", ["device=h100"]), True, Console(quiet=True)) == load_device("h100")  # given


def test_the_calibration_measures_on_the_device_it_is_given():
    from tts.profiling.gpu import measure

    tflops, gbs = measure("cpu", "float32", 0.02, 32, 1)  # the CUDA route's code, on the CPU here
    assert tflops > 0 and gbs > 0


def test_a_cpu_host_keeps_the_cpu_profile(monkeypatch):
    import torch

    from tts.profiling.host_device import on_this_host

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: pytest.fail("no card is asked for"))
    monkeypatch.setattr("tts.profiling.calibrate.host_profile", lambda p, dtype=None: (p, None))
    node = compose("config", [])
    assert on_this_host(node) is node and node.device.name == "cpu"


def test_a_device_given_is_kept_on_any_card(cuda):
    from tts.profiling.host_device import on_this_host

    cuda.props.name = "NVIDIA L4"
    given = compose("config", ["device=h100"])
    assert on_this_host(given) is given and validate(given).device.name == "h100"
