#!/usr/bin/env python3
"""Turns bench/e2e's results.json into table.md, epochs.dat and two PNGs (gnuplot).

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
    with open(os.path.join(out, "stalls.dat"), "w") as fh:
        fh.write("# setup median_ms p99_ms (epochs 2+) pfs_datasets\n")
        for n in names:
            fh.write(f"{n} {rows[n]['stall_median'] * 1e3:.2f} {rows[n]['stall_p99'] * 1e3:.2f} "
                     f"{rows[n]['pfs_bytes'] / ds:.3f}\n")
    plot = [
        "set terminal pngcairo size 900,520 noenhanced",
        f"set output '{os.path.join(out, 'epochs.png')}'",
        "set title 'Epoch time per epoch (%d ranks on 1 node, or on 2 in the -2nodes row; "
        "emulated PFS)'" % r["ranks"],
        "set xlabel 'epoch'", "set ylabel 'seconds'", "set key outside right", "set grid",
        "set xtics 1", "set yrange [0:*]",
        "plot " + ", ".join(f"'{os.path.join(out, 'epochs.dat')}' using 1:{i + 2} with "
                            f"linespoints lw 2 title '{n}'" for i, n in enumerate(names)),
        f"set output '{os.path.join(out, 'stalls.png')}'",
        "set title 'Stall per batch after epoch 1, median and p99 (+0.01 ms so that 0 shows)'",
        "set style data histograms", "set style histogram clustered gap 1",
        "set style fill solid 0.8 border -1", "set xtics rotate by -30", "set ylabel 'ms'",
        "set xlabel ''", "set logscale y", "set yrange [0.01:*]", "unset xrange",
        f"plot '{os.path.join(out, 'stalls.dat')}' using ($2+0.01):xtic(1) title 'median', "
        f"'' using ($3+0.01) title 'p99'",
    ]
    subprocess.run(["gnuplot"], input="\n".join(plot), text=True, check=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
