"""The exactness check: the reference run, every holder compared, the measurement, the cuts
against the planner's shares, and what the cost model predicts."""
