"""An injectable GPU source for telemetry tests (no GPU, no vendor library)."""

from __future__ import annotations

import threading

from k2bench.harness.telemetry.gpu import DeviceError, Reading


class FakeSource:
    """A device source whose counter advances a fixed step per read; read number `fail_at` raises."""

    vendor = "fake"

    def __init__(self, n: int = 2, fail_at: int | None = None, reads_wanted: int = 6):
        self.ids, self.names = [str(i) for i in range(n)], ["Fake"] * n
        self.reads = [0] * n
        self.fail_at, self.closed = fail_at, False
        self.enough = threading.Event()
        self.reads_wanted = reads_wanted

    def read(self, index: int) -> Reading:
        self.reads[index] += 1
        k = self.reads[index]
        if min(self.reads) >= self.reads_wanted:
            self.enough.set()
        if index == 1 and k == self.fail_at:
            raise DeviceError("GPU 1: fell off the bus")
        return Reading(power_w=250.0, energy_j=7.0 * k, sm_clock_mhz=1500.0)

    def close(self) -> None:
        self.closed = True
