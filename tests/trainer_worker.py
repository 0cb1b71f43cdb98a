"""Run by tests/test_distributed_trainer.py under torchrun: a few steps of a torch module with one
worker per rank (DistributedTrainer); and the in-process trainer the tests compare it with."""

import argparse
import sys

import numpy as np
import torch

from steadystep import compress, decentral, dispatch
from steadystep.ranks import RankError
from steadystep.torch.decentral import DecentralizedTrainer
from tests.rank_worker import barrier, topology_named


def model(seed: int, batch_norm: bool = False, classes: int = 3) -> torch.nn.Module:
    """Two classes of hyper-parameters (a group with its own lr scale) and a frozen parameter;
    with ``batch_norm``, buffers too (floating and integer). vmap's rule for batch norm sums
    in another order over N workers than over one, so only without it does the in-process
    trainer compute each worker's gradient exactly as a rank does."""
    torch.manual_seed(seed)
    norm = torch.nn.BatchNorm1d(7) if batch_norm else torch.nn.LayerNorm(7)
    module = torch.nn.Sequential(torch.nn.Linear(5, 7), norm, torch.nn.Tanh(), torch.nn.Linear(7, classes, bias=False))
    module[1].weight.requires_grad_(False)
    return module.double()


def options(
    module: torch.nn.Module, topology: str, order: str, size: int, adaptive: bool, communication: str = ""
) -> dict:
    """The trainer's options; ``communication``: "int8" (compressed gossip) or "diloco" (outer
    steps every 2, their pseudo-gradients in top-k 50 %)."""
    extra: dict = {}
    if communication == "int8":
        extra = dict(compression=compress.int8(), seed=3)
    elif communication == "diloco":
        extra = dict(outer=decentral.DiLoCo(every=2), compression=compress.top_k(0.5), seed=3)
    lr = decentral.TokenSchedule(
        workers=size, batch=6, context=1, warmup_tokens=6 * size, total_tokens=60 * size, base_lr=0.05
    )
    return dict(
        topology=topology_named(topology, size),
        order=order,
        lr=lr,
        weight_decay=0.01,
        max_norm=0.5,
        consensus=(decentral.AdaptiveConsensus(power=1.0) if adaptive else 0.75) if communication != "diloco" else 1.0,
        groups=[{"params": [module[3].weight], "lr_scale": 0.5}],
        vmap=True,  # the ranks' way (one worker each): the in-process trainer then equals them bit for bit
        **extra,
    )


def batch(rank: int, t: int, poison: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * t + rank)
    inputs = torch.randn(6, 5, generator=generator, dtype=torch.float64)
    if poison == (rank, t):
        inputs[0, 0] = torch.inf
    return inputs, torch.randint(0, 3, (6,), generator=generator)


def simulate(
    size: int,
    topology: str,
    order: str,
    steps: int,
    adaptive: bool = False,
    batch_norm: bool = False,
    communication: str = "",
) -> DecentralizedTrainer:
    """The in-process run with N workers that the ranks must match."""
    module = model(0, batch_norm)
    trainer = DecentralizedTrainer(module, size, **options(module, topology, order, size, adaptive, communication))
    for t in range(steps):
        inputs, targets = zip(*(batch(rank, t) for rank in range(size)))
        trainer.step(torch.stack(inputs), torch.stack(targets))
    return trainer


def communication_state(trainer: DecentralizedTrainer) -> np.ndarray:
    """Every class's public copies or outer state side by side, [N, ·] ([N, 0] for dense gossip)."""
    state = [
        np.asarray(value)
        for optimizer in trainer.optimizers
        for name, value in sorted(optimizer.buffers.items())
        if name not in ("params", "exp_avg", "exp_avg_sq")
    ]
    return np.concatenate([np.zeros((trainer.workers, 0)), *state], axis=1)


