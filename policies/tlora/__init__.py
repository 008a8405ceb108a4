"""tLoRA (arXiv 2602.07263) as a package: the rules, the plain policy built on them, the speed index,
and the registered policy that wires rules and index (see ``policy``'s docstring).

Public face: ``TLoRA`` (registered as ``tlora``) and ``TLoRAConfig``.
"""

from tlora_sim.policies.tlora.config import TLoRAConfig
from tlora_sim.policies.tlora.policy import TLoRA

__all__ = ["TLoRA", "TLoRAConfig"]
