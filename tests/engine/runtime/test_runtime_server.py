"""`k2bench serve` on the tiny checkpoint, driven by the official openai client and raw HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from k2bench.net import free_port

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PROMPT_IDS = [17, 200, 33, 48, 5, 301, 77, 150, 12, 90]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny", quant="mxfp4")


class Server:
    def __init__(self, model: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "k2bench.harness.cli", "serve", "--model", str(model), "--port", str(self.port),
             "--num-kv-blocks", "256", "--block-size", "16", "--max-model-len", "1024", "--dtype", "float32", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError("server did not become ready")

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        return {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln and not ln.startswith("#")}

    def stop(self) -> str:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.stdout.read()


@pytest.fixture(scope="module")
def server(tiny):
    s = Server(tiny, "--served-model-name", "tiny")
    yield s
    s.stop()


def greedy_stream_ids(client: openai.OpenAI, n: int = 12) -> list[int]:
    """Token ids of a greedy completion, read from the streamed chunks' token_ids."""
    ids = []
    for chunk in client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=n, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True}):
        if chunk.choices:
            ids.extend((chunk.choices[0].model_extra or {}).get("token_ids") or [])
    return ids


def test_completion_usage_and_length_under_ignore_eos(server):
    c = server.client()
    r = c.completions.create(model="tiny", prompt="Hello, how are", max_tokens=7, temperature=0,
                             extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7
    r2 = c.completions.create(model="tiny", prompt="Hello, how are", max_tokens=7, temperature=0,
                              extra_body={"ignore_eos": True})
    assert r2.choices[0].text == r.choices[0].text  # greedy is deterministic


def test_models_lists_the_model_folder_as_root_so_an_attached_sweep_finds_the_vocabulary(tiny, server):
    from k2bench.harness.servers.launch import ServerHandle

    with urllib.request.urlopen(server.url + "/v1/models", timeout=5) as r:
        served = json.loads(r.read())["data"]
    assert [m["id"] for m in served] == ["tiny"]
    assert served[0]["root"] == str(tiny.resolve())
    # What `k2bench sweep --url` does with it: the tokenizer is found without --model.
    handle = ServerHandle(url=server.url, engine="external", served=served)
    assert handle.model_root("tiny") == tiny.resolve()


def test_streaming_completion_with_usage_and_token_id_prompt(server):
    c = server.client()
    chunks = list(c.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=9, temperature=0.8, seed=3,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True, "top_k": 50, "top_p": 0.9}))
    token_chunks = [ch for ch in chunks if ch.choices]
    assert len(token_chunks) == 9  # one SSE message per generated token
    assert token_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 9 and chunks[-1].usage.prompt_tokens == len(PROMPT_IDS)
    again = [ch for ch in c.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=9, temperature=0.8,
                                               seed=3, stream=True, extra_body={"ignore_eos": True, "top_k": 50,
                                                                                 "top_p": 0.9})]
    assert [ch.choices[0].model_extra["token_ids"] for ch in again] == \
           [ch.choices[0].model_extra["token_ids"] for ch in token_chunks]  # same seed, same tokens


def test_chat_streaming_and_not(server):
    c = server.client()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True, "min_tokens": 5})
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    parts = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in parts if ch.choices)
    assert text == r.choices[0].message.content
    assert parts[-1].usage.completion_tokens == 5


