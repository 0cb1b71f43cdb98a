"""Three AdamW8bit and AdamW4bit steps on 10M parameters of this GPU: the program ci/gpu_check.sh
runs under Nsight Compute (ncu), whose reading of the blockwise kernels (DRAM and SM
throughput, occupancy, stalls) says where their time goes."""

import torch

from steadystep.torch import AdamW4bit, AdamW8bit


def main() -> None:
    for optimizer_class in (AdamW8bit, AdamW4bit):
        param = torch.nn.Parameter(torch.randn(10_000_000, device="cuda"))
        param.grad = torch.randn_like(param)
        optimizer = optimizer_class([param], lr=1e-3)
        for _ in range(3):
            optimizer.step()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
