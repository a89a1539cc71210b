"""The command the demo prints for serving its store's dashboard afterwards."""

from __future__ import annotations

import shlex

from inferpath.demo.run import DemoOptions, up_command


def test_the_default_dashboard_port_needs_no_flag() -> None:
    assert up_command("chdb:///tmp/demo", DemoOptions.dashboard_port) == "inferpath up --store chdb:///tmp/demo"


def test_a_chosen_dashboard_port_is_passed_on_and_paths_are_quoted() -> None:
    command = up_command("chdb:///tmp/my demo", 47002)
    assert shlex.split(command) == ["inferpath", "up", "--store", "chdb:///tmp/my demo", "--dashboard-port", "47002"]
