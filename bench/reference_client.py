"""InferenceX's client against k2bench's test server, with its CPU measured: the reference for issue 24.

InferenceX's ``utils/bench_serving/benchmark_serving.py`` (https://github.com/SemiAnalysisAI/InferenceX; not
shipped with k2bench: pass the path of a checkout's copy) is imported as it is and its ``benchmark()``
coroutine run once, closed-loop at ``--concurrency`` (its ``max_concurrency``, all requests issued at
once), on asyncio's own loop as its ``main`` runs it. Its tokenizer is a word-level one built here with
the ``tokenizers`` library to match the test server's (token id ``i`` is the word ``t<i>``), so no model
files are needed. The CPU reported (user + system of this process) covers only the ``benchmark()``
call: not the imports, the tokenizer or the prompts. It needs ``transformers``, ``tokenizers``, ``tqdm``
and ``numpy`` installed.

    python bench/reference_client.py --client PATH/benchmark_serving.py --url http://127.0.0.1:8000 \\
        --concurrency 64 --num-prompts 192 --isl 128 --osl 1024 --out /tmp/ref.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import resource
import statistics
import sys
from pathlib import Path

VOCAB = 32000  # the test server's (k2bench.harness.load.testserver_models.VOCAB_SIZE)


def word_tokenizer():
    """A fast tokenizer whose ids are the test server's: ``t<i>`` is id ``i``, words split on whitespace."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    vocab["[UNK]"] = VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def _cpu_s() -> tuple[float, float]:
    """User + system, and user alone, of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_utime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", required=True, help="path of InferenceX's benchmark_serving.py")
    ap.add_argument("--url", required=True, help="the test server's base URL")
    ap.add_argument("--model", default="k2bench-test")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=192)
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, default=1024)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    client = Path(args.client)
    if not client.is_file():
        print(f"error: no InferenceX client at {client} (its utils/bench_serving/benchmark_serving.py)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(client.parent))  # it imports its neighbours (backend_request_func, ...)
    try:
        bs = __import__(client.stem)
    except ImportError as exc:
        print(f"error: cannot import {client}: {exc} (it needs transformers, tqdm, numpy)", file=sys.stderr)
        return 2
    tokenizer = word_tokenizer()
    requests = [(" ".join(f"t{(7 * i + j) % VOCAB}" for j in range(args.isl)), args.isl, args.osl, None)
                for i in range(args.num_prompts)]
    if len(tokenizer(requests[0][0], add_special_tokens=False).input_ids) != args.isl:
        print("error: the word-level tokenizer does not give one token per word", file=sys.stderr)
        return 2
    url = args.url.rstrip("/")
    kwargs = dict(backend="vllm", api_url=f"{url}/v1/completions", base_url=url, model_id=args.model,
                  model_name=None, tokenizer=tokenizer, input_requests=requests, logprobs=None, best_of=1,
                  request_rate=float("inf"), burstiness=1.0, disable_tqdm=True, num_warmups=0, profile=False,
                  selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"], selected_percentiles=[50.0, 99.0],
                  ignore_eos=True, goodput_config_dict={}, max_concurrency=args.concurrency, lora_modules=None)
    accepted = inspect.signature(bs.benchmark).parameters
    missing = [k for k in accepted if k not in kwargs and accepted[k].default is inspect.Parameter.empty]
    if missing:
        print(f"error: this copy of benchmark() also wants {missing}: not the version this script was written "
              "for", file=sys.stderr)
        return 2
    cpu0, user0 = _cpu_s()
    with contextlib.redirect_stdout(sys.stderr):  # its report goes to stderr; stdout stays ours
        result = asyncio.run(bs.benchmark(**{k: v for k, v in kwargs.items() if k in accepted}))
    cpu1, user1 = _cpu_s()
    cpu, user = cpu1 - cpu0, user1 - user0
    ok = [i for i, e in enumerate(result["errors"]) if not e]
    messages = sum(1 + len(result["itls"][i]) for i in ok)  # messages with choices: one token each here
    ttft_ms = [result["ttfts"][i] * 1e3 for i in ok]
    tpot_ms = [sum(result["itls"][i]) * 1e3 / len(result["itls"][i]) for i in ok if result["itls"][i]]
    doc = {"client": "InferenceX benchmark_serving.py", "path": str(client), "requests": len(requests),
           "completed": len(ok), "failed": len(requests) - len(ok), "token_messages": messages,
           "client_cpu_s": cpu, "client_user_s": user, "client_cpu_us_per_token": cpu / messages * 1e6 if messages else None,
           "duration_s": result["duration"], "output_tok_s": result["output_throughput"],
           "ttft_ms_median": statistics.median(ttft_ms) if ttft_ms else None,
           "tpot_ms_median": statistics.median(tpot_ms) if tpot_ms else None,
           "first_error": next((e for e in result["errors"] if e), None)}
    Path(args.out).write_text(json.dumps(doc, indent=2))
    print(json.dumps({k: v for k, v in doc.items() if k != "first_error"}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
