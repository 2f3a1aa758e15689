"""Data-parallel PyTorch training on rdmaps servers.

    import rdmaps, rdmaps.torch
    client = rdmaps.Client()                     # servers/rank/world from the launcher
    opt = rdmaps.torch.DistributedOptimizer(model, client, prefix="mlp/",
                                            optimizer="sgd", lr=0.5)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()          # each gradient is pushed as autograd makes it
        opt.step()                               # wait for the pushes, pull the new parameters

Every parameter becomes one server tensor named prefix + its name in the
module (``named_parameters()``; names over 63 bytes are shortened with a
hash).  The tensors are created with the parameters' values as ``init``:
the first creator's values are kept, so when rank 0 creates first its
initial parameters win, as broadcast_parameters does in other frameworks
(``broadcast_parameters`` below orders it: rank 0 creates, a barrier, the
others open-create).  After creation every worker pulls, so all start from
the same values.

Backward: a hook on each parameter (``Tensor.register_hook``) starts the
push of its gradient the moment autograd produces it, so communication
overlaps the rest of backward.  ``step()`` waits for every push, then pulls
every parameter straight into its storage (CPU: no copy) for the next
forward.  ``hooks=False`` pushes everything in ``step()`` instead, after
backward, to measure what the overlap gains.  A parameter that got no
gradient in a step pushes zeros (sync tensors need every worker's push).

Where the optimizer runs:
  * on the servers (``optimizer`` = "sgd", "momentum", "adam" with
    lr/momentum/betas/eps/weight_decay): workers push gradients, the
    servers apply ``rescale * sum`` (sync: in rank order, bit-reproducible)
    and workers pull parameters.  ``rescale`` defaults to 1/world_size, so
    the step uses the mean gradient.
  * locally (``local_optimizer=torch.optim.X(...)``): the servers only
    average (optimizer "sum", rescale 1/world_size) into a running sum;
    each worker pulls it, takes the difference with the previous pull as
    the mean gradient, sets ``p.grad`` to it and runs the local optimizer.
    Every worker does the same step on the same values, so they stay
    equal.  (The mean gradient is a difference of fp32 running sums, so it
    carries their rounding.)

Modes: "sync" (BSP), "bounded" with ``staleness`` k (SSP), "async" (ASP).
Wire dtype: ``wire_dtype="f32"`` or "bf16" (gradients converted before the
push; servers accumulate in fp32; pulls are fp32).

CUDA: the C library takes host memory.  A CUDA parameter gets a pinned
host staging buffer (``torch.empty(..., pin_memory=True)``): the hook
copies the gradient into it (synchronously) and pushes from it, and the
pull lands in a second one that is copied to the device.  GPU-direct
registration is later work.  This path is written for CUDA but not tested
on a GPU in this tree's CI (the test machines have none).

Timing: ``stats`` counts steps and the seconds ``step()`` spent waiting on
the servers (``comm_wait``), so a trainer can report the share of each
step spent on communication.
"""
from __future__ import annotations

import hashlib
import time
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch

import rdmaps

__all__ = ["DistributedOptimizer", "broadcast_parameters", "tensor_name"]


def tensor_name(prefix: str, name: str) -> str:
    """The server tensor name of a parameter: prefix + name, or (over 63
    bytes) a shortened form with a hash of the full name."""
    full = prefix + name
    if len(full.encode()) <= 63 and all(0x21 <= b <= 0x7e for b in full.encode()):
        return full
    h = hashlib.sha1(full.encode()).hexdigest()[:12]
    safe = "".join(c if 0x21 <= ord(c) <= 0x7e else "_" for c in full)
    return safe[:50] + "~" + h


def _named(params) -> List[Tuple[str, torch.nn.Parameter]]:
    if isinstance(params, torch.nn.Module):
        return list(params.named_parameters())
    out = list(params)
    if out and not isinstance(out[0], tuple):
        return [(str(i), p) for i, p in enumerate(out)]
    return out


def broadcast_parameters(params, client: "rdmaps.Client", prefix: str = "", **tensor_kw) -> Dict[str, "rdmaps.Tensor"]:
    """Make every worker's parameters rank 0's: rank 0 creates each tensor
    with its values as init, then a barrier, then the others create (their
    init is ignored: the first creator's is kept) and every worker pulls
    the values into its parameters.  Returns the tensors by parameter name.
    tensor_kw are Client.tensor's options (all workers must agree)."""
    named = _named(params)
    tensors: Dict[str, rdmaps.Tensor] = {}

    def create():
        for n, p in named:
            host = p.detach().to("cpu", torch.float32).contiguous()
            tensors[n] = client.tensor(tensor_name(prefix, n), p.numel(), init=host.view(-1), **tensor_kw)

    if client.rank == 0:
        create()
    client.barrier()
    if client.rank != 0:
        create()
    for n, p in named:
        _pull_into(tensors[n], p, None)
    return tensors


