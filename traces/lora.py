"""Seeded, configurable assignment of LoRA attributes to trace jobs.

No public trace records LoRA attributes, so a replay keeps each job's arrival, GPU count and duration
from the trace and draws base model, rank, batch size, sequence length and tolerated slowdown from a
named, documented distribution. The default ``tlora`` follows the tLoRA reproduction described in
``docs/model.md`` ("Traces"): ranks {2, 4, 8, 16}, {1, 2, 4, 8} sequences per GPU per micro-batch
(``micro_batch_per_gpu``; the global batch follows from the job's data-parallel degree), no gradient
accumulation (``grad_accum`` 1: no public trace records it), base models
Llama-3-8B and Qwen3-8B, all uniform; sequence lengths {512, 1024, 2048} tokens uniform and tolerated
slowdown {1.25: 25 %, 1.5: 50 %, 2.0: 25 %} are this project's choices (tLoRA's scheduler keeps every
member within its tolerated slowdown).

Named distributions: ``tlora`` (default) and ``mixed-ranks`` (as ``tlora`` but ranks
{4, 8, 16, 32, 64, 128} uniform: the heterogeneous-rank case where padding to the largest rank hurts),
and ``llm-cluster`` (an LLM cluster's fine-tuning mix: Llama-3-8B 40 %, Qwen3-8B 30 %, Qwen2.5-32B 20 %,
Llama-3-70B 10 %; ranks {8, ..., 128} and sequences {1024, 2048, 4096} uniform; this project's choice;
70B only for jobs of >= 4 GPUs: its bf16 weights (141 GB) fill two H100s before any activation, so a
smaller job draws one of the other models instead).
A JSON file with the fields of :class:`LoraDistribution` (``to_dict`` form) also works.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError
from tlora_sim.traces.job_attrs import TRACE_ATTRS

LORA_COLUMNS: tuple[str, ...] = ("model", "rank", "micro_batch_per_gpu", "grad_accum", "seq_len", "max_slowdown")
#: the fields of a distribution that are value -> probability tables
TABLES: tuple[str, ...] = ("models", "ranks", "micro_batch_per_gpu", "grad_accum", "seq_lens", "max_slowdown")


def _uniform(values: list) -> dict:
    return {v: 1.0 / len(values) for v in values}


@dataclass(frozen=True)
class LoraDistribution:
    """Independent categorical distributions (value -> probability) of the LoRA attributes of a job.

    Fields: ``models`` (base model name), ``ranks`` (LoRA rank r), ``micro_batch_per_gpu`` (sequences
    per model replica per micro-batch; a job's global batch is this x its data-parallel degree x
    ``grad_accum``, fixed when its parallelism plan is chosen: ``sim/core/workload.py``),
    ``grad_accum`` (micro-batches per optimizer step), ``seq_lens`` (tokens/sequence),
    ``max_slowdown`` (tolerated slowdown factor >= 1 vs running alone), and ``min_gpus`` (model ->
    fewest GPUs a job of that model asks for: a job asking fewer draws its model from the others,
    renormalised; not a probability table). JSON files may say ``batch_sizes`` for
    ``micro_batch_per_gpu`` (earlier versions' name).

    Raises:
        InputError: empty table, a probability <= 0, probabilities not summing to 1 (within 1e-6),
            a rank/batch/seq length < 1, a slowdown < 1, an empty model name.
    """

    name: str = "tlora"
    models: dict[str, float] = field(default_factory=lambda: {"llama3-8b": 0.5, "qwen3-8b": 0.5})
    ranks: dict[int, float] = field(default_factory=lambda: _uniform([2, 4, 8, 16]))
    micro_batch_per_gpu: dict[int, float] = field(default_factory=lambda: _uniform([1, 2, 4, 8]))
    seq_lens: dict[int, float] = field(default_factory=lambda: _uniform([512, 1024, 2048]))
    max_slowdown: dict[float, float] = field(default_factory=lambda: {1.25: 0.25, 1.5: 0.5, 2.0: 0.25})
    grad_accum: dict[int, float] = field(default_factory=lambda: {1: 1.0})
    min_gpus: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for model, k in self.min_gpus.items():
            if model not in self.models or not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
                raise InputError(f"min_gpus: {model!r} -> {k!r} must name one of the models and an integer >= 1",
                                 field="min_gpus")
        if self.min_gpus and all(k > 1 for m, k in self.min_gpus.items()) and set(self.min_gpus) >= set(self.models):
            raise InputError("min_gpus leaves no model for one-GPU jobs", field="min_gpus")
        for fname in TABLES:
            table = getattr(self, fname)
            if not isinstance(table, Mapping) or not table:
                raise InputError("must be a non-empty value -> probability table", field=fname)
            probs = list(table.values())
            if any(not isinstance(p, (int, float)) or not p > 0 for p in probs):
                raise InputError(f"probabilities must be > 0, got {probs}", field=fname)
            if abs(math.fsum(probs) - 1.0) > 1e-6:
                raise InputError(f"probabilities must sum to 1, got {math.fsum(probs):.9g}", field=fname)
            for value in table:
                if fname == "models":
                    ok = isinstance(value, str) and value.strip() != ""
                elif fname == "max_slowdown":
                    ok = isinstance(value, (int, float)) and 1.0 <= value < math.inf
                else:
                    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1
                if not ok:
                    raise InputError(f"invalid value {value!r}", field=fname)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (table keys become strings)."""
        d = asdict(self)
        return {k: ({str(kk): vv for kk, vv in v.items()} if isinstance(v, dict) else v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LoraDistribution":
        """Inverse of :meth:`to_dict`; missing tables take the ``tlora`` defaults.

        Raises:
            InputError: unknown field, key not convertible to its type, or the checks of the class.
        """
        d = dict(d)
        if "batch_sizes" in d and "micro_batch_per_gpu" not in d:
            d["micro_batch_per_gpu"] = d.pop("batch_sizes")
        known = {"name", "min_gpus", *TABLES}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"unknown fields {sorted(unknown)}; expected {sorted(known)}", field=sorted(unknown)[0])
        kinds = {"models": str, "ranks": int, "micro_batch_per_gpu": int, "grad_accum": int, "seq_lens": int,
                 "max_slowdown": float}
        kw: dict[str, Any] = {}
        for fname, value in d.items():
            if fname == "name":
                kw["name"] = str(value)
                continue
            if fname == "min_gpus":
                if not isinstance(value, Mapping) or not all(isinstance(v, int) for v in value.values()):
                    raise InputError("must be an object model -> integer", field=fname)
                kw[fname] = {str(k): int(v) for k, v in value.items()}
                continue
            if not isinstance(value, Mapping):
                raise InputError("must be an object value -> probability", field=fname)
            try:
                kw[fname] = {kinds[fname](k): float(p) for k, p in value.items()}
            except (TypeError, ValueError) as e:
                raise InputError(f"bad entry ({e})", field=fname) from None
        return cls(**kw)


DISTRIBUTIONS: dict[str, LoraDistribution] = {
    "tlora": LoraDistribution(),
    "mixed-ranks": LoraDistribution(name="mixed-ranks", ranks=_uniform([4, 8, 16, 32, 64, 128])),
    "llm-cluster": LoraDistribution(
        name="llm-cluster",
        models={"llama3-8b": 0.4, "qwen3-8b": 0.3, "qwen2.5-32b": 0.2, "llama3-70b": 0.1},
        ranks=_uniform([8, 16, 32, 64, 128]), seq_lens=_uniform([1024, 2048, 4096]),
        min_gpus={"llama3-70b": 4}),
}


#: largest LoRA distribution JSON accepted (bytes): a distribution is five small tables.
MAX_JSON_BYTES = 1 << 20


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook: an object with a repeated key is an error, not "last one wins"."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def load_distribution(name_or_json_path: str) -> LoraDistribution:
    """A registered distribution by name, or one read from a JSON file (``to_dict`` form).

    Raises:
        InputError: neither a known name nor an existing file (lists the names), unreadable or invalid JSON,
            a file over ``MAX_JSON_BYTES``, nesting too deep, a key repeated in one object, invalid tables
            (field named).
    """
    if name_or_json_path in DISTRIBUTIONS:
        return DISTRIBUTIONS[name_or_json_path]
    path = Path(name_or_json_path)
    if not path.is_file():
        raise InputError(f"unknown LoRA distribution {name_or_json_path!r}; known: "
                         f"{', '.join(sorted(DISTRIBUTIONS))}, or a JSON file path", field="lora")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise InputError(f"is {path.stat().st_size:,} bytes; a LoRA distribution is a few tables "
                         f"(limit {MAX_JSON_BYTES:,} bytes)", file=str(path))
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read LoRA distribution JSON ({e})", file=str(path)) from None
    except RecursionError:
        raise InputError("cannot read LoRA distribution JSON (nested too deeply)", file=str(path)) from None
    except _DuplicateKey as e:
        raise InputError(f"key {e.args[0]!r} appears twice in one object", file=str(path),
                         field=str(e.args[0])) from None
    if not isinstance(data, dict):
        raise InputError("LoRA distribution JSON must be an object", file=str(path))
    data.setdefault("name", path.stem)
    try:
        return LoraDistribution.from_dict(data)
    except InputError as e:
        raise InputError(e.message, file=str(path), field=e.field) from None


def _draw(rng: np.random.Generator, table: Mapping, n: int, dtype: Any) -> np.ndarray:
    values = np.array(list(table.keys()), dtype=dtype)
    p = np.array(list(table.values()), dtype=np.float64)
    return rng.choice(values, size=n, p=p / p.sum())


def assign_lora(trace: pd.DataFrame, dist: LoraDistribution, rng: np.random.Generator) -> pd.DataFrame:
    """Return a copy of ``trace`` with LoRA attributes drawn independently per job, except those the
    trace gives (:mod:`tlora_sim.traces.job_attrs` columns).

    Draws (vectorised ``rng.choice``, one call per attribute over all rows, in this fixed order, table
    entries in their dict order): ``model`` (str), ``rank`` (int64), ``micro_batch_per_gpu`` (int64,
    sequences per model replica per micro-batch), ``seq_len`` (int64, tokens), ``max_slowdown``
    (float64), ``grad_accum`` (int64); then, where ``dist.min_gpus`` rules a drawn model out for a
    job's ``num_gpus``, that job's model again from the allowed ones (one draw per GPU count, in
    ascending order). Arrival, GPU count and duration are unchanged; ``attrs["lora_distribution"]``
    records ``dist.to_dict()``. Same rng state -> identical output.

    Attributes in the trace replace the drawn value row by row (every draw is still made, so the rows
    the trace leaves open get the same values as without the trace's columns): ``model``, ``rank``,
    ``seq_len``, ``max_slowdown`` as given; ``batch_size`` B (sequences per optimizer step of the job)
    becomes ``micro_batch_per_gpu = max(1, ceil(B / num_gpus))`` and ``grad_accum = 1`` (a sequence is
    never split across GPUs, so the batch run is the nearest multiple of the data-parallel degree:
    ``jobs.csv``'s ``batch_size`` shows it); ``steps`` is kept as a column (``build_jobs`` runs that
    many steps instead of deriving them from the duration). A trace with any attribute column gets
    ``attrs_from_trace`` (str): the attributes that row took from the trace, ``;``-separated in
    :data:`~tlora_sim.traces.job_attrs.TRACE_ATTRS` order (``""``: all drawn).

    Raises:
        InputError: ``trace`` already has a drawn-only LoRA column (``micro_batch_per_gpu``, ``grad_accum``).
    """
    given = {c: trace[c].to_numpy() for c in TRACE_ATTRS if c in trace.columns}
    clash = [c for c in LORA_COLUMNS if c in trace.columns and c not in given]
    if clash:
        raise InputError(f"trace already has LoRA columns {clash}", field=clash[0])
    n = len(trace)
    out = trace.drop(columns=list(given)).copy() if given else trace.copy()
    has_model = given["model"] != "" if "model" in given else np.zeros(n, dtype=bool)
    models = _draw(rng, dist.models, n, object)
    out["rank"] = _draw(rng, dist.ranks, n, np.int64)
    out["micro_batch_per_gpu"] = _draw(rng, dist.micro_batch_per_gpu, n, np.int64)
    out["seq_len"] = _draw(rng, dist.seq_lens, n, np.int64)
    out["max_slowdown"] = _draw(rng, dist.max_slowdown, n, np.float64)
    out["grad_accum"] = _draw(rng, dist.grad_accum, n, np.int64)
    if dist.min_gpus and n:
        gpus = out["num_gpus"].to_numpy(np.int64)
        need = np.array([dist.min_gpus.get(m, 1) for m in models])
        redraw = (need > gpus) & ~has_model
        for g in np.unique(gpus[redraw]):
            rows = np.flatnonzero((gpus == g) & redraw)
            allowed = {m: p for m, p in dist.models.items() if dist.min_gpus.get(m, 1) <= g}
            models[rows] = _draw(rng, allowed, len(rows), object)
    from_trace = {}
    if "model" in given:
        models[has_model] = given["model"][has_model]
        from_trace["model"] = has_model
    for col in ("rank", "seq_len", "max_slowdown", "batch_size"):
        if col in given:
            mask = ~np.isnan(given[col].astype(np.float64))
            from_trace[col] = mask
            if col == "batch_size":
                gpus = out["num_gpus"].to_numpy(np.int64)
                mb = np.maximum(1, np.ceil(given[col][mask] / gpus[mask])).astype(np.int64)
                out.loc[mask, "micro_batch_per_gpu"] = mb
                out.loc[mask, "grad_accum"] = 1
            else:
                kind = np.float64 if col == "max_slowdown" else np.int64
                values = out[col].to_numpy().copy()
                values[mask] = given[col][mask].astype(kind)
                out[col] = values
    out["model"] = pd.Series(models, index=out.index, dtype=str)
    if "steps" in given:
        out["steps"] = given["steps"].astype(np.float64)
        from_trace["steps"] = ~np.isnan(out["steps"].to_numpy())
    if given:
        names = [c for c in TRACE_ATTRS if c in from_trace]
        marks = np.column_stack([from_trace[c] for c in names])
        out["attrs_from_trace"] = pd.Series([";".join(c for c, m in zip(names, row) if m) for row in marks],
                                            index=out.index, dtype=str)
    out.attrs = copy.deepcopy(trace.attrs)
    out.attrs["lora_distribution"] = dist.to_dict()
    return out


def check_models(trace: pd.DataFrame, known: Sequence[str]) -> None:
    """Check the base models a trace gives (its ``model`` column, if any) against the catalog.

    Args:
        trace: a trace table (``traces.frame``), possibly with a ``model`` column (``""`` = not given).
        known: the model names the cost model knows (``tlora_sim.sim.costmodel.models.MODELS``).

    Raises:
        InputError: the first unknown name, naming the file and data row it came from and the file's
            column (``attrs["attr_columns"]["model"]``); the message lists the known names.
    """
    if "model" not in trace.columns:
        return
    names = trace["model"].to_numpy(dtype=object)
    bad = (names != "") & ~np.isin(names, np.asarray(list(known), dtype=object))
    if bad.any():
        from tlora_sim.traces.frame import source_of

        i = int(np.argmax(bad))
        file, row = source_of(trace, i)
        raise InputError(f"unknown base model {names[i]!r}; known: {', '.join(sorted(known))}", file=file, row=row,
                         field=trace.attrs.get("attr_columns", {}).get("model", "model"))
