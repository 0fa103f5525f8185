"""What a replay's roofline step costs (`replay.step_costs`): the device profiles' measured
efficiencies (`tts.memory.device.StepEfficiency`, fitted by `tts.profiling.step_fit` to the
steps timed on each GPU, kept in `docs/gpu/`), or the datasheet roofline as before. No
test here times anything: the measurements are the files in the repository."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tts.benchmarks.allocator_timing import SHAPES
from tts.config.compose import ConfigError, compose, validate
from tts.config.saved_run import ReplayOptions, replay_config
from tts.memory.device import StepEfficiency, device_from_dict, load_device
from tts.memory.roofline import decode_cost, prefill_cost, t_decode_step, t_prefill
from tts.metrics.step_cost import RooflineCost

REPO = Path(__file__).resolve().parent.parent
SHAPE = SHAPES["qwen2.5-7b"]
LAUNCH = 0.002


def check(gpu: str) -> dict:
    return json.loads((REPO / "docs" / "gpu" / f"roofline_check_{gpu}.json").read_text())


@pytest.mark.parametrize("gpu", ["h100", "h200", "a100", "rtx4090"])
def test_a_measured_decode_step_is_its_bytes_at_the_measured_bandwidth_plus_the_layers_fixed_time(gpu):
    device = load_device(gpu)
    eff = device.efficiency
    cost = RooflineCost(SHAPE, device, LAUNCH, measured=True)
    batch, ctx = 8, 1024  # memory-bound: the weights and the KV context read once
    c = decode_cost(SHAPE, ctx)
    memory = (c.bytes_fixed + batch * c.bytes_per_seq) / (device.bandwidth_gbs * 1e9 * eff.memory)
    assert memory > batch * c.flops_per_seq / (device.peak_tflops * 1e12 * eff.compute)
    fixed = SHAPE.num_layers * eff.layer_us * 1e-6
    assert cost.step_s([ctx] * batch, []) == pytest.approx(LAUNCH + fixed + memory, rel=1e-12)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_a_measured_prefill_chunk_is_its_flops_at_the_measured_compute_rate_plus_the_layers_fixed_time(gpu):
    device = load_device(gpu)
    eff = device.efficiency
    cost = RooflineCost(SHAPE, device, LAUNCH, measured=True)
    flops = prefill_cost(SHAPE, 2048).flops(1)
    expected = LAUNCH + SHAPE.num_layers * eff.layer_us * 1e-6 + flops / (device.peak_tflops * 1e12 * eff.compute)
    assert cost.step_s([], [(2048, 0)]) == pytest.approx(expected, rel=1e-12)


def test_datasheet_prices_a_step_as_before_the_measurements():
    h200 = load_device("h200")
    cost = RooflineCost(SHAPE, h200, LAUNCH, measured=False)
    assert cost.step_s([512] * 64, []) == pytest.approx(LAUNCH + t_decode_step(SHAPE, h200, 64, 512), rel=1e-12)
    assert cost.step_s([], [(8192, 0)]) == pytest.approx(LAUNCH + t_prefill(SHAPE, h200, 1, 8192), rel=1e-12)
    assert RooflineCost(SHAPE, h200, LAUNCH).step_s([512], []) == cost.step_s([512], [])  # the class's default
    assert "datasheet" in cost.describe()
    assert cost.step_s([], []) == RooflineCost(SHAPE, h200, LAUNCH, measured=True).step_s([], []) == 0.0


def test_a_profile_without_efficiencies_is_priced_at_its_own_numbers_and_says_so():
    bare = replace(load_device("h200"), efficiency=None)
    measured, datasheet = (RooflineCost(SHAPE, bare, LAUNCH, measured=m) for m in (True, False))
    steps = ([1024] * 32, []), ([], [(4096, 0)])
    assert [measured.step_s(*s) for s in steps] == [datasheet.step_s(*s) for s in steps]
    assert "no measured efficiencies" in measured.prices()
    assert load_device("cpu").efficiency is None  # the CPU's calibrated numbers are measured rates already


def test_measured_prices_the_h200s_steps_where_the_datasheet_priced_prefill_at_half():
    """Against the steps timed on the H200 (kernels only, so no launch): within the fit's
    worst error everywhere, where the datasheet priced prefill at 0.33 to 0.56 of it."""
    data, h200 = check("h200"), load_device("h200")
    for row in data["steps"]:
        shape = SHAPES[row["model"]]
        work = ([row["ctx"]] * row["batch"], []) if row["stage"] == "decode" else ([], [(row["ctx"], 0)])
        measured = RooflineCost(shape, h200, 0.0, measured=True).step_s(*work) * 1e3 / row["measured_ms"]
        datasheet = RooflineCost(shape, h200, 0.0).step_s(*work) * 1e3 / row["measured_ms"]
        assert datasheet == pytest.approx(1 / row["measured_over_roofline"], rel=1e-6)  # the check's own roofline
        assert 0.75 < measured < 1.16, row
        if row["stage"] == "prefill":
            assert datasheet < 0.6 and abs(measured - 1) < 0.16, row


def test_the_measured_profiles_efficiencies_are_the_fit_of_their_measurement_in_the_repository():
    from tts.profiling.step_fit import efficiency

    for gpu in ("h100", "h200"):
        path = f"docs/gpu/roofline_check_{gpu}.json"
        assert load_device(gpu).efficiency == efficiency(check(gpu), path)
        assert (REPO / path).is_file() and (REPO / path.replace(".json", ".md")).is_file()


@pytest.mark.parametrize("gpu", ["a100", "rtx4090"])
def test_a_gpu_never_measured_borrows_the_h100s_efficiencies_labelled_as_borrowed(gpu):
    own, h100 = load_device(gpu), load_device("h100")
    assert (own.efficiency.compute, own.efficiency.memory, own.efficiency.layer_us) == (
        h100.efficiency.compute, h100.efficiency.memory, h100.efficiency.layer_us)
    assert own.efficiency.source.startswith("borrowed from the h100 profile")
    assert "docs/gpu/roofline_check_h100.json" in own.efficiency.source
    assert own.peak_tflops != h100.peak_tflops  # its own datasheet roofline


def test_a_bad_efficiency_names_its_field():
    data = load_device("h100").to_dict()
    with pytest.raises(ValueError, match=r"device.efficiency.compute must be in \(0, 1\]"):
        device_from_dict({**data, "efficiency": {**data["efficiency"], "compute": 1.5}})
    with pytest.raises(ValueError, match="unknown device.efficiency keys.*valid keys"):
        device_from_dict({**data, "efficiency": {**data["efficiency"], "compte": 0.5}})
    with pytest.raises(ValueError, match="device.efficiency: missing keys.*source"):
        device_from_dict({**data, "efficiency": {"compute": 0.5, "memory": 0.5, "layer_us": 1}})
    with pytest.raises(ConfigError, match="device.efficiency.layer_us"):
        validate(compose("config", ["device=h100", "device.efficiency.layer_us=-1"]))


def test_a_composed_gpu_config_carries_its_profiles_efficiencies():
    from tts.assembly.memory_split import device_profile

    cfg = validate(compose("config", ["device=h200"]))
    assert isinstance(cfg.device.efficiency, StepEfficiency)
    assert device_profile(cfg) == load_device("h200")
    assert device_profile(validate(compose("config", ["device=cpu"]))).efficiency is None


def test_replay_step_costs_is_measured_by_default_and_validated():
    assert ReplayOptions().step_costs == "measured"
    saved = {"device": load_device("cpu").to_dict()}
    assert replay_config(saved, ["replay.step_costs=datasheet"])[1].step_costs == "datasheet"
    with pytest.raises(ConfigError, match="replay.step_costs: 'roofline'; valid choices: measured, datasheet"):
        ReplayOptions(step_costs="roofline")
    with pytest.raises(ConfigError, match="no such replay option; valid: .*replay.step_costs"):
        replay_config(saved, ["replay.step_price=datasheet"])


def test_the_replays_first_line_says_which_price_it_used():
    from tts.results.host import simulated_line

    h200 = load_device("h200")
    host = {"simulated": True, "device": h200.to_dict(), "cost": "roofline"}
    for measured, said in ((True, "measured step costs (compute 0.49, memory 0.8"), (False, "datasheet step costs")):
        prices = RooflineCost(SHAPE, h200, LAUNCH, measured=measured).prices()
        assert said in simulated_line({**host, "step_costs": prices})
    assert "roofline_check_h200.json" in RooflineCost(SHAPE, h200, LAUNCH, measured=True).prices()


@pytest.mark.parametrize("step_costs", ["measured", "datasheet"])
def test_the_replays_roofline_costs_take_the_option(step_costs):
    from tts.replay.setup import ReplayBackends

    backends = ReplayBackends.__new__(ReplayBackends)  # its cost models alone: no trace, no tokenizer
    backends.cfg = validate(compose("config", ["device=h200", "generator=qwen2.5-math-1.5b", "verifier=skywork_1.5b",
                                               "generator.dtype=bfloat16", "verifier.dtype=bfloat16"]))
    backends.options = ReplayOptions(cost="roofline", step_costs=step_costs)
    backends.costs = backends._costs()
    assert {c.measured for c in backends.costs.values()} == {step_costs == "measured"}
    assert backends.step_prices().startswith(f"{step_costs} step costs")


def test_tts_reports_ratio_by_device_tells_the_two_prices_and_each_n_apart():
    from types import SimpleNamespace

    from tts.report.plots import device_ratios
    from tts.report.tables import Column

    def replay(step_costs, n, goodput):
        host = {"simulated": True, "device": {"name": "h200"}, "cost": "roofline",
                "models": {"generator": "qwen2.5-math-1.5b", "verifier": "skywork_1.5b"},
                "options": {"step_costs": step_costs} if step_costs else {}}
        run = SimpleNamespace(host=host)
        return [Column(f"{v}", run, v, {"precise_goodput": g, "latency_s_mean": 1 / g}, {"search": {"n": n}})
                for v, g in (("baseline", 1.0), ("PMS", goodput))]

    columns = replay("measured", 16, 1.3) + replay("datasheet", 16, 1.5) + replay(None, 32, 1.1)
    got = {label: goodput for _, label, goodput, _ in device_ratios(columns)}
    assert got == {"qwen2.5-math-1.5b/skywork_1.5b N=16 (measured steps): PMS/baseline": 1.3,
                   "qwen2.5-math-1.5b/skywork_1.5b N=16 (datasheet steps): PMS/baseline": 1.5,
                   "qwen2.5-math-1.5b/skywork_1.5b N=32 (datasheet steps): PMS/baseline": 1.1}  # from before the option
