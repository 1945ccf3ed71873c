"""The TP all-reduce's choice between one-shot and NCCL (CPU, gloo): which tensors would take the
one-shot kernel, that every rank agrees on one verdict, that CPU/gloo falls back with one log line (or
fails cleanly when one-shot is forced), and that a TP 2 engine's greedy tokens stay TP 1's."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

from k2bench.net import free_port

pytestmark = pytest.mark.engine

HIDDEN = 7168


def _reducer_with_buffers(max_bytes: int):
    """An AllReduce as `setup` leaves it after a successful rendezvous (host tensors stand in for the buffers)."""
    from k2bench.engine.model.allreduce import AllReduce

    r = AllReduce()
    r.max_bytes = max_bytes
    r.buffers = {d: torch.empty(max_bytes // torch.empty((), dtype=d).element_size(), dtype=d)
                 for d in (torch.bfloat16, torch.float32)}
    return r


def test_one_shot_takes_small_tensors_of_its_dtypes_and_layouts_only():
    from k2bench.engine.model.allreduce import AllReduce
    from k2bench.engine.runtime.runtime_config import ONE_SHOT_MAX_BYTES, RuntimeConfig

    assert RuntimeConfig().one_shot_max_bytes == ONE_SHOT_MAX_BYTES
    r = _reducer_with_buffers(ONE_SHOT_MAX_BYTES)
    bf16 = torch.bfloat16
    # The default covers decode batches up to 32 tokens of Kimi-K2's hidden size in bf16, and a little more.
    assert r.use_one_shot(torch.zeros(1, HIDDEN, dtype=bf16))
    assert r.use_one_shot(torch.zeros(32, HIDDEN, dtype=bf16))
    assert r.use_one_shot(torch.zeros(36, HIDDEN, dtype=bf16))  # 516,096 bytes
    assert not r.use_one_shot(torch.zeros(37, HIDDEN, dtype=bf16))  # 530,432 bytes: NCCL
    assert not r.use_one_shot(torch.zeros(128, HIDDEN, dtype=bf16))
    assert r.use_one_shot(torch.zeros(16, HIDDEN))  # float32 counts bytes: half the tokens
    assert not r.use_one_shot(torch.zeros(32, HIDDEN))
    # dtypes the symmetric-memory kernel is not built for, layouts it cannot read, empty tensors
    assert not r.use_one_shot(torch.zeros(4, HIDDEN, dtype=torch.float16))
    assert not r.use_one_shot(torch.zeros(HIDDEN, 4, dtype=bf16).t())
    assert not r.use_one_shot(torch.zeros(4 * HIDDEN + 1, dtype=bf16)[1:])  # 2-byte offset
    assert not r.use_one_shot(torch.zeros(3, dtype=bf16))  # 6 bytes: not a whole 4-byte word
    assert not r.use_one_shot(torch.zeros(0, HIDDEN, dtype=bf16))
    # Before set-up (or after a fallback) nothing takes the one-shot path.
    fresh = AllReduce()
    assert not fresh.one_shot and not fresh.use_one_shot(torch.zeros(1, HIDDEN, dtype=bf16))


def test_runtime_settings_reject_unknown_modes_and_sizes():
    from k2bench.engine.runtime.runtime_config import RuntimeConfig

    for bad, msg in [(dict(all_reduce="quick"), "--all-reduce must be one of auto, nccl, one-shot"),
                     (dict(one_shot_max_bytes=8), "--one-shot-max-bytes must be in 16..")]:
        with pytest.raises(ValueError, match=msg):
            RuntimeConfig(**bad).validate()


def _gloo_rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from k2bench.engine.model import allreduce

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    res: dict = {}
    cpu = torch.device("cpu")
    r = allreduce.AllReduce()
    res["auto"] = r.setup(1 << 19, cpu, (torch.bfloat16, torch.float32), rank=rank)
    res["auto_one_shot"] = r.one_shot
    x = torch.full((4, 8), float(rank + 1))
    r(x)
    res["sum"] = x.tolist()
    res["calls"] = dict(r.calls)
    res["nccl"] = r.setup(1 << 19, cpu, (torch.float32,), enabled=False, rank=rank)
    try:
        r.setup(1 << 19, cpu, (torch.float32,), required=True, rank=rank)
        res["forced"] = "no error"
    except allreduce.OneShotUnavailable as exc:
        res["forced"] = str(exc)
    # One rank that cannot makes every rank fall back, each told why.
    res["agree_mixed"] = allreduce._agree("rank 0 has no peer access" if rank == 0 else None, cpu)
    res["agree_all"] = allreduce._agree(None, cpu)
    torch.save(res, f"{out}.{rank}")
    dist.destroy_process_group()


def test_gloo_group_falls_back_to_its_own_all_reduce_and_every_rank_agrees(tmp_path):
    out = str(tmp_path / "res")
    mp.start_processes(_gloo_rank, args=(2, free_port(), out), nprocs=2, join=True, start_method="fork")
    r0, r1 = (torch.load(f"{out}.{k}") for k in (0, 1))
    for r in (r0, r1):
        assert r["auto"] == "all-reduce: gloo only; one-shot is off because it needs CUDA devices (the group runs gloo on cpu)"
        assert r["auto_one_shot"] is False
        assert r["sum"] == [[3.0] * 8] * 4 and r["calls"] == {"one-shot": 0, "nccl": 1}
        assert r["nccl"] == "all-reduce: gloo (one-shot not asked for)"
        assert r["forced"] == "it needs CUDA devices (the group runs gloo on cpu)"
        assert r["agree_all"] is None
    assert r0["agree_mixed"] == "rank 0 has no peer access"
    assert r1["agree_mixed"] == "another rank could not set it up (see its log)"


def _generate(model_dir, tp: int, mode: str) -> list[list[int]]:
    from k2bench.engine.runtime.build import EngineOptions, build_engine
    from k2bench.engine.runtime.runtime_config import RuntimeConfig
    from k2bench.engine.runtime.sequence import SamplingParams, Sequence

    rt = RuntimeConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256, block_size=16,
                       num_kv_blocks=64, all_reduce=mode)
    # W4 in float32: TP changes only the summation order (A4W4's activation rounding can flip a near tie)
    eng = build_engine(EngineOptions(model=str(model_dir), device="cpu", dtype="float32", quant_mode="w4", tp=tp,
                                     runtime=rt))
    try:
        g = torch.Generator().manual_seed(3)
        seqs = [Sequence(torch.randint(10, 400, (n,), generator=g).tolist(),
                         SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)) for n in (9, 30, 3)]
        eng.generate(seqs)
        return [s.output_token_ids for s in seqs]
    finally:
        eng.shutdown()


def test_tp2_engine_on_cpu_logs_the_fallback_once_and_keeps_tp1_tokens(tmp_path, caplog):
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    d = write_tiny_checkpoint(tmp_path / "tiny", quant="mxfp4", seed=5)
    want = _generate(d, 1, "auto")
    assert all(len(t) == 6 for t in want)
    caplog.set_level(logging.INFO, logger="k2bench.engine")
    assert _generate(d, 2, "auto") == want
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("all-reduce:")]
    assert lines == ["all-reduce: gloo only; one-shot is off because it needs CUDA devices (the group runs gloo on cpu)"]
    assert _generate(d, 2, "nccl") == want


def test_forced_one_shot_where_it_cannot_run_is_a_one_line_error(tmp_path):
    from k2bench.engine.model.tiny import write_tiny_checkpoint

    d = write_tiny_checkpoint(tmp_path / "tiny", quant="mxfp4", seed=5)
    p = subprocess.run([sys.executable, "-m", "k2bench.harness.cli", "serve", "--model", str(d), "--tp", "2",
                        "--device", "cpu", "--all-reduce", "one-shot", "--num-kv-blocks", "64", "--max-model-len",
                        "256", "--port", str(free_port())], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert "k2bench: error: --all-reduce one-shot cannot run here: it needs CUDA devices" in p.stderr
    assert "Traceback" not in p.stderr + p.stdout


class _FakeOneShot:
    """Stands in for the symmetric-memory kernel on gloo: a correct sum, or a broken one that skips the peers."""

    def __init__(self, broken: bool):
        self.broken = broken

    def install(self, monkeypatch, allreduce) -> None:
        broken = self.broken

        def rendezvous(r, dtypes, max_bytes, device):
            r.buffers = {d: torch.empty(max_bytes // torch.empty((), dtype=d).element_size(), dtype=d) for d in dtypes}
            r.max_bytes = max_bytes
            return None

        def one_shot(r, x):
            import torch.distributed as dist

            if not broken:
                dist.all_reduce(x)
            return x

        monkeypatch.setattr(allreduce, "_local_obstacle", lambda *a: None)
        monkeypatch.setattr(allreduce.AllReduce, "_try_rendezvous", rendezvous)
        monkeypatch.setattr(allreduce.AllReduce, "_one_shot", one_shot)


def _self_check_rank(rank: int, world: int, port: int, out: str, broken: bool) -> None:
    import torch.distributed as dist

    from k2bench.engine.model import allreduce

    torch.set_num_threads(1)
    mp_ = pytest.MonkeyPatch()
    _FakeOneShot(broken).install(mp_, allreduce)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    r = allreduce.AllReduce()
    res = {"line": r.setup(4096, torch.device("cpu"), (torch.float32,), rank=rank)}
    small, large = torch.full((8, 8), float(rank + 1)), torch.full((8, 256), float(rank + 1))  # 256 B, 8 KiB
    r(small)
    r(large)
    res["calls"] = dict(r.calls)
    res["sums"] = (small.unique().tolist(), large.unique().tolist())
    torch.save(res, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.mark.parametrize("broken", [False, True])
def test_self_check_keeps_a_correct_one_shot_and_turns_a_wrong_one_off(tmp_path, broken):
    out = str(tmp_path / "res")
    mp.start_processes(_self_check_rank, args=(2, free_port(), out, broken), nprocs=2, join=True,
                       start_method="fork")
    for k in (0, 1):
        res = torch.load(f"{out}.{k}")
        assert res["sums"] == ([3.0], [3.0])  # the model's sums are right either way
        if broken:
            # the broken kernel returned each rank's own part: every element differed from the real sum
            assert res["line"] == ("all-reduce: gloo only; one-shot is off because its self-check differs from "
                                   "NCCL in 1024 of 1024 elements (torch.float32)")
            assert res["calls"] == {"one-shot": 0, "nccl": 2}
        else:
            assert res["line"] == "all-reduce: one-shot over symmetric memory up to 4096 bytes (float32), gloo above"
            assert res["calls"] == {"one-shot": 1, "nccl": 1}  # 256 B took one-shot, 8 KiB went to gloo
