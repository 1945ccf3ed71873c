"""The tensor-parallel sum after row-parallel layers: NCCL, or one-shot over symmetric memory when small.

At decode batch sizes the all-reduced tensor is tiny (32 tokens x 7168 bf16 is 448 KiB), and NCCL's
ring costs its latency, not its bandwidth. PyTorch's symmetric memory (`torch.distributed.
_symmetric_memory`) gives every rank a buffer its peers can read over peer-to-peer; its
`one_shot_all_reduce` kernel copies the local part in, meets the peers at a barrier on signal pads,
and each rank reads and sums all peers' buffers in one pass: one kernel, no multicast. It runs
inside CUDA graphs, provided the buffers were allocated and rendezvoused before capture, which
`AllReduce.setup` does at start-up on every rank in the same order.

The kernel takes float32 and bfloat16 only; NVLink multicast (multimem) is never used (the lent
multi-GPU hosts keep it off). Every rank must take the same path for the same tensor, or one waits
forever at a barrier the other never reaches: the choice depends only on the tensor's size, dtype
and layout (the same on every rank), and the set-up agrees on one verdict with a collective.
"""

from __future__ import annotations

import logging
import os
import warnings

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

ONE_SHOT_DTYPES = (torch.bfloat16, torch.float32)  # what the symmetric-memory kernel is compiled for
_ALIGN = 16  # bytes: the kernel's widest vector access, also asked of the local input's offset


class OneShotUnavailable(RuntimeError):
    """Symmetric memory cannot serve this group (its message says why, for the log line)."""


