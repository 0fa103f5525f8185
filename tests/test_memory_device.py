"""Device profiles: the shipped YAMLs, Hydra composition, and CPU calibration."""

import dataclasses

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from tts.profiling.calibrate import calibrate_cpu, total_memory_gb, write_profile
from tts.memory.device import DeviceProfile, available_devices, device_from_dict, load_device

SHIPPED = ["a100", "cpu", "h100", "h200", "rtx4090"]


def test_shipped_profiles_are_listed():
    assert set(SHIPPED) <= set(available_devices())


@pytest.mark.parametrize("name", SHIPPED)
def test_profile_loads_with_positive_fields_and_source(name):
    device = load_device(name)
    assert device.name == name
    assert device.peak_tflops > 0 and device.bandwidth_gbs > 0 and device.memory_gb > 0
    assert device.source.strip()
    assert device.kind == ("cpu" if name == "cpu" else "gpu")
    assert device.calibrated == (name == "cpu")


def test_gpu_datasheet_numbers():
    got = {n: (d.peak_tflops, d.bandwidth_gbs, d.memory_gb)
           for n in ("rtx4090", "a100", "h100", "h200") for d in [load_device(n)]}
    assert got == {
        "rtx4090": (165.2, 1008.0, 24.0),
        "a100": (312.0, 2039.0, 80.0),
        "h100": (989.0, 3350.0, 80.0),
        "h200": (989.0, 4800.0, 141.0),
    }


def test_hydra_compose_device_group():
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name=None, overrides=["+device=h100"])
    device = device_from_dict(OmegaConf.to_container(cfg.device))
    assert device == load_device("h100")


def test_unknown_device_name_lists_valid_ones():
    with pytest.raises(ValueError, match="h100"):
        load_device("tpu9000")


def test_unknown_key_and_bad_kind_rejected():
    fields = dict(name="x", kind="gpu", peak_tflops=1, bandwidth_gbs=1, memory_gb=1, source="s")
    with pytest.raises(ValueError, match="bogus"):
        device_from_dict({**fields, "bogus": 1})
    with pytest.raises(ValueError, match="kind"):
        device_from_dict({**fields, "kind": "tpu"})
    with pytest.raises(ValueError, match="bandwidth_gbs"):
        device_from_dict({**fields, "bandwidth_gbs": 0})


def test_ridge_point():
    assert load_device("h100").ridge_point == pytest.approx(989e12 / 3350e9)


def test_calibrate_cpu_short_run_and_write_roundtrip(tmp_path):
    profile = calibrate_cpu(seconds=0.2, matmul_n=256, copy_mib=16)
    assert profile.kind == "cpu" and profile.calibrated
    assert profile.peak_tflops > 0 and profile.bandwidth_gbs > 0
    assert profile.memory_gb == pytest.approx(total_memory_gb(), rel=1e-3)
    path = write_profile(profile, tmp_path / "device" / "cpu.yaml")
    assert load_device(path) == profile


def test_write_profile_roundtrip_literal(tmp_path):
    profile = DeviceProfile("box", "gpu", 1.5, 2.5, 3.5, "hand-typed", calibrated=False)
    assert load_device(write_profile(profile, tmp_path / "box.yaml")) == profile


def test_calibration_records_the_cpu_it_measured():
    from tts.profiling.calibrate import this_host

    assert calibrate_cpu(seconds=0.2, matmul_n=256, copy_mib=16).host == this_host()
    assert load_device("cpu").host  # the shipped CPU profile names its CPU


def _other_cpu(host="Some Other CPU, 64 threads, float32"):
    return DeviceProfile("cpu", "cpu", 0.1, 20.0, 24.0, "calibrated elsewhere", calibrated=True, host=host)


def test_host_profile_keeps_a_profile_measured_here_and_every_gpu_or_hand_typed_one(tmp_path, monkeypatch):
    import tts.profiling.calibrate as cal

    monkeypatch.setattr(cal, "_calibrate", lambda *a: pytest.fail("nothing should be measured"))
    here = _other_cpu(cal.this_host())
    for profile in (here, load_device("h100"), DeviceProfile("cpu", "cpu", 1.0, 1.0, 1.0, "typed"),
                    _other_cpu(host="")):  # a profile from before `host` was recorded
        assert cal.host_profile(profile, tmp_path) == (profile, None)


def test_host_profile_measures_another_cpus_profile_once_and_reads_it_back(tmp_path, monkeypatch):
    import tts.profiling.calibrate as cal

    measured = DeviceProfile("cpu", "cpu", 2.5, 25.0, 24.0, "measured here", calibrated=True, host=cal.this_host())
    calls = []
    monkeypatch.setattr(cal, "_calibrate", lambda *a: calls.append(a) or (measured, 0.0))
    got, note = cal.host_profile(_other_cpu(), tmp_path)
    assert got == measured and len(calls) == 1
    assert "Some Other CPU" in note and cal.this_host() in note
    assert cal.host_profile(_other_cpu(), tmp_path) == (measured, note) and len(calls) == 1  # the cache

    (cache,) = tmp_path.glob("cpu-*.yaml")
    cache.write_text("peak_tflops: [not a number")  # corrupt: measured again
    assert cal.host_profile(_other_cpu(), tmp_path)[0] == measured and len(calls) == 2


