"""One torch.distributed rank over NCCL on a GPU (ci/gpu_check.sh runs it under torchrun): GPU rows
go to NCCL as the same memory, come back and are mixed on the GPU, and the rank's steps equal
the in-process ones bit for bit. ``--cpu`` runs the same checks over gloo on host rows (a dry
run for machines without a GPU).

    python3 -m torch.distributed.run --standalone --nproc-per-node 1 ci/nccl_check.py
"""

import argparse
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from steadystep import decentral, lm
from steadystep.torch.decentral import DecentralizedTrainer
from steadystep.torch.distributed import DistributedAdamW, DistributedTrainer, GroupCommunicator, local_rank


def check(condition: bool, what: str) -> None:
    print(("ok     " if condition else "FAILED ") + what, flush=True)
    if not condition:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="gloo and host rows instead of NCCL and GPU rows")
    on_cpu = parser.parse_args().cpu
    device = torch.device("cpu") if on_cpu else torch.device("cuda", local_rank())
    if not on_cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if on_cpu else "cpu:gloo,cuda:nccl")
    comm = GroupCommunicator(None)
    check(comm.nccl != on_cpu, f"process group backend {dist.get_backend()}: NCCL {'off' if on_cpu else 'on'}")

    row = torch.randn(4099, device=device)
    if not on_cpu:
        from numba import cuda

        check(comm.on_gpu(row), "a CUDA tensor travels from GPU memory")
        check(comm.carried(row, True).data_ptr() == row.data_ptr(), "... as itself (zero-copy)")
        numba_row = cuda.to_device(np.arange(10.0))
        check(
            comm.carried(numba_row, True).data_ptr() == numba_row.device_ctypes_pointer.value,
            "a Numba device array travels as the same memory",
        )
    # (torch refuses a send to oneself, so one rank cannot try batch_isend_irecv: gloo runs it in the tests)
    total = comm.sum(row)
    check(isinstance(total, torch.Tensor) == (not on_cpu), "a sum comes back where the row is (GPU rows: on the GPU)")
    check(np.array_equal(np.asarray(torch.as_tensor(total).cpu()), row.cpu().numpy()), "... and is the row (one rank)")

    # DistributedAdamW on a GPU row against the in-process step, bit for bit: a one-peer
    # topology, and a matrix (mixed on the GPU: W = [[1]] with γ = 0.5)
    for topology in (decentral.one_peer_exponential(), decentral.from_matrix(np.ones((1, 1)), "one")):
        start = torch.randn(1000, device=device, dtype=torch.float32)
        options = dict(topology=topology, lr=1e-2, weight_decay=0.1, max_norm=1.0, consensus=0.5)
        worker = DistributedAdamW(start.clone(), **options)
        alone = decentral.DecentralizedAdamW(start.clone().reshape(1, -1), **options)
        for t in range(3):
            grad = torch.randn(1000, device=device, generator=torch.Generator(device).manual_seed(t))
            worker.step(grad)
            alone.step(grad.reshape(1, -1))
        check(torch.equal(worker.params, alone.params.reshape(-1)), f"DistributedAdamW ({topology.name}) = in-process")

    # DistributedTrainer on a module on this device against the in-process trainer with one worker
    torch.manual_seed(0)
    model = lm.ByteTransformer(context=32, width=64, layers=2, heads=4).to(device)
    options = dict(topology=decentral.one_peer_exponential(), lr=3e-3, weight_decay=0.1, max_norm=1.0)
    trainer = DistributedTrainer(model, **options)
    alone = DecentralizedTrainer(model, 1, vmap=True, **options)  # vmapped, as a rank's one worker is
    started = time.perf_counter()
    for t in range(5):
        tokens = torch.randint(0, 256, (8, 33), device=device, generator=torch.Generator(device).manual_seed(t))
        ours = trainer.step(tokens[:, :-1], tokens[:, 1:])
        theirs = alone.step(tokens[None, :, :-1], tokens[None, :, 1:])
    seconds = (time.perf_counter() - started) / 5
    check(torch.equal(trainer.params, alone.params[0]), "DistributedTrainer = in-process trainer, bit for bit")
    check(bool(ours.losses == theirs.losses[0]), "... and so are the losses")
    check(trainer.consensus_distance() == 0.0 and trainer.gather().t == 5, "consensus distance and gather")
    print(f"nccl_check: all passed on {device} ({seconds * 1e3:.1f} ms per trainer step, both trainers)")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
