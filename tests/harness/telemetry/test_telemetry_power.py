"""GPU telemetry: energy and validity from a window's samples, the sampler thread against an injected
device source, GPU selection, telemetry off without a library, and the real NVML path (gpu marker)."""

from __future__ import annotations

import sys
import threading
from itertools import pairwise

import pytest
from telemetry_fakes import FakeSource

from k2bench.errors import UserError
from k2bench.harness.telemetry import gpu
from k2bench.harness.telemetry.gpu import DeviceError, Reading, select_gpu_ids
from k2bench.harness.telemetry.power import GpuSampler, Window, summarize


def window(per_gpu: list[list[Reading | None]], dt: float = 0.1) -> Window:
    n = len(per_gpu[0])
    ids = [str(i) for i in range(len(per_gpu))]
    return Window(ids=ids, names=["Fake GPU"] * len(ids), vendor="fake", t=[100.0 + k * dt for k in range(n)],
                  readings=per_gpu)


def test_energy_from_the_counter_per_token_and_per_joule():
    # two GPUs at 300 W whose counters advance 30 J per 0.1 s: 9 intervals x 30 J x 2 GPUs = 540 J
    gpus = [[Reading(power_w=300.0, energy_j=5000.0 + 30.0 * k, sm_clock_mhz=1980.0 - k, mem_clock_mhz=2619.0,
                     temp_c=50.0 + k, util_pct=90.0, mem_used_mib=1000.0 + k) for k in range(10)] for _ in range(2)]
    e = summarize(window(gpus), total_tokens=1000, output_tokens=200)
    assert e["power_valid"] is True and e["reason"] is None
    assert e["energy_j"] == pytest.approx(540.0)
    assert e["energy_from"] == "counter"
    assert e["j_per_token"] == pytest.approx(0.54)
    assert e["j_per_output_token"] == pytest.approx(2.7)
    assert e["tokens_per_j"] == pytest.approx(1000 / 540)
    assert e["power_w_mean"] == pytest.approx(600.0)  # 540 J over 0.9 s, both GPUs together
    g0 = e["gpus"][0]
    assert (g0["power_w_mean"], g0["power_w_max"], g0["energy_j"]) == (300.0, 300.0, 270.0)
    assert g0["sm_clock_mhz"] == {"mean": 1975.5, "min": 1971.0, "max": 1980.0}
    assert g0["temp_c_max"] == 59.0 and g0["mem_used_mib_max"] == 1009.0
    assert e["raw"]["t_s"][:3] == [0.0, 0.1, 0.2] and len(e["raw"]["gpus"][1]["power_w"]) == 10


def test_energy_integrated_from_power_without_a_counter():
    # power ramps 100 -> 190 W over 0.9 s: the area is the mean of the ends times the time, 130.5 J
    gpus = [[Reading(power_w=100.0 + 10.0 * k) for k in range(10)]]
    e = summarize(window(gpus), total_tokens=261, output_tokens=29)
    assert e["power_valid"] is True
    assert e["energy_from"] == "power"
    assert e["energy_j"] == pytest.approx(130.5)
    assert e["j_per_token"] == pytest.approx(0.5)
    assert e["gpus"][0]["power_w_max"] == 190.0 and e["gpus"][0]["sm_clock_mhz"] is None


def test_a_counter_reset_invalidates_the_level_but_keeps_the_integrated_energy():
    counters = [900.0, 910.0, 920.0, 3.0, 13.0, 23.0]
    gpus = [[Reading(power_w=100.0, energy_j=c) for c in counters]]
    e = summarize(window(gpus), total_tokens=10, output_tokens=5)
    assert e["power_valid"] is False
    assert "reset" in e["reason"] and "GPU 0" in e["reason"]
    assert e["energy_j"] == pytest.approx(50.0)  # 100 W x 0.5 s, not the counter's -877 J
    assert e["gpus"][0]["energy_from"] == "power"


def test_a_gpu_missing_from_samples_or_too_few_samples_is_not_valid():
    good = [Reading(power_w=200.0, energy_j=20.0 * k) for k in range(8)]
    dropped = list(good)
    dropped[4] = None
    e = summarize(window([good, dropped]), total_tokens=10, output_tokens=5)
    assert e["power_valid"] is False and "GPU 1 missing from 1 of 8 samples" in e["reason"]
    short = summarize(window([good[:3]]), total_tokens=10, output_tokens=5)
    assert short["power_valid"] is False and "3 samples (fewer than 5)" in short["reason"]


def test_the_sampler_thread_brackets_the_window_and_records_every_read():
    src = FakeSource(fail_at=3)
    sampler = GpuSampler(src, hz=200.0)
    sampler.begin()
    assert src.enough.wait(60), "the sampler thread never read the GPUs"
    w = sampler.end()
    sampler.close()
    assert src.closed
    n = len(w.t)
    assert n == src.reads[0] == src.reads[1] >= 6  # every tick read every GPU, begin and end included
    assert all(b >= a for a, b in pairwise(w.t))
    assert w.readings[1][2] is None and w.errors == ["GPU 1: fell off the bus"]
    e = summarize(w, total_tokens=100, output_tokens=10)
    assert e["gpus"][0]["energy_j"] == pytest.approx(7.0 * (n - 1))  # counter read 1 .. read n
    assert e["power_valid"] is False and "GPU 1 missing from 1 of" in e["reason"]
    assert src.reads == [n, n]  # nothing read after end()


