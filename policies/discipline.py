"""Queue discipline as two separate axes: a priority order and a backfilling rule.

A policy's *queue discipline* says in which order waiting jobs are considered (``order``) and
whether a job that cannot start blocks the ones behind it (``backfill``):

* ``order``: ``fifo`` (arrival), ``urgency`` (tLoRA's response ratio), ``srpt`` (shortest
  isolated remaining runtime), ``sjf`` (shortest isolated runtime of the whole job),
  ``srpt-aged`` (SRPT with a starvation guard: a job whose urgency exceeds ``AGING_FACTOR``
  goes first; ``tlora_sim.policies.ordering``);
* ``backfill``: ``easy`` (EASY backfilling, Lifka 1995: the first waiting job that cannot start
  gets a reservation, later jobs start if they do not delay it), ``conservative`` (every waiting
  job ahead keeps a reservation), ``none`` (strict head-of-line: the first job that cannot start
  stops every later start).

Every policy takes both as options (``--option NAME.order=sjf``, ``--option NAME.backfill=none``).
``none`` is never a policy's default. The older single ``ordering`` option maps onto the two axes
through :data:`LEGACY_ORDERING` (kept so that existing scripts keep their meaning).

``compare --discipline`` chooses, for every policy of a comparison, one of :data:`DISCIPLINES`:
``default`` (each policy's own order, with EASY backfilling: the reference's backfilling for all),
``shared`` (the reference's FIFO order and EASY backfilling for all) or ``native`` (each system
exactly as its paper or repository describes it, :data:`NATIVE`).
"""

from __future__ import annotations

from tlora_sim.traces.errors import InputError

ORDERS: tuple[str, ...] = ("fifo", "urgency", "srpt", "sjf", "srpt-aged")
"""Priority orders (``order`` option)."""

BACKFILLS: tuple[str, ...] = ("easy", "conservative", "none")
"""Backfilling rules (``backfill`` option)."""

LEGACY_ORDERING: dict[str, tuple[str, str]] = {
    "fifo": ("fifo", "none"),
    "backfill": ("fifo", "easy"),
    "urgency": ("urgency", "none"),
    "srpt": ("srpt", "none"),
}
"""The old ``ordering=`` values as ``(order, backfill)``: same behaviour as before the split."""

DISCIPLINES: tuple[str, ...] = ("default", "shared", "native")
"""Values of ``compare --discipline``."""

NATIVE: dict[str, dict[str, str]] = {
    # Each seed system's published discipline (the policy modules' docstrings give the sources).
    "independent": {"order": "fifo", "backfill": "none"},
    "independent-backfill": {"order": "fifo", "backfill": "easy"},
    "independent-fused": {"order": "fifo", "backfill": "easy"},
    "mlora": {"order": "fifo", "backfill": "none"},
    "lorafusion": {"order": "fifo", "backfill": "none"},
    "alto": {"order": "fifo", "backfill": "none"},
    "tlora": {"order": "urgency", "backfill": "easy"},
}
"""Each built-in system's own discipline; a policy not listed keeps its defaults under ``native``."""


def _check_name(value: str, known: tuple[str, ...], what: str, field: str) -> str:
    """``value`` if it is one of ``known``, else InputError naming them (``field``)."""
    if value not in known:
        raise InputError(f"unknown {what} {value!r}; known: {', '.join(known)}", field=field)
    return value


def check_order(order: str) -> str:
    """Validate a priority order name.

    Raises:
        InputError: unknown name (the message lists the known ones).
    """
    return _check_name(order, ORDERS, "priority order", "order")


def check_backfill(backfill: str) -> str:
    """Validate a backfilling rule name.

    Raises:
        InputError: unknown name (the message lists the known ones).
    """
    return _check_name(backfill, BACKFILLS, "backfilling", "backfill")


def discipline_options(policy: str, discipline: str) -> dict[str, str]:
    """The ``order``/``backfill`` options that ``compare --discipline discipline`` gives ``policy``.

    Args:
        policy: a registered policy name (``<name>-nogroup`` ablations use their base's entry).
        discipline: one of :data:`DISCIPLINES`.

    Returns:
        Options to merge under the user's own ``--option`` values (the user's win); empty for
        ``default`` (every policy's default is already EASY backfilling with its own order).

    Raises:
        InputError: unknown discipline.
    """
    _check_name(discipline, DISCIPLINES, "discipline", "--discipline")
    if discipline == "default":
        return {}
    if discipline == "shared":
        return {"order": "fifo", "backfill": "easy"}
    base = policy[: -len("-nogroup")] if policy.endswith("-nogroup") else policy
    return dict(NATIVE.get(base, {}))