def test_bad_requests_are_openai_400s(server):
    c = server.client()
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        c.completions.create(model="tiny", prompt=[5] * 1100, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="does not exist"):
        c.completions.create(model="other", prompt="hi", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.completions.create(model="tiny", prompt="hi", max_tokens=4, temperature="hot")
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        c.completions.create(model="tiny", prompt=[1, 2, 10**6], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="messages"):
        c.chat.completions.create(model="tiny", messages=[], max_tokens=4)
    req = urllib.request.Request(server.url + "/v1/completions", data=b"{not json", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 400 and "error" in json.loads(err.value.read())
    odd = [{"prompt": [[1, 2], [3]]}, {"prompt": "hi", "stop": 5}, {"prompt": "hi", "max_tokens": 10**30},
           {"prompt": "hi", "top_k": 1.5}, {"prompt": "hi", "top_p": 0}, {"prompt": "hi", "ignore_eos": "yes"},
           {"prompt": "hi", "min_tokens": 9, "max_tokens": 2}, {"prompt": "hi", "n": 2}, {"prompt": None},
           {"prompt": "hi", "stream_options": []}, {"prompt": [-1]}, {"prompt": "hi", "seed": 1.5},
           {"prompt": "hi", "seed": 2**70}]
    for body in odd:
        req = urllib.request.Request(server.url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 400, body
    # accepted oddities must not hurt the engine either: int64-extreme seeds, tiny temperatures
    for seed, temp in ((2**63 - 1, 0.7), (-(2**63), 0.7), (-5, 0.7), (None, 1e-9)):
        r = c.completions.create(model="tiny", prompt="hi", max_tokens=3, seed=seed, temperature=temp,
                                 extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3
    assert c.models.list().data[0].id == "tiny"  # still alive after all that


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_frees_kv_blocks(server, stream):
    import http.client

    before = server.metrics()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    body = json.dumps({"model": "tiny", "prompt": PROMPT_IDS, "max_tokens": 900, "stream": stream, "ignore_eos": True})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    if stream:
        resp = conn.getresponse()
        assert resp.status == 200
        resp.read1(200)  # the stream has started: the request holds KV blocks now
    else:
        deadline = time.monotonic() + 10
        while server.metrics()["k2bench_num_requests_running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert server.metrics()["k2bench_kv_cache_usage_perc"] > 0
    conn.sock.shutdown(2)
    conn.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = server.metrics()
        if m["k2bench_kv_cache_usage_perc"] == 0 and m["k2bench_num_requests_running"] == 0:
            break
        time.sleep(0.2)
    assert m["k2bench_kv_cache_usage_perc"] == 0 and m["k2bench_num_requests_running"] == 0
    assert m["k2bench_request_aborted_total"] == before["k2bench_request_aborted_total"] + 1
    assert m["k2bench_generation_tokens_total"] < before["k2bench_generation_tokens_total"] + 900


def test_metrics_count_each_request_and_token_in_prometheus_form(server):
    """The counters move by exactly the requests' tokens, and the latency histograms (vLLM's names)
    get one observation per request (TTFT, queue, e2e) and one per later token (ITL)."""
    from k2bench.harness.telemetry.server_metrics import metrics_url, parse

    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(metrics_url(server.url), timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            return {k: v for k, (_, v) in parse(r.read().decode()).items()}

    before = scrape()
    lengths = (3, 5, 8)
    c = server.client()
    for i, n in enumerate(lengths):
        c.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=n, stream=bool(i % 2),
                             extra_body={"ignore_eos": True})
    after = scrape()
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    p = "k2bench_"
    assert delta[p + "prompt_tokens_total"] == len(PROMPT_IDS) * len(lengths)
    assert delta[p + "generation_tokens_total"] == sum(lengths)
    assert delta[p + "request_success_total"] == len(lengths)
    for name in ("time_to_first_token_seconds", "request_queue_time_seconds", "e2e_request_latency_seconds"):
        assert delta[p + name + "_count"] == len(lengths), name
    assert delta[p + "inter_token_latency_seconds_count"] == sum(n - 1 for n in lengths)
    # each request's end comes after its first token, so the sums keep that order
    assert delta[p + "e2e_request_latency_seconds_sum"] >= delta[p + "time_to_first_token_seconds_sum"] > 0
    # vLLM's phases, one observation per request: queue + prefill is the server's TTFT (the same moments),
    # prefill + decode its inference time
    phase = {name: delta[f"{p}request_{name}_time_seconds_sum"] for name in ("queue", "prefill", "decode", "inference")}
    for name in phase:
        assert delta[f"{p}request_{name}_time_seconds_count"] == len(lengths), name
    assert phase["queue"] + phase["prefill"] == pytest.approx(delta[p + "time_to_first_token_seconds_sum"], abs=1e-6)
    assert phase["prefill"] + phase["decode"] == pytest.approx(phase["inference"], abs=1e-6)
    assert phase["decode"] > 0 and phase["prefill"] > 0
    assert after[p + "num_requests_running"] == 0 and 0 <= after[p + "kv_cache_usage_perc"] <= 1


def test_api_key_is_required_and_never_printed(tiny):
    s = Server(tiny, "--api-key", "sekrit-k2", "--served-model-name", "tiny")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="sekrit-k").models.list()  # a prefix of the key is not the key
        assert s.client(api_key="sekrit-k2").models.list().data[0].id == "tiny"
        with pytest.raises(openai.BadRequestError):
            s.client(api_key="sekrit-k2").completions.create(model="tiny", prompt="hi", max_tokens=2,
                                                          extra_body={"top_k": 2**63})
    finally:
        out = s.stop()
    assert "ready on" in out and "sekrit-k2" not in out


def test_binding_beyond_loopback_without_a_key_warns():
    from k2bench.harness.commands.serve import exposure_warning

    for host in ("0.0.0.0", "::", "10.1.2.3", "myhost.example"):
        assert "without an API key" in exposure_warning(host, None)
        assert exposure_warning(host, "k") is None
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert exposure_warning(host, None) is None


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_gives_the_same_greedy_tokens(tiny, server, tp):
    want = greedy_stream_ids(server.client())
    assert len(want) == 12
    s = Server(tiny, "--tp", str(tp), "--served-model-name", "tiny")
    try:
        assert greedy_stream_ids(s.client()) == want
    finally:
        s.stop()


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def test_dead_worker_ends_the_server_with_a_clear_message(tiny):
    s = Server(tiny, "--tp", "2", "--served-model-name", "tiny")
    try:
        workers = _children(s.proc.pid)
        assert workers, "no tensor-parallel worker process found"
        os.kill(workers[0], signal.SIGKILL)
        code = s.proc.wait(timeout=20)
        out = s.stop()
        assert code != 0
        assert "worker rank 1" in out and "shutting down" in out
    finally:
        s.stop()
