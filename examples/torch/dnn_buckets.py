"""DNN-shaped all-reduce benchmark: the gradient tensors of ResNet-50, VGG-16 and BERT-base, put
in buckets as PyTorch 1.13's DDP does by default (parameters in reverse order, the first bucket
capped at 1 MB and the others at 25 MB), all-reduced bucket by bucket (all started, then all
waited for, as DDP's backward does), switchml vs gloo; the time of one training step's
communication.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch/dnn_buckets.py --workers 2

Parameter shapes are the models' published architectures (torchvision's resnet50 and vgg16,
bert-base-uncased); the script checks each model's total against its well-known parameter count.
--scale shrinks every tensor (for a quick smoke run). Starts its own software switch in-process
unless SWITCHML_SWITCH is set. Prints a table and writes --json.
"""
import argparse
import json
import os
import statistics
import sys

import switchml
import switchml.torch as swtorch
from step_timing import buckets, numel, time_allreduces  # DDP's default bucketing


def resnet50():
    shapes = [(64, 3, 7, 7), (64,), (64,)]  # conv1, bn1 weight and bias
    cin = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            for k, (co, ci) in enumerate(((width, cin), (width, width), (4 * width, width))):
                ks = 3 if k == 1 else 1
                shapes += [(co, ci, ks, ks), (co,), (co,)]
            if b == 0:  # downsample: 1x1 conv and its batch norm
                shapes += [(4 * width, cin, 1, 1), (4 * width,), (4 * width,)]
            cin = 4 * width
    return shapes + [(1000, 2048), (1000,)], 25_557_032


def vgg16():
    shapes, cin = [], 3
    for cout in (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512):
        shapes += [(cout, cin, 3, 3), (cout,)]
        cin = cout
    for fin, fout in ((512 * 7 * 7, 4096), (4096, 4096), (4096, 1000)):
        shapes += [(fout, fin), (fout,)]
    return shapes, 138_357_544


def bert_base():
    h, ff = 768, 3072
    shapes = [(30522, h), (512, h), (2, h), (h,), (h,)]  # embeddings and their LayerNorm
    for _ in range(12):
        for _ in range(4):  # query, key, value, attention output
            shapes += [(h, h), (h,)]
        shapes += [(h,), (h,), (ff, h), (ff,), (h, ff), (h,), (h,), (h,)]
    return shapes + [(h, h), (h,)], 109_482_240  # pooler


MODELS = {"resnet50": resnet50, "vgg16": vgg16, "bert-base": bert_base}


def bench_worker(rank, world, sizes, iterations):
    import torch
    torch.set_num_threads(1)
    return time_allreduces([torch.randn(n) for n in sizes], iterations)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--workers", default="2")
    p.add_argument("--backends", default="gloo,switchml")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--json", default="dnn_buckets.json")
    a = p.parse_args()
    env, switch = {}, None
    if not os.environ.get("SWITCHML_SWITCH"):
        switch = switchml.Switch()
        env["SWITCHML_SWITCH"] = f"127.0.0.1:{switch.control_port}"
    rows = []
    print(f"{'model':10s} {'workers':>7s} {'buckets':>7s} {'elements':>11s} {'backend':>9s} "
          f"{'median step':>11s} {'min':>8s} {'max':>8s} {'elem/s':>9s}")
    for name in a.models.split(","):
        shapes, expect = MODELS[name]()
        total = sum(numel(s) for s in shapes)
        if total != expect:
            sys.exit(f"{name}: {total} parameters, expected {expect}")
        sizes = buckets(shapes, a.scale)
        for world in (int(w) for w in a.workers.split(",")):
            for backend in a.backends.split(","):
                per_rank = swtorch.run_local(world, bench_worker, sizes, a.iterations,
                                             backend=backend, env=env, timeout=1800)
                # A step ends when its slowest rank is done.
                steps = [max(r[i] for r in per_rank) for i in range(a.iterations)]
                med = statistics.median(steps)
                row = {"model": name, "workers": world, "backend": backend,
                       "buckets": sizes, "elements": sum(sizes), "step_seconds": steps,
                       "median_s": med, "elements_per_s": sum(sizes) / med}
                rows.append(row)
                print(f"{name:10s} {world:7d} {len(sizes):7d} {sum(sizes):11d} {backend:>9s} "
                      f"{med:10.3f}s {min(steps):7.3f}s {max(steps):7.3f}s "
                      f"{row['elements_per_s']:9.2e}")
    if switch is not None:
        switch.stop()
    with open(a.json, "w") as f:
        json.dump({"config": vars(a), "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
