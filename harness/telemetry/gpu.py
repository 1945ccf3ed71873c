"""Reading GPUs through their vendors' libraries: NVML (nvidia-ml-py) and AMD's amdsmi.

Both libraries are optional (the `gpu` extra installs nvidia-ml-py; amdsmi ships with ROCm and is
not on PyPI for every ROCm version). `open_source` answers either a source or the one-line reason
why telemetry is off, so a CPU machine runs a sweep unchanged.

Which GPUs: the ids the user gave (--gpu-ids), else the server's CUDA_VISIBLE_DEVICES /
HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES, else every GPU the library sees. NVML numbers GPUs
in PCI bus order, which is CUDA's order only under CUDA_DEVICE_ORDER=PCI_BUS_ID (the usual
order of identical GPUs on one board); UUIDs (GPU-...) are unambiguous and are resolved as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from k2bench.errors import UserError

VISIBLE_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Reading:
    """One GPU at one instant; None where the GPU or library does not report the quantity."""

    power_w: float | None
    energy_j: float | None = None  # cumulative counter since the driver loaded
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    temp_c: float | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None


class DeviceError(Exception):
    """A GPU that answered before no longer answers (fell off the bus, driver reset)."""


class DeviceSource(Protocol):
    vendor: str
    ids: list[str]  # as the user or the environment named them
    names: list[str]  # product names, same order

    def read(self, index: int) -> Reading: ...

    def close(self) -> None: ...


def parse_gpu_ids(text: str) -> list[str]:
    """``0,1,2,3`` or UUIDs; UserError on an empty or malformed list."""
    ids = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not i for i in ids):
        raise UserError(f"--gpu-ids {text!r}: expected a comma-separated list such as 0,1,2,3")
    for i in ids:
        if not (i.isdigit() or i.startswith(("GPU-", "MIG-"))):
            raise UserError(f"--gpu-ids {text!r}: {i!r} is neither a GPU index nor a GPU-/MIG- UUID")
    if len(set(ids)) != len(ids):
        raise UserError(f"--gpu-ids {text!r}: a GPU is listed twice")
    return ids


def select_gpu_ids(explicit: str | None, server_env: Mapping[str, str]) -> list[str] | None:
    """The GPUs the server under test uses; None means every GPU the library sees."""
    if explicit:
        return parse_gpu_ids(explicit)
    for name in VISIBLE_ENV:
        value = server_env.get(name)
        if value is not None and value.strip():
            try:
                return parse_gpu_ids(value)
            except UserError as exc:
                raise UserError(f"{name}={value!r} of the server: {exc}") from None
    return None


class NvmlSource:
    """NVIDIA GPUs through NVML: power, the energy counter (Volta and later), clocks, ..."""

    vendor = "nvidia"

    def __init__(self, ids: list[str] | None):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            self.ids = ids if ids is not None else [str(i) for i in range(count)]
            self._handles = [self._handle(i, count) for i in self.ids]
            self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self._handles]
        except Exception:
            pynvml.nvmlShutdown()
            raise

    def _handle(self, gpu_id: str, count: int):
        nv = self._nvml
        if gpu_id.startswith(("GPU-", "MIG-")):
            return nv.nvmlDeviceGetHandleByUUID(gpu_id)
        if int(gpu_id) >= count:
            raise UserError(f"GPU {gpu_id} asked for, but NVML sees {count} GPU(s) (0..{count - 1})")
        return nv.nvmlDeviceGetHandleByIndex(int(gpu_id))

    def _instant_power(self, h) -> float | None:
        """Instantaneous board power (W) where the driver offers the field; nvmlDeviceGetPowerUsage
        is a one-second average on Ampere and later, too smooth for a 10 Hz timeline."""
        nv = self._nvml
        try:
            v = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_POWER_INSTANT])[0]
        except (nv.NVMLError, AttributeError):
            return None
        if v.nvmlReturn != nv.NVML_SUCCESS:
            return None
        by_type = {nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal", nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
                   nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal", nv.NVML_VALUE_TYPE_DOUBLE: "dVal"}
        attr = by_type.get(v.valueType)
        return None if attr is None else float(getattr(v.value, attr)) / 1000.0  # mW

    def read(self, index: int) -> Reading:
        nv, h = self._nvml, self._handles[index]
        try:
            power = self._instant_power(h)
            if power is None:
                power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # mW
        except nv.NVMLError as exc:
            raise DeviceError(f"GPU {self.ids[index]}: {exc}") from None

        def opt(fn, *args):
            try:
                return fn(h, *args)
            except nv.NVMLError:
                return None

        energy = opt(nv.nvmlDeviceGetTotalEnergyConsumption)  # mJ
        util = opt(nv.nvmlDeviceGetUtilizationRates)
        mem = opt(nv.nvmlDeviceGetMemoryInfo)
        return Reading(
            power_w=power,
            energy_j=None if energy is None else energy / 1000.0,
            sm_clock_mhz=_num(opt(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)),
            mem_clock_mhz=_num(opt(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM)),
            temp_c=_num(opt(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)),
            util_pct=None if util is None else float(util.gpu),
            mem_used_mib=None if mem is None else mem.used / (1 << 20),
        )

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class AmdSmiSource:
    """AMD GPUs through amdsmi (ROCm 6+). Written against amdsmi's documented Python API; it has not
    been run on an AMD GPU in this project yet, so a failure here turns telemetry off with its reason."""

    vendor = "amd"

    def __init__(self, ids: list[str] | None):
        import amdsmi

        self._smi = amdsmi
        amdsmi.amdsmi_init()
        try:
            handles = amdsmi.amdsmi_get_processor_handles()
            if ids is None:
                ids = [str(i) for i in range(len(handles))]
            for i in ids:
                if not i.isdigit() or int(i) >= len(handles):
                    raise UserError(f"GPU {i} asked for, but amdsmi sees {len(handles)} GPU(s)")
            self.ids = ids
            self._handles = [handles[int(i)] for i in ids]
            self.names = [str(amdsmi.amdsmi_get_gpu_asic_info(h).get("market_name", "AMD GPU"))
                          for h in self._handles]
        except Exception:
            amdsmi.amdsmi_shut_down()
            raise

    def read(self, index: int) -> Reading:
        smi, h = self._smi, self._handles[index]
        try:
            info = smi.amdsmi_get_power_info(h)
        except smi.AmdSmiException as exc:
            raise DeviceError(f"GPU {self.ids[index]}: {exc}") from None
        power = _num(info.get("current_socket_power"))
        if power is None:  # MI300-class parts report only the averaged socket power
            power = _num(info.get("average_socket_power"))

        def opt(fn, *args):
            try:
                return fn(h, *args)
            except smi.AmdSmiException:
                return None

        energy = opt(smi.amdsmi_get_energy_count)
        joules = None
        if energy:
            count = energy.get("energy_accumulator", energy.get("power"))
            if count is not None and energy.get("counter_resolution") is not None:
                joules = float(count) * float(energy["counter_resolution"]) / 1e6  # resolution in uJ
        gfx = opt(smi.amdsmi_get_clock_info, smi.AmdSmiClkType.GFX) or {}
        mclk = opt(smi.amdsmi_get_clock_info, smi.AmdSmiClkType.MEM) or {}
        activity = opt(smi.amdsmi_get_gpu_activity) or {}
        vram = opt(smi.amdsmi_get_gpu_vram_usage) or {}
        temp = opt(smi.amdsmi_get_temp_metric, smi.AmdSmiTemperatureType.HOTSPOT,
                   smi.AmdSmiTemperatureMetric.CURRENT)
        return Reading(power_w=power, energy_j=joules, sm_clock_mhz=_num(gfx.get("clk")),
                       mem_clock_mhz=_num(mclk.get("clk")), temp_c=_num(temp),
                       util_pct=_num(activity.get("gfx_activity")), mem_used_mib=_num(vram.get("vram_used")))

    def close(self) -> None:
        self._smi.amdsmi_shut_down()


def open_source(ids: list[str] | None) -> tuple[DeviceSource | None, str | None]:
    """(source, None) when GPUs can be read, else (None, the one-line reason telemetry is off).

    A bad explicit id is the user's mistake and raises UserError; everything else is a note.
    """
    reasons = []
    for label, cls, module in (("NVML", NvmlSource, "pynvml"), ("amdsmi", AmdSmiSource, "amdsmi")):
        try:
            __import__(module)
        except ImportError:
            reasons.append(f"{label} not installed")
            continue
        try:
            source = cls(ids)
        except UserError:
            raise
        except Exception as exc:  # no driver, no device, library/driver mismatch
            reasons.append(f"{label}: {str(exc).strip() or type(exc).__name__}")
            continue
        if not source.ids:
            source.close()
            reasons.append(f"{label}: no GPU found")
            continue
        return source, None
    hint = " (pip install 'k2bench[gpu]' for NVIDIA; amdsmi comes with ROCm)" if all(
        r.endswith("not installed") for r in reasons) else ""
    return None, "GPU telemetry off: " + "; ".join(reasons) + hint


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _num(value) -> float | None:
    try:
        return None if value is None or value == "N/A" else float(value)
    except (TypeError, ValueError):
        return None
