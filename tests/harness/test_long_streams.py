"""Long contexts and long outputs stream without client artefacts: 128k-token prompts, 8k-token outputs.

The test server times every stream it sends (its /stats record); the client's stamps are checked against
that, request by request: every token message arrives and is stamped, the prompt's length is what the
server counted, TTFT includes the server's prefill of 128k tokens, and first-to-last-token time matches
what the server spent sending them. (A client reading with a small buffer, or parsing per message on a
slow path, shows here as lost messages or a stretched decode: vLLM #39963, pegainfer #548.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request

import pytest

from k2bench.harness.load.loadgen import LevelSpec, run_level
from k2bench.harness.servers import launch
from k2bench.workloads.prompts import Prompt

ISL, OSL = 128 * 1024, 8 * 1024
PREFILL_US = 2.0  # per prompt token: 262 ms of prefill for 128k tokens
ITL_MS = 1.0


@contextlib.contextmanager
def serving(tmp_path, *args: str):
    with launch.from_recipe("testserver", model="k2bench-test", extra_args=list(args), log_dir=tmp_path) as s:
        yield s.base_url


def test_128k_prompts_and_8k_outputs_match_the_server(tmp_path) -> None:
    prompts = [Prompt(input_len=ISL + i, output_len=OSL, token_ids=[(i * 31 + j) % 30000 for j in range(ISL + i)])
               for i in range(2)]
    with serving(tmp_path, "--ttft-ms", "5", "--itl-ms", str(ITL_MS), "--prefill-us-per-token", str(PREFILL_US)) as url:
        spec = LevelSpec(base_url=url, model="k2bench-test", concurrency=2, num_prompts=2, num_warmup=0,
                         timeout_s=120)
        records = asyncio.run(run_level(spec, prompts))
        with urllib.request.urlopen(f"{url}/stats?from=0&streams=1") as resp:
            truth = {s["prompt_tokens"]: s for s in json.loads(resp.read())["streams"]}
    assert len(records) == 2
    for r in records:
        assert r.success, r.error
        s = truth[r.requested_input_tokens]
        assert r.prompt_tokens == r.requested_input_tokens  # 128k prompt tokens arrived, counted as sent
        assert r.output_tokens == OSL and len(r.token_ns) == OSL == s["messages"]  # every message stamped
        ttft_client = (r.token_ns[0] - r.send_ns) / 1e6
        ttft_server = (s["first_sent"] - s["arrived"]) * 1e3
        # the server's TTFT starts when the body's last byte arrived: prefill included, transfer not
        assert ttft_server >= 5 + ISL * PREFILL_US / 1e3 - 1
        assert ttft_client >= ttft_server - 1.0
        assert ttft_client - ttft_server < 500  # sending 700 kB of JSON on loopback, generously
        decode_client = (r.token_ns[-1] - r.token_ns[0]) / 1e6
        decode_server = (s["last_sent"] - s["first_sent"]) * 1e3
        assert decode_server >= (OSL - 1) * ITL_MS - 20  # deadlines count from the due first token, not a late one
        # 8k messages over ~8 s: the client's decode span within 1% of the server's, TPOT error likewise
        assert decode_client == pytest.approx(decode_server, rel=0.01)
        assert all(b >= a for a, b in zip(r.token_ns, r.token_ns[1:], strict=False))
