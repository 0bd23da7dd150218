"""Loss and jitter of the emulated link, measured: loss over >= 10 000 packets, jitter's spread against
the configured law (uniform on [latency - jitter, latency + jitter], standard deviation jitter/sqrt(3)),
and what per-packet loss costs the delay line in throughput (GSO units are split to drop single packets).
Impairments are configured on the east->west direction only, so round trips carry them once.

Usage: .venv/bin/python bench/link_impairments.py [--packets 10000]   (root)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

import pandas as pd

from testbed import api

PREFIX = "tb-imp-"


def pings(link: dict, count: int, interval: float) -> dict:
    topology = {"name": "impair", "dcs": [{"name": "east", "nodes": 1}, {"name": "west", "nodes": 1}],
                "links": [{"between": ["east", "west"], **link}]}
    with api.testbed(topology, prefix=PREFIX) as testbed:
        dst = testbed.plan.node("west-0").address
        server = testbed.fabric.popen("west-0", [sys.executable, "-m", "testbed.agents.probe", "serve"],
                                      stdout=subprocess.PIPE, text=True)
        server.stdout.readline()
        client = testbed.fabric.popen("east-0", [sys.executable, "-m", "testbed.agents.probe", "rtt", dst, "--count",
                                                 str(count), "--interval", str(interval)], stdout=subprocess.PIPE, text=True)
        result = json.loads(client.communicate(timeout=600)[0])
        server.kill()
        server.wait()
        return result


def throughput_cap(loss: str) -> float:
    """Goodput of one TCP flow over an unshaped 5 ms link: what the delay line itself can carry."""
    topology = {"name": "cap", "dcs": [{"name": "east", "nodes": 1}, {"name": "west", "nodes": 1}],
                "links": [{"between": ["east", "west"], "latency": "5ms", "loss": loss, "reverse": {"loss": "0%"}}]}
    with api.testbed(topology, prefix=PREFIX) as testbed:
        dst = testbed.plan.node("west-0").address
        server = testbed.fabric.popen("west-0", [sys.executable, "-m", "testbed.agents.probe", "serve", "--warmup", "1"],
                                      stdout=subprocess.PIPE, text=True)
        server.stdout.readline()
        client = testbed.fabric.popen("east-0", [sys.executable, "-m", "testbed.agents.probe", "send", dst, "--seconds",
                                                 "4"], stdout=subprocess.PIPE, text=True)
        result = json.loads(client.communicate(timeout=120)[0])
        server.kill()
        server.wait()
        return result["goodput_bps"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--packets", type=int, default=10000)
    args = parser.parse_args()
    api.handle_signals()  # SIGTERM and Ctrl-C take the testbed down before the script ends
    rows = []
    for loss in (0.001, 0.01, 0.05):
        r = pings({"latency": "2ms", "bandwidth": "1gbit", "loss": f"{loss * 100}%", "reverse": {"loss": "0%"}},
                  args.packets, 0.001)
        measured = 1 - r["received"] / r["sent"]
        rows.append({"impairment": f"loss {loss:.1%}", "packets": r["sent"], "configured": loss,
                     "measured": measured, "measured/configured": measured / loss})
    for jitter_ms in (1.0, 2.0, 5.0):
        count = max(400, args.packets // 10)
        r = pings({"latency": "20ms", "jitter": f"{jitter_ms}ms", "reverse": {"jitter": "0ms"}}, count,
                  2.2 * jitter_ms / 1e3)  # spaced wider than the jitter window: FIFO never clamps
        expected = jitter_ms / 1e3 / 3**0.5
        measured = statistics.pstdev(r["rtts"])
        rows.append({"impairment": f"jitter {jitter_ms:g}ms (std)", "packets": len(r["rtts"]),
                     "configured": expected, "measured": measured, "measured/configured": measured / expected})
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4g"))
    whole, per_packet = throughput_cap("0%"), throughput_cap("0.001%")
    print(f"\ndelay-line throughput, unshaped 5 ms link, one TCP flow: {whole / 1e9:.1f} Gbit/s with offload units "
          f"kept whole (loss 0), {per_packet / 1e9:.2f} Gbit/s with per-packet loss (GSO off)")


if __name__ == "__main__":
    main()  # each testbed is torn down as its `with` ends
