"""Training proof: the same DDP training (train_digits.py) with gloo and with switchml, 2 and 4
processes on loopback, same seeds; compares loss curves, test accuracy and iterations/s and
plots both loss curves. A control run (gloo whose summed gradients are perturbed by one float32
rounding, 2^-24 relative) shows how far two runs drift apart from differences of that size
alone: late in training, where the loss is near 0, SGD with momentum amplifies any difference.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch/compare_digits.py --out-dir DIR

Starts its own software switch in-process (or uses SWITCHML_SWITCH if set). Writes
DIR/digits.json and DIR/digits_loss.png; exits 1 if a check fails:
  - final test accuracies within --max-accuracy-gap points (0.5);
  - the mean loss curves (switchml vs gloo) within --max-loss-gap (absolute, every iteration)
    or, when the control drifts further than that, within 10 times the control's largest gap.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_digits  # noqa: E402

import switchml  # noqa: E402
import switchml.torch as swtorch  # noqa: E402


def run(backend, world, args, env, perturb=0.0):
    res = swtorch.run_local(world, train_digits.train, backend, args.epochs, args.batch_size,
                            args.lr, args.seed, perturb, backend=backend, env=env,
                            timeout=args.timeout)
    losses = np.mean([r["losses"] for r in res], axis=0)  # the job's loss: mean over ranks
    return {
        "losses": losses.tolist(),
        "accuracy": res[0]["accuracy"],
        "accuracy_all_ranks_equal": len({r["accuracy"] for r in res}) == 1,
        # The job moves at the pace of its slowest rank.
        "iterations_per_s": min(r["iterations_per_s"] for r in res),
        "iterations": res[0]["iterations"],
    }


def plot(results, worlds, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(worlds), figsize=(6 * len(worlds), 8), squeeze=False,
                             sharex="col")
    for col, world in enumerate(worlds):
        ax, gap_ax = axes[0][col], axes[1][col]
        g = np.array(results[f"gloo/{world}"]["losses"])
        for key, label, style in ((f"gloo/{world}", "gloo", "-"),
                                  (f"switchml/{world}", "switchml", "--")):
            r = results[key]
            ax.plot(r["losses"], style, label=f"{label} (test acc. {r['accuracy']:.2f}%)",
                    linewidth=1.2)
        for key, label in ((f"switchml/{world}", "switchml - gloo"),
                           (f"control/{world}", "control (gloo, gradients x (1 +- 2^-24)) - gloo")):
            if key in results:
                gap_ax.plot(np.abs(np.array(results[key]["losses"]) - g) + 1e-12, label=label,
                            linewidth=0.8)
        ax.set_title(f"DDP, {world} processes")
        ax.set_ylabel("training loss (mean over ranks)")
        ax.set_yscale("log")
        ax.legend()
        gap_ax.set_xlabel("iteration")
        gap_ax.set_ylabel("|loss difference| from gloo")
        gap_ax.set_yscale("log")
        gap_ax.legend(fontsize=8)
    fig.suptitle("scikit-learn digits, MLP 64-256-256-10: gloo vs switchml, same seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default=".")
    p.add_argument("--workers", default="2,4")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--max-accuracy-gap", type=float, default=0.5)
    p.add_argument("--max-loss-gap", type=float, default=1e-3)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-control", action="store_true", help="skip the perturbed gloo run")
    args = p.parse_args()
    worlds = [int(w) for w in args.workers.split(",")]
    os.makedirs(args.out_dir, exist_ok=True)

    switch = None
    env = {}
    if not os.environ.get("SWITCHML_SWITCH"):
        switch = switchml.Switch()
        env["SWITCHML_SWITCH"] = f"127.0.0.1:{switch.control_port}"
    results, failures = {"config": vars(args)}, []
    for world in worlds:
        for backend in ("gloo", "switchml"):
            results[f"{backend}/{world}"] = run(backend, world, args, env)
        if not args.no_control:
            results[f"control/{world}"] = run("gloo", world, args, env, perturb=2**-24)
        g, s = results[f"gloo/{world}"], results[f"switchml/{world}"]
        gaps = np.abs(np.array(g["losses"]) - np.array(s["losses"]))
        control_gap = (float(np.abs(np.array(g["losses"]) -
                                    np.array(results[f"control/{world}"]["losses"])).max())
                       if not args.no_control else 0.0)
        cmp = {
            "max_loss_gap": float(gaps.max()),
            "control_max_loss_gap": control_gap,
            "max_relative_loss_gap": float((gaps / np.array(g["losses"])).max()),
            "accuracy_gap": abs(g["accuracy"] - s["accuracy"]),
            "speed_ratio": s["iterations_per_s"] / g["iterations_per_s"],
        }
        results[f"compare/{world}"] = cmp
        print(f"{world} processes, {g['iterations']} iterations:")
        for name, r in (("gloo", g), ("switchml", s)):
            print(f"  {name:9s} final loss {r['losses'][-1]:.5f}  test accuracy "
                  f"{r['accuracy']:.2f}%  {r['iterations_per_s']:.1f} iterations/s")
        if not args.no_control:
            c = results[f"control/{world}"]
            print(f"  control   final loss {c['losses'][-1]:.5f}  test accuracy "
                  f"{c['accuracy']:.2f}%  (gloo, gradients x (1 +- 2^-24))")
        print(f"  max |loss gap| {cmp['max_loss_gap']:.2e} (relative "
              f"{cmp['max_relative_loss_gap']:.2e}; the control's {control_gap:.2e}), "
              f"accuracy gap {cmp['accuracy_gap']:.2f} points, switchml/gloo speed "
              f"{cmp['speed_ratio']:.2f}")
        if cmp["accuracy_gap"] > args.max_accuracy_gap:
            failures.append(f"{world} processes: accuracy gap {cmp['accuracy_gap']:.2f} points")
        if cmp["max_loss_gap"] > max(args.max_loss_gap, 10 * control_gap):
            failures.append(f"{world} processes: loss gap {cmp['max_loss_gap']:.2e}")
        if not (g["accuracy_all_ranks_equal"] and s["accuracy_all_ranks_equal"]):
            failures.append(f"{world} processes: ranks ended with different models")
    if switch is not None:
        switch.stop()
    with open(os.path.join(args.out_dir, "digits.json"), "w") as f:
        json.dump(results, f, indent=1)
    if not args.no_plot:
        plot(results, worlds, os.path.join(args.out_dir, "digits_loss.png"))
        print(f"wrote {os.path.join(args.out_dir, 'digits_loss.png')}")
    for msg in failures:
        print("FAIL:", msg)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
