#!/usr/bin/env python3
"""The benchmark plots of the documentation, from a benchmark run kept beside them.

Usage:
  python scripts/plot_benchmarks.py run DIR [--database-url URL ...]   # run, keep the output
  python scripts/plot_benchmarks.py plot DIR                           # DIR/*.json -> DIR/*.svg

``run`` runs, one after the other, ``scripts/bench.py protocol`` (the library against raw
PyMySQL doing the same SQL work, and Peewee alone, on every server given) and ``scripts/bench.py
relay --only latency --wake all`` (COMMIT to BullMQ job, per wake-up, on each server), and keeps
their JSON output, the exact command lines, the date, the machine and its load average in
DIR. ``plot`` reads only DIR, so a plot can always be traced to the run it came from; it
needs matplotlib (the ``[docs]`` extra).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
DEFAULT_URLS = ["mysql://root@127.0.0.1:3306/outbox_lite", "mysql://root@127.0.0.1:3308/outbox_lite"]
BENCH = ["--only", "commit", "--only", "claim", "--only", "claim-many", "--only", "write",
         "--rounds", "3", "--json"]
LATENCY = ["--only", "latency", "--wake", "all", "--rate", "5", "--rate", "200",
           "--seconds", "10", "--idle-seconds", "5", "--json"]


def _run(out: Path, urls: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    commands = []

    def bench(name: str, argv: list[str]) -> None:
        command = [sys.executable, *argv]
        commands.append(" ".join(["python", *[a if " " not in a else repr(a) for a in argv]]))
        print("running:", commands[-1], flush=True)
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        (out / name).write_text(result.stdout, encoding="utf-8")

    load_before = os.getloadavg()
    started = dt.datetime.now(dt.timezone.utc)
    bench("bench.json", [str(SCRIPTS / "bench.py"), "protocol",
                         *[x for url in urls for x in ("--database-url", url)], *BENCH])
    for n, url in enumerate(urls):
        bench(f"latency-{n}.json", [str(SCRIPTS / "bench.py"), "relay", "--database-url", url,
                                    *LATENCY])
    meta = {"started": started.isoformat(timespec="seconds"),
            "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(), "machine": platform.platform(),
            "python": platform.python_version(), "servers": urls,
            "commands": [c.replace(str(SCRIPTS) + "/", "scripts/") for c in commands]}
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def _plot(out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.patches
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "outbox-lite", "font.size": 9})  # stable SVG ids
    made = []
    bench = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    servers = list(bench)
    colours = {"outbox_lite": "#3f51b5", "Peewee alone, no outbox_lite": "#7986cb",
               "raw PyMySQL, same SQL": "#9e9e9e"}
    groups: dict[str, dict[str, dict[str, float]]] = {}  # measure -> server -> series -> value
    for server in servers:
        last = ""
        for row in bench[server]:
            name = row["measure"].strip()
            if row.get("raw_or_empty") is None or row["measure"] == "relay":
                continue  # a reference without a raw side (one connection's commits)
            if name.startswith("same,") and "Peewee alone" in name:
                groups[last][server]["Peewee alone, no outbox_lite"] = row["library_or_loaded"]
                continue
            if name.startswith("same,"):
                name = last.split(" (")[0] + "," + name[len("same,"):]
            last = name
            groups.setdefault(name, {})[server] = {
                "outbox_lite": row["library_or_loaded"],
                "raw PyMySQL, same SQL": row["raw_or_empty"], "ratio": row["ratio"]}
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.8), squeeze=False)
    width = 0.8 / len(colours)
    for ax, (name, by_server) in zip(axes[0], groups.items()):
        for x, server in enumerate(servers):
            values = by_server.get(server, {})
            for k, (series, colour) in enumerate(colours.items()):
                if series in values:
                    ax.bar(x + (k - 1) * width, values[series], width, color=colour)
            if values:  # the run's own ratio: the median of the rounds' library/raw ratios
                top = max(v for key, v in values.items() if key != "ratio")
                ax.text(x, top * 1.04, f"{values['ratio']:.2f}× raw", ha="center", fontsize=8)
        ax.set_xticks(range(len(servers)), [s.split(" at ")[0] for s in servers])
        ax.set_title(name.replace(" (", "\n(", 1), fontsize=9)
        ax.set_ylabel("per second (median of the rounds)")
        ax.margins(y=0.15)
    handles = [matplotlib.patches.Patch(color=c, label=n) for n, c in colours.items()]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8)
    fig.suptitle("Throughput: outbox_lite, Peewee alone and raw PyMySQL doing the same SQL work")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    made.append(out / "throughput.svg")
    fig.savefig(made[-1])
    plt.close(fig)

    latency = sorted(out.glob("latency-*.json"))
    reports = [json.loads(p.read_text(encoding="utf-8")) for p in latency]
    rates = sorted({r for rep in reports for r in rep["latency"]["rates"]})
    fig, axes = plt.subplots(len(reports), len(rates), figsize=(5 * len(rates), 3 * len(reports)),
                             squeeze=False)
    for row, (path, rep) in enumerate(zip(latency, reports)):
        server = servers[row] if row < len(servers) else path.stem  # run's order
        for col, rate in enumerate(rates):
            ax = axes[row][col]
            for wake in rep["latency"]["modes"]:
                [entry] = [r for r in wake["rates"] if r["rate"] == rate]
                delays = sorted(entry["delays_ms"])
                ax.step(delays, [(i + 1) / len(delays) for i in range(len(delays))],
                        where="post", label=f"{wake['wake']} (p50 {entry['p50_ms']:.1f} ms)")
            ax.set_xscale("log")
            ax.set_title(f"{server}: {rate:g} events/s")
            ax.set_xlabel("COMMIT to BullMQ job, ms (log)")
            ax.set_ylabel("share of events")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Latency distribution by wake-up (one relay, BullMQ)")
    fig.tight_layout()
    made.append(out / "latency.svg")
    fig.savefig(made[-1])
    plt.close(fig)
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("run", "plot"))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--database-url", action="append", metavar="URL",
                        help=f"a server to run on (repeatable; default: {' and '.join(DEFAULT_URLS)})")
    args = parser.parse_args()
    if args.action == "run":
        _run(args.dir, args.database_url or DEFAULT_URLS)
    for path in _plot(args.dir):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
