"""DDP steps of DNN-shaped models: the parameters of ResNet-50, VGG-16 or BERT-base (their
published shapes, dnn_buckets.py) with almost no computation, so that a step is DDP's
all-reduce of the model's gradients plus DDP's and the optimizer's passes over them. What a
user training such a model sees of the backend where the computation is fast (a GPU) and the
network is not.

The model: every parameter tensor p_i of the architecture, in its order; the forward pass
computes z = sum_i p_i.sum() / numel(p_i) (one read of every parameter) and predicts x * z
for each sample x. The data: x ~ N(0, 1), y = 1.5 x + 0.1 N(0, 1) (the same on every rank, each
rank training on its share of each step's samples); the loss is the mean squared error. So every
parameter gets a gradient every step (each tensor a constant, different per tensor and step),
DDP packs them in its default buckets (1 MB first, then 25 MB; VGG-16's 411 MB layer is a
bucket of its own) and all-reduces them while backward runs, and SGD updates every parameter.
The loss falls from about 2.3 toward the noise (0.01) by a factor of ~0.64 per step; with switchml it must agree
with gloo's to float32 rounding. "accuracy" (for rack_report.py): the share of test samples
predicted within 0.25 of y.

Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment):

    SWITCHML_SWITCH=127.0.0.1:50099 torchrun --nproc_per_node 2 \\
        examples/torch/train_dnn.py --backend switchml --model resnet50

rack_train.sh --script train_dnn.py -- --model vgg16 runs it with gloo and with switchml in the
emulated rack and compares the two.
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import dnn_buckets
import step_timing


class ShapedModel(nn.Module):
    """A model with the given parameter shapes and next to no computation (see above)."""

    def __init__(self, shapes):
        super().__init__()
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.randn(s) * 0.02) for s in shapes])
        self.scales = [1.0 / p.numel() for p in self.weights]

    def forward(self, x):
        z = sum(p.sum() * c for p, c in zip(self.weights, self.scales))
        return x * z


def data(n, seed):
    g = torch.Generator().manual_seed(seed + 1000)
    x = torch.randn(n, generator=g)
    return x, 1.5 * x + 0.1 * torch.randn(n, generator=g)


def train(rank, world, model_name, steps=10, warmup=3, batch_size=64, lr=None, seed=0,
          bucket_view=True, set_to_none=False, profile=0, allreduce_iterations=5):
    """Trains for warmup + steps steps; returns this rank's per-step losses, the test accuracy
    and loss, the step and phase times after warm-up, DDP's bucket sizes and the time of the
    bare all-reduce of the same buckets (step_timing.measure_allreduce)."""
    torch.set_num_threads(1)
    step_timing.keep_freed_memory()
    shapes, expect = dnn_buckets.MODELS[model_name]()
    torch.manual_seed(seed)  # the same initial model on every rank and for every backend
    module = ShapedModel(shapes)
    parameters = sum(p.numel() for p in module.parameters())
    assert parameters == expect, f"{model_name}: {parameters} parameters, expected {expect}"
    # z moves by lr * (sum_i 1/numel_i) per unit of its gradient: lr = 0.1 / that sum makes z
    # close 20% of its distance to 1.5 per step (E[x^2] = 1), whatever the model.
    lr = lr or 0.1 / sum(module.scales)
    model = DDP(module, gradient_as_bucket_view=bucket_view)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    total = warmup + steps
    train_x, train_y = data(total * world * batch_size, seed)
    test_x, test_y = data(10_000, seed + 1)
    loss_fn = nn.MSELoss()
    timer = step_timing.StepTimer(warmup)
    profiler = step_timing.Profiler(profile, warmup)
    losses = []
    dist.barrier()
    for step in range(total):
        profiler.step(step)
        timer.start()
        lo = (step * world + rank) * batch_size
        x, y = train_x[lo:lo + batch_size], train_y[lo:lo + batch_size]
        timer.mark("data")
        # PyTorch 1.13's default (set_to_none=False): the gradients stay views of DDP's buckets.
        opt.zero_grad(set_to_none=set_to_none)
        loss = loss_fn(model(x), y)
        timer.mark("forward")
        loss.backward()  # DDP's all-reduces: started during backward, waited for at its end
        timer.mark("backward")
        opt.step()
        timer.mark("optimizer")
        losses.append(loss.item())
        timer.stop()
    profiler.finish(rank)
    with torch.no_grad():
        pred = model.module(test_x)
        test_loss = loss_fn(pred, test_y).item()
        accuracy = ((pred - test_y).abs() < 0.25).float().mean().item() * 100
    sizes = step_timing.ddp_bucket_numels(model)
    r = timer.results()
    r.update({"losses": losses, "accuracy": accuracy, "test_loss": test_loss,
              "iterations": len(losses), "parameters": parameters, "model": model_name,
              "bucket_numels": sizes,
              "allreduce_seconds": step_timing.measure_allreduce_sizes(
                  sizes, allreduce_iterations)})
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="switchml")
    p.add_argument("--model", default="resnet50", choices=sorted(dnn_buckets.MODELS))
    p.add_argument("--steps", type=int, default=10, help="measured steps (after warm-up)")
    p.add_argument("--warmup", type=int, default=3, help="steps trained but not timed")
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    p.add_argument("--lr", type=float, help="SGD's learning rate (default: z closes 20%% of its gap a step)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-bucket-view", action="store_true",
                   help="DDP's default gradient buckets (copies in and out)")
    p.add_argument("--set-to-none", action="store_true",
                   help="zero_grad(set_to_none=True): fresh gradients every step")
    p.add_argument("--allreduce-iterations", type=int, default=5,
                   help="timed rounds of the bare all-reduce of DDP's buckets")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="print torch.profiler's table of STEPS steps after warm-up (rank 0)")
    p.add_argument("--out", help="write rank 0's results here (JSON)")
    a = p.parse_args()
    rank, world = step_timing.init_from_torchrun(a.backend)
    r = train(rank, world, a.model, a.steps, a.warmup, a.batch_size, a.lr, a.seed,
              not a.no_bucket_view, a.set_to_none, a.profile, a.allreduce_iterations)
    step_timing.finish(r, a.out, lambda r: (
        f"{a.backend}: {world} processes, {a.model} shapes, {r['parameters']} parameters in "
        f"{len(r['bucket_numels'])} buckets, {r['iterations']} steps, loss "
        f"{r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}, test loss {r['test_loss']:.4f}, "
        f"{step_timing.summary(r)}"))


if __name__ == "__main__":
    main()
