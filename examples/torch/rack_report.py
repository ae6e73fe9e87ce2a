"""The comparison printed by rack_train.sh: for each worker count, gloo's and switchml's median
step, the speed-up, the phases, the bare all-reduce, accuracy and rank 0's loss gap; an optional
JSON of everything and a plot. Exits 1 when the accuracies differ by more than 0.5 points.

    rack_report.py OUT_DIR WORKERS_LIST RATE SCRIPT [JSON] [PLOT] [MULTICAST]

MULTICAST: the switchml runs' mode (rack_train.sh --multicast), checked against what rank 0's
group ran with; the share of results that came through the job's multicast group is printed.
"""
import json
import statistics
import sys

import numpy as np

BACKENDS = ("gloo", "switchml")


def load(out, workers):
    return {b: json.load(open(f"{out}/{b}-{workers}.json")) for b in BACKENDS}


def phases(r):
    return {k: statistics.median(v) for k, v in r.get("phase_seconds", {}).items()}


def plot(rows, rate, script, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, curves) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.38
    for j, b in enumerate(BACKENDS):
        x = np.arange(len(rows)) + (j - 0.5) * width
        steps = [row[b]["step_s"] for row in rows]
        comm = [row[b].get("allreduce_s", 0) for row in rows]
        bars.bar(x, steps, width, label=f"{b}: step", color=("tab:blue", "tab:orange")[j])
        bars.bar(x, comm, width * 0.45, label=f"{b}: its all-reduce alone", color="black",
                 alpha=(0.35, 0.7)[j])
        for xi, s in zip(x, steps):
            bars.text(xi, s, f"{s:.2f}", ha="center", va="bottom", fontsize=8)
    bars.set_xticks(np.arange(len(rows)))
    bars.set_xticklabels([f"{row['workers']} workers\n{row['speedup']:.2f}x" for row in rows])
    bars.set_ylabel("median step (s)")
    bars.set_title(f"{script}, {rows[0]['parameters']:,} parameters, {rate} cables")
    bars.set_ylim(0, 1.35 * max(row[b]["step_s"] for row in rows for b in BACKENDS))
    bars.legend(fontsize=8, loc="upper center", ncol=2)
    last = rows[-1]
    for b, style in zip(BACKENDS, ("-", "--")):
        curves.plot(last[b]["losses"], style, label=f"{b} (test acc. {last[b]['accuracy']:.2f}%)")
    curves.set_xlabel("step")
    curves.set_ylabel("rank 0's training loss")
    curves.set_title(f"{last['workers']} workers")
    curves.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    out, workers_list, rate, script = sys.argv[1:5]
    json_path = sys.argv[5] if len(sys.argv) > 5 else ""
    plot_path = sys.argv[6] if len(sys.argv) > 6 else ""
    multicast = sys.argv[7] if len(sys.argv) > 7 else "auto"
    # The switch servers the job was striped over (rack_train.sh --switch-hosts; 0: the switch
    # on the bridge).
    switch_hosts = sys.argv[8] if len(sys.argv) > 8 else "0"
    rows, ok = [], True
    for workers in [int(w) for w in workers_list.split(",")]:
        res = load(out, workers)
        hosts = workers if switch_hosts == "n" else int(switch_hosts)
        row = {"workers": workers, "rate": rate, "script": script, "switch_hosts": hosts,
               "parameters": res["gloo"].get("parameters")}
        for b, r in res.items():
            row[b] = {"step_s": statistics.median(r["step_seconds"]),
                      "steps": len(r["step_seconds"]),
                      "steps_per_s": r["iterations_per_s"], "phases_s": phases(r),
                      "accuracy": r["accuracy"], "losses": r["losses"]}
            if "allreduce_seconds" in r:
                row[b]["allreduce_s"] = r["allreduce_seconds"]
            if "switchml" in r:  # rank 0's transport, multicast mode and datagram counters
                row[b]["switchml"] = r["switchml"]
        g, s = row["gloo"], row["switchml"]
        row["speedup"] = g["step_s"] / s["step_s"]
        gap = np.abs(np.array(g["losses"]) - np.array(s["losses"]))
        row["max_loss_gap"] = float(gap.max())
        acc_gap = abs(g["accuracy"] - s["accuracy"])
        if acc_gap > 0.5:
            ok = False
            print(f"FAIL: {workers} workers: the test accuracies differ by {acc_gap:.2f} points")
        for b in BACKENDS:
            r = row[b]
            ph = ", ".join(f"{k} {v:.3f}" for k, v in r["phases_s"].items())
            ar = f"; all-reduce alone {r['allreduce_s']:.3f} s" if "allreduce_s" in r else ""
            print(f"  {workers} workers {b:8s}: median step {r['step_s']:.3f} s over "
                  f"{r['steps']} steps ({ph}){ar}; loss {r['losses'][0]:.4f} -> "
                  f"{r['losses'][-1]:.4f}, test accuracy {r['accuracy']:.2f}%")
        extra = ""
        sw = s.get("switchml")
        if sw is not None:
            share = sw["group_datagrams_received"] / max(1, sw["datagrams_received"])
            print(f"  {workers} workers switchml: multicast {sw['multicast']}, "
                  f"{sw['group_datagrams_received']} of rank 0's {sw['datagrams_received']} "
                  f"datagrams through the job's group ({100 * share:.0f}%), "
                  f"{sw['packets_retransmitted']} of {sw['packets_sent']} packets re-sent")
            extra += f" multicast={sw['multicast']} group_share={share:.3f}"
            if sw["multicast"] != multicast:
                ok = False
                print(f"FAIL: switchml ran with multicast {sw['multicast']}, not {multicast}")
            elif multicast == "on" and share < 0.5:
                ok = False
                print("FAIL: with --multicast on, most results came unicast")
        if "allreduce_s" in g and "allreduce_s" in s:
            extra += (f" gloo_allreduce_s={g['allreduce_s']:.4f} "
                      f"switchml_allreduce_s={s['allreduce_s']:.4f} "
                      f"allreduce_speedup={g['allreduce_s'] / s['allreduce_s']:.3f}")
        print(f"RACK_TRAIN script={script} workers={workers} rate={rate} switch_hosts={hosts} "
              f"parameters={row['parameters']} gloo_step_s={g['step_s']:.4f} "
              f"switchml_step_s={s['step_s']:.4f} speedup={row['speedup']:.3f}{extra} "
              f"accuracy_gloo={g['accuracy']:.2f} accuracy_switchml={s['accuracy']:.2f} "
              f"max_loss_gap={row['max_loss_gap']:.2e}")
        rows.append(row)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
    if plot_path:
        plot(rows, rate, script, plot_path)
    if not ok:
        print("FAIL: the backends' test accuracies differ by more than 0.5 points, or "
              "switchml did not run as asked (see above)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
