"""What the source project does by hand, as the independent reference for the torch trainer:
N separate module copies, each with ``torch.optim.AdamW``, per-worker ``clip_grad_norm_``,
and parameter mixing with the dense W_t."""

import copy

import torch

from steadystep.arena import decays_matrices


class ReferenceWorkers:
    def __init__(
        self,
        module,
        workers,
        *,
        topology,
        order="awc",
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0.0,
        max_norm=None,
        consensus=1.0,
        implementation=None,
        group_of=None,
    ):
        self.models = [copy.deepcopy(module) for _ in range(workers)]
        self.topology, self.order, self.lr, self.max_norm, self.consensus = topology, order, lr, max_norm, consensus
        self.t = 0
        options = implementation or {"foreach": False}
        # group_of(name, parameter) -> (lr scale, weight decay); by default decay on ndim >= 2
        group_of = group_of or (lambda name, p: (1.0, weight_decay if decays_matrices(tuple(p.shape)) else 0.0))
        self.optimizers = []
        for model in self.models:
            groups = {}
            for name, p in model.named_parameters():
                if p.requires_grad:
                    scale, rate = group_of(name, p)
                    groups.setdefault((scale, rate), []).append(p)
            self.optimizers.append(
                torch.optim.AdamW(
                    [
                        {"params": params, "weight_decay": rate, "lr_scale": scale}
                        for (scale, rate), params in groups.items()
                    ],
                    lr=lr,
                    betas=betas,
                    eps=eps,
                    **options,
                )
            )

    def step(self, inputs, targets, loss_fn, lr=None, gamma=None):
        lr = self.lr if lr is None else lr
        gamma = self.consensus if gamma is None else gamma
        losses = []
        for i, (model, optimizer) in enumerate(zip(self.models, self.optimizers)):
            optimizer.zero_grad()
            loss = loss_fn(model(inputs[i]), targets[i])
            loss.backward()
            losses.append(loss.detach())
            if self.max_norm is not None:
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], self.max_norm)
            for group in optimizer.param_groups:
                group["lr"] = lr * group["lr_scale"]
        workers = len(self.models)
        weights = (
            gamma * self.topology.matrix(workers, self.t)
            + (1 - gamma) * torch.eye(workers, dtype=torch.float64).numpy()
        )
        if self.order == "awc":
            self._mix(weights)
            for optimizer in self.optimizers:
                optimizer.step()
        else:
            for optimizer in self.optimizers:
                optimizer.step()
            self._mix(weights)
        self.t += 1
        return torch.stack(losses)

    def _mix(self, weights):
        with torch.no_grad():
            for parameters in zip(*(model.parameters() for model in self.models)):
                if not parameters[0].requires_grad:
                    continue
                stacked = torch.stack([p.detach().clone() for p in parameters])
                W = torch.as_tensor(weights, dtype=stacked.dtype)
                mixed = torch.tensordot(W, stacked, dims=1)
                for p, value in zip(parameters, mixed):
                    p.copy_(value)

    def stacked(self):
        return {
            name: torch.stack([dict(model.named_parameters())[name].detach() for model in self.models])
            for name, p in self.models[0].named_parameters()
            if p.requires_grad
        }
