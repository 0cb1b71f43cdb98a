"""Writes the checkpoints of tests/test_checkpoint_compat.py with the code of the day it runs
(the files here came out of commit 20ca9da, before steadystep.decentral became a package): a
flat run and a torch-module run saved after two steps, and where each stood two steps later.
From the repository root: python -m tests.data.checkpoints.make (rewrite them only for a
new checkpoint format, and keep the old files too)."""

import numpy as np

from tests.test_checkpoint_compat import DATA, batch, flat_run, gradient, trainer_run


def main() -> None:
    run = flat_run()
    for t in range(2):
        run.step(gradient(t))
    run.save(DATA / "decentral_t2.npz", extra={"note": "saved by 20ca9da"}, arrays={"seen": np.arange(3.0)})
    for t in range(2, 4):
        run.step(gradient(t))
    np.savez(DATA / "decentral_t4_expected.npz", params=run.params, exp_avg=run.exp_avg, exp_avg_sq=run.exp_avg_sq)

    trainer = trainer_run()
    for t in range(2):
        trainer.step(*batch(t))
    trainer.save(DATA / "trainer_t2.npz", extra={"note": "saved by 20ca9da"})
    for t in range(2, 4):
        trainer.step(*batch(t))
    state = {f"rows{index}": rows.numpy() for index, rows in enumerate(trainer.rows)}
    state |= {f"buffer/{name}": stacked.numpy() for name, stacked in trainer.buffers.items()}
    np.savez(DATA / "trainer_t4_expected.npz", **state)


if __name__ == "__main__":
    main()