def snapshot(trainer) -> list:
    """A copy of everything a step may change on this rank."""
    state = [
        np.array(dispatch.host_array(getattr(optimizer, name)))
        for optimizer in trainer.local.optimizers
        for name in ("params", "exp_avg", "exp_avg_sq")
    ]
    return state + [b.numpy().copy() for b in trainer.local.buffers.values()] + [np.array(trainer.t)]


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    from steadystep.torch.distributed import DistributedTrainer

    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["torch"], default="torch")
    parser.add_argument("--target", choices=["cpu", "cuda"])
    parser.add_argument("--topology", required=True)
    parser.add_argument("--order", default="awc")
    parser.add_argument("--adaptive", action="store_true")
    parser.add_argument("--batch-norm", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--poison", type=int, nargs=2, metavar=("RANK", "T"))
    parser.add_argument("--bad-batch", type=int, nargs=2, metavar=("RANK", "T"))
    parser.add_argument("--odd-max-norm", type=int, metavar="RANK")
    parser.add_argument("--odd-model", type=int, metavar="RANK")
    parser.add_argument("--resume-at", type=int)
    parser.add_argument("--resume-from", metavar="PREFIX")
    parser.add_argument("--save-at-end", metavar="PREFIX")
    parser.add_argument("--communication", choices=["int8", "diloco"], default="")
    arguments = parser.parse_args(argv)
    if not dist.is_initialized():  # once a process: it may run many cases (tests/launches.py)
        dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    module = model(rank, arguments.batch_norm)  # every rank's own initial weights: rank 0's are broadcast
    if arguments.odd_model == rank:
        module = model(rank, arguments.batch_norm, classes=4)
    settings = options(module, arguments.topology, arguments.order, size, arguments.adaptive, arguments.communication)
    settings["target"] = arguments.target
    if arguments.odd_max_norm == rank:
        settings["max_norm"] = 0.6
    poison = tuple(arguments.poison) if arguments.poison else None
    original = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    try:
        trainer, template = DistributedTrainer(module, **settings), module
        before = snapshot(trainer)
        if arguments.resume_from:
            trainer.load(arguments.resume_from)
            before = snapshot(trainer)
        for t in range(trainer.t, trainer.t + arguments.steps):
            if arguments.resume_at == t:
                trainer.save(f"{arguments.out}/checkpoint", extra={"t": t})
                fresh = model(rank + 7, arguments.batch_norm)  # other weights: all of them come from the files
                other = DistributedTrainer(
                    fresh, **{**settings, "groups": [{"params": [fresh[3].weight], "lr_scale": 0.5}]}
                )
                assert other.load(f"{arguments.out}/checkpoint") == {"t": t}
                trainer, template = other, fresh
            inputs, targets = batch(rank, t, poison)
            if arguments.bad_batch is not None and tuple(arguments.bad_batch) == (rank, t):
                targets = targets[:-1]
            before = snapshot(trainer)
            result = trainer.step(inputs, targets)
            assert result.losses.dim() == 0 and result.grad_norms.dim() == 0
    except (decentral.NonFiniteGradientError, RankError, ValueError) as error:
        unchanged = "trainer" not in locals() or all(map(np.array_equal, snapshot(trainer), before))
        # one write of the whole line: the ranks share torchrun's stdout, and print() writes the
        # text and its newline apart, so two ranks' lines could splice into one
        sys.stdout.write(f"rank {rank}: {type(error).__name__}: {error} (params unchanged: {unchanged})\n")
        sys.stdout.flush()
        return 3
    assert all(torch.equal(tensor, original[name]) for name, tensor in module.state_dict().items()), "module changed"
    if arguments.save_at_end:
        trainer.save(arguments.save_at_end)
    whole = trainer.gather()
    mean = trainer.mean_model()
    distance = trainer.consensus_distance()
    # this rank's view of the run is worker `rank` of the gathered in-process trainer
    vector = torch.nn.utils.parameters_to_vector
    assert torch.equal(vector(trainer.worker_model().parameters()), vector(whole.worker_model(rank).parameters()))
    for t in range(trainer.t + 2):  # schedules: the same lr and γ as in-process, at every step
        assert trainer.learning_rate(t) == whole.learning_rate(t)
        assert trainer.consensus_strength(t) == whole.consensus_strength(t)
    assert f"rank {rank} of {size}" in repr(trainer) and trainer.module is template
    if rank == 0:
        np.savez(
            f"{arguments.out}/gathered.npz",
            params=whole.params.numpy(),
            exp_avg=np.concatenate([o.exp_avg for o in whole.optimizers], axis=1),
            state=communication_state(whole),
            bytes_sent=whole.bytes_sent,
            buffers=np.concatenate(
                [np.zeros((size, 0))]
                + [b.reshape(size, -1).numpy().astype(np.float64) for b in whole.buffers.values()],
                axis=1,
            ),
            t=whole.t,
            mean=torch.nn.utils.parameters_to_vector(mean.parameters()).detach().numpy(),
            mean_buffers=np.concatenate(
                [np.zeros(0)] + [b.reshape(-1).numpy().astype(np.float64) for b in mean.buffers()]
            ),
            distance=distance,
        )
    return 0


if __name__ == "__main__":
    from tests.launches import serve

    try:
        code = serve(main, barrier, sys.argv[1:])
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    sys.exit(code)
