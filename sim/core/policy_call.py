"""Asking a policy to decide, with its failures reported as the policy's, not the simulator's.

A policy is user code (often a plug-in, ``--policy-module``): its ``decide()`` may raise, or
return None or a value that is not a sequence of actions. :func:`decide_checked` turns either into
a :class:`PolicyError`, an :class:`~tlora_sim.sim.core.invariants.InvariantError` like an invalid
action (the CLI exits with status 3), whose one line names the policy, the simulated time and the
exception, and which carries the traceback as text (so it survives pickling from a ``compare``
worker process; ``rundir.staged_dir`` writes it to ``error.txt`` of the kept staging directory).
"""

from __future__ import annotations

import traceback
from typing import Any, Sequence

from tlora_sim.sim.core.invariants import InvariantError


class PolicyError(InvariantError):
    """A policy's ``decide()`` raised, or returned something that is not a sequence of actions.

    Attributes:
        policy: the policy's name.
        time_s: simulated time of the decision (s).
        what: ``Type: message`` of the exception, or what was returned.
        traceback_text: the policy's traceback as formatted where it was caught ("" for a bad
            return value); travels with the error across processes (``compare --workers``).
        traceback_file: where the traceback was written (``rundir.staged_dir``), or None.
    """

    def __init__(self, policy: str, time_s: float, what: str, traceback_text: str = "") -> None:
        self.policy = policy
        self.time_s = float(time_s)
        self.what = what
        self.traceback_text = traceback_text
        self.traceback_file: str | None = None
        super().__init__(f"policy {policy!r} failed in decide() at t={self.time_s:.6f}s: {what}")


def _name(policy: Any) -> str:
    return str(getattr(policy, "name", None) or type(policy).__name__)


def decide_checked(policy: Any, snap: Any, now_s: float) -> Sequence[Any]:
    """``policy.decide(snap)``, checked: a list or tuple passes at the cost of one class test;
    any other iterable (not a string) passes too.

    Args:
        policy: the policy (``tlora_sim.policies.registry.Policy``).
        snap: the snapshot it decides on.
        now_s: simulated time of the decision (s), for the message.

    Raises:
        PolicyError: ``decide`` raised (any exception, ``SystemExit`` and ``GeneratorExit``
            included; ``KeyboardInterrupt`` propagates, and an ``InvariantError`` raised inside it
            is re-raised as is), or returned None, a string or a non-iterable.
    """
    try:
        actions = policy.decide(snap)
    except InvariantError:
        raise
    except (Exception, SystemExit, GeneratorExit) as e:  # noqa: BLE001 - the policy's bug (exit 3)
        text = " ".join(str(e).split())
        raise PolicyError(_name(policy), now_s, f"{type(e).__name__}: {text}" if text else type(e).__name__,
                          traceback.format_exc()) from None
    cls = actions.__class__
    if cls is not list and cls is not tuple and (
            actions is None or isinstance(actions, (str, bytes)) or not hasattr(actions, "__iter__")):
        raise PolicyError(_name(policy), now_s, f"returned {actions!r} instead of a sequence of actions")
    return actions
