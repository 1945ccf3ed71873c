"""Tensor-parallel processes: launch one worker per extra rank, feed them each step, watch them.

Rank 0 is the server process: it schedules, builds the step inputs and broadcasts them
(a 4-int header, then one packed int64 body); workers run the same forward on their shard and
discard the logits. A worker that dies makes rank 0 print which one and exit at once (a
watchdog thread polls the worker processes, since a collective with a dead peer would block);
a worker whose parent died exits too.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

from k2bench.engine.runtime.runner import HEADER_LEN, StepInputs

log = logging.getLogger(__name__)

# Idle servers leave workers waiting in a broadcast for as long as nobody sends a request.
_PG_TIMEOUT = datetime.timedelta(days=30)
STOP = -1


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def init_group(rank: int, world_size: int, port: int, device: str) -> None:
    dist.init_process_group(backend_for(device), init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=_PG_TIMEOUT)


def rank_device(device: str, rank: int) -> str:
    if device.startswith("cuda"):
        torch.cuda.set_device(rank)
        return f"cuda:{rank}"
    return device


def setup_all_reduce(model, mode: str, max_bytes: int, device: str) -> None:
    """Choose the model's all-reduce path (collective: every rank, same order, before graph capture).

    A forced one-shot that cannot run here is a settings error the CLI shows in one line."""
    from k2bench.engine.model.allreduce import OneShotUnavailable
    from k2bench.engine.runtime.runtime_config import EngineConfigError

    par = model.par
    try:
        par.reducer.setup(max_bytes, torch.device(device), (par.dtype, torch.float32), enabled=mode != "nccl",
                          required=mode == "one-shot", rank=par.rank)
    except OneShotUnavailable as exc:
        raise EngineConfigError(f"--all-reduce one-shot cannot run here: {exc}") from None


def cpu_threads(world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // world_size)


def set_host_threads(device: str, world_size: int) -> None:
    """Torch's intra-op threads for this rank's host work.

    On CPU the model itself runs there: the cores are shared among the ranks. On a GPU the host only
    builds step inputs from a few thousand integers, where a pool of OpenMP threads costs more in wake-ups
    (and, in a container with a CPU quota, in throttling) than it saves: one thread, as vLLM's workers do.
    An explicit OMP_NUM_THREADS is left as the user set it."""
    if device == "cpu":
        torch.set_num_threads(cpu_threads(world_size))
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


class Workers:
    """Rank 0's handle on ranks 1..N-1: their processes, the step broadcast and the watchdog."""

    def __init__(self, spec: dict, world_size: int, port: int, device: str):
        self.world_size = world_size
        self.device = device
        self._closing = False
        self.procs: list[subprocess.Popen] = []
        for rank in range(1, world_size):
            args = dict(spec, rank=rank, world_size=world_size, port=port, parent=os.getpid())
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "k2bench.engine.runtime.distributed", json.dumps(args)]))
        self._watch = threading.Thread(target=self._watchdog, name="k2bench-tp-watchdog", daemon=True)
        self._watch.start()

    def _watchdog(self) -> None:
        while not self._closing:
            for rank, p in enumerate(self.procs, start=1):
                code = p.poll()
                if code is not None and not self._closing:
                    print(f"k2bench serve: tensor-parallel worker rank {rank} (pid {p.pid}) exited with code "
                          f"{code}; the server cannot continue without it and is shutting down",
                          file=sys.stderr, flush=True)
                    self._kill_all()
                    os._exit(3)
            time.sleep(0.2)

    def shutdown_hard(self) -> None:
        """Startup failed on rank 0: the workers may be stuck in a collective, so kill them, and take down
        this rank's group now. Left to interpreter exit, the group's threads met their dead peers during
        finalisation and the process could abort (SIGABRT, "terminate called") after the one-line error."""
        self._closing = True
        self._kill_all()
        for p in self.procs:
            p.wait()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # a group whose peers are gone may refuse; the process ends anyway
                pass

    def _kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def _dev(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device) if self.device.startswith("cuda") else t

    def broadcast_ints(self, values: list[int]) -> None:
        dist.broadcast(self._dev(torch.tensor(values, dtype=torch.int64)), 0)

    def broadcast_step(self, inp: StepInputs) -> None:
        header, body = inp.pack()
        dist.broadcast(self._dev(header), 0)
        dist.broadcast(self._dev(body), 0)

    def shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
        try:
            dist.broadcast(self._dev(torch.tensor([STOP] * HEADER_LEN, dtype=torch.int64)), 0)
        except Exception:  # a worker already gone: nothing to tell it
            pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def recv_ints(n: int, device: str) -> list[int]:
    t = torch.empty(n, dtype=torch.int64, device=device if device.startswith("cuda") else "cpu")
    dist.broadcast(t, 0)
    return [int(x) for x in t.tolist()]


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(0.5)


def worker_main(spec: dict) -> None:
    from k2bench.engine.model.loader import load_model
    from k2bench.engine.runtime.runner import make_runner  # here to keep the module import light

    rank, world = spec["rank"], spec["world_size"]
    threading.Thread(target=_watch_parent, args=(spec["parent"],), daemon=True).start()
    device = rank_device(spec["device"], rank)
    set_host_threads(device, world)
    init_group(rank, world, spec["port"], spec["device"])
    model, cfg = load_model(spec["model"], device=device, dtype=spec["dtype"], quant_mode=spec["quant_mode"],
                            backend=spec["backend"], tp_rank=rank, tp_size=world)
    num_blocks, block_size, max_model_len, max_rows, kv_code, graphs, warm_ctx, warm_tokens = recv_ints(8, device)
    setup_all_reduce(model, spec["all_reduce"], spec["one_shot_max_bytes"], device)
    runner = make_runner(model, cfg, num_blocks=num_blocks, block_size=block_size, kv_code=kv_code,
                         max_model_len=max_model_len, max_rows=max_rows, device=device, cuda_graphs=bool(graphs))
    runner.warm_up(warm_ctx, warm_tokens)  # this thread runs every step of this rank (as LLMEngine.warm_up on rank 0)
    bdev = device if device.startswith("cuda") else "cpu"
    header = torch.empty(HEADER_LEN, dtype=torch.int64, device=bdev)
    while True:
        dist.broadcast(header, 0)
        h = header.cpu()
        if int(h[0]) == STOP:
            break
        body = torch.empty(StepInputs.body_len(h), dtype=torch.int64, device=bdev)
        dist.broadcast(body, 0)
        runner.execute(StepInputs.unpack(h, body))
    dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s tp-worker: %(message)s")
    from k2bench.engine.runtime.runtime_config import EngineConfigError

    try:
        worker_main(json.loads(sys.argv[1]))
    except EngineConfigError as exc:  # rank 0 hits the same setting and says so; no traceback here
        print(f"tp-worker: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
