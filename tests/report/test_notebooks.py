"""Execute every notebook of notebooks/ top to bottom on small inputs, so they cannot rot.

How: nbformat reads the notebook, the first code cell (tagged ``parameters``, papermill style) is
replaced by the test's parameters (``NAME = repr(value)`` lines), and nbclient runs every cell in
a fresh Jupyter kernel with notebooks/ as the working directory. The kernel is the ``python3``
kernel spec when it starts this interpreter (the one ipykernel installs into the venv: its argv
``python`` is mapped to ``sys.executable`` by jupyter_client); otherwise a kernel spec pinned to
``sys.executable`` is written to a temporary Jupyter path. A cell that raises fails the test with
the cell's traceback. Skipped, with the reason, when nbclient, nbformat or ipykernel is missing
(``pip install -e '.[dev]'``).

Inputs: ``api`` (only ``import tlora_sim as ts``) compares 2 policies on a 40-job synthetic trace and saves
it; ``reproduce_tlora`` replays a 40-job synthetic trace under 3 policies (and a 2-point load
sweep of 20-job traces); ``kernels`` and ``costmodel`` read the committed profiler data when it is
there (``profiler/data/kernel_bench_*.csv``, ``profile_*.csv``), else small synthetic tables built
here (tests/report/test_profiler_plots.py's builders).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="executing notebooks needs nbformat (the [dev] extra)")
nbclient = pytest.importorskip("nbclient", reason="executing notebooks needs nbclient (the [dev] extra)")
pytest.importorskip("ipykernel", reason="executing notebooks needs ipykernel (the [dev] extra)")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
DATA = ROOT / "profiler" / "data"
NAMES = ("reproduce_tlora.ipynb", "kernels.ipynb", "costmodel.ipynb", "api.ipynb")
CELL_TIMEOUT_S = 300


def _helpers():
    """tests/report/test_profiler_plots.py loaded by path (its synthetic-table builders)."""
    spec = importlib.util.spec_from_file_location("_tlora_profiler_plot_tests", Path(__file__).with_name(
        "test_profiler_plots.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    """A kernel spec that starts this interpreter: ``python3`` when it does, else a temporary one."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        argv0 = KernelSpecManager().get_kernel_spec("python3").argv[0]
        same = argv0 in {"python", f"python{sys.version_info[0]}", "python%d.%d" % sys.version_info[:2]} \
            or Path(argv0).resolve() == Path(sys.executable).resolve()
    except NoSuchKernel:
        same = False
    if same:
        yield "python3"
        return
    jdir = tmp_path_factory.mktemp("jupyter")
    kdir = jdir / "kernels" / "tlora-sim-test"
    kdir.mkdir(parents=True)
    (kdir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "tlora-sim test", "language": "python"}))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(jdir) + (os.pathsep + old if old else "")
    try:
        yield "tlora-sim-test"
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old


def _execute(name: str, params: dict, kernel: str):
    """Run notebook ``name`` with its parameters cell replaced by ``params``; return (nb, seconds)."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert "parameters" in first.metadata.get("tags", []), f"{name}: the first code cell must be tagged parameters"
    for key in params:  # only override parameters the notebook defines
        assert f"\n{key} =" in "\n" + first.source, f"{name}: no parameter {key}"
    first.source = "# parameters set by tests/report/test_notebooks.py\n" + "\n".join(
        f"{k} = {v!r}" for k, v in params.items())
    client = nbclient.NotebookClient(nb, kernel_name=kernel, timeout=CELL_TIMEOUT_S,
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    t0 = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - t0


def _text(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            out.extend(str(v) for k, v in o.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(out)


def _images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


@pytest.mark.parametrize("name", NAMES)
def test_committed_without_outputs_and_with_parameters_cell(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and "parameters" in code[0].metadata.get("tags", [])
    for c in code:
        assert c.outputs == [] and c.execution_count is None, f"{name}: commit notebooks without outputs"


@pytest.mark.slow
def test_reproduce_tlora(tmp_path, kernel_name):
    out = tmp_path / "reproduce"
    nb, secs = _execute("reproduce_tlora.ipynb", {
        "WORKLOADS": {"tiny": ("synthetic:jobs=40,seed=3,load=0.8,gpus=32,max_gpus=8", "4x8xH100")},
        "POLICIES": ["independent-backfill", "mlora", "tlora"],
        "SEED": 0, "LORA_DIST": "tlora", "OUT": str(out), "WORKERS": 1, "REUSE": False,
        "LOAD_SWEEP": {"trace": "synthetic:jobs=20,seed=5,gpus=32,max_gpus=8", "cluster": "4x8xH100",
                       "loads": [0.6, 1.0], "policies": ["independent-backfill", "tlora"]},
        "FORMATS": ["png"],
    }, kernel_name)
    for fig in ("jct_cdf", "slowdown_cdf", "throughput_time", "utilization_time", "bars"):
        assert (out / "tiny" / "figures" / f"{fig}.png").is_file(), fig
    assert (out / "load_sweep" / "figures" / "queue_vs_load.png").is_file()
    import pandas as pd

    rel = pd.read_csv(out / "relative.csv")
    assert rel["policy"].tolist() == ["independent-backfill", "mlora", "tlora"]  # against the reference
    assert rel.loc[0, ["throughput_x", "avg_jct_speedup"]].tolist() == [1.0, 1.0]
    assert "all jobs finished in every run" in _text(nb)
    assert _images(nb) >= 6


def test_kernels(tmp_path, kernel_name):
    committed = sorted(DATA.glob("kernel_bench_*.csv"))
    csv_path = committed[0] if committed else _helpers().synthetic_kernel_csv(tmp_path / "kernel_bench_cpu.csv")
    out = tmp_path / "kernels"
    nb, secs = _execute("kernels.ipynb", {"KERNEL_CSV": str(csv_path), "OUT": str(out), "FORMATS": ["png"]},
                        kernel_name)
    assert (out / "kernels.png").is_file() and (out / "kernels_vs_base.png").is_file()
    assert (out / "kernels_eager.png").is_file()
    assert "fused / base median" in _text(nb)
    assert _images(nb) == 3


def test_costmodel(tmp_path, kernel_name):
    if sorted(DATA.glob("profile_*.csv")):
        data = DATA
    else:
        data = _helpers().synthetic_profile_dir(tmp_path / "data", models=("llama3-8b", "qwen3-8b"))
    out = tmp_path / "costmodel"
    nb, secs = _execute("costmodel.ipynb", {"DATA": str(data), "GPU": None, "HOLDOUT_EVERY": None,
                                            "OUT": str(out), "FORMATS": ["png"]}, kernel_name)
    assert sorted(out.glob("costmodel_*.png"))
    text = _text(nb)
    assert "held-out median APE" in text and "in-sample median APE" in text
    assert _images(nb) >= 1


def test_api(tmp_path, kernel_name):
    out = tmp_path / "api"
    nb, secs = _execute("api.ipynb", {"TRACE": "synthetic:jobs=40,seed=3", "CLUSTER": "1x8xH100",
                                      "POLICIES": ["independent", "tlora"], "SEED": 0, "OUT": str(out)}, kernel_name)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    imports = {line.split()[1] for line in code.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"pandas", "IPython.display", "tlora_sim"}, imports  # only the Python API
    assert (out / "summary.csv").is_file() and (out / "tlora" / "jobs.csv").is_file()
    text = _text(nb)
    assert "ranks from the trace: 20 of" in text and "adapter(s): step" in text
    assert _images(nb) >= 1
