"""DDP training of a recommendation model, the communication-bound workload: NCF-style (a user
and an item embedding table, their product and a small MLP predicting a click), on synthetic
implicit feedback drawn from a planted model. Almost all parameters are the two embedding
tables; DDP all-reduces their dense gradients every step, while a step's computation touches only
the batch's rows and the small MLP. This is the shape of the paper's recommendation and language
benchmarks (large embeddings relative to compute), where switchml's all-reduce speed shows in the
step time.

Data (the same on every rank; rank r trains on its share of each step's samples): users and
items drawn with Zipf-like popularity (p(k) ~ 1 / (k + 10)^0.9 over a shuffled order), a click
when b_u + b_i + <P_u, Q_i> / sqrt(8) + 0.5 N(0, 1) > 0, with planted N(0, 1) biases and 8-dim
factors. A fixed test set of 50,000 pairs from the same distribution measures accuracy (0.5 at
the start; the planted model itself scores about 0.9).

Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment):

    SWITCHML_SWITCH=127.0.0.1:50099 torchrun --nproc_per_node 2 \\
        examples/torch/train_rec.py --backend switchml

rack_train.sh runs it with gloo and with switchml in the emulated rack and compares the two.
"""
import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import step_timing


class NCF(nn.Module):
    """Neural collaborative filtering: user and item embeddings of `dim`, their concatenation
    with their elementwise product into an MLP (3 dim -> hidden -> 1), a click logit."""

    def __init__(self, users, items, dim=16, hidden=64):
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)
        nn.init.normal_(self.user.weight, std=0.05)
        nn.init.normal_(self.item.weight, std=0.05)
        self.mlp = nn.Sequential(nn.Linear(3 * dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, u, i):
        a, b = self.user(u), self.item(i)
        return self.mlp(torch.cat([a, b, a * b], 1)).squeeze(1)


class Data:
    """The planted model and samples from it (deterministic given the seed)."""

    def __init__(self, users, items, seed, factors=8):
        g = torch.Generator().manual_seed(seed + 1000)
        self.g = g
        self.p_user = torch.randn(users, factors, generator=g)
        self.q_item = torch.randn(items, factors, generator=g)
        self.b_user = torch.randn(users, generator=g)
        self.b_item = torch.randn(items, generator=g)
        self.scale = 1 / math.sqrt(factors)

        def popularity(n):
            w = 1 / (torch.arange(n, dtype=torch.float64) + 10) ** 0.9
            return w[torch.argsort(torch.randperm(n, generator=g))].float()
        self.w_user, self.w_item = popularity(users), popularity(items)

    def sample(self, n):
        u = torch.multinomial(self.w_user, n, replacement=True, generator=self.g)
        i = torch.multinomial(self.w_item, n, replacement=True, generator=self.g)
        logit = (self.b_user[u] + self.b_item[i] +
                 (self.p_user[u] * self.q_item[i]).sum(1) * self.scale +
                 0.5 * torch.randn(n, generator=self.g))
        return u, i, (logit > 0).float()


def train(rank, world, backend, steps=40, batch_size=256, lr=1.0, emb_lr=None, seed=0,
          users=1 << 19, items=1 << 19, dim=16, hidden=64, warmup=5, bucket_view=True,
          profile=0):
    """Trains for warmup + steps steps; returns this rank's per-step losses, the test accuracy
    and loss of the final model, the step times and phase times after warm-up, and the time of
    the bare all-reduce of the model's gradients (step_timing.measure_allreduce). profile > 0:
    rank 0 prints torch.profiler's table of that many steps after warm-up."""
    torch.set_num_threads(1)
    step_timing.keep_freed_memory()
    data = Data(users, items, seed)
    test_u, test_i, test_y = data.sample(50_000)
    total = warmup + steps
    train_u, train_i, train_y = data.sample(total * world * batch_size)
    torch.manual_seed(seed)  # the same initial model on every rank and for every backend
    model = NCF(users, items, dim, hidden)
    emb = [model.user.weight, model.item.weight]
    opt = torch.optim.SGD([{"params": emb, "lr": emb_lr or batch_size * world},
                           {"params": model.mlp.parameters()}], lr=lr)
    # Gradients as views of DDP's buckets and set to None between steps: no copy into or out
    # of the buckets (the default of newer PyTorch; see docs/python.md).
    model = DDP(model, gradient_as_bucket_view=bucket_view)
    loss_fn = nn.BCEWithLogitsLoss()
    timer = step_timing.StepTimer(warmup)
    losses = []
    profiler = step_timing.Profiler(profile, warmup)
    dist.barrier()
    for step in range(total):
        profiler.step(step)
        timer.start()
        lo = (step * world + rank) * batch_size
        u, i, y = (t[lo:lo + batch_size] for t in (train_u, train_i, train_y))
        timer.mark("data")
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(u, i), y)
        timer.mark("forward")
        loss.backward()  # DDP's all-reduces: started during backward, waited for at its end
        timer.mark("backward")
        opt.step()
        timer.mark("optimizer")
        losses.append(loss.item())
        timer.stop()
    profiler.finish(rank)
    with torch.no_grad():
        logits = model.module(test_u, test_i)
        accuracy = ((logits > 0).float() == test_y).float().mean().item() * 100
        test_loss = loss_fn(logits, test_y).item()
    r = timer.results()
    r.update({"losses": losses, "accuracy": accuracy, "test_loss": test_loss,
              "iterations": len(losses),
              "parameters": sum(p.numel() for p in model.parameters()),
              "allreduce_seconds": step_timing.measure_allreduce(model.module)})
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="switchml")
    p.add_argument("--steps", type=int, default=40, help="measured steps (after warm-up)")
    p.add_argument("--warmup", type=int, default=5, help="steps trained but not timed")
    p.add_argument("--batch-size", type=int, default=256, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=1.0, help="the MLP's learning rate")
    p.add_argument("--emb-lr", type=float,
                   help="the embeddings' learning rate (default: the global batch, samples "
                   "per rank x ranks, i.e. 1 per sample)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--users", type=int, default=1 << 19, help="rows of the user table")
    p.add_argument("--items", type=int, default=1 << 19, help="rows of the item table")
    p.add_argument("--dim", type=int, default=16, help="embedding width")
    p.add_argument("--hidden", type=int, default=64, help="the MLP's hidden units")
    p.add_argument("--no-bucket-view", action="store_true",
                   help="DDP's default gradient buckets (copies in and out)")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="print torch.profiler's table of STEPS steps after warm-up (rank 0)")
    p.add_argument("--out", help="write rank 0's results here (JSON)")
    a = p.parse_args()
    rank, world = step_timing.init_from_torchrun(a.backend)
    r = train(rank, world, a.backend, a.steps, a.batch_size, a.lr, a.emb_lr, a.seed, a.users,
              a.items, a.dim, a.hidden, a.warmup, not a.no_bucket_view, a.profile)
    step_timing.finish(r, a.out, lambda r: (
        f"{a.backend}: {world} processes, {r['parameters']} parameters, "
        f"{r['iterations']} steps, loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}, "
        f"test loss {r['test_loss']:.4f}, test accuracy {r['accuracy']:.2f}%, "
        f"{step_timing.summary(r)}"))


if __name__ == "__main__":
    main()