def test_gpu_selection_order_and_bad_ids():
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "0"}
    assert select_gpu_ids("0,1", env) == ["0", "1"]
    assert select_gpu_ids(None, env) == ["2", "3"]
    assert select_gpu_ids(None, {"HIP_VISIBLE_DEVICES": "1"}) == ["1"]
    assert select_gpu_ids(None, {"CUDA_VISIBLE_DEVICES": "GPU-0a1b"}) == ["GPU-0a1b"]
    assert select_gpu_ids(None, {}) is None
    for bad in ("0,,1", "a", "1,1"):
        with pytest.raises(UserError, match="--gpu-ids"):
            select_gpu_ids(bad, {})
    with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES"):
        select_gpu_ids(None, {"CUDA_VISIBLE_DEVICES": "x,y"})


def test_no_gpu_library_means_telemetry_off_with_one_line_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    source, note = gpu.open_source(None)
    assert source is None
    assert note.startswith("GPU telemetry off: NVML not installed; amdsmi not installed")
    assert "k2bench[gpu]" in note and "\n" not in note


def test_a_library_without_a_driver_is_a_note_not_an_error(monkeypatch):
    class Broken:
        def __init__(self, ids):
            raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setattr(gpu, "NvmlSource", Broken)
    monkeypatch.setattr(gpu, "AmdSmiSource", Broken)
    monkeypatch.setitem(sys.modules, "pynvml", sys)  # importable
    monkeypatch.setitem(sys.modules, "amdsmi", sys)
    source, note = gpu.open_source(["0"])
    assert source is None and note.count("NVML Shared Library Not Found") == 2


@pytest.mark.gpu
def test_nvml_reads_a_real_gpu():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pytest.skip("no NVIDIA driver")
    source, note = gpu.open_source(["0"])
    assert note is None and source is not None
    r = source.read(0)
    limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(source._handles[0]) / 1000.0
    assert 0 < r.power_w <= limit * 1.2
    assert r.sm_clock_mhz and r.sm_clock_mhz > 0 and r.mem_used_mib is not None
    sampler = GpuSampler(source, hz=10.0)
    sampler.begin()
    done = threading.Event()
    done.wait(1.0)  # a second of idle samples: the count is checked, not the time
    w = sampler.end()
    sampler.close()
    e = summarize(w, total_tokens=1, output_tokens=1)
    assert len(w.t) >= 2 and e["energy_j"] is not None and e["energy_j"] > 0
    assert 0 < e["gpus"][0]["power_w_mean"] <= limit * 1.2


class _FakeNvml:
    """Just enough of pynvml's surface (names, constants, units as NVML documents them: mW, mJ, bytes)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU, NVML_SUCCESS = 1, 2, 0, 0
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_VALUE_TYPE_DOUBLE, NVML_VALUE_TYPE_UNSIGNED_INT = 0, 1
    NVML_VALUE_TYPE_UNSIGNED_LONG, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 2, 3

    class NVMLError(Exception):
        pass

    def __init__(self, instant: bool):
        self.instant, self.gone, self.shut = instant, set(), False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"h{i}"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return "h1" if uuid == "GPU-b" else self._fail()

    def _fail(self):
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlDeviceGetFieldValues(self, h, ids):
        from types import SimpleNamespace

        ok = self.instant and h not in self.gone
        return [SimpleNamespace(nvmlReturn=0 if ok else 3, valueType=1, value=SimpleNamespace(uiVal=412_500))]

    def nvmlDeviceGetPowerUsage(self, h):
        return 398_000 if h not in self.gone else self._fail()

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return 123_456_789

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 47

    def nvmlDeviceGetUtilizationRates(self, h):
        from types import SimpleNamespace

        return SimpleNamespace(gpu=93, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        from types import SimpleNamespace

        return SimpleNamespace(used=96 * (1 << 30), total=141 * (1 << 30))


@pytest.mark.parametrize("instant", [True, False])
def test_the_nvml_binding_converts_units_and_names_a_lost_gpu(monkeypatch, instant):
    fake = _FakeNvml(instant)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source, note = gpu.open_source(["0", "GPU-b"])
    assert note is None and source.vendor == "nvidia" and source.names == ["NVIDIA H200", "NVIDIA H200"]
    r = source.read(1)
    assert r.power_w == (412.5 if instant else 398.0)  # the instantaneous field when offered, else the average
    assert (r.energy_j, r.sm_clock_mhz, r.mem_clock_mhz, r.temp_c, r.util_pct, r.mem_used_mib) == (
        123_456.789, 1980.0, 3201.0, 47.0, 93.0, 96 * 1024.0)
    fake.gone.add("h1")
    with pytest.raises(DeviceError, match="GPU GPU-b"):
        source.read(1)
    source.close()
    assert fake.shut
    with pytest.raises(UserError, match="NVML sees 2 GPU"):
        gpu.open_source(["5"])
