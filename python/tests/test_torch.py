"""rdmaps.torch with two ranks in one process (one thread each: the
library releases the GIL): broadcast of rank 0's values, hooks against
pushing after backward, a local optimizer on server-side averages, the
server optimizers, bf16 on the wire, parameters without a gradient."""
import itertools
import threading

import numpy as np
import pytest
import torch

import rdmaps
import rdmaps.torch as rt

_names = itertools.count()


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


class WithUnused(torch.nn.Module):
    """body, and a parameter forward never uses: it gets no gradient."""

    def __init__(self, body):
        super().__init__()
        self.body = body
        self.extra = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.body(x)


def data(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(5, 8, generator=g), torch.randint(0, 3, (5,), generator=g)


def train(servers, steps=6, world=2, seeds=(0, 1), local=None, unused=False, **kw):
    """Each rank in its own thread; returns (per-rank models, initial models, losses)."""
    prefix = f"torch{next(_names)}/"
    models = [model(seeds[r]) for r in range(world)]
    if unused:
        models = [WithUnused(m) for m in models]
    inits = [{n: p.detach().clone() for n, p in m.named_parameters()} for m in models]
    losses = [[] for _ in range(world)]
    errors = []

    def rank_main(r):
        try:
            torch.set_num_threads(1)
            with rdmaps.Client(servers.uris, rank=r, world_size=world, timeout_ms=20000) as c:
                m = models[r]
                lopt = local(m.parameters()) if local else None
                opt = rt.DistributedOptimizer(m, c, prefix=prefix, local_optimizer=lopt, **kw)
                for step in range(steps):
                    opt.zero_grad()
                    x, y = data(r, step)
                    loss = torch.nn.functional.cross_entropy(m(x), y)
                    loss.backward()
                    opt.step()
                    losses[r].append(float(loss))
                assert opt.stats["steps"] == steps and opt.stats["comm_wait"] >= 0
                opt.close()
        except BaseException as e:      # reported by the main thread
            errors.append(e)

    ths = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(120)
    assert not errors, errors
    return models, inits, losses


def params(m):
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def same_bits(a, b):
    return all(torch.equal(a[n].view(torch.int32), b[n].view(torch.int32)) for n in a)


def test_rank0_values_win_and_ranks_agree(servers):
    models, inits, _ = train(servers, steps=0, optimizer="sgd", lr=0.1)
    assert not same_bits(inits[0], inits[1])                # they started apart
    assert same_bits(params(models[0]), inits[0])           # rank 0's values won
    assert same_bits(params(models[1]), inits[0])


def test_sync_sgd_ranks_identical_and_hooks_change_nothing(servers):
    a, _, la = train(servers, optimizer="sgd", lr=0.1)
    b, _, lb = train(servers, optimizer="sgd", lr=0.1, hooks=False)
    pa, pb = params(a[0]), params(b[0])
    assert same_bits(pa, params(a[1])) and same_bits(pb, params(b[1]))
    assert same_bits(pa, pb)                                # where the push starts changes no bit
    assert la == lb


def test_sync_sgd_matches_a_local_reference(servers):
    """Server SGD (rescale 1/2) == averaging the two ranks' gradients by hand."""
    models, inits, _ = train(servers, steps=4, optimizer="sgd", lr=0.1)
    ref = model(0)
    ps = dict(ref.named_parameters())
    for step in range(4):
        grads = []
        for r in range(2):
            ref.zero_grad()
            x, y = data(r, step)
            torch.nn.functional.cross_entropy(ref(x), y).backward()
            grads.append({n: p.grad.clone() for n, p in ps.items()})
        with torch.no_grad():
            for n, p in ps.items():
                p.copy_(p - np.float32(0.1) * (np.float32(0.5) * (grads[0][n] + grads[1][n])))
    assert same_bits(params(models[0]), params(ref))


def test_local_optimizer_on_server_averages(servers):
    server, _, _ = train(servers, steps=4, optimizer="sgd", lr=0.1)
    local, _, _ = train(servers, steps=4, local=lambda ps: torch.optim.SGD(ps, lr=0.1))
    for n, p in params(server[0]).items():
        torch.testing.assert_close(params(local[0])[n], p, rtol=1e-4, atol=1e-6)
    assert same_bits(params(local[0]), params(local[1]))


@pytest.mark.parametrize("kw", [dict(optimizer="momentum", lr=0.05, momentum=0.9),
                                dict(optimizer="adam", lr=0.01, betas=(0.9, 0.999), eps=1e-8),
                                dict(optimizer="sgd", lr=0.2, wire_dtype="bf16"),
                                dict(optimizer="sgd", lr=0.2, mode="async"),
                                dict(optimizer="sgd", lr=0.2, mode="bounded", staleness=1)])
def test_optimizers_modes_and_bf16_learn(servers, kw):
    # the same batch every step: the loss must fall
    def fixed(rank, step):
        return torch.randn(5, 8, generator=torch.Generator().manual_seed(rank)), torch.tensor([0, 1, 2, 0, 1])
    global data
    saved, data = data, fixed
    try:
        models, _, losses = train(servers, steps=25, **kw)
    finally:
        data = saved
    for r in range(2):
        assert losses[r][-1] < 0.7 * losses[r][0], (kw, losses[r])
    if kw.get("mode", "sync") == "sync":
        assert same_bits(params(models[0]), params(models[1]))


def test_parameter_without_gradient_pushes_zeros(servers):
    models, inits, _ = train(servers, steps=3, unused=True, optimizer="sgd", lr=0.1)
    for m in models:
        assert same_bits({"w": m.extra.weight.detach()}, {"w": inits[0]["extra.weight"]})


def test_long_names_are_shortened():
    n = rt.tensor_name("p/", "x" * 100)
    assert len(n) <= 63 and n != rt.tensor_name("p/", "x" * 99)
    assert rt.tensor_name("p/", "0.weight") == "p/0.weight"
