"""One worker process per device for the real-time executor (needs torch).

``tlora-sim execute --device cuda --gpus N`` (N > 1) and ``--device cpu --gpus N --processes``
start N workers (``torch.multiprocessing``, spawn), one per device: worker ``r`` owns ``cuda:r``
(NCCL) or a share of the CPU (gloo), and joins one ``torch.distributed`` job of N ranks with a
process group for every set of two or more devices (created at start-up by all ranks, as
``new_group`` requires). The coordinator (``sim/executor/poolloop.py``, in the executor's loop)
sends commands; each worker runs them in order and answers on one shared result queue:

* ``build``: a group's super-model on this device (``trainer.GroupTrainer``) over this worker's
  share of every member's sequences, restored from the members' saved states that the command
  carries (the same states to every worker of the group: identical adapter copies);
* ``step``: one optimizer step; on a group of k > 1 devices the adapter gradients are summed by
  one all-reduce of a flat fp32 bucket over the group's process group and divided by k before
  each worker's AdamW step, so the copies stay identical;
* ``save``: the group's lowest device sends every member's adapter and AdamW moments (packed,
  ``pack_state``) when asked; every worker reports a checksum of its adapter weights
  (``adapter_checksum``) and drops the group.

Every reply carries the worker's ``time.perf_counter()`` start and end (one monotonic clock for all
processes of a host) and the measured milliseconds (device-synchronised).

NVLink multicast is never enabled: ``NO_MULTICAST`` is set in the environment of every worker
(before it starts and again before it initialises NCCL).
"""

from __future__ import annotations

import itertools
import os
import queue as _queue
import socket
import time
import traceback

#: set in every worker's environment: NVLink SHARP / multicast off (NCCL, symmetric memory, NVSHMEM)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_FIELDS = ("A", "B", "mA", "vA", "mB", "vB")
#: process groups of every device subset are made at start-up: 2^N - N - 1 of them
MAX_PROCESSES = 8


def shares(batch: int, k: int) -> list[int]:
    """Whole sequences of a ``batch`` on each of ``k`` data-parallel replicas (the first
    ``batch mod k`` one more; the largest is ``ceil(batch / k)``, what
    ``parallelism.per_gpu_mixes`` prices for ``dp``)."""
    return [batch // k + (1 if i < batch % k else 0) for i in range(k)]


def pack_state(s) -> dict:
    """An ``AdapterState`` as a few flat host tensors (one per field), so that a queue moves a
    handful of shared-memory blocks rather than one per layer and projection."""
    import torch

    out = {"steps": s.steps}
    for f in _FIELDS:
        d = getattr(s, f)
        keys = list(d)
        out[f] = (keys, [tuple(d[k].shape) for k in keys],
                  torch.cat([d[k].reshape(-1) for k in keys]) if keys else None)
    return out


def unpack_state(p: dict):
    """Inverse of ``pack_state`` (views into the packed tensors)."""
    from tlora_sim.sim.executor.trainer import AdapterState

    s = AdapterState(steps=p["steps"])
    for f in _FIELDS:
        keys, shapes, flat = p[f]
        o, d = 0, getattr(s, f)
        for k, sh in zip(keys, shapes):
            n = 1
            for v in sh:
                n *= v
            d[k] = flat[o:o + n].view(sh)
            o += n
    return s


def adapter_checksum(gt) -> int:
    """An exact checksum of a group's adapter weights (their bit patterns weighted by position,
    summed in int64 on the device, one host sync): equal on two workers iff their copies are
    equal, but for collisions."""
    import torch

    total = None
    for k, p in enumerate(x for lo in gt.loras for x in lo.params):
        v = p.detach().reshape(-1)
        bits = v.view(torch.int16 if v.element_size() == 2 else torch.int32).to(torch.int64)
        w = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 1009 + k + 1
        s = (bits * w).sum()
        total = s if total is None else total * 31 + s  # int64 wraps: deterministic
    return 0 if total is None else int(total.item())


def _all_reduce_mean(params, pg, k: int) -> None:
    import torch
    import torch.distributed as dist

    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params])
    dist.all_reduce(flat, group=pg)
    flat /= k
    o = 0
    for p in params:
        n = p.numel()
        p.grad = flat[o:o + n].view_as(p).to(p.dtype)
        o += n


