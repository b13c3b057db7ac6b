#!/usr/bin/env python3
"""Turns bench/e2e's results.json into table.md, the plots' data files and two PNGs (gnuplot).

    report.py DIR        (DIR holds results.json; run by e2e.py at the end of a run)
"""

import json
import os
import subprocess
import sys

SIM_POLICY = {"no-io": "no-io", "dataloader-w4": "dataloader", "nopfs-frequency": "frequency",
              "nopfs-staging": "staging", "nopfs-fill-once": "fill-once",
              "nopfs-frequency-2nodes": "frequency"}
TWO_NODES = "-2nodes"  # rows whose simulate column comes from the 2-node simulation


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "results.json")) as fh:
        r = json.load(fh)
    rows = {row["name"]: row for row in r["rows"]}
    sim = {p["policy"]: p for p in (r["simulate"] or {}).get("policies", [])}
    sim_fc = {p["policy"]: p for p in (r.get("simulate_no_fetch_and_cache") or {}).get("policies", [])}
    sim2 = {p["policy"]: p for p in (r.get("simulate_2nodes") or {}).get("policies", [])}
    sim2_fc = {p["policy"]: p
               for p in (r.get("simulate_2nodes_no_fetch_and_cache") or {}).get("policies", [])}

    def predicted(table, name):
        if name.endswith(TWO_NODES):
            table = sim2 if table is sim else sim2_fc
        p = table.get(SIM_POLICY.get(name, ""))
        if p is None:
            return "—"
        return (" / ".join(f"{x:.1f}" for x in p["epoch_s"]) +
                f"; {p['job_pfs_bytes'] / ds:.2f}")
    base = rows.get("dataloader-w4")
    noio = rows.get("no-io")
    ds = r["dataset_bytes"]

    lines = [
        f"F = {r['samples']} samples, {ds / 1e6:.0f} MB (mean {ds / r['samples'] / 1e3:.0f} KB); "
        f"{r['ranks']} ranks on 1 node, batch {r['batch']} per rank, compute {r['rate']:g} "
        f"samples/s per rank; E = {r['epochs']}; emulated PFS t(γ) = {r['pfs']} MB/s; nopfs "
        f"tiers: RAM {r['ram_fraction']:g} and SSD {r['ssd_fraction']:g} of the dataset "
        f"(per node in the `{TWO_NODES}` row: half of that, the same {r['ranks']} ranks on 2 "
        f"nodes whose daemons run on this machine and serve each other over loopback); "
        f"{r['cores']} cores; {r['date']}.",
        "",
        "| setup | epoch times (s) | epochs 2+ mean (s) | × no-io | speed-up vs DL-w4 (epochs 2+) "
        "| stall median / p99 (ms), epochs 2+ | epoch 1 stall p99 (ms) | PFS bytes (datasets) "
        "| wall incl. start-up (s) | simulate (as nopfsd): epoch times (s); PFS datasets "
        "| simulate --no-fetch-and-cache |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        t = row["epoch_times"]
        later = mean(t[1:]) if len(t) > 1 else t[0]
        vs_noio = later / mean(noio["epoch_times"][1:] or noio["epoch_times"]) if noio else None
        speed = (mean(base["epoch_times"][1:] or base["epoch_times"]) / later) if base else None
        lines.append(
            f"| {name} | {' / '.join(f'{x:.1f}' for x in t)} | {later:.2f} | "
            f"{vs_noio:.2f} | {speed:.2f} | {row['stall_median'] * 1e3:.1f} / "
            f"{row['stall_p99'] * 1e3:.0f} | {row['stall_first_p99'] * 1e3:.0f} | "
            f"{row['pfs_bytes'] / ds:.2f} | {row['wall']:.1f} | {predicted(sim, name)} | "
            f"{predicted(sim_fc, name)} |")
    for note in r["notes"]:
        lines += ["", f"Note: {note}."]
    with open(os.path.join(out, "table.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")

    names = list(rows)
    with open(os.path.join(out, "epochs.dat"), "w") as fh:
        fh.write("# epoch " + " ".join(names) + "\n")
        for e in range(r["epochs"]):
            fh.write(f"{e + 1} " + " ".join(f"{rows[n]['epoch_times'][e]:.3f}" for n in names)
                     + "\n")
    # One bar pair per setup, fastest epochs 2+ first: epoch 1 and the mean of the later epochs,
    # each with its value; the title says what the figure shows.
    def later_mean(n):
        t = rows[n]["epoch_times"]
        return mean(t[1:]) if len(t) > 1 else t[0]

    order = sorted(names, key=later_mean)
    with open(os.path.join(out, "epoch_bars.dat"), "w") as fh:
        fh.write("# setup epoch1_s epochs2+_mean_s\n")
        for n in order:
            fh.write(f"{n} {rows[n]['epoch_times'][0]:.3f} {later_mean(n):.3f}\n")
    with open(os.path.join(out, "stalls.dat"), "w") as fh:
        fh.write("# setup median_ms p99_ms (epochs 2+) pfs_datasets\n")
        for n in order:
            fh.write(f"{n} {rows[n]['stall_median'] * 1e3:.2f} {rows[n]['stall_p99'] * 1e3:.2f} "
                     f"{rows[n]['pfs_bytes'] / ds:.3f}\n")
    best = min((n for n in names if n.startswith("nopfs-")), key=later_mean, default=None)
    headline = ""
    if best is not None and base is not None:
        headline = (f": {best} {later_mean('dataloader-w4') / later_mean(best):.1f}x faster than "
                    "dataloader-w4 after epoch 1")
    bars = os.path.join(out, "epoch_bars.dat")
    stalls = os.path.join(out, "stalls.dat")
    bar_style = ["set style data histograms", "set style histogram clustered gap 1",
                 "set style fill solid 0.85 border -1", "set boxwidth 0.9",
                 "set xtics rotate by -25 nomirror offset -1.5,0", "set xlabel ''", "set grid ytics",
                 "set key inside top right vertical box opaque", "set bmargin 7"]
    plot = [
        "set terminal pngcairo size 1000,560 noenhanced font ',11'",
        f"set output '{os.path.join(out, 'epochs.png')}'",
        f"set title \"Epoch time, lower is better{headline}\\n"
        f"({r['ranks']} ranks; emulated PFS; setups sorted by epochs 2+)\"",
        *bar_style, "set ylabel 'seconds'", "set yrange [0:*]",
        f"plot '{bars}' using 2:xtic(1) title 'epoch 1' lc rgb '#9e9e9e', "
        f"'' using 3 title 'epochs 2+ (mean)' lc rgb '#1565c0', "
        f"'' using ($0-0.15):2:(sprintf('%.1f', $2)) with labels offset 0,0.6 notitle, "
        f"'' using ($0+0.15):3:(sprintf('%.1f', $3)) with labels offset 0,0.6 notitle",
        f"set output '{os.path.join(out, 'stalls.png')}'",
        "set title \"Stall per batch after epoch 1, lower is better (log scale)\\n"
        "(0 is drawn as 0.01 ms)\"",
        *bar_style, "set ylabel 'ms'", "set logscale y", "set yrange [0.01:*]",
        f"plot '{stalls}' using ($2+0.01):xtic(1) title 'median' lc rgb '#9e9e9e', "
        f"'' using ($3+0.01) title 'p99' lc rgb '#c62828', "
        f"'' using ($0-0.15):($2+0.01):(sprintf('%.1f', $2)) with labels offset 0,0.6 notitle, "
        f"'' using ($0+0.15):($3+0.01):(sprintf('%.0f', $3)) with labels offset 0,0.6 notitle",
    ]
    subprocess.run(["gnuplot"], input="\n".join(plot), text=True, check=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
