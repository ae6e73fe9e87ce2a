"""bench.py --ddp: DDP training steps of DNN-shaped models, gloo against switchml.

For every setting of --settings and every model of --ddp, runs examples/torch/train_dnn.py (the
parameter shapes of ResNet-50, VGG-16 or BERT-base with next to no computation: what a user sees
where the computation is fast) once per backend at every worker count, and reports the median step
of the slowest rank, the speed-up over gloo, the bare all-reduce of the same DDP buckets and the
step's ratio to it, and the largest gap between the backends' losses. The runs are the examples'
own scripts, so the figures are the ones a user reproduces with them:
  loopback            examples/torch/host_train.sh (gloo, switchml over UDP and over shm)
  rack:RATE           examples/torch/rack_train.sh --rate RATE (the switch on the bridge)
  server-rack:RATE    rack_train.sh --switch-hosts K (the job striped over K switch servers)
Writes ddp.json, ddp.md and ddp.png (step time against workers, one panel per setting).
"""

import json
import os
import shutil
import statistics
import subprocess

import outputs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples", "torch")
MODELS = ("resnet50", "vgg16", "bert-base")  # examples/torch/dnn_buckets.py's MODELS
HOST_BACKENDS = ("gloo", "udp", "shm")  # host_train.sh's names
BACKEND_LABELS = {"gloo": "gloo", "udp": "switchml (UDP)", "shm": "switchml (shm)",
                  "switchml": "switchml"}


def log(msg):
    print(f"[bench --ddp] {msg}", flush=True)


def check(build):
    """A message saying what the build lacks for --ddp, or None."""
    if not os.access(os.path.join(build, "tools", "switchml"), os.X_OK):
        return f"--ddp: no {build}/tools/switchml (scripts/bench.sh builds it)"
    python = os.path.join(build, "python", "switchml")
    if not (os.path.isdir(python) and any(f.startswith("_torch") for f in os.listdir(python))):
        return (f"--ddp needs the torch backend in {build}/python (build it: ninja -C {build} "
                "switchml switchml_python_core switchml_torch; scripts/bench.sh --ddp does)")
    return None


def _run(cmd, log_path, timeout):
    """Runs cmd with its output in log_path; True when it succeeded (a failure is logged)."""
    log(" ".join(cmd))
    with open(log_path, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            log(f"timed out after {timeout} s (log: {log_path})")
            return False
    if rc != 0:
        log(f"failed with exit status {rc} (log: {log_path}):")
        with open(log_path) as f:
            print("".join(f.readlines()[-15:]), end="", flush=True)
    return rc == 0


def _loss_gap(a, b):
    return max((abs(x - y) for x, y in zip(a, b)), default=float("nan"))


def _host_rows(a, build, model, out):
    """Loopback: host_train.sh, one row per worker count with gloo, udp and shm."""
    run_dir = os.path.join(out, f"loopback-{model}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    ok = _run(["bash", os.path.join(EXAMPLES, "host_train.sh"), build,
               "--workers", ",".join(map(str, a.workers)), "--backends", ",".join(HOST_BACKENDS),
               "--out-dir", run_dir, "--", "--model", model, "--steps", str(a.ddp_steps)],
              os.path.join(run_dir, "host_train.log"), a.run_timeout * len(a.workers))
    rows = []
    for n in a.workers:
        row = {"setting": "loopback", "model": model, "workers": n, "backends": {}}
        for b in HOST_BACKENDS:
            path = os.path.join(run_dir, f"w{n}-{b}.json")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                r = json.load(f)
            row["parameters"] = r.get("parameters")
            row["backends"][b] = {"step_s": statistics.median(r["step_seconds"]),
                                  "losses": r.get("losses", [])}
            if "allreduce_seconds" in r:
                row["backends"][b]["allreduce_s"] = r["allreduce_seconds"]
        rows.append(row)
    return rows, ok


def _rack_rows(a, build, model, setting, out):
    """A rack: rack_train.sh per switch-host count (the bridge's switch: 0)."""
    kind, rate = setting.split(":")
    counts = a.switch_hosts if kind == "server-rack" else ["0"]
    rows, ok = [], True
    for k in counts:
        name = f"{setting.replace(':', '-')}-{model}" + (f"-k{k}" if kind == "server-rack" else "")
        run_dir = os.path.join(out, name)
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        json_path = os.path.join(run_dir, "rack_train.json")
        ok = _run(["bash", os.path.join(EXAMPLES, "rack_train.sh"), build,
                   "--workers", ",".join(map(str, a.workers)), "--rate", rate,
                   "--script", "train_dnn.py", "--switch-hosts", k, "--json", json_path,
                   "--logs", run_dir, "--", "--model", model, "--steps", str(a.ddp_steps)],
                  os.path.join(run_dir, "rack_train.log"),
                  a.run_timeout * len(a.workers)) and ok
        if not os.path.exists(json_path):
            continue
        with open(json_path) as f:
            for r in json.load(f):
                row = {"setting": setting, "model": model, "workers": r["workers"],
                       "parameters": r.get("parameters"), "backends": {}}
                if kind == "server-rack":
                    row["switch_hosts"] = r["switch_hosts"]
                for b in ("gloo", "switchml"):
                    row["backends"][b] = {"step_s": r[b]["step_s"], "losses": r[b]["losses"]}
                    if "allreduce_s" in r[b]:
                        row["backends"][b]["allreduce_s"] = r[b]["allreduce_s"]
                rows.append(row)
    return rows, ok


