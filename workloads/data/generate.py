"""Writes the small example files shipped beside the workload definitions (deterministic, seed 0):

- conversations.json: 40 ShareGPT-format conversations of 3 to 5 user turns (made-up sentences from a
  fixed word list, with made-up answers), for conversation and ShareGPT examples and tests;
- trace_1k.jsonl: 1,000 requests in Mooncake's trace format (timestamp in ms, input_length,
  output_length, hash_ids of 512-token blocks): Poisson arrivals at about 8 requests/s, one of 12 shared
  "system prompt" chains of 1 to 3 blocks (Zipf-like popularity) in 80% of requests, then 0 to 2 blocks
  of their own.

    python -m k2bench.workloads.data.generate   # rewrites both files in this folder
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
WORDS = ("the model serves many users who ask about code data weather travel food music history science "
         "numbers cities rivers planets engines trains prices markets gardens books films games rules "
         "questions answers reasons examples steps plans lists tables charts").split()
BLOCK = 512


def _sentence(rng: np.random.Generator, lo: int, hi: int) -> str:
    n = int(rng.integers(lo, hi + 1))
    words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=n)]
    return " ".join(words).capitalize() + "."


def conversations(rng: np.random.Generator, count: int = 40) -> list[dict]:
    out = []
    for i in range(count):
        turns = []
        for _ in range(int(rng.integers(3, 6))):
            turns.append({"from": "human", "value": " ".join(_sentence(rng, 6, 14) for _ in range(2))})
            turns.append({"from": "gpt", "value": " ".join(_sentence(rng, 8, 16) for _ in range(3))})
        out.append({"id": f"conv-{i}", "conversations": turns})
    return out


def trace(rng: np.random.Generator, count: int = 1000, rate: float = 8.0) -> list[dict]:
    chains = [list(range(100 * c, 100 * c + int(rng.integers(1, 4)))) for c in range(12)]
    weights = 1.0 / np.arange(1, len(chains) + 1)
    weights /= weights.sum()
    next_id = 10_000
    t = 0.0
    out = []
    for _ in range(count):
        t += float(rng.exponential(1.0 / rate))
        ids: list[int] = []
        if rng.random() < 0.8:
            ids = list(chains[int(rng.choice(len(chains), p=weights))])
        own = int(rng.integers(0 if ids else 1, 3))
        ids += list(range(next_id, next_id + own))
        next_id += own
        length = (len(ids) - 1) * BLOCK + int(rng.integers(1, BLOCK + 1))  # the last block may be partial
        out.append({"timestamp": round(t * 1000), "input_length": length,
                    "output_length": int(rng.integers(16, 129)), "hash_ids": ids})
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    (HERE / "conversations.json").write_text(json.dumps(conversations(rng), indent=1) + "\n")
    (HERE / "trace_1k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace(rng)))


if __name__ == "__main__":
    main()
