"""DDP training of a small MLP on scikit-learn's handwritten digits (python3-sklearn ships the
data), with any torch.distributed backend; with "switchml" the gradients are summed by the switch.

Under torchrun (each process reads RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment):

    SWITCHML_SWITCH=127.0.0.1:50099 torchrun --nproc_per_node 2 \\
        examples/torch/train_digits.py --backend switchml

compare_digits.py runs it with gloo and with switchml and compares the two.
"""
import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn.parallel import DistributedDataParallel as DDP

import step_timing


def load_data(seed):
    """The 1797 8x8 digits, scaled to [0, 1]; a fixed 80/20 train/test split."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed,
                                                        stratify=y)
    return (torch.from_numpy(x_train), torch.from_numpy(y_train).long(),
            torch.from_numpy(x_test), torch.from_numpy(y_test).long())


def make_model(hidden=256, layers=2):
    """An MLP: 64 inputs, `layers` hidden layers of `hidden` units with ReLU, 10 outputs. The
    default has 85k parameters (340 KB of gradients a step); hidden=2048 has 4.35M (17 MB), enough
    that a step's all-reduce outweighs its computation on a 1 Gbit/s cable."""
    widths = [64] + [hidden] * layers
    mods = []
    for a, b in zip(widths, widths[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(widths[-1], 10))


def perturbed_allreduce_hook(generator, relative):
    """A DDP communication hook: the default average (divide, all-reduce), then every summed
    gradient element multiplied by (1 + u * relative), u uniform in [-1, 1] and the same on
    every rank. With relative = 2^-24 it is the size of one float32 rounding: a control that
    shows how far two runs drift apart from differences that small alone."""
    def hook(world, bucket):
        t = bucket.buffer().div_(world)
        fut = dist.all_reduce(t, async_op=True).get_future()

        def perturb(f):
            out = f.value()[0]
            u = torch.rand(out.shape, generator=generator) * 2 - 1
            return out.mul_(1 + u * relative)
        return fut.then(perturb)
    return hook


def train(rank, world, backend, epochs=20, batch_size=16, lr=0.05, seed=0, perturb=0.0, hidden=256,
          layers=2, warmup=0, measure_allreduce=False, profile=0):
    """Trains on this rank's shard; returns the per-iteration losses (this rank's batch), the
    test accuracy of the final model and the training loop's iterations per second, not counting
    the first `warmup` iterations (their time is setup: first touch of buffers, the backend's
    first all-reduce). perturb > 0 adds perturbed_allreduce_hook(perturb). With
    measure_allreduce, also the time of the bare all-reduce of the model's gradients
    (step_timing.measure_allreduce). profile > 0: rank 0 prints torch.profiler's table of that
    many iterations after warm-up."""
    if backend == "switchml":
        import switchml.torch  # noqa: F401 - registers the backend
    torch.set_num_threads(1)
    step_timing.keep_freed_memory()
    x_train, y_train, x_test, y_test = load_data(seed)
    torch.manual_seed(seed)  # the same initial model on every rank and for every backend
    model = DDP(make_model(hidden, layers))
    if perturb > 0:
        model.register_comm_hook(world, perturbed_allreduce_hook(
            torch.Generator().manual_seed(seed + 1), perturb))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    n = len(x_train) // world * world  # every rank runs the same number of iterations
    losses = []
    timer = step_timing.StepTimer(warmup)
    profiler = step_timing.Profiler(profile, warmup)
    dist.barrier()
    for _ in range(epochs):
        order = torch.randperm(len(x_train), generator=g)[:n]
        shard = order[rank::world]
        for i in range(0, len(shard) - batch_size + 1, batch_size):
            profiler.step(len(losses))
            timer.start()
            idx = shard[i:i + batch_size]
            timer.mark("data")
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            timer.mark("forward")
            loss.backward()  # DDP's all-reduces: started during backward, waited for at its end
            timer.mark("backward")
            opt.step()
            timer.mark("optimizer")
            losses.append(loss.item())
            timer.stop()
    profiler.finish(rank)
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item() * 100
    r = timer.results()
    r.update({"losses": losses, "accuracy": accuracy, "iterations": len(losses),
              "parameters": sum(p.numel() for p in model.parameters())})
    if measure_allreduce:
        r["allreduce_seconds"] = step_timing.measure_allreduce(model.module)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="switchml")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=256, help="units per hidden layer")
    p.add_argument("--layers", type=int, default=2, help="hidden layers")
    p.add_argument("--warmup", type=int, default=0,
                   help="iterations left out of iterations/s (still trained); when > 0, the "
                   "bare all-reduce of the gradients is timed too")
    p.add_argument("--profile", type=int, default=0, metavar="ITERATIONS",
                   help="print torch.profiler's table of ITERATIONS iterations after warm-up "
                   "(rank 0)")
    p.add_argument("--out", help="write rank 0's results here (JSON)")
    a = p.parse_args()
    rank, world = step_timing.init_from_torchrun(a.backend)
    r = train(rank, world, a.backend, a.epochs, a.batch_size, a.lr, a.seed, hidden=a.hidden,
              layers=a.layers, warmup=a.warmup, measure_allreduce=a.warmup > 0, profile=a.profile)
    step_timing.finish(r, a.out, lambda r: (
        f"{a.backend}: {world} processes, {r['parameters']} parameters, "
        f"{r['iterations']} iterations, final loss "
        f"{r['losses'][-1]:.4f}, test accuracy {r['accuracy']:.2f}%, "
        f"{r['iterations_per_s']:.1f} iterations/s; {step_timing.summary(r)}"))


if __name__ == "__main__":
    main()
