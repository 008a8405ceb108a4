"""The direct launch of ``profiler/kernels/fastlaunch.BoundLaunch`` (profiler/KERNELS.md, "Host
overhead"), on the CPU: a stand-in kernel records what Triton's normal launch and the compiled
kernel's launcher would receive, so the argument order, the fallbacks and the re-binding are
checked without a GPU; the real kernels' results through both paths are checked by
tests/gpu/test_kernels.py (interpreter: normal path) and ``bench/kernels.py --check`` (GPU: direct).
"""
from __future__ import annotations

import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tlora_sim.profiler.kernels import fastlaunch  # noqa: E402
from tlora_sim.profiler.kernels.fastlaunch import BoundLaunch  # noqa: E402


def _fn(X, Y, n, seed, stride, BLOCK: "tl.constexpr" = 64, MODE: "tl.constexpr" = "a"):
    pass


class _Param:
    def __init__(self, name, dns):
        self.name, self.do_not_specialize = name, dns


class _Compiled:
    def __init__(self, fail=False):
        self.calls, self.fail = [], fail
        self.function, self.packed_metadata = "FUNC", "META"

    def run(self, *a):
        if self.fail:
            raise TypeError("launcher takes another form")
        self.calls.append(a)


class _Kernel:
    """Stands in for a ``triton.JITFunction``: ``kernel[grid](*args, **kw)`` records a normal
    launch and returns its compiled kernel."""

    def __init__(self, fail=False):
        self.signature = inspect.signature(_fn)
        self.params = [_Param(n, n == "seed") for n in self.signature.parameters]
        self.compiled = _Compiled(fail)
        self.normal = []

    def __getitem__(self, grid):
        def go(*a, **kw):
            self.normal.append((grid, a, kw))
            return self.compiled
        return go


