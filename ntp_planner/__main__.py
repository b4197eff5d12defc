"""``python -m ntp_planner``: the `ntp` command, for when the script is not on PATH."""

from ntp_planner.cli import main

if __name__ == "__main__":
    main()
