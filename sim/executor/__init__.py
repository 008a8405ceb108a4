"""sim/executor: the real-time executor (``tlora-sim execute``) and its validation against the
simulator (``tlora-sim validate-run``); docs/executor.md.

Modules: ``workload`` (the scaled-down jobs, ``workload.csv``), ``trainer`` (real LoRA training on
one device, needs torch), ``clock`` (wall and virtual clocks, device ids), ``runtime`` (the loop
driving a policy through snapshots and actions), ``execute`` (a run directory), ``steptable``
(cost models from a run's measured steps), ``planning`` (a policy planning with the executed
run's model), ``validate`` (replay and compare), ``figure`` (``validation.png``).
"""
