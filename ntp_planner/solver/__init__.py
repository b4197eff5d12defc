"""WHAT layout to run: the uniform search, per-layer TP degrees, the stage solvers, placement on
the topology, and the planner that ties them into a Plan (with why each runner-up lost)."""