def _pull_into(t: "rdmaps.Tensor", p: torch.Tensor, staging: Optional[torch.Tensor]) -> None:
    with torch.no_grad():
        if p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous():
            t.pull(p.data.view(-1))
        else:
            buf = staging if staging is not None else torch.empty(p.numel(), dtype=torch.float32)
            t.pull(buf)
            p.data.copy_(buf.view_as(p))


class _Slot:
    """One parameter: its server tensor, its request in flight, staging."""
    __slots__ = ("name", "param", "tensor", "push_req", "pull_req", "pushed", "push_stage", "pull_stage",
                 "hook", "prev")

    def __init__(self, name, param, tensor):
        self.name, self.param, self.tensor = name, param, tensor
        self.push_req = self.pull_req = None
        self.pushed = False
        self.push_stage = self.pull_stage = None
        self.hook = None
        self.prev = None        # local-optimizer mode: the last running sum pulled


class DistributedOptimizer:
    """Data-parallel training of ``model`` through rdmaps servers.

    Args:
        model: a torch.nn.Module, or (name, parameter) pairs, or parameters.
        client: a connected rdmaps.Client (its rank and world size are used).
        prefix: prepended to each parameter name to name its server tensor.
        mode: "sync", "bounded" (with staleness) or "async".
        optimizer: the servers' optimizer, "sgd", "momentum" or "adam"
            (ignored with local_optimizer).
        lr, momentum, betas, eps, weight_decay: its hyper-parameters (None:
            the C defaults).
        rescale: gradient factor on the servers (default 1/world_size).
        wire_dtype: "f32" or "bf16" gradients on the wire.
        local_optimizer: a torch optimizer over the same parameters: the
            servers then only average and this one steps locally.
        hooks: True pushes each gradient from its autograd hook (overlap);
            False pushes all of them in step(), after backward.
        broadcast: rank 0's initial values win (broadcast_parameters); if
            False every worker creates at once and whichever comes first wins.
    """

    def __init__(self, model, client: "rdmaps.Client", *, prefix: str = "", mode: str = "sync",
                 staleness: int = 0, optimizer: str = "sgd", lr: Optional[float] = None,
                 momentum: Optional[float] = None, betas: Optional[Tuple[float, float]] = None,
                 eps: Optional[float] = None, weight_decay: Optional[float] = None,
                 rescale: Optional[float] = None, wire_dtype: str = "f32",
                 local_optimizer: Optional[torch.optim.Optimizer] = None, hooks: bool = True,
                 broadcast: bool = True):
        self.client = client
        self.local_optimizer = local_optimizer
        self.hooks = hooks
        self.wire_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[wire_dtype]
        self.stats = {"steps": 0, "comm_wait": 0.0, "step_time": 0.0}
        named = [(n, p) for n, p in _named(model) if p.requires_grad]
        if rescale is None:
            rescale = 1.0 / client.world_size
        kw = dict(dtype=wire_dtype, mode=mode, staleness=staleness, rescale=rescale)
        if local_optimizer is None:
            kw.update(optimizer=optimizer, lr=lr, momentum=momentum, eps=eps, weight_decay=weight_decay)
            if betas is not None:
                kw.update(beta1=betas[0], beta2=betas[1])
        else:
            kw.update(optimizer="sum")
        if local_optimizer is None:
            if broadcast:
                tensors = broadcast_parameters(named, client, prefix, **kw)
            else:
                tensors = {}
                for n, p in named:
                    host = p.detach().to("cpu", torch.float32).contiguous()
                    tensors[n] = client.tensor(tensor_name(prefix, n), p.numel(), init=host.view(-1), **kw)
                for n, p in named:
                    _pull_into(tensors[n], p, None)
        else:
            # the servers hold a running sum of mean gradients, from zero;
            # the parameters themselves start equal from rank 0's values
            broadcast_parameters(named, client, prefix + "init/", mode="sync")
            tensors = {n: client.tensor(tensor_name(prefix, n), p.numel(), **kw) for n, p in named}
        self._slots: List[_Slot] = []
        for n, p in named:
            s = _Slot(n, p, tensors[n])
            if p.device.type != "cpu":
                s.push_stage = torch.empty(p.numel(), dtype=self.wire_dtype, pin_memory=True)
                s.pull_stage = torch.empty(p.numel(), dtype=torch.float32, pin_memory=True)
            if local_optimizer is not None:
                s.prev = s.tensor.pull(torch.empty(p.numel(), dtype=torch.float32))
            if hooks:
                s.hook = p.register_hook(self._make_hook(s))
            self._slots.append(s)
        self._t_last = None

    # ---- backward ----
    def _wire(self, s: _Slot, grad: torch.Tensor) -> torch.Tensor:
        """The gradient as the push sends it: CPU, contiguous, wire dtype."""
        g = grad.detach()
        if g.device.type != "cpu":
            s.push_stage.copy_(g.reshape(-1))       # synchronous: staging is ready on return
            return s.push_stage
        if g.dtype != self.wire_dtype:
            g = g.to(self.wire_dtype)
        return g.contiguous().view(-1)

    def _push(self, s: _Slot, grad: torch.Tensor) -> None:
        if s.pushed:        # a second backward before step(): add it locally is not our job
            raise RuntimeError(f"rdmaps.torch: {s.name}: a second gradient before step(); "
                               "call step() after each backward")
        s.push_req = s.tensor.push_start(self._wire(s, grad))
        s.pushed = True

    def _make_hook(self, s: _Slot):
        def hook(grad: torch.Tensor) -> None:
            self._push(s, grad)
            return None
        return hook

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients (as torch.optim.Optimizer.zero_grad)."""
        for s in self._slots:
            if set_to_none:
                s.param.grad = None
            elif s.param.grad is not None:
                s.param.grad.detach_().zero_()

    # ---- the step ----
    def step(self) -> None:
        """Push what backward did not (hooks=False, or parameters without a
        gradient: zeros), wait for every push, pull every parameter."""
        t0 = time.perf_counter()
        for s in self._slots:
            if not s.pushed:
                g = s.param.grad
                if g is None:
                    g = torch.zeros(s.param.numel(), dtype=torch.float32)
                self._push(s, g)
        wait = 0.0
        tw = time.perf_counter()
        try:
            for s in self._slots:
                req, s.push_req, s.pushed = s.push_req, None, False
                req.wait()
        finally:
            for s in self._slots:           # a failure leaves nothing in flight
                if s.push_req is not None:
                    try:
                        s.push_req.wait()
                    except rdmaps.RdmapsError:
                        pass
                    s.push_req, s.pushed = None, False
        if self.local_optimizer is None:
            reqs = []
            for s in self._slots:
                p = s.param
                direct = p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous()
                if not direct and s.pull_stage is None:
                    s.pull_stage = torch.empty(p.numel(), dtype=torch.float32)
                # CPU fp32: straight into the parameter's storage
                reqs.append((s, direct, s.tensor.pull_start(p.data.view(-1) if direct else s.pull_stage)))
            for s, direct, r in reqs:
                r.wait()
            wait += time.perf_counter() - tw
            with torch.no_grad():
                for s, direct, r in reqs:
                    if not direct:
                        s.param.data.copy_(s.pull_stage.view_as(s.param))
        else:
            sums = [(s, s.tensor.pull_start(torch.empty(s.param.numel(), dtype=torch.float32)))
                    for s in self._slots]
            for s, r in sums:
                r.wait()
            wait += time.perf_counter() - tw
            with torch.no_grad():
                for s, r in sums:
                    cur = r.result
                    mean = (cur - s.prev).view_as(s.param)
                    s.prev = cur
                    s.param.grad = mean.to(s.param.device, s.param.dtype)
            self.local_optimizer.step()
        self.stats["steps"] += 1
        self.stats["comm_wait"] += wait
        now = time.perf_counter()
        self.stats["step_time"] += now - t0

    def comm_share(self, step_seconds: float) -> float:
        """comm_wait as a share of step_seconds (the caller's wall time)."""
        return self.stats["comm_wait"] / step_seconds if step_seconds > 0 else 0.0

    def close(self) -> None:
        """Remove the hooks and close the tensors (the client stays open)."""
        for s in self._slots:
            if s.hook is not None:
                s.hook.remove()
                s.hook = None
            if s.push_req is not None:
                try:
                    s.push_req.wait()
                except rdmaps.RdmapsError:
                    pass
            s.tensor.close()
        self._slots = []

    def __enter__(self) -> "DistributedOptimizer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
