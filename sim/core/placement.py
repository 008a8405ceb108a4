"""GPU placement: which nodes' GPUs a group gets. Pure functions over a free-GPU vector.

Jobs of at most one node's GPUs go on one node, best fit (the node with the fewest free GPUs
that still fits, lowest index on ties), which keeps whole nodes free for large jobs. Larger jobs
take whole free nodes, preferring a rack with enough of them (fewest nodes left over, lowest
rack first), and put any remainder best-fit.
"""

from __future__ import annotations

from dataclasses import dataclass

Placement = tuple[tuple[int, int], ...]
"""((node, gpus), ...) sorted by node."""


@dataclass
class FreeGpus:
    """Free GPUs per node; a mutable working copy a policy may plan on.

    Attributes:
        free: free GPU count per node (list of int, one per node). Change it only through
            :meth:`apply` (or :meth:`take`): the object keeps, next to it, how many nodes have each
            free count and the cluster total, so that :meth:`find` answers a one-node request from
            those counts (one C-level ``list.index``) instead of a Python scan of every node.
        gpus_per_node: GPUs in each node.
        nodes_per_rack: nodes in a rack.
    """

    free: list[int]
    gpus_per_node: int
    nodes_per_rack: int = 4

    def __post_init__(self) -> None:
        count = [0] * (self.gpus_per_node + 1)
        for f in self.free:
            count[f] += 1
        self._count = count  # nodes with c free GPUs, c = 0..gpus_per_node
        self._total = sum(self.free)

    @property
    def total(self) -> int:
        """Free GPUs in the cluster."""
        return self._total

    def copy(self) -> "FreeGpus":
        """An independent copy to plan on."""
        c = FreeGpus.__new__(FreeGpus)
        c.free, c.gpus_per_node, c.nodes_per_rack = list(self.free), self.gpus_per_node, self.nodes_per_rack
        c._count, c._total = list(self._count), self._total
        return c

    def find(self, n_gpus: int) -> Placement | None:
        """Where ``n_gpus`` GPUs would go now, or None if they do not fit (nothing is taken).

        The same answer as :func:`place` on ``free``: for a one-node request the best fit is the
        lowest-index node among those with the fewest free GPUs that still fit, i.e. the first
        node whose free count is the smallest non-empty count >= ``n_gpus``."""
        if n_gpus <= 0 or n_gpus > self._total:
            return None
        if n_gpus <= self.gpus_per_node:
            count = self._count
            for c in range(n_gpus, self.gpus_per_node + 1):
                if count[c]:
                    return ((self.free.index(c), n_gpus),)
            return None
        if self._count[self.gpus_per_node] < n_gpus // self.gpus_per_node:  # too few whole nodes
            return None
        return place(self.free, n_gpus, self.gpus_per_node, self.nodes_per_rack)

    def take(self, n_gpus: int) -> Placement | None:
        """Find and reserve ``n_gpus`` GPUs; None (and nothing reserved) if they do not fit."""
        p = self.find(n_gpus)
        if p is not None:
            self.apply(p, -1)
        return p

    def apply(self, placement: Placement, sign: int) -> None:
        """Reserve (sign=-1) or release (sign=+1) a placement.

        Raises:
            RuntimeError: the result would leave a node below 0 or above its GPUs (double booking);
                nodes before the offending one in ``placement`` stay changed, as before.
        """
        free, count = self.free, self._count
        for node, k in placement:
            v = free[node] + sign * k
            if v < 0 or v > self.gpus_per_node:
                raise RuntimeError(f"GPU accounting broken on node {node}: {free[node]} free, change {sign * k}")
            count[free[node]] -= 1
            count[v] += 1
            self._total += sign * k
            free[node] = v


def place(free: list[int], n_gpus: int, gpus_per_node: int, nodes_per_rack: int = 4) -> Placement | None:
    """Choose GPUs for a group of ``n_gpus`` GPUs given ``free`` per node (see module docstring).

    Returns:
        The placement, or None when the free GPUs cannot host it.
    """
    if n_gpus <= 0 or n_gpus > sum(free):
        return None
    if n_gpus <= gpus_per_node:
        best = -1
        for node, f in enumerate(free):
            if f >= n_gpus and (best < 0 or f < free[best]):
                best = node
                if f == n_gpus:
                    break
        return None if best < 0 else ((best, n_gpus),)
    full, rest = divmod(n_gpus, gpus_per_node)
    whole = [i for i, f in enumerate(free) if f == gpus_per_node]
    if len(whole) < full:
        return None
    by_rack: dict[int, list[int]] = {}
    for i in whole:
        by_rack.setdefault(i // nodes_per_rack, []).append(i)
    fitting = [(len(v) - full, r) for r, v in by_rack.items() if len(v) >= full]
    chosen = by_rack[min(fitting)[1]][:full] if fitting else whole[:full]
    out = [(i, gpus_per_node) for i in chosen]
    if rest:
        left = [f if i not in chosen else 0 for i, f in enumerate(free)]
        tail = place(left, rest, gpus_per_node, nodes_per_rack)
        if tail is None:
            return None
        out += list(tail)
    return tuple(sorted(out))
