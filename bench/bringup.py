"""Bring-up and teardown time of a backend for 1x2, 2x4 and 4x8 nodes (medians of N runs).

Usage: .venv/bin/python bench/bringup.py [--reps 5] [--backend netns|docker] [--image testbed:latest]   (root)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import pandas as pd

from testbed import api
from testbed.fabric.docker.engine import clean as clean_containers  # what is left, checked: not a use case
from testbed.fabric.netns.namespaces import list_namespaces

PREFIX = "tb-bench-"


def chain(dcs: int, nodes: int):
    names = [f"dc{i}" for i in range(dcs)]
    return api.load_topology({
        "name": f"{dcs}x{nodes}",
        "dcs": [{"name": n, "nodes": nodes} for n in names],
        "links": [{"between": [a, b], "latency": "5ms", "bandwidth": "1gbit"} for a, b in itertools.pairwise(names)],
    })


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--backend", choices=("netns", "docker"), default="netns")
    parser.add_argument("--image", help="with --backend docker (default: env TESTBED_IMAGE or testbed:latest)")
    args = parser.parse_args()
    api.handle_signals()  # SIGTERM and Ctrl-C take the testbed down before the script ends
    backend = api.backend(args.backend, **({"image": args.image} if args.image else {}))
    rows = []
    for dcs, nodes in ((1, 2), (2, 4), (4, 8)):
        topology = chain(dcs, nodes)
        ups, downs = [], []
        for _ in range(args.reps):
            start = time.perf_counter()
            api.up(topology, prefix=PREFIX, backend=backend)
            ups.append(time.perf_counter() - start)
            start = time.perf_counter()
            api.down(prefix=PREFIX)
            downs.append(time.perf_counter() - start)
            assert not list_namespaces(PREFIX) and not clean_containers(PREFIX)
        objects = dcs * (nodes + 2) if args.backend == "netns" else dcs * (nodes + 1)
        rows.append({"topology": f"{dcs} DC x {nodes} nodes", "backend": args.backend,
                     "namespaces" if args.backend == "netns" else "containers": objects,
                     "up median s": statistics.median(ups), "up max s": max(ups),
                     "down median s": statistics.median(downs), "down max s": max(downs)})
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    try:
        main()
    finally:
        api.down(prefix=PREFIX)
