"""A profiled cost-model artifact: where the files live, loading with the in-depth checks, the
schema's constants (plan families, measured plans, term texts), and the artifacts' identity.

``load_artifact`` reads a ``costmodel_<gpu>.json`` (``profiler/fit.py`` writes it; a calibrated
one from ``tlora-sim costmodel calibrate`` or any ``--artifact FILE`` is read the same way) and
checks every field the model computes with. ``register`` gives a loaded artifact its key
(``<id>:<sha256>``), under which ``tables.tables_of``, ``model.predict_of`` and the
multi-GPU planner find it again (their memos are keyed by it, not by the dict).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from tlora_sim.traces.errors import InputError

SCHEMA = "tlora-sim/costmodel/1"
PLAN_FAMILY = {"alone": "loop", "loop": "loop", "fused": "fused", "lorafusion": "lorafusion", "grouped": "grouped"}
#: plans measured by an artifact that does not say (``measured_plans`` absent: the artifacts fitted
#: before LoRAFusion's kernels and the grouped GEMM were profiled)
MEASURED_PLANS = ("alone", "loop", "fused")

#: fewest adapters per mix a plan family was measured with, for artifacts whose coverage does not
#: say (``adapters_min``): the profiler runs LoRAFusion's kernels and the grouped GEMM on
#: multi-adapter mixes only (``profiler/profile.py --plans``)
ADAPTERS_MIN_DEFAULT = {"lorafusion": 2, "grouped": 2}


# ------------------------------------------------------------------------------------ files
def data_dir() -> Path:
    """``profiler/data`` (package data; torch-free)."""
    try:
        from importlib.resources import files

        p = Path(str(files("tlora_sim.profiler") / "data"))
        if p.is_dir():
            return p
    except Exception:  # noqa: BLE001
        pass
    return Path(__file__).resolve().parents[3] / "profiler" / "data"


def artifact_path(gpu: str, directory: str | Path | None = None) -> Path:
    """Where the artifact of GPU type ``gpu`` lives: ``costmodel_<gpu lower>.json``."""
    return Path(directory or data_dir()) / f"costmodel_{gpu.lower()}.json"


def load_artifact(path: str | Path) -> dict:
    """Read and check an artifact. Raises InputError on a missing file or wrong schema."""
    p = Path(path)
    try:
        if not p.is_file():
            raise InputError("cost-model artifact is not a regular file" if p.exists()
                             else "cost-model artifact: no such file", file=str(p))
        if p.stat().st_size > MAX_ARTIFACT_BYTES:
            raise InputError(f"cost-model artifact is larger than {MAX_ARTIFACT_BYTES >> 20} MiB: not an artifact",
                             file=str(p))
        with p.open("rb") as f:
            raw = f.read(MAX_ARTIFACT_BYTES + 1)
    except OSError as e:
        raise InputError(f"cannot read cost-model artifact: {e.strerror}", file=str(p)) from None
    if len(raw) > MAX_ARTIFACT_BYTES:
        raise InputError(f"cost-model artifact is larger than {MAX_ARTIFACT_BYTES >> 20} MiB: not an artifact",
                         file=str(p))
    try:
        art = json.loads(raw)
    except UnicodeDecodeError:
        raise InputError("cost-model artifact is not JSON (not UTF-8 text)", file=str(p)) from None
    except json.JSONDecodeError as e:
        raise InputError(f"cost-model artifact is not JSON ({e.msg})", file=str(p), row=e.lineno) from None
    if not isinstance(art, dict) or art.get("schema") != SCHEMA:
        got = art.get("schema") if isinstance(art, dict) else type(art).__name__
        raise InputError(f"cost-model artifact has schema {got!r}, expected {SCHEMA!r}", file=str(p))
    check_artifact(art, str(p))
    art["_path"], art["_sha256"] = str(p), hashlib.sha256(raw).hexdigest()
    return art


#: artifacts are small (the shipped ones 40-60 kB; a calibrated one adds its points): a file
#: larger than this is refused before it is read (e.g. ``--artifact /dev/zero``)
MAX_ARTIFACT_BYTES = 32 << 20

#: (path, type) pairs every artifact must have; ``*`` stands for every model / plan key.
_SHAPE = ((("id",), str), (("gpu",), str), (("models",), dict), (("optimizer", "coef"), dict),
          (("models", "*", "l0"), dict), (("models", "*", "head"), dict), (("models", "*", "attn"), dict),
          (("models", "*", "plans"), dict), (("models", "*", "plans", "*", "coef"), dict),
          (("models", "*", "plans", "*", "features"), list), (("models", "*", "plans", "*", "memory"), dict))


def check_artifact(art: dict, file: str) -> None:
    """Check that a loaded artifact has the fields the model reads, with the right types.

    Raises:
        InputError: naming the file and the first missing or mistyped field (a dotted path).
    """
    def walk(node, path, done):
        if not path:
            return [(done, node)]
        key, rest = path[0], path[1:]
        if key == "*":
            if not isinstance(node, dict) or not node:
                raise InputError("expected a non-empty object", file=file, field=".".join(done) or "<root>")
            return [x for k, v in node.items() for x in walk(v, rest, done + [str(k)])]
        if not isinstance(node, dict) or key not in node:
            raise InputError("missing", file=file, field=".".join(done + [key]))
        return walk(node[key], rest, done + [key])

    for path, typ in _SHAPE:
        for where, value in walk(art, list(path), []):
            if not isinstance(value, typ):
                raise InputError(f"expected {typ.__name__}, got {type(value).__name__}", file=file,
                                 field=".".join(where))
    _check_numbers(art, file)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _curve(node, field: str, file: str, x: str, need_positive: bool = True) -> None:
    """``node`` holds lists ``x`` and ``ms`` of one length >= 1, finite, x ascending, > 0."""
    if not isinstance(node, dict):
        raise InputError(f"expected an object, got {type(node).__name__}", file=file, field=field)
    for key in (x, "ms"):
        v = node.get(key)
        if not isinstance(v, list) or not v:
            raise InputError("missing or not a non-empty list", file=file, field=f"{field}.{key}")
        for k, e in enumerate(v):
            if not _finite(e) or (need_positive and e <= 0):
                raise InputError(f"expected a finite number > 0, got {e!r}", file=file, field=f"{field}.{key}[{k}]")
    if len(node[x]) != len(node["ms"]):
        raise InputError(f"{x} and ms differ in length", file=file, field=f"{field}.ms")
    if any(b <= a for a, b in zip(node[x], node[x][1:])):
        raise InputError("not strictly ascending", file=file, field=f"{field}.{x}")


def _check_numbers(art: dict, file: str) -> None:
    """The artifact's numbers the model computes with: finite (no NaN or infinity), the measured
    curves well formed (``_curve``). Raises InputError naming the field (a dotted path)."""
    for k, v in art["optimizer"]["coef"].items():
        if not _finite(v):
            raise InputError(f"expected a finite number, got {v!r}", file=file, field=f"optimizer.coef.{k}")
    for m, e in art["models"].items():
        _curve(e["l0"], f"models.{m}.l0", file, "tokens")
        _curve(e["head"], f"models.{m}.head", file, "tokens")
        if not e["attn"]:
            raise InputError("expected a non-empty object", file=file, field=f"models.{m}.attn")
        for s, v in e["attn"].items():
            if not str(s).isdigit() or int(s) < 1:
                raise InputError(f"expected a sequence length, got {s!r}", file=file, field=f"models.{m}.attn")
            _curve(v, f"models.{m}.attn.{s}", file, "seqs")
        for fam, pe in e["plans"].items():
            where = f"models.{m}.plans.{fam}"
            for k, v in pe["coef"].items():
                if not _finite(v):
                    raise InputError(f"expected a finite number, got {v!r}", file=file, field=f"{where}.coef.{k}")
            for k in ("cpu0", "cpu_n", "cpu_g", "call_ms", "call_ms_alone", "p", "nano_host"):
                if k in pe and (not _finite(pe[k]) or pe[k] < 0):
                    raise InputError(f"expected a finite number >= 0, got {pe[k]!r}", file=file, field=f"{where}.{k}")
            for part in ("peak", "saved"):
                mem = pe["memory"].get(part, {})
                if not isinstance(mem, dict):
                    raise InputError("expected an object", file=file, field=f"{where}.memory.{part}")
                for k, v in mem.items():
                    if not _finite(v):
                        raise InputError(f"expected a finite number, got {v!r}", file=file,
                                         field=f"{where}.memory.{part}.{k}")


# ------------------------------------------------------------------------------------ identity
_REGISTRY: dict[str, dict] = {}


def artifact_key(art: dict) -> str:
    """The identity of a loaded artifact: ``<id>:<sha256 of the file>`` (the dict's ``id()`` for an
    artifact built in memory, which has no file)."""
    return f"{art['id']}:{art.get('_sha256', id(art))}"


def register(art: dict) -> str:
    """Register a loaded artifact and return its key (``artifact_key``). Registering the same file
    again replaces the entry with an equal artifact (same bytes), so answers memoised by key stay
    true."""
    key = artifact_key(art)
    _REGISTRY[key] = art
    return key


def registered(key: str) -> dict:
    """The artifact registered under ``key`` (``register``). Raises KeyError for an unknown key."""
    return _REGISTRY[key]


def profiled_source(cost_model) -> tuple[dict, str] | None:
    """``(artifact, key)`` of a profiled cost model (one whose ``key`` is registered and is its
    ``artifact``'s own key: two models that loaded the same file share it), else None: how the batch forms (``formula.FusedBatch``,
    ``multigpu.PlannerBatch``) recognise the model without importing its class."""
    key, art = getattr(cost_model, "key", None), getattr(cost_model, "artifact", None)
    if not isinstance(key, str) or not isinstance(art, dict) or key not in _REGISTRY or "id" not in art \
            or artifact_key(art) != key:
        return None
    return art, key


# ------------------------------------------------------------------------------ measured plans
def measured_plans(art: dict) -> tuple:
    """The plans an artifact measured: its ``measured_plans`` (written by ``profiler/fit.py``),
    else ``MEASURED_PLANS`` (alone, loop, fused)."""
    got = art.get("measured_plans")
    return tuple(got) if isinstance(got, (list, tuple)) else MEASURED_PLANS


def plan_measured(art: dict, model: str, plan: str) -> bool:
    """True if ``plan`` is measured for ``model``: listed by the artifact and its family fitted in
    the model's entry. Otherwise the cost model predicts it as fused x the roofline's ratio."""
    fam = PLAN_FAMILY.get(plan)
    entry = art.get("models", {}).get(model)
    return plan in measured_plans(art) and fam is not None and entry is not None and fam in entry.get("plans", {})


# ------------------------------------------------------------------------------------ terms
TERMS = {"measured": ["decoder layer forward+backward per mix and plan (l0 + attention + adapter term)",
                      "embedding + LM head + loss", "AdamW step", "layer and head peak working memory"],
         "analytic": ["gradient all-reduce and sharded-weight all-gather (sim/costmodel/roofline.py formulas)",
                      "nano-batch overlap", "plans lorafusion/grouped (fused x roofline ratio)",
                      "frozen weights, adapter state (16 B/param), checkpointed layer inputs, 2 GiB workspace"]}


_OLD_MULTI = "several GPUs: fused x roofline ratio"
SEED_PLANS_MULTI_GPU = "several GPUs: their one-GPU fit inside the planner, with the fused plan's CPU sharing"
"""How measured ``lorafusion``/``grouped`` are priced on several GPUs (the artifact's term text,
``profiler/fit.py``)."""


def terms_now(terms: dict) -> dict:
    """An artifact's term list as this code uses it: artifacts fitted before the multi-GPU planner
    priced ``lorafusion``/``grouped`` with their own fits say those plans are a roofline ratio on
    several GPUs; that text is replaced by what is done now (the measurements are the same)."""
    return {k: [t.replace(_OLD_MULTI, SEED_PLANS_MULTI_GPU) for t in v] for k, v in terms.items()}
