"""Worker of tests/test_multiprocess.py: `python -m gedl_jax.train ARGS` with the epoch ends
deferred as off the CPU (`training.DEFER_EPOCH_ENDS`), so the path an accelerator's processes
take (validation and checkpoints after the next call is queued, saved by the loop itself: no
saver thread with several processes) runs on CPU processes. Its last line counts the epoch ends
that were deferred, so a test knows that the path ran.

    python train_deferred.py ARGS...
"""

import sys

from gedl_jax.commands import train
from gedl_jax.run import training


def main() -> int:
    training.DEFER_EPOCH_ENDS = True
    finished = []
    finish = training._Loop.finish_epoch_end

    def counted(loop):
        assert loop.saver is None, "several processes save in the loop's own thread"
        finished.append(loop.pending.step)
        finish(loop)

    training._Loop.finish_epoch_end = counted
    try:
        return train.main()
    finally:
        print(f"deferred epoch ends at steps {finished}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
