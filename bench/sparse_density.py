#!/usr/bin/python3
"""Block-sparse all-reduce against gradient density: switchml with --sparse-auto (and --sparse,
and dense) at each --density, beside Gloo (halving-doubling, dense: its time does not depend on
the density), all in one setting of bench.py (by default the emulated rack at 1 Gbit/s). Writes
the rows (JSON), a table (Markdown) and a plot of the speed-up over Gloo against the density.

    flock -x /work/.cpu.lock /usr/bin/python3 bench/sparse_density.py --workers 8 \\
        --out build-bench/sparse-density

--density is the fraction of blocks non-zero on some worker (the union); --overlap the chance
that another worker holds a non-zero block too (1: the same blocks everywhere). Each point is
one bench.py run (--rounds of its median); see docs/benchmarks.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def bench(a, systems, switchml_args, out):
    cmd = [sys.executable, os.path.join(HERE, "bench.py"), "--settings", a.setting,
           "--workers", str(a.workers), "--sizes", a.size, "--systems", systems,
           "--rounds", str(a.rounds), "--iterations", str(a.iterations), "--out", out,
           "--switchml-args", switchml_args]
    if a.switchml:
        cmd += ["--switchml", a.switchml]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if a.quiet else None)
    with open(os.path.join(out, "bench.json")) as f:
        return json.load(f)["rows"]


def median_of(rows, system):
    times = [r["median_s"] for r in rows if r["system"] == system and r.get("verified", True)]
    if not times:
        sys.exit(f"sparse_density: no verified {system} row")
    return statistics.median(times)


def plot(result, path):
    """The speed-up over Gloo against the density, one line per mode, dense switchml beside."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows, gloo, dense = result["rows"], result["gloo_hd_s"], result["dense_switchml_s"]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for m in dict.fromkeys(r["mode"] for r in rows):
        pts = [(r["density"], r["speedup_vs_gloo"]) for r in rows if r["mode"] == m]
        ax.plot([x for x, _ in pts], [y for _, y in pts], "o-",
                label=f"switchml --sparse{'-auto' if m == 'auto' else ''}")
    ax.axhline(gloo / dense, color="gray", ls="--", label="switchml dense")
    ax.axhline(1, color="black", lw=0.8, label="Gloo (halving-doubling)")
    if min(r["density"] for r in rows) > 0:
        ax.set_xscale("log")
    else:
        ax.set_xscale("symlog", linthresh=0.001)
        ax.set_xlim(left=0)
    ax.set_yscale("log")
    ax.set_xlabel("density (fraction of blocks non-zero on some worker)")
    ax.set_ylabel("speed-up over Gloo")
    ax.set_title(f"{result['setting']}, {result['workers']} workers, {result['size']} float32, "
                 f"overlap {result['overlap']:g}")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setting", default="rack:1gbit", help="a bench.py setting")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--size", default="64M", help="tensor size (bench.py --sizes)")
    p.add_argument("--densities", default="0.001,0.01,0.1,0.25,0.5,0.7,0.8,0.9,1")
    p.add_argument("--overlap", type=float, default=0.5)
    p.add_argument("--modes", default="auto,on", help="comma-separated: auto (--sparse-auto), "
                   "on (--sparse)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--switchml", help="the switchml binary (bench.py's default otherwise)")
    p.add_argument("--out", default="build-bench/sparse-density")
    p.add_argument("--quiet", action="store_true", help="hide bench.py's own output")
    p.add_argument("--replot", metavar="JSON", help="only redraw the plot of an earlier run's "
                   "sparse_density.json (next to it)")
    a = p.parse_args()
    if a.replot:
        with open(a.replot) as f:
            plot(json.load(f), os.path.join(os.path.dirname(a.replot), "sparse_density.png"))
        return
    modes = {"auto": "--sparse-auto", "on": "--sparse"}
    for m in a.modes.split(","):
        if m not in modes:
            sys.exit(f"sparse_density: unknown mode {m!r}: use auto or on")
    densities = [float(d) for d in a.densities.split(",")]
    if any(not 0 <= d <= 1 for d in densities):
        sys.exit("sparse_density: densities must be in [0, 1]")
    os.makedirs(a.out, exist_ok=True)

    base = bench(a, "gloo-hd,switchml", "", os.path.join(a.out, "dense"))
    gloo, dense = median_of(base, "gloo-hd"), median_of(base, "switchml")
    rows = []
    for d in densities:
        for m in a.modes.split(","):
            args = f"{modes[m]} --density {d:g} --overlap {a.overlap:g}"
            got = bench(a, "switchml", args, os.path.join(a.out, f"{m}-{d:g}"))
            t = median_of(got, "switchml")
            rows.append({"mode": m, "density": d, "median_s": t, "speedup_vs_gloo": gloo / t,
                         "vs_dense_switchml": dense / t})
            print(f"{m:5s} density {d:<6g} {t:.4f} s: {gloo / t:.2f}x gloo, "
                  f"{dense / t:.2f}x dense switchml", flush=True)
    result = {"setting": a.setting, "workers": a.workers, "size": a.size, "overlap": a.overlap,
              "gloo_hd_s": gloo, "dense_switchml_s": dense, "rows": rows}
    with open(os.path.join(a.out, "sparse_density.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(a.out, "sparse_density.md"), "w") as f:
        f.write(f"{a.setting}, {a.workers} workers, {a.size} float32, overlap {a.overlap:g}: "
                f"Gloo halving-doubling {gloo:.4f} s, dense switchml {dense:.4f} s\n\n")
        f.write("| density | mode | switchml | vs Gloo | vs dense switchml |\n|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['density']:g} | {r['mode']} | {r['median_s']:.4f} s | "
                    f"{r['speedup_vs_gloo']:.2f}x | {r['vs_dense_switchml']:.2f}x |\n")
    plot(result, os.path.join(a.out, "sparse_density.png"))
    print(f"wrote {a.out}/sparse_density.{{json,md,png}}")


if __name__ == "__main__":
    main()
