"""``python -m ntp_planner.cli``: the `ntp` command."""

from ntp_planner.cli import main

if __name__ == "__main__":
    main()
