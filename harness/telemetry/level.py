"""One place the sweep talks to: open GPU sampling, server-metrics scraping and the price once per
sweep, bracket each level's measured window, and hand back the level's `energy`, `cost` and
`server_metrics` fields plus the run-level notes (why a source is off, which GPUs, which price).

The window opens after the level's warmup has finished and closes when its last measured request
has, so the server's counter deltas are exactly the measured requests' tokens.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from k2bench.harness.telemetry import cost, gpu, power, roofline, server_split
from k2bench.harness.telemetry import server_metrics as scrape


@dataclass
class TelemetryConfig:
    """The sweep's telemetry settings; the CLI fills it (--no-telemetry, --gpu-ids, --gpu-hour-usd,
    --metrics-url)."""

    gpu: bool = True
    gpu_ids: str | None = None
    gpu_hour_usd: float | None = None
    server_metrics: bool = True
    metrics_urls: tuple[str, ...] = ()  # where to scrape /metrics (default: the server under test)
    gpu_hz: float = power.DEFAULT_HZ
    metrics_hz: float = scrape.DEFAULT_HZ

    def validate(self) -> None:
        if self.gpu_ids is not None:
            gpu.parse_gpu_ids(self.gpu_ids)
        if self.gpu_hour_usd is not None:
            cost.check_price(self.gpu_hour_usd)


class LevelTelemetry:
    """Telemetry of one sweep: `begin()` / `end()` around each measured window, `fields(point)` after."""

    def __init__(self, cfg: TelemetryConfig, *, base_url: str, server_env: Mapping[str, str], hardware: str | None,
                 api_key: str | None = None, say: Callable[[str], None] | None = None,
                 source: gpu.DeviceSource | None = None, roof: dict | None = None):
        self.say = say or (lambda text: None)
        self.notes: dict[str, str] = {}
        self.sampler: power.GpuSampler | None = None
        self.roof = roof
        if source is None and cfg.gpu and not cfg.gpu_ids and not is_local(base_url):
            self._note("gpu", f"GPU telemetry off: the server ({urlsplit(base_url).hostname}) is not on this "
                              "machine; pass --gpu-ids to read this machine's GPUs anyway")
        elif source is None and cfg.gpu:
            source, note = gpu.open_source(gpu.select_gpu_ids(cfg.gpu_ids, server_env))
            if note:
                self._note("gpu", note)
        elif source is None:
            self._note("gpu", "GPU telemetry off: --no-telemetry")
        self.gpus = [] if source is None else [{"id": i, "name": n} for i, n in zip(source.ids, source.names, strict=True)]
        self.vendor = None if source is None else source.vendor
        if source is not None:
            self.sampler = power.GpuSampler(source, hz=cfg.gpu_hz)
            self.say(f"GPU telemetry: {source.vendor} {', '.join(f'{i} ({n})' for i, n in zip(source.ids, source.names, strict=True))}")
        urls = cfg.metrics_urls or (base_url,)
        # one window per server scraped, named by its instance (host:port; the whole URL where two share one)
        names = [scrape.instance_of(u) for u in urls]
        if len(set(names)) < len(names):
            names = list(urls)
        self.metrics = ({name: scrape.ServerMetricsWindow(u, hz=cfg.metrics_hz, api_key=api_key)
                         for name, u in zip(names, urls, strict=True)} if cfg.server_metrics else {})
        if not cfg.server_metrics:
            self._note("server_metrics", "server metrics off: --no-telemetry")
        for instance, window in self.metrics.items():
            if not window.probe():  # known before the run is recorded, so its notes are complete
                self._note(f"server_metrics:{instance}" if len(urls) > 1 else "server_metrics", window.note)
        self.price, price_note = cost.resolve_price(cfg.gpu_hour_usd, hardware)
        self.price_source = price_note if self.price is not None else None
        if self.price is None:
            self._note("cost", price_note)
        self._gpu_window: power.Window | None = None
        self._server: dict | None = None

    def _note(self, key: str, text: str) -> None:
        if key not in self.notes:
            self.notes[key] = text
            self.say(text)

    def begin(self) -> None:
        self._gpu_window, self._server = None, None
        if self.sampler is not None:
            self.sampler.begin()
        for instance, window in self.metrics.items():
            if not window.begin() and window.note:
                self._note(f"server_metrics:{instance}" if len(self.metrics) > 1 else "server_metrics", window.note)

    def end(self) -> None:
        if self.sampler is not None:
            self._gpu_window = self.sampler.end()
        ends = {instance: window.end() for instance, window in self.metrics.items()}
        ends = {instance: end for instance, end in ends.items() if end is not None}
        self._server = scrape.merge(ends) if ends else None

    def abort(self) -> None:
        """Close a window left open (the level failed or was interrupted), dropping its results;
        after a normal end() it does nothing."""
        gpu_open = self.sampler is not None and self.sampler.is_open
        server_open = any(window.is_open for window in self.metrics.values())
        if not (gpu_open or server_open):
            return
        if gpu_open:
            self.sampler.end()
        for window in self.metrics.values():
            if window.is_open:
                window.end()
        self._gpu_window, self._server = None, None

    def fields(self, point: dict) -> dict:
        """The level's `energy`, `cost` and `server_metrics` (each None when its source is off), and the
        flat figures the metric catalogue follows (energy ones only from power_valid levels; the server's
        time split and speculation where its metrics have them)."""
        energy = None
        if self._gpu_window is not None:
            total = (point.get("input_tokens") or 0) + (point.get("output_tokens") or 0)
            energy = power.summarize(self._gpu_window, total, point.get("output_tokens") or 0)
        price = cost.level_cost(self.price, point.get("tput_per_gpu"), point.get("output_tput_per_gpu"),
                                self.price_source)
        valid = energy is not None and energy["power_valid"]
        share = roofline.level_share(self.roof, point)
        server = self._server
        if server is not None:  # what the flat figures were read from: the buckets of each percentile
            server = {**server, "split": server_split.phase_split(server), "speculation": server_split.speculation(server)}
        return {"energy": energy, "cost": price, "server_metrics": server, **server_split.level_figures(server),
                "j_per_token": energy["j_per_token"] if valid else None,
                "tokens_per_j": energy["tokens_per_j"] if valid else None,
                "usd_per_mtok": price["usd_per_mtok"] if price else None,
                "usd_per_mtok_output": price["usd_per_mtok_output"] if price else None,
                "pct_roofline": share["pct_tput"] if share else None}

    def run_meta(self) -> dict:
        """What the run records about its telemetry: sources' notes, the GPUs read, the price used."""
        out: dict = {"notes": dict(self.notes)}
        if self.gpus:
            out["gpus"], out["vendor"] = self.gpus, self.vendor
        if self.price is not None:
            out["gpu_hour_usd"] = self.price
            out["price_source"] = self.price_source
        return out

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None


def is_local(base_url: str) -> bool:
    """Whether the server's host is this machine (so its GPUs are the ones this process can read)."""
    host = (urlsplit(base_url if "://" in base_url else "http://" + base_url).hostname or "").lower()
    if host in ("localhost", "::1", "0.0.0.0") or host.startswith("127."):
        return True
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    if host in names:
        return True
    try:
        return host in {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
