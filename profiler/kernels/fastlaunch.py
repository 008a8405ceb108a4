"""Launching an already compiled Triton kernel with its arguments bound once (profiler/KERNELS.md,
"Host overhead").

A ``BoundLaunch`` is one launch site of a launch plan: the kernel, its grid, every argument that
the plan fixes (sizes, strides, splits, the plan's device tables, constexprs) and its launch
options, bound once; a call passes only the arguments that change from step to step (the step's
tensors, the dropout seed). The first call goes through Triton's normal launch (``config.launch``:
compilation, the shared-memory stages fallback), which returns the ``CompiledKernel``; later calls
hand the full argument list straight to that kernel's launcher, as Triton's own ``JITFunction.run``
does after its argument binding, specialisation and cache look-up (Triton 3.x:
``compiled.run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata, launch_metadata,
enter_hook, exit_hook, *args)``), which is what those steps would pick again.

The direct launch is used only while it is known to pick the same compiled kernel: every changing
argument keeps the specialisation it had at the first call (tensor dtype and 16-byte alignment;
an int's width, and its == 1 / multiple-of-16 classes unless the kernel marks it
``do_not_specialize``), no launch hook is installed (profilers such as Proton), and the launcher
accepted the call form. Otherwise the call goes through the normal launch (and re-binds). Under
the Triton interpreter (``TRITON_INTERPRET=1``) there is no compiled kernel and every call is a
normal launch.
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Optional, Sequence

import torch

from .config import launch

__all__ = ["BoundLaunch", "direct_launch_enabled"]

DIRECT_LAUNCH_REFUSED = {"off": False}
"""``["off"]`` turns True when a launcher refused the direct call form: every later bound launch of
this process then goes the normal way (``direct_launch_enabled``; a dict, so that tests can reset it)."""


def direct_launch_enabled() -> bool:
    """Whether ``BoundLaunch`` may call compiled kernels directly: not under the Triton interpreter,
    not with ``TLORA_DIRECT_LAUNCH=0``, and not after the launcher refused the direct call form."""
    return (os.environ.get("TRITON_INTERPRET") != "1"
            and os.environ.get("TLORA_DIRECT_LAUNCH", "1") != "0" and not DIRECT_LAUNCH_REFUSED["off"])


def _spec(v, dns: bool):
    """What Triton's specialisation sees of one argument value (the part that picks the compiled
    kernel): tensors by dtype and 16-byte alignment, ints by width and (unless ``dns``) the
    == 1 / multiple-of-16 classes, bools and None by value, anything else by type."""
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() & 15 == 0)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        wide = not (-2 ** 31 <= v < 2 ** 31)
        return ("i", wide) if dns else ("i", wide, v == 1, v % 16 == 0)
    return type(v)


try:  # Triton >= 3.4 keeps its launch hooks in knobs.runtime (3.6: HookChain objects, never None)
    from triton import knobs as _knobs
    _RT = _knobs.runtime
except Exception:  # noqa: BLE001 - an older Triton: no hooks to honour here
    _RT = None


def hook_set(h) -> bool:
    """Whether launch hook ``h`` would do anything: None or an empty HookChain does not."""
    return h is not None and bool(getattr(h, "calls", True))


def hooks_installed() -> bool:
    """Whether a launch enter/exit hook (e.g. the Proton profiler's) is installed: then every
    launch goes through Triton's normal path, which builds the hooks' launch metadata."""
    if _RT is None:
        return False
    return hook_set(_RT.launch_enter_hook) or hook_set(_RT.launch_exit_hook)


def _stream_fn() -> Callable[[], int]:
    """The raw current CUDA stream of the current device, as Triton's driver reads it
    (``torch.cuda.current_device`` without its Python wrapper)."""
    get_raw = torch._C._cuda_getCurrentRawStream
    cur = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
    return lambda: get_raw(cur())


def raw_launcher(runner):
    """(C launch function, cooperative flag, PDL flag) of Triton 3.6's CUDA launcher object
    (``CudaLauncher``), to skip its Python ``__call__``: for a kernel without global or profile
    scratch memory that only forwards to ``runner.launch(gx, gy, gz, stream, function,
    cooperative, pdl, None, None, *args)`` (``launch``: the C launcher, or Triton's wrapper that
    expands host tensor descriptors). None where the launcher is not that shape (then the bound
    launch calls ``runner`` itself, as Triton does)."""
    import triton
    if not triton.__version__.startswith("3.6"):
        return None
    try:
        if runner.global_scratch_size or runner.profile_scratch_size:
            return None
        return runner.launch, runner.launch_cooperative_grid, runner.launch_pdl
    except AttributeError:
        return None


STREAM = [_stream_fn]
"""Factory of the stream getter a bound launch uses (a list, so that tests can replace it)."""


class BoundLaunch:
    """One launch of ``kernel`` over ``grid`` with ``static`` arguments (name -> value: ints,
    constexprs, the plan's device tensors) and ``options`` (num_warps, ...) bound; ``dynamic``
    names the arguments given per call, in order. ``name``, ``buckets``, ``cfg`` and
    ``start_stages`` are ``config.launch``'s (pipeline stages and their shared-memory fallback).
    ``checked``: indices of the dynamic values whose specialisation is re-checked on every direct
    call (default: all); leave out only values whose dtype and alignment cannot change (buffers
    the caller allocates itself, fixed-offset views of them, the plan's own tensors).

    ``bl(*values)`` launches with the dynamic arguments ``values``. Raises what Triton raises
    (compilation errors, ``OutOfResources`` below one stage) and TypeError on a wrong number of
    values. Counters ``n_direct`` / ``n_normal`` say how each call went (for tests and the
    host-overhead benchmark)."""

    __slots__ = ("kernel", "grid", "name", "buckets", "cfg", "dynamic", "static", "options",
                 "start_stages", "checked", "_fast", "_dns", "n_direct", "n_normal")

    def __init__(self, kernel, grid: Sequence[int], name: str, buckets: int, cfg,
                 dynamic: Sequence[str], static: dict, options: Optional[dict] = None,
                 start_stages: Optional[int] = None, checked: Optional[Sequence[int]] = None):
        g = tuple(int(v) for v in grid) + (1, 1)
        self.kernel, self.grid = kernel, g[:3]
        self.name, self.buckets, self.cfg = name, buckets, cfg
        self.dynamic = tuple(dynamic)
        self.static, self.options = dict(static), dict(options or {})
        self.start_stages = start_stages
        dns = set()
        for p in getattr(kernel, "params", ()) or ():
            if getattr(p, "do_not_specialize", False):
                dns.add(getattr(p, "name", None))
        self._dns = tuple(n in dns for n in self.dynamic)
        self.checked = tuple(range(len(self.dynamic)) if checked is None else checked)
        self._fast = None
        self.n_direct = self.n_normal = 0

    def __call__(self, *values) -> None:
        if len(values) != len(self.dynamic):
            raise TypeError(f"{self.name}: {len(self.dynamic)} dynamic arguments "
                            f"{self.dynamic}, got {len(values)}")
        f = self._fast
        if f is not None:
            fn, mid, template, slots, specs, stream = f
            ok = not hooks_installed()
            if ok:
                for i in self.checked:
                    if _spec(values[i], self._dns[i]) != specs[i]:
                        ok = False
                        break
            if ok:
                args = template.copy()
                for i, v in zip(slots, values):
                    args[i] = v
                gx, gy, gz = self.grid
                try:
                    fn(gx, gy, gz, stream(), *mid, *args)
                except TypeError as e:  # a launcher with another call form: never again
                    DIRECT_LAUNCH_REFUSED["off"] = True
                    self._fast = None
                    warnings.warn(f"direct Triton launch refused ({e}); using the normal launch")
                else:
                    self.n_direct += 1
                    return
        self._normal(values)

    def _normal(self, values) -> None:
        kw = dict(self.static)
        kw.update(zip(self.dynamic, values))
        compiled = launch(self.kernel, self.grid, self.name, self.buckets, self.cfg,
                          start_stages=self.start_stages, **kw, **self.options)
        self.n_normal += 1
        self._fast = None
        if compiled is None or not direct_launch_enabled():
            return
        try:
            self._fast = self._bind(compiled, kw, values)
        except Exception as e:  # noqa: BLE001 - binding is an optimisation: stay on the normal path
            warnings.warn(f"{self.name}: no direct launch ({e!r})")
            self._fast = None

    def _bind(self, compiled, kw: dict, values):
        """(launch function, its arguments between the stream and the kernel's, the kernel's full
        argument list, dynamic slots, their specs, stream function) of ``compiled``, the kernel
        the normal launch just ran with ``kw``: Triton 3.6's call ``compiled.run(gx, gy, gz,
        stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)``
        with no launch metadata or hooks, or its C launcher directly (``raw_launcher``)."""
        sig = self.kernel.signature  # inspect.Signature of the kernel's Python function
        ba = sig.bind(**kw)
        ba.apply_defaults()
        names = list(ba.arguments)
        template = list(ba.arguments.values())
        slots = tuple(names.index(n) for n in self.dynamic)
        for i in slots:  # the step's own tensors: filled per call, never kept alive here
            template[i] = None
        specs = tuple(_spec(v, d) for v, d in zip(values, self._dns))
        run = compiled.run
        function = compiled.function
        meta = compiled.packed_metadata
        raw = raw_launcher(run)
        if raw is not None:
            fn, coop, pdl = raw
            mid = (function, coop, pdl, None, None, meta, None, None, None)
        else:
            fn, mid = run, (function, meta, None, None, None)
        return (fn, mid, template, slots, specs, STREAM[0]())
