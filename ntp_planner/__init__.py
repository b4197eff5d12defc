"""WHAT TO DO: layout search, Plan, placement, reports and the `ntp` CLI.

Import submodules directly (``ntp_planner.solver.planner``, ``ntp_planner.plan``); this package
imports nothing at start-up so `ntp --help` stays fast.
"""

__version__ = "0.1.0"
