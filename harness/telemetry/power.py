"""GPU sampling over a measured window, and what the window's samples say about energy.

A sampler thread reads every GPU at 10 Hz between `begin()` and `end()`; both ends take a reading
synchronously, so the energy counter brackets the window exactly. Energy comes from the GPU's
own counter where it has one (NVML on Volta and later) and from integrating power otherwise.
A level's figures are `power_valid` only when every GPU gave enough readings, none dropped
out, and no counter went backwards; the reason is kept when they are not, numbers and all.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

from k2bench.harness.telemetry.gpu import DeviceError, DeviceSource, Reading

DEFAULT_HZ = 10.0
MIN_SAMPLES = 5  # per GPU: fewer and a mean power says little (a window under half a second)
_FIELDS = ("power_w", "sm_clock_mhz", "mem_clock_mhz", "temp_c", "util_pct", "mem_used_mib")


@dataclass
class Window:
    """Raw readings of one window: times (monotonic s) and, per GPU, a Reading or None (read failed)."""

    ids: list[str]
    names: list[str]
    vendor: str
    t: list[float] = field(default_factory=list)
    readings: list[list[Reading | None]] = field(default_factory=list)  # [gpu][sample]
    errors: list[str] = field(default_factory=list)


class GpuSampler:
    """Samples a DeviceSource in a background thread, one window at a time."""

    def __init__(self, source: DeviceSource, hz: float = DEFAULT_HZ, clock: Callable[[], float] = time.monotonic):
        if hz <= 0:
            raise ValueError("the sampling rate must be positive")
        self.source, self.period, self.clock = source, 1.0 / hz, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._window: Window | None = None
        self._lock = threading.Lock()

    def begin(self) -> None:
        if self._thread is not None:
            raise RuntimeError("a window is already open")
        s = self.source
        self._window = Window(ids=list(s.ids), names=list(s.names), vendor=s.vendor,
                              readings=[[] for _ in s.ids])
        self._stop.clear()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="k2bench-gpu-sampler", daemon=True)
        self._thread.start()

    @property
    def is_open(self) -> bool:
        return self._thread is not None

    def end(self) -> Window:
        if self._thread is None or self._window is None:
            raise RuntimeError("no window is open")
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()
        window, self._window = self._window, None
        return window

    def _run(self) -> None:
        start = self.clock()
        k = 1
        while not self._stop.wait(max(0.0, start + k * self.period - self.clock())):
            self._sample()
            k += 1
            behind = int((self.clock() - start) / self.period)
            if behind > k:  # a slow read: skip the missed ticks rather than firing a burst
                k = behind

    def _sample(self) -> None:
        w = self._window
        if w is None:  # end() raced a tick of the thread; it has already taken the closing reading
            return
        row: list[Reading | None] = []
        for i in range(len(w.ids)):
            try:
                row.append(self.source.read(i))
            except DeviceError as exc:
                row.append(None)
                if len(w.errors) < 10:
                    w.errors.append(str(exc))
        with self._lock:
            w.t.append(self.clock())
            for i, r in enumerate(row):
                w.readings[i].append(r)

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.source.close()


def summarize(window: Window, total_tokens: int, output_tokens: int, min_samples: int = MIN_SAMPLES) -> dict:
    """Per-level energy: per-GPU power and clocks, joules per token, tokens per joule, validity, raw samples."""
    t0 = window.t[0] if window.t else 0.0
    problems: list[str] = []
    per_gpu = []
    total_j = 0.0
    counter_all = True
    for gid, name, rows in zip(window.ids, window.names, window.readings, strict=True):
        ok = [(t, r) for t, r in zip(window.t, rows, strict=True) if r is not None and r.power_w is not None]
        missing = len(rows) - len(ok)
        if missing:
            problems.append(f"GPU {gid} missing from {missing} of {len(rows)} samples")
        if len(ok) < min_samples:
            problems.append(f"GPU {gid}: {len(ok)} samples (fewer than {min_samples})")
        energy, source = _energy(ok)
        if source == "reset":
            problems.append(f"GPU {gid}: energy counter went backwards (reset); energy integrated from power")
        counter_all &= source == "counter"
        total_j += energy or 0.0
        powers = [r.power_w for _, r in ok]
        per_gpu.append({
            "id": gid, "name": name, "samples": len(ok),
            "power_w_mean": _r(statistics.fmean(powers)) if powers else None,
            "power_w_max": _r(max(powers)) if powers else None,
            "energy_j": _r(energy), "energy_from": "counter" if source == "counter" else "power",
            "sm_clock_mhz": _spread([r.sm_clock_mhz for _, r in ok]),
            "mem_clock_mhz": _spread([r.mem_clock_mhz for _, r in ok]),
            "temp_c_max": _max([r.temp_c for _, r in ok]),
            "util_pct_mean": _mean([r.util_pct for _, r in ok]),
            "mem_used_mib_max": _max([r.mem_used_mib for _, r in ok]),
        })
    duration = (window.t[-1] - t0) if window.t else 0.0
    have_energy = total_j > 0
    return {
        "power_valid": not problems and have_energy,
        "reason": "; ".join(problems) if problems else (None if have_energy else "no energy measured"),
        "vendor": window.vendor,
        "duration_s": _r(duration, 3),
        "energy_j": _r(total_j) if have_energy else None,
        "energy_from": "counter" if counter_all else "power",
        "power_w_mean": _r(total_j / duration) if have_energy and duration > 0 else None,
        "j_per_token": _ratio(total_j, total_tokens) if have_energy else None,
        "j_per_output_token": _ratio(total_j, output_tokens) if have_energy else None,
        "tokens_per_j": _ratio(total_tokens, total_j) if have_energy else None,
        "gpus": per_gpu,
        "errors": window.errors,
        "raw": _raw(window, t0),
    }


def _energy(ok: list[tuple[float, Reading]]) -> tuple[float | None, str]:
    """Joules over the readings: the counter's difference when every reading has it and it never
    falls; otherwise the trapezoid integral of power ('power', or 'reset' when the counter fell)."""
    if len(ok) < 2:
        return None, "power"
    counters = [r.energy_j for _, r in ok]
    if all(c is not None for c in counters):
        if all(b >= a for a, b in pairwise(counters)):
            return counters[-1] - counters[0], "counter"
        fell = "reset"
    else:
        fell = "power"
    joules = sum((t1 - t0) * (a.power_w + b.power_w) / 2 for (t0, a), (t1, b) in pairwise(ok))
    return joules, fell


def _raw(window: Window, t0: float) -> dict:
    """Samples for the run page's timelines: seconds from the window start, a list per quantity per GPU."""
    gpus = []
    for gid, rows in zip(window.ids, window.readings, strict=True):
        gpus.append({"id": gid, **{f: [None if r is None else _r(getattr(r, f)) for r in rows] for f in _FIELDS}})
    return {"t_s": [round(t - t0, 3) for t in window.t], "gpus": gpus}


def _spread(values: list[float | None]) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"mean": _r(statistics.fmean(vals)), "min": _r(min(vals)), "max": _r(max(vals))}


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return _r(statistics.fmean(vals)) if vals else None


def _max(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return _r(max(vals)) if vals else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)
