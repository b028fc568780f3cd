"""The default rank program of the torch.distributed tests (job_runner.run_job starts one per
rank; test_backend.py's tests and some of test_security.py's run it).

    python dist_jobs.py SCENARIO --rank R --world-size N --init-method URL --result FILE

The command line, the result file and the helpers are job_harness.py's. The scenarios:
collective_jobs.py (collectives, ddp: results against Gloo's), failure_jobs.py (errors,
killed_peer, no_show: calls that must fail) and lifecycle_jobs.py (lifecycle, device_map,
torchrun, destroy_race).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from collective_jobs import scenario_collectives, scenario_ddp
from failure_jobs import scenario_errors, scenario_killed_peer, scenario_no_show
from job_harness import Checks, main
from lifecycle_jobs import (
    scenario_destroy_race,
    scenario_device_map,
    scenario_lifecycle,
    scenario_torchrun,
)

SCENARIOS: dict[str, Callable[[argparse.Namespace, Checks], None]] = {
    "collectives": scenario_collectives,
    "ddp": scenario_ddp,
    "errors": scenario_errors,
    "killed_peer": scenario_killed_peer,
    "lifecycle": scenario_lifecycle,
    "device_map": scenario_device_map,
    "torchrun": scenario_torchrun,
    "destroy_race": scenario_destroy_race,
    "no_show": scenario_no_show,
}


if __name__ == "__main__":
    sys.exit(main(SCENARIOS, leave_hard=("killed_peer",)))