class AllReduce:
    """Sums a tensor over the TP group in place; one-shot below `max_bytes` once set up, NCCL (or gloo) else.

    Until `setup` succeeds it is plain `dist.all_reduce`, so models built outside the runtime (tests,
    benches) behave as before."""

    def __init__(self) -> None:
        self.max_bytes = 0
        self.buffers: dict[torch.dtype, torch.Tensor] = {}
        self.group_name = ""
        self.calls = {"one-shot": 0, "nccl": 0}  # eager calls by path (a graph replay does not count)
        self._fused_copy = False  # torch has one_shot_all_reduce_copy_out (copy into the buffer in-kernel)

    @property
    def one_shot(self) -> bool:
        return bool(self.buffers)

    def use_one_shot(self, x: torch.Tensor) -> bool:
        """Whether x goes through the one-shot kernel: small enough, a dtype it takes, laid out as it needs."""
        return (x.dtype in self.buffers and x.is_contiguous() and 0 < x.nbytes <= self.max_bytes
                and x.nbytes % 4 == 0 and (x.storage_offset() * x.element_size()) % _ALIGN == 0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_one_shot(x):
            self.calls["one-shot"] += 1
            return self._one_shot(x)
        self.calls["nccl"] += 1
        dist.all_reduce(x)
        return x

    def _one_shot(self, x: torch.Tensor) -> torch.Tensor:
        buf = self.buffers[x.dtype][: x.numel()].view(x.shape)
        ops = torch.ops.symm_mem
        if self._fused_copy:
            return ops.one_shot_all_reduce_copy_out(buf, x, "sum", self.group_name, x)
        buf.copy_(x)
        return ops.one_shot_all_reduce_out(buf, "sum", self.group_name, x)

    # ---- start-up, on every rank in the same order --------------------------------------------------
    def setup(self, max_bytes: int, device: torch.device, dtypes: tuple[torch.dtype, ...], *,
              enabled: bool = True, required: bool = False, rank: int = 0) -> str:
        """Pick the path for this group and return the one line that says which (rank 0 logs it).

        Falls back to NCCL where one-shot cannot run here or disagrees with NCCL, or raises
        `OneShotUnavailable` instead when it is `required`; sets nothing up unless `enabled`.
        Collective: every rank of the default group must call it with the same arguments, before any
        CUDA graph is captured."""
        self.buffers, self.max_bytes = {}, 0
        backend = dist.get_backend()
        if not enabled:
            line = f"all-reduce: {backend} (one-shot not asked for)"
        else:
            wanted = tuple(d for d in dict.fromkeys(dtypes) if d in ONE_SHOT_DTYPES)
            reason = _agree(_local_obstacle(device, wanted, max_bytes), device)
            if reason is None:
                reason = _agree(self._try_rendezvous(wanted, max_bytes, device), device)
            if reason is None:
                reason = _agree(self._self_check(device), device)
            if reason is None:
                names = "/".join(str(d).removeprefix("torch.") for d in self.buffers)
                line = (f"all-reduce: one-shot over symmetric memory up to {max_bytes} bytes ({names}), "
                        f"{backend} above")
            else:
                self.buffers, self.max_bytes = {}, 0
                if required:
                    raise OneShotUnavailable(reason)
                line = f"all-reduce: {backend} only; one-shot is off because {reason}"
        if rank == 0:
            log.info("%s", line)
        return line

    def _try_rendezvous(self, dtypes: tuple[torch.dtype, ...], max_bytes: int, device: torch.device) -> str | None:
        """Allocate one symmetric buffer per dtype and exchange handles with the peers (collective)."""
        # The CUDA backend would also create a multicast object at rendezvous where the switch offers one;
        # the one-shot kernel never reads it, and on shared hosts multicast must stay off.
        os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
        try:
            from torch.distributed import _symmetric_memory as symm_mem

            _prefer_cuda_backend(symm_mem, device)
            group_name = dist.group.WORLD.group_name
            if torch.__version__ < "2.11":  # before 2.11 the group's store had to be registered first (deprecated since)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    symm_mem.enable_symm_mem_for_group(group_name)
            buffers = {}
            for d in dtypes:
                numel = max_bytes // torch.empty((), dtype=d).element_size()
                buf = symm_mem.empty(numel, dtype=d, device=device)
                symm_mem.rendezvous(buf, group_name)
                buffers[d] = buf
        except Exception as exc:  # a failed rendezvous (no peer access, no IPC handles) leaves NCCL in charge
            return f"the symmetric-memory rendezvous failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        self.buffers, self.max_bytes = buffers, max_bytes
        self.group_name = group_name
        self._fused_copy = _has_op("one_shot_all_reduce_copy_out")
        return None

    def _self_check(self, device: torch.device) -> str | None:
        """One-shot results against NCCL's on test tensors per dtype; any difference turns it off.

        Tried with the in-kernel copy first where torch has it, then with a separate copy, since the
        fused op is the newer one; the first that runs decides."""
        error = ""
        for fused in ((True, False) if self._fused_copy else (False,)):
            self._fused_copy = fused
            try:
                return self._compare_with_nccl(device)
            except Exception as exc:
                error = error or f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            finally:
                self.calls = {"one-shot": 0, "nccl": 0}
        return f"its self-check failed ({error})"

    def _compare_with_nccl(self, device: torch.device) -> str | None:
        """Small nonzero integers make every summation order exact: the two must agree bit for bit."""
        rank = dist.get_rank()
        gen = torch.Generator(device=device).manual_seed(1000 + rank)
        for d, buf in self.buffers.items():
            # the whole buffer (every block of the kernel, several passes), and a few rows with a ragged end
            for n in dict.fromkeys((buf.numel(), min(buf.numel(), 3 * 7168 + 2))):
                # nonzero, so a kernel that misses a peer changes every element it touches
                mag = torch.randint(1, 9, (n,), generator=gen, device=device)
                x = (mag * (torch.randint(0, 2, (n,), generator=gen, device=device) * 2 - 1)).to(d)
                ref = x.clone()
                dist.all_reduce(ref)
                got = x.clone()
                if not self.use_one_shot(got):
                    return f"the one-shot path does not take the test tensor ({d}, {got.nbytes} bytes)"
                self(got)
                if not torch.equal(got, ref):  # a host bool: waits for both sums
                    bad = int((got != ref).sum())
                    return f"its self-check differs from NCCL in {bad} of {n} elements ({d})"
        return None


def _prefer_cuda_backend(symm_mem, device: torch.device) -> None:
    """Pin the peer-to-peer backend that one_shot_all_reduce's kernels are written for, where torch lets us
    choose (NVSHMEM would also serve, with a heavier start); a torch that cannot keeps its default."""
    try:
        if hasattr(symm_mem, "set_backend") and symm_mem.get_backend(device) is None:
            symm_mem.set_backend("CUDA")
    except Exception:
        log.debug("symmetric memory keeps its default backend", exc_info=True)


def _has_op(name: str) -> bool:
    try:
        getattr(torch.ops.symm_mem, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _local_obstacle(device: torch.device, dtypes: tuple[torch.dtype, ...], max_bytes: int) -> str | None:
    """Why one-shot cannot run on this rank, known without talking to the peers; None if nothing stops it."""
    if device.type != "cuda":
        return f"it needs CUDA devices (the group runs {dist.get_backend()} on {device.type})"
    if torch.version.hip is not None:
        return "it is unverified on ROCm"
    if max_bytes < _ALIGN:
        return f"its size limit is {max_bytes} bytes"
    if not dtypes:
        return "the model's dtypes are not bfloat16 or float32"
    try:
        from torch.distributed import _symmetric_memory  # noqa: F401
    except ImportError as exc:
        return f"this torch has no symmetric memory ({exc})"
    if not _has_op("one_shot_all_reduce_out"):
        return "this torch has no symm_mem.one_shot_all_reduce_out"
    return None


def _agree(reason: str | None, device: torch.device) -> str | None:
    """Every rank's verdict combined: if one rank cannot, none does (so no rank waits at a lone barrier)."""
    ok = torch.tensor([0 if reason else 1], dtype=torch.int32, device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if int(ok.item()) == 1:
        return None
    return reason or "another rank could not set it up (see its log)"