def _worker(rank: int, world: int, device: str, tiny: bool, port: int, threads: int, cmds, results) -> None:
    os.environ.update(NO_MULTICAST)
    try:
        import torch
        import torch.distributed as dist

        from tlora_sim.profiler.layer import sync
        from tlora_sim.sim.executor.trainer import DeviceTrainer, warm_up

        torch.set_num_threads(max(1, threads))
        cuda = device == "cuda"
        if cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
        groups = {ids: dist.new_group(list(ids)) for k in range(2, world + 1)
                  for ids in itertools.combinations(range(world), k)}
        if world <= 4:  # the communicators' set-up before the clock starts (NCCL makes them lazily)
            for ids, pg in groups.items():
                if rank in ids:
                    dist.all_reduce(torch.zeros(1, device=dev), group=pg)
        trainer = DeviceTrainer(str(dev), tiny=tiny)
        name = torch.cuda.get_device_name(rank) if cuda else "cpu"
        results.put(("ready", -1, -1, rank, 0.0, 0.0, 0.0, name))
        live: dict = {}
        while True:
            cmd = cmds.get()
            op, seq = cmd[0], cmd[1]
            if op == "stop":
                break
            t0 = time.perf_counter()
            extra = None
            gid = -1
            if op == "base":
                trainer.base(cmd[2])
            elif op == "warmup":
                _, _, model, plan, shapes, ranks = cmd
                warm_up(trainer, model, plan, shapes, ranks)
            elif op == "build":
                _, _, gid, ids, model, plan, members, states = cmd
                trainer.states.clear()
                trainer.states.update({j: (unpack_state(p) if p is not None else None) for j, p in states.items()})
                gt = trainer.group(model, plan, members)
                trainer.states.clear()
                if len(ids) > 1:
                    pg, k = groups[tuple(ids)], len(ids)
                    gt.grad_hook = lambda params, pg=pg, k=k: _all_reduce_mean(params, pg, k)
                live[gid] = gt
                sync(dev)
            elif op == "step":
                _, _, gid, nano, micro = cmd
                live[gid].step(nano, micro)
            elif op == "save":
                _, _, gid, want = cmd
                gt = live.pop(gid)
                packed = {}
                if want:
                    trainer.states.clear()
                    gt.save()
                    packed = {j: pack_state(trainer.states[j]) for j in gt.jobs}
                    trainer.states.clear()
                extra = (adapter_checksum(gt), packed)
                del gt
                trainer.release()
            else:
                raise ValueError(f"unknown command {op!r}")
            t1 = time.perf_counter()
            results.put((op, seq, gid, rank, (t1 - t0) * 1e3, t0, t1, extra))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - every failure goes to the coordinator, which stops the run
        results.put(("error", -1, -1, rank, 0.0, 0.0, 0.0, traceback.format_exc()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerPool:
    """N worker processes, one per device (see the module docstring); the executor's trainer when
    it drives several real devices (``RealTimeExecutor`` checks ``parallel``).

    Args:
        device: ``"cuda"`` (worker r on ``cuda:r``, NCCL) or ``"cpu"`` (gloo).
        n: workers (devices), 1 to ``MAX_PROCESSES``.
        tiny: train the tiny shape (as ``DeviceTrainer``).
        threads: torch threads per worker (default: the CPU's cores over ``n``, at least 1;
            ``OMP_NUM_THREADS`` when set).
        start_timeout_s: how long the workers may take to start and join the process group.

    Raises:
        ValueError: ``n`` out of range.
        RuntimeError: a worker failed to start (its traceback in the message).
    """

    parallel = True

    def __init__(self, device: str, n: int, tiny: bool = False, threads: int | None = None,
                 start_timeout_s: float = 300.0):
        if not 1 <= n <= MAX_PROCESSES:
            raise ValueError(f"one worker per device: 1 to {MAX_PROCESSES} devices, got {n}")
        import torch.multiprocessing as mp

        if threads is None:
            env = os.environ.get("OMP_NUM_THREADS", "")
            threads = int(env) if env.isdigit() else max(1, (os.cpu_count() or 1) // n)
        self.device, self.n, self.tiny = device, n, tiny
        self.backend = "nccl" if device == "cuda" else "gloo"
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.cmds = [ctx.Queue() for _ in range(n)]
        self.states: dict[int, dict] = {}  # job -> packed AdapterState on the host (shared memory)
        self._seq = 0
        os.environ.update(NO_MULTICAST)  # inherited by the spawned workers
        port = _free_port()
        self.procs = [ctx.Process(target=_worker, args=(r, n, device, tiny, port, threads, self.cmds[r],
                                                        self.results), daemon=True) for r in range(n)]
        for p in self.procs:
            p.start()
        self.device_names = [""] * n
        deadline = time.monotonic() + start_timeout_s
        ready = 0
        try:
            while ready < n:
                msg = self.get(timeout=max(0.0, deadline - time.monotonic()), need=True)
                if msg[0] == "ready":
                    self.device_names[msg[3]] = msg[7]
                    ready += 1
        except BaseException:
            self.close()
            raise

    def next_seq(self) -> int:
        """A new command number (replies echo it)."""
        self._seq += 1
        return self._seq

    def send(self, device: int, cmd: tuple) -> None:
        """Queue ``cmd`` (``(op, seq, ...)``) on worker ``device``."""
        self.cmds[device].put(cmd)

    def get(self, timeout: float, need: bool = False):
        """The next reply ``(op, seq, gid, rank, ms, perf_t0, perf_t1, extra)``, or None after
        ``timeout`` s (``need``: a RuntimeError instead).

        Raises:
            RuntimeError: a worker reported an exception or died.
        """
        end = time.monotonic() + timeout
        while True:
            try:
                msg = self.results.get(timeout=min(1.0, max(0.0, end - time.monotonic())))
            except _queue.Empty:
                msg = None
            if msg is not None:
                if msg[0] == "error":
                    self.close()
                    raise RuntimeError(f"executor worker {msg[3]} failed:\n{msg[7]}")
                return msg
            dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
            if dead:
                self.close()
                raise RuntimeError(f"executor worker(s) {dead} died (exit codes "
                                   f"{[self.procs[r].exitcode for r in dead]})")
            if time.monotonic() >= end:
                if need:
                    self.close()
                    raise RuntimeError(f"executor workers did not answer within {timeout:.0f} s")
                return None

    def call_all(self, op: str, *args, timeout: float = 600.0) -> list:
        """Send ``(op, seq, *args)`` to every worker and wait for all replies (set-up only)."""
        seq = self.next_seq()
        for d in range(self.n):
            self.send(d, (op, seq, *args))
        got = []
        while len(got) < self.n:
            msg = self.get(timeout, need=True)
            if msg[1] == seq:
                got.append(msg)
        return got

    def base(self, model: str) -> None:
        """Build ``model``'s base weights on every device."""
        self.call_all("base", model)

    def warmup(self, model: str, plan: str, shapes: list, ranks: list[int]) -> None:
        """``trainer.warm_up`` on every device: single-device steps of ``plan`` per job shape in
        ``shapes`` ((rank, sequences, seq_len)) and over ``ranks`` (JIT and autotuning before the
        clock starts)."""
        self.call_all("warmup", model, plan, [tuple(x) for x in shapes], list(ranks))

    def release(self) -> None:
        """Nothing to do here: each worker empties its own allocator cache after a save."""

    def close(self) -> None:
        """Stop the workers (asked first, then terminated after 30 s)."""
        for q in self.cmds:
            try:
                q.put(("stop", 0))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 30
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self.procs = [p for p in self.procs if p.is_alive()]