def test_host_profile_does_not_keep_a_calibration_from_a_busy_machine(tmp_path, monkeypatch):
    import tts.profiling.calibrate as cal

    measured = DeviceProfile("cpu", "cpu", 2.5, 25.0, 24.0, "measured here", calibrated=True, host=cal.this_host())
    monkeypatch.setattr(cal, "_calibrate", lambda *a: (measured, 0.5))
    assert cal.host_profile(_other_cpu(), tmp_path)[0] == measured
    assert not list(tmp_path.glob("cpu-*.yaml"))


def test_a_vllm_run_on_another_cpu_records_this_cpus_profile(tmp_path, monkeypatch):
    import tts.profiling.calibrate as cal
    from tts.config.compose import compose as compose_config
    from tts.profiling.host_device import on_this_host

    measured = DeviceProfile("cpu", "cpu", 2.5, 25.0, 24.0, "measured here", calibrated=True, host=cal.this_host())
    monkeypatch.setattr(cal, "_calibrate", lambda *a: (measured, 0.0))
    monkeypatch.setattr(cal, "host_cache", lambda cache: tmp_path)
    node = compose_config("config", ["device.host='Some Other CPU, 64 threads, float32'"])
    got = on_this_host(node)
    assert got.device.peak_tflops == 2.5 and got.device.host == cal.this_host()
    assert node.device.peak_tflops != 2.5  # the composed config is left as it was
    fake = compose_config("config", ["generator=fake", "device.host='Some Other CPU, 64 threads, float32'"])
    assert on_this_host(fake) is fake  # nothing runs here that the profile prices


def test_a_resumed_run_keeps_the_profile_it_measured_on_this_cpu(tmp_path, monkeypatch):
    import tts.profiling.calibrate as cal
    from tts.config.compose import compose as compose_config
    from tts.profiling.host_device import on_this_host

    monkeypatch.setattr(cal, "_calibrate", lambda *a: pytest.fail("a resumed run measures nothing"))
    recorded = DeviceProfile("cpu", "cpu", 2.25, 24.0, 24.0, "measured here", calibrated=True, host=cal.this_host())
    folder = tmp_path / "run"  # a run folder whose config recorded `recorded`
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump({"device": recorded.to_dict()}))
    other = ["device.host='Some Other CPU, 64 threads, float32'", f"bench.results_dir={tmp_path}", "bench.run_name=run"]
    got = on_this_host(compose_config("config", other + ["bench.resume=true"]))
    assert got.device.peak_tflops == 2.25 and got.device.host == cal.this_host()
    monkeypatch.setattr(cal, "_calibrate", lambda *a: (dataclasses.replace(recorded, peak_tflops=3.0), 0.0))
    monkeypatch.setattr(cal, "host_cache", lambda cache: tmp_path / "cache")
    assert on_this_host(compose_config("config", other)).device.peak_tflops == 3.0  # a new run measures


def test_a_run_resumed_on_another_cpu_keeps_its_profile(tmp_path, monkeypatch):
    """A long run resumed on another machine keeps the profile its first part measured,
    so its speculation width and memory split do not change (and the resume is not refused
    as "other settings"); the note names both CPUs."""
    import tts.profiling.calibrate as cal
    from tts.config.compose import compose as compose_config
    from tts.profiling.host_device import _resumed_device, on_this_host

    monkeypatch.setattr(cal, "_calibrate", lambda *a: pytest.fail("a resumed run measures nothing"))
    recorded = _other_cpu()
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump({"device": recorded.to_dict()}))
    node = compose_config("config", [f"bench.results_dir={tmp_path}", "bench.run_name=run", "bench.resume=true"])
    assert on_this_host(node).device.host == recorded.host
    got, note = _resumed_device(node, load_device("cpu"), "float32")
    assert got == recorded and "Some Other CPU" in note and cal.this_host("float32") in note
    assert _resumed_device(node, recorded, "float32") == (recorded, None)


def test_the_profile_prices_the_dtype_the_models_run_in(tmp_path, monkeypatch):
    """A run pinned to float32 on a CPU with native bf16 is priced at float32: the host key
    names the run's dtype, and the peak is that dtype's rate."""
    import tts.profiling.calibrate as cal

    monkeypatch.setattr(cal, "_measure", lambda *a: (20.0, {"bfloat16": 0.4, "float32": 0.1}, 2, 0.0))
    profile, _ = cal._calibrate(0.1, 64, 1, "float32")
    assert profile.peak_tflops == 0.1 and profile.host == cal.this_host("float32") and profile.host.endswith("float32")
    assert cal._calibrate(0.1, 64, 1, "bfloat16")[0].peak_tflops == 0.4
    got, note = cal.host_profile(_other_cpu(), tmp_path, dtype="float32")
    assert got.peak_tflops == 0.1 and cal.this_host("float32") in note
