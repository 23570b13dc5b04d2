"""Worker of tests/test_multiprocess.py: join a jax.distributed job and check a workdir.

    python check_workdir.py COORDINATOR_ADDRESS NUM_PROCESSES PROCESS_ID WORKDIR

Exit 0 when `rundir.check_shared_workdir` accepts WORKDIR, 3 when it raises (message printed).
"""

import pathlib
import sys

import jax

from gedl_jax.run import rundir


def main() -> int:
    address, num_processes, process_id, workdir = sys.argv[1:5]
    jax.distributed.initialize(address, int(num_processes), int(process_id),
                               initialization_timeout=120, heartbeat_timeout_seconds=10)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        rundir.check_shared_workdir(workdir)
    except ValueError as e:
        print(f"error: {e}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
