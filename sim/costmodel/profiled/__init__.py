"""The profiled cost model (predictions from measurements of real GPUs), in five rooms, each
importing only the ones before it:

* ``artifact``: the artifact files, their schema and in-depth checks, and their identity (``register``);
* ``tables``: one model's measured curves, interpolated (``Tables``, ``tables_of``);
* ``formula``: the step formula, one implementation over floats or arrays (``layer_formula``,
  ``step_s``, ``opt_ms``), called by the scalar ``layer_ms`` and the vectorised ``FusedBatch``;
* ``multigpu``: the planner on several GPUs (``plan_step``, ``best_plan``) and its vectorised
  lower bound (``PlannerBatch``);
* ``model``: the ``CostModel`` (``ProfiledCostModel``) and its one answer memo (``memo_of``).

Import from the room (``tlora_sim.sim.costmodel.profiled.model``); this file re-exports nothing.
"""
