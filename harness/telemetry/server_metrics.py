"""What the server itself counted during a measured window, from its Prometheus /metrics.

Servers' counters are cumulative since they started, so a window's share is the difference of a
scrape at its start and one at its end; gauges (KV-cache usage, running and waiting requests)
are also scraped once a second in between and summarised as mean and max. Names stay as the
server exposes them (``vllm:prompt_tokens_total``, ``k2bench_prompt_tokens_total``), with labels
written Prometheus-style. Histograms and summaries contribute their ``_count`` and ``_sum``
(deltas); a histogram's buckets are kept as the window's bucket deltas (``histograms``, see
k2bench.harness.telemetry.histograms), from which the server-side time split is read; a summary's
quantiles are left out (they cannot be taken over a window). A server without /metrics is noted
once, not an error.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from k2bench.harness.telemetry import histograms
from k2bench.net import normalize_base_url

DEFAULT_HZ = 1.0
Scrape = dict[str, tuple[str, float]]  # sample key -> ("counter" | "gauge" | "bucket", value)


class ScrapeError(Exception):
    pass


def metrics_url(url: str) -> str:
    """The /metrics address of a server root (``http://h:p``, ``.../v1``), or ``url`` itself when it
    already names the endpoint (``http://h:p/metrics``, a --metrics-url)."""
    root = normalize_base_url(url)
    return root if root.endswith("/metrics") else root + "/metrics"


def instance_of(url: str) -> str:
    """What Prometheus calls a target: host:port (a URL without a port keeps its scheme's default)."""
    parts = urlsplit(normalize_base_url(url))
    return parts.netloc or url


def with_label(key: str, name: str, value: str) -> str:
    """A sample key with one more label (a key without labels gets its first)."""
    if key.endswith("}"):
        return f'{key[:-1]},{name}="{value}"}}'
    return f'{key}{{{name}="{value}"}}'


def merge(windows: dict[str, dict]) -> dict:
    """Several servers' windows (``--metrics-url`` given more than once: the prefill and decode workers
    of one disaggregated server) as one, each sample labelled with its server's ``instance``. The gauge
    timelines (``raw``) are the first server's, unlabelled, so the run page draws them as for one."""
    if len(windows) == 1:
        return next(iter(windows.values()))
    out: dict = {"counters": {}, "gauges": {}, "histograms": {}, "instances": list(windows)}
    notes = []
    for instance, w in windows.items():
        for part in ("counters", "gauges", "histograms"):
            out[part].update({with_label(k, "instance", instance): v for k, v in (w.get(part) or {}).items()})
        if w.get("note"):
            notes.append(f"{instance}: {w['note']}")
    out["scrapes"] = min(w.get("scrapes", 0) for w in windows.values())
    first = next(iter(windows.values()))
    if "raw" in first:
        out["raw"] = first["raw"]
    if notes:
        out["note"] = "; ".join(notes)
    if not out["histograms"]:
        del out["histograms"]
    return out


def sample_key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def parse(text: str) -> Scrape:
    """Prometheus text exposition -> {sample key: (kind, value)}; counters include histogram counts/sums,
    and each histogram bucket is kept under `histograms.bucket_key` with kind "bucket"."""
    out: Scrape = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ScrapeError(f"not Prometheus text: {exc}") from None
    for fam in families:
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue  # a creation timestamp, not a quantity
            if fam.type == "counter":
                kind = "counter"
            elif fam.type == "histogram" and s.name.endswith("_bucket") and "le" in s.labels:
                labels = {k: v for k, v in s.labels.items() if k != "le"}
                key = histograms.bucket_key(sample_key(fam.name, labels), s.labels["le"])
                out[key] = ("bucket", float(s.value))
                continue
            elif fam.type in ("histogram", "gaugehistogram", "summary"):
                if not s.name.endswith(("_count", "_sum")) or fam.type == "gaugehistogram":
                    continue
                kind = "counter"
            elif fam.type in ("gauge", "unknown", "untyped"):
                kind = "gauge"
            else:  # info, stateset: labels, not quantities
                continue
            out[sample_key(s.name, s.labels)] = (kind, float(s.value))
    return out


def scrape(url: str, timeout_s: float = 5.0, api_key: str | None = None) -> Scrape:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ScrapeError(f"{url}: {reason}") from None
    return parse(text)


def summarize(first: Scrape, last: Scrape, middle: list[Scrape], times: list[float] | None = None) -> dict:
    """Counters and histogram buckets as deltas over the window; gauges as mean and max over every
    scrape that had them, and, given the scrapes' times, each gauge's series (the run page's KV-usage
    and queue timelines)."""
    counters: dict[str, float] = {}
    reset: list[str] = []
    for key, (kind, end) in sorted(last.items()):
        if kind != "counter":
            continue
        start = first.get(key, ("counter", 0.0))[1]  # a label set born during the window started at 0
        if end < start:
            reset.append(key)
            continue
        counters[key] = _clean(end - start)
    series: dict[str, list[float]] = {}
    for scrape_ in (first, *middle, last):
        for key, (kind, value) in scrape_.items():
            if kind == "gauge":
                series.setdefault(key, []).append(value)
    gauges = {k: {"mean": _clean(sum(v) / len(v)), "max": _clean(max(v))} for k, v in sorted(series.items())}
    out: dict = {"counters": counters, "gauges": gauges, "scrapes": 2 + len(middle)}
    hists, broken = histograms.deltas(first, last)
    if hists:
        out["histograms"] = {k: d.to_json() for k, d in hists.items()}
    reset += broken
    if times is not None and len(times) == out["scrapes"]:
        scrapes = (first, *middle, last)
        out["raw"] = {"t_s": [round(t - times[0], 3) for t in times],
                      "gauges": {k: [sc[k][1] if k in sc else None for sc in scrapes] for k in series}}
    if reset:
        out["note"] = f"counter(s) went backwards during the window (server restarted?): {', '.join(reset)}"
    return out


class ServerMetricsWindow:
    """Scrapes at begin(), once a second in a thread, and at end(); one instance per sweep."""

    def __init__(self, url: str, hz: float = DEFAULT_HZ, api_key: str | None = None,
                 scrape_fn: Callable[[str], Scrape] | None = None):
        self.url = metrics_url(url)
        self.period = 1.0 / hz
        self._scrape = scrape_fn or (lambda url: scrape(url, api_key=api_key))
        self.note: str | None = None  # set once when the server has no usable /metrics
        self._first: Scrape | None = None
        self._middle: list[Scrape] = []
        self._times: list[float] = []  # monotonic time of each kept scrape
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self.note is None

    @property
    def is_open(self) -> bool:
        return self._thread is not None

    def probe(self) -> bool:
        """One scrape to learn whether the server has a usable /metrics (sets `note` once if not)."""
        if not self.available:
            return False
        try:
            self._scrape(self.url)
        except ScrapeError as exc:
            self.note = f"server metrics off: {exc}"
            return False
        return True

    def begin(self) -> bool:
        """Start a window; False (and `note` set, once) when the server has no usable /metrics."""
        if not self.available:
            return False
        try:
            self._first = self._scrape(self.url)
        except ScrapeError as exc:
            self.note = f"server metrics off: {exc}"
            return False
        self._middle, self._times = [], [time.monotonic()]
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="k2bench-metrics-scraper", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                scraped = self._scrape(self.url)
            except ScrapeError:
                continue  # a missed gauge sample; the window's ends decide the counters
            self._middle.append(scraped)
            self._times.append(time.monotonic())

    def end(self) -> dict | None:
        """The window's counters and gauges; None when no window is open or the closing scrape failed."""
        if self._thread is None or self._first is None:
            return None
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            last = self._scrape(self.url)
        except ScrapeError as exc:
            return {"counters": {}, "gauges": {}, "scrapes": 1 + len(self._middle),
                    "note": f"the closing scrape failed: {exc}"}
        return summarize(self._first, last, self._middle, [*self._times, time.monotonic()])


def _clean(value: float) -> float | int:
    """Token and request counts print as integers; everything else keeps its fraction."""
    return int(value) if float(value).is_integer() else round(value, 6)
