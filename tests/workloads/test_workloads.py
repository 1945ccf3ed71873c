"""Workloads (k2bench.workloads): definitions, exact-length token prompts that avoid special ids, range ratio, text mode."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from k2bench.errors import UserError
from k2bench.harness.servers import launch
from k2bench.net import free_port
from k2bench.workloads import loader
from k2bench.workloads import prompts as prompts_mod


def test_bundled_definitions_load() -> None:
    names = loader.available()
    assert {"8k1k", "1k1k", "1k8k"} <= set(names)
    w = loader.load("8k1k")
    assert (w.isl, w.osl, w.range_ratio, w.mode) == (8192, 1024, 1.0, "tokens")


def test_unknown_workload_lists_the_known_ones() -> None:
    with pytest.raises(UserError, match="unknown workload 'nope'.*1k1k.*8k1k"):
        loader.load("nope")


def test_unknown_key_in_definition_is_an_error(tmp_path) -> None:
    f = tmp_path / "w.toml"
    f.write_text('name = "w"\nisl = 10\nosl = 5\nrange_ration = 0.8\n')
    with pytest.raises(UserError, match="unknown key.*range_ration"):
        loader.load(str(f))


def test_resolve_matches_definition_by_lengths_and_overrides() -> None:
    assert loader.resolve(None, 1024, 8192).name == "1k8k"
    assert loader.resolve(None, None, None).name == "8k1k"
    custom = loader.resolve(None, 100, 7)
    assert (custom.name, custom.isl, custom.osl) == ("isl100-osl7", 100, 7)
    over = loader.resolve("1k1k", None, 64)
    assert (over.isl, over.osl) == (1024, 64) and over.name != "1k1k"


def test_token_prompts_exact_seeded_and_in_range() -> None:
    w = loader.Workload(name="t", isl=300, osl=20, token_id_range=(50, 60))
    a = prompts_mod.token_prompts(w, 5, seed=1)
    b = prompts_mod.token_prompts(w, 5, seed=1)
    c = prompts_mod.token_prompts(w, 5, seed=2)
    assert [p.token_ids.tolist() for p in a] == [p.token_ids.tolist() for p in b]
    assert [p.token_ids.tolist() for p in a] != [p.token_ids.tolist() for p in c]
    for p in a:
        assert p.input_len == len(p.token_ids) == 300 and p.output_len == 20
        assert set(p.token_ids.tolist()) <= set(range(50, 60))


def test_vocabulary_from_model_dir_avoids_special_tokens(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 40, "bos_token_id": 39, "eos_token_id": 38}))
    added = [{"id": i, "content": f"<s{i}>", "special": True} for i in range(4)]
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": added, "model": {"vocab": {}}}))
    vocab = prompts_mod.vocabulary_from_model_dir(tmp_path)
    assert vocab is not None and vocab.special == [0, 1, 2, 3, 38, 39]
    w = loader.Workload(name="t", isl=2000, osl=4)
    ids = np.array(prompts_mod.token_prompts(w, 3, vocab)[0].token_ids)
    assert ids.min() >= 4 and ids.max() <= 37
    assert len(np.unique(ids)) == 34  # every ordinary id shows up in 2000 draws from 34
    assert prompts_mod.vocabulary_from_model_dir(tmp_path / "missing") is None


def test_range_ratio_as_inferencex_uses_it() -> None:
    w = loader.Workload(name="r", isl=1000, osl=100, range_ratio=0.8)
    prompts = prompts_mod.token_prompts(w, 400)
    ins = np.array([p.input_len for p in prompts])
    outs = np.array([p.output_len for p in prompts])
    assert ins.min() >= 800 and ins.max() <= 1000 and outs.min() >= 80 and outs.max() <= 100
    assert ins.std() > 30  # spread over the range, not pinned to one end
    assert all(len(p.token_ids) == p.input_len for p in prompts)
    assert math.isclose(ins.mean(), 900, rel_tol=0.03)


@pytest.mark.parametrize("bad", [{"isl": 0}, {"osl": -1}, {"range_ratio": 0.0}, {"range_ratio": 1.5}, {"mode": "x"}])
def test_invalid_workloads_rejected(bad: dict) -> None:
    with pytest.raises(UserError):
        loader.Workload(**{"name": "b", "isl": 10, "osl": 10, **bad})


def test_text_mode_round_trips_through_server_tokenizer(tmp_path) -> None:
    w = loader.Workload(name="txt", isl=50, osl=8, mode="text")
    with launch.from_recipe("testserver", model="m", log_dir=tmp_path) as server:
        prompts = prompts_mod.build_prompts(w, 3, base_url=server.base_url, model="m")
        import urllib.request

        for p in prompts:
            assert p.token_ids is None and isinstance(p.text, str)
            req = urllib.request.Request(server.base_url + "/tokenize", data=json.dumps({"prompt": p.text}).encode())
            with urllib.request.urlopen(req) as resp:
                assert json.loads(resp.read())["count"] == 50 == p.input_len


def test_text_mode_without_server_is_a_user_error() -> None:
    with pytest.raises(UserError, match="need a server"):
        prompts_mod.build_prompts(loader.Workload(name="txt", isl=5, osl=2, mode="text"), 1)


async def test_text_mode_trims_and_pads_when_the_tokenizer_merges() -> None:
    """A tokenizer that merges "ab" into one token: decode-then-encode loses tokens, so text mode has
    to top the prompt up (and trim) until the server counts exactly the wanted length."""
    import re

    from aiohttp import web

    def detok(ids: list[int]) -> str:
        return "".join("ab" if i == 100 else chr(97 + i % 26) for i in ids)

    def tok(text: str) -> list[int]:
        return [100 if m == "ab" else ord(m) - 97 for m in re.findall(r"ab|[a-z]", text)]

    async def tokenize(request: web.Request) -> web.Response:
        ids = tok((await request.json())["prompt"])
        return web.json_response({"tokens": ids, "count": len(ids)})

    async def detokenize(request: web.Request) -> web.Response:
        return web.json_response({"prompt": detok((await request.json())["tokens"])})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        w = loader.Workload(name="merge", isl=400, osl=4, mode="text", token_id_range=(0, 2))  # only a/b
        seeds = prompts_mod.token_prompts(w, 3)
        assert any(len(tok(detok(p.token_ids))) < 400 for p in seeds)  # the naive round trip falls short
        prompts = await prompts_mod._text_prompts(f"http://127.0.0.1:{port}", "m", seeds)
    finally:
        await runner.cleanup()
    for p in prompts:
        assert len(tok(p.text)) == 400 == p.input_len


@pytest.mark.parametrize("answer", ["<html>proxy error</html>", '{"detail": "no prompt here"}'])
async def test_text_mode_unusable_tokenizer_answer_is_a_server_error(answer: str) -> None:
    """A 200 that is not JSON, or JSON without the expected field, is one clear error, not a traceback."""
    from aiohttp import web

    from k2bench.errors import ServerError

    async def detokenize(request: web.Request) -> web.Response:
        return web.Response(text=answer)

    app = web.Application()
    app.router.add_post("/detokenize", detokenize)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        w = loader.Workload(name="txt", isl=5, osl=2, mode="text")
        with pytest.raises(ServerError, match="/detokenize did not answer a JSON object with 'prompt'"):
            await prompts_mod._text_prompts(f"http://127.0.0.1:{port}", "m", prompts_mod.token_prompts(w, 1))
    finally:
        await runner.cleanup()
