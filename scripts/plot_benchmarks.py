#!/usr/bin/env python3
"""The benchmark plots of the documentation, from a benchmark run kept beside them.

Usage:
  python scripts/plot_benchmarks.py run DIR [--database-url URL ...]   # run, keep the output
  python scripts/plot_benchmarks.py plot DIR                           # DIR/*.json -> DIR/*.svg

``run`` runs, one after the other, ``scripts/bench.py`` (the library against raw PyMySQL
doing the same SQL work, and Peewee alone, on every server given) and ``scripts/bench_relay.py
--only latency --wake all`` (COMMIT to BullMQ job, per wake-up, on each server), and keeps
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
    bench("bench.json", [str(SCRIPTS / "bench.py"),
                         *[x for url in urls for x in ("--database-url", url)], *BENCH])
    for n, url in enumerate(urls):
        bench(f"latency-{n}.json", [str(SCRIPTS / "bench_relay.py"), "--database-url", url,
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
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "outbox-lite", "font.size": 9})  # stable SVG ids
    made = []
    bench = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    servers = list(bench)
    rows = {s: [r for r in bench[s] if r.get("raw_or_empty") and "/s" in r["measure"]]
            for s in servers}
    measures = [r["measure"] for r in rows[servers[0]]]
    fig, axes = plt.subplots(1, len(servers), figsize=(5.2 * len(servers), 0.9 + 0.75 * len(measures)),
                             sharey=True, squeeze=False)
    labels = [m.split(",")[0] if len(m) > 40 else m for m in measures]
    for ax, server in zip(axes[0], servers):
        by = {r["measure"]: r for r in rows[server]}
        ys = range(len(measures))
        lib = [by[m]["library_or_loaded"] if m in by else 0 for m in measures]
        raw = [by[m]["raw_or_empty"] if m in by else 0 for m in measures]
        ax.barh([y + 0.2 for y in ys], raw, height=0.38, label="raw PyMySQL, same SQL",
                color="#9e9e9e")
        ax.barh([y - 0.2 for y in ys], lib, height=0.38, label="outbox_lite", color="#3f51b5")
        for y, m in zip(ys, measures):
            if m in by and by[m]["ratio"]:
                ax.text(max(lib[y], raw[y]) * 1.02, y, f"{by[m]['ratio']:.2f}×", va="center")
        ax.set_title(server)
        ax.set_xlabel("per second (median of the rounds)")
        ax.set_yticks(list(ys), labels)
        ax.invert_yaxis()
        ax.margins(x=0.18)
    axes[0][0].legend(loc="lower right", fontsize=8)
    fig.suptitle("Throughput: the library against raw PyMySQL doing the same SQL work")
    fig.tight_layout()
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