@pytest.fixture(autouse=True)
def _direct_on(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("TLORA_DIRECT_LAUNCH", raising=False)
    monkeypatch.setitem(fastlaunch.DIRECT_LAUNCH_REFUSED, "off", False)
    monkeypatch.setattr(fastlaunch, "STREAM", [lambda: (lambda: 1234)])
    monkeypatch.setattr(fastlaunch, "hooks_installed", lambda: False)


def _bl(k, checked=None):
    return BoundLaunch(k, (6,), "t", 0, None, ("X", "Y", "seed"),
                       dict(n=10, stride=32, MODE="b"), dict(num_warps=4), start_stages=2,
                       checked=checked)


def test_first_call_is_a_normal_launch_then_direct_with_the_full_argument_list():
    k = _Kernel()
    bl = _bl(k)
    x, y = torch.zeros(8), torch.zeros(8)
    bl(x, y, 5)
    assert bl.n_normal == 1 and bl.n_direct == 0 and not k.compiled.calls
    assert not any(v is x or v is y for v in bl._fast[2])  # the step's tensors are not kept
    grid, a, kw = k.normal[0]
    assert grid == (6, 1, 1) and kw["num_stages"] == 2 and kw["num_warps"] == 4
    assert kw["X"] is x and kw["n"] == 10 and kw["MODE"] == "b"
    x2, y2 = torch.ones(8), torch.ones(8)
    bl(x2, y2, 99)
    assert bl.n_direct == 1 and len(k.normal) == 1
    c = k.compiled.calls[0]
    # grid, stream, function, packed metadata, launch metadata and hooks (none), then every
    # parameter in signature order, defaults filled in
    assert c[:9] == (6, 1, 1, 1234, "FUNC", "META", None, None, None)
    assert c[9] is x2 and c[10] is y2 and c[11:] == (10, 99, 32, 64, "b")


def test_a_changed_specialisation_goes_back_to_the_normal_launch():
    k = _Kernel()
    bl = _bl(k)
    x = torch.zeros(16)
    bl(x, x, 1)
    bl(x[1:], x, 2)               # 4-byte offset: no longer 16-byte aligned
    assert bl.n_normal == 2 and bl.n_direct == 0
    bl(x[1:], x, 3)               # bound again for that alignment
    assert bl.n_direct == 1
    bl(x.to(torch.float64), x, 3)  # another dtype
    assert bl.n_normal == 3
    bl(x, x, 2 ** 40)              # a seed that no longer fits 32 bits (do_not_specialize: width only)
    assert bl.n_normal == 4


def test_unchecked_values_are_not_inspected():
    k = _Kernel()
    bl = _bl(k, checked=(0,))
    x = torch.zeros(16)
    bl(x, x, 1)
    bl(x, x[1:], 2)               # Y is declared fixed by the caller: stays direct
    assert bl.n_direct == 1


def test_hooks_and_the_interpreter_use_the_normal_launch(monkeypatch):
    k = _Kernel()
    bl = _bl(k)
    x = torch.zeros(8)
    bl(x, x, 1)
    monkeypatch.setattr(fastlaunch, "hooks_installed", lambda: True)
    bl(x, x, 1)
    assert bl.n_direct == 0 and bl.n_normal == 2
    monkeypatch.setattr(fastlaunch, "hooks_installed", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not fastlaunch.direct_launch_enabled()
    bl2 = _bl(k)
    bl2(x, x, 1)
    bl2(x, x, 1)
    assert bl2.n_direct == 0 and bl2.n_normal == 2


def test_a_refused_call_form_disables_the_direct_launch():
    k = _Kernel(fail=True)
    bl = _bl(k)
    x = torch.zeros(8)
    bl(x, x, 1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        bl(x, x, 1)              # direct call refused: this launch goes the normal way
    assert any("direct Triton launch refused" in str(m.message) for m in w)
    assert bl.n_normal == 2 and bl.n_direct == 0 and len(k.normal) == 2
    assert not fastlaunch.direct_launch_enabled()


def test_wrong_number_of_values_raises():
    bl = _bl(_Kernel())
    with pytest.raises(TypeError):
        bl(torch.zeros(1))


def test_hook_detection_reads_triton_hook_chains():
    class Chain:
        def __init__(self, calls):
            self.calls = calls
    assert not fastlaunch.hook_set(None)
    assert not fastlaunch.hook_set(Chain([]))
    assert fastlaunch.hook_set(Chain([print]))
    assert fastlaunch.hook_set(print)  # a plain callable (older Triton)


def test_triton_36_launcher_is_called_without_its_python_wrapper(monkeypatch):
    import triton

    class Runner:
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid, launch_pdl = False, True

        def __init__(self):
            self.raw = []

        def launch(self, *a):
            self.raw.append(a)

        def __call__(self, *a):
            raise AssertionError("the Python __call__ should be skipped")

    k = _Kernel()
    k.compiled.run = Runner()
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    bl = _bl(k)
    x = torch.zeros(8)
    bl(x, x, 1)
    bl(x, x, 7)
    a = k.compiled.run.raw[0]
    # grid, stream, function, cooperative, PDL, no scratch, packed metadata, no launch
    # metadata or hooks, then the kernel's arguments
    assert a[:13] == (6, 1, 1, 1234, "FUNC", False, True, None, None, "META", None, None, None)
    assert a[13] is x and a[16] == 7
    k2 = _Kernel()
    k2.compiled.run = Runner()
    k2.compiled.run.global_scratch_size = 128   # scratch to allocate: Triton's own __call__
    assert fastlaunch.raw_launcher(k2.compiled.run) is None
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    assert fastlaunch.raw_launcher(Runner()) is None


def test_a_module_and_its_cached_programs_are_freed_without_the_cyclic_collector():
    """Plans cache their launch programs; a program must not point back at its plan (or the
    module's weight would stay allocated until the cyclic garbage collector runs)."""
    import gc
    import os
    import weakref

    os.environ.setdefault("TRITON_INTERPRET", "1")
    from tlora_sim.profiler.kernels import MultiLoRALinear

    mod = MultiLoRALinear(32, 16, [4, 8], dropout=0.1, dtype=torch.float32)
    mod.set_segments([5, 3])
    x = torch.randn(8, 32, requires_grad=True)
    y = mod(x)
    torch.autograd.grad(y, [x, mod.lora_A, mod.lora_B], torch.randn_like(y))
    plan = next(iter(mod.plans().values()))
    assert any(str(k[0]).endswith("prog") for k in plan.extra if isinstance(k, tuple))
    refs = [weakref.ref(mod.weight), weakref.ref(plan)]
    gc.disable()
    try:
        del mod, plan, y
        assert all(r() is None for r in refs)
    finally:
        gc.enable()