def _derive(row):
    """Speed-ups over gloo, each step's ratio to its bare all-reduce, the largest loss gap."""
    bs = row["backends"]
    gloo = bs.get("gloo")
    for name, r in bs.items():
        if gloo is not None and name != "gloo":
            r["speedup"] = gloo["step_s"] / r["step_s"]
            r["max_loss_gap"] = _loss_gap(gloo["losses"], r["losses"])
        if "allreduce_s" in r:
            r["step_over_allreduce"] = r["step_s"] / r["allreduce_s"]


def markdown(report):
    lines = [f"# DDP steps, gloo against switchml (commit {report['commit']})", "",
             f"Median step of the slowest rank over {report['config']['ddp_steps']} steps after "
             "warm-up (examples/torch/train_dnn.py); speed-up = gloo's step / this backend's; "
             "step / all-reduce = the step over the bare all-reduce of the same DDP buckets "
             "(what overlap with computation leaves; 1.0 = none lost); loss gap = the largest "
             "difference of rank 0's losses from gloo's.", "",
             "| setting | model | workers | backend | step | speed-up | step / all-reduce | "
             "loss gap |", "|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        setting = row["setting"] + (f" k={row['switch_hosts']}" if "switch_hosts" in row else "")
        for name, r in row["backends"].items():
            sp = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
            so = f"{r['step_over_allreduce']:.2f}" if "step_over_allreduce" in r else "-"
            gap = f"{r['max_loss_gap']:.1e}" if "max_loss_gap" in r else "-"
            lines.append(f"| {setting} | {row['model']} | {row['workers']} | "
                         f"{BACKEND_LABELS.get(name, name)} | {r['step_s']:.3f} s | {sp} | {so} | "
                         f"{gap} |")
    if report.get("failed"):
        lines += ["", "Failed runs (no row): " + ", ".join(report["failed"])]
    return "\n".join(lines) + "\n"


def plot(report, path):
    """Step time against workers: one panel per setting, a line per model and backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({(r["setting"], r.get("switch_hosts", 0)) for r in report["rows"]})
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4.5), squeeze=False)
    for ax, (setting, k) in zip(axes[0], settings):
        sub = [r for r in report["rows"] if r["setting"] == setting
               and r.get("switch_hosts", 0) == k]
        for i, model in enumerate(sorted({r["model"] for r in sub})):
            rows = sorted((r for r in sub if r["model"] == model), key=lambda r: r["workers"])
            for j, b in enumerate(sorted({b for r in rows for b in r["backends"]})):
                pts = [(r["workers"], r["backends"][b]["step_s"]) for r in rows
                       if b in r["backends"]]
                # A color per model; gloo dashed, switchml's transports solid with their marker.
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=f"C{i}",
                        marker="os^v"[j % 4], linestyle="--" if b == "gloo" else "-",
                        label=f"{model}, {BACKEND_LABELS.get(b, b)}")
        ax.set_xticks(sorted({r["workers"] for r in sub}))
        ax.set_xlabel("workers")
        ax.set_ylabel("median DDP step (s)")
        ax.set_ylim(bottom=0)
        ax.set_title(setting + (f", {k} switch hosts" if k else ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"DDP steps of DNN-shaped models - commit {report['commit']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_outputs(report, out, docs_dir):
    files = []
    for name, text in (("ddp.json", json.dumps(report, indent=1) + "\n"),
                       ("ddp.md", markdown(report))):
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
        files.append(os.path.join(out, name))
    if report["rows"]:
        try:
            plot(report, os.path.join(out, "ddp.png"))
            files.append(os.path.join(out, "ddp.png"))
        except ImportError as e:
            log(f"no plot: {e} (apt-get install python3-matplotlib)")
    outputs.publish(files, docs_dir, log)


def run(a, build, commit):
    """Every setting and model; returns the exit status (1 when a run failed)."""
    report = {"commit": commit, "config": {"settings": a.settings, "models": a.ddp,
                                           "workers": a.workers, "ddp_steps": a.ddp_steps},
              "rows": [], "failed": []}
    for setting in a.settings:
        for model in a.ddp:
            if setting == "loopback":
                rows, ok = _host_rows(a, build, model, a.out)
            else:
                rows, ok = _rack_rows(a, build, model, setting, a.out)
            for row in rows:
                _derive(row)
            report["rows"] += rows
            if not ok:
                report["failed"].append(f"{setting} {model}")
            write_outputs(report, a.out, "")  # after every run: an interrupted bench keeps them
    write_outputs(report, a.out, a.docs_dir)
    print(markdown(report), end="")
    return 1 if report["failed"] else 0
