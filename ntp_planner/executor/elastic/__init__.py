"""Live recovery: faults, membership, the worker's generations, the coordinator, the next layout
and how the state moves to it."""
