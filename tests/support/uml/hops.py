"""What each netem hop adds beyond its delay inside user-mode Linux: a chain of namespaces joined by veths, the
same chain measured with and without netem, per number of hops (run inside UML, as root).

    scripts/uml-run -- python -m tests.support.uml.hops [--hops 1,2,3] [--delay-ms 5] [--count 300] [--realtime]

For H hops, ping crosses 2 H netem qdiscs a round trip (each veth end's egress). It prints, per H, the median
round trip without netem, with it, and the excess over 2 H x delay, in ms (JSON lines).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import subprocess
import sys
import uuid

from tests.support.uml.harness import host_realtime

TIME = re.compile(r"time=([0-9.]+) ms")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def build(prefix: str, hops: int) -> list[str]:
    """Namespaces prefix0..prefixH in a line, link k between k-1 and k (10.k.0.1 - 10.k.0.2), routed end to end."""
    names = [f"{prefix}{k}" for k in range(hops + 1)]
    for name in names:
        _ip("netns", "add", name)
        _ip("-n", name, "link", "set", "lo", "up")
        subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
    for k in range(1, hops + 1):
        left, right = names[k - 1], names[k]
        _ip("link", "add", f"{prefix}r{k}", "type", "veth", "peer", "name", f"{prefix}l{k}")
        _ip("link", "set", f"{prefix}r{k}", "netns", left, "name", f"r{k}")
        _ip("link", "set", f"{prefix}l{k}", "netns", right, "name", f"l{k}")
        _ip("-n", left, "addr", "add", f"10.{k}.0.1/24", "dev", f"r{k}")
        _ip("-n", right, "addr", "add", f"10.{k}.0.2/24", "dev", f"l{k}")
        _ip("-n", left, "link", "set", f"r{k}", "up")
        _ip("-n", right, "link", "set", f"l{k}", "up")
    for k, name in enumerate(names):
        for j in range(1, hops + 1):
            if j > k + 1:  # to the right
                _ip("-n", name, "route", "add", f"10.{j}.0.0/24", "via", f"10.{k + 1}.0.2")
            elif j < k:  # to the left
                _ip("-n", name, "route", "add", f"10.{j}.0.0/24", "via", f"10.{k}.0.1")
    return names


def shape(names: list[str], delay_ms: float) -> None:
    """netem `delay_ms` on both ends of every link (0: no netem)."""
    verb = "replace" if delay_ms > 0 else "del"
    for k in range(1, len(names)):
        for name, dev in ((names[k - 1], f"r{k}"), (names[k], f"l{k}")):
            extra = ["netem", "delay", f"{delay_ms}ms", "limit", "10000"] if delay_ms > 0 else []
            subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", verb, "dev", dev, "root", *extra],
                           capture_output=True)


def pings(names: list[str], count: int, interval: float) -> list[float]:
    """Round trips in ms from the first namespace to the last's address."""
    hops = len(names) - 1
    out = subprocess.run(["ip", "netns", "exec", names[0], "ping", "-n", "-c", str(count), "-i", str(interval),
                          f"10.{hops}.0.2"], capture_output=True, text=True).stdout
    return [float(x) for x in TIME.findall(out)]


def measure(hops: int, delay_ms: float, count: int, interval: float) -> dict:
    prefix = f"hop{uuid.uuid4().hex[:3]}-"
    names = build(prefix, hops)
    try:
        pings(names, 20, interval)  # warm: ARP, first touches
        plain = statistics.median(pings(names, count, interval))
        shape(names, delay_ms)
        pings(names, 20, interval)
        rtts = pings(names, count, interval)
        shaped = statistics.median(rtts)
        q90 = sorted(rtts)[int(0.9 * len(rtts))]
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    excess = shaped - plain - 2 * hops * delay_ms
    return {"hops": hops, "delay_ms": delay_ms, "plain_ms": round(plain, 3), "shaped_ms": round(shaped, 3),
            "excess_ms": round(excess, 3), "excess_per_qdisc_ms": round(excess / (2 * hops), 3),
            "shaped_p90_ms": round(q90, 3)}


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hops", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hops", default="1,2,3")
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--realtime", action="store_true", help="measure under harness.host_realtime()")
    options = parser.parse_args(args)
    for hops in (int(h) for h in options.hops.split(",")):
        with host_realtime() if options.realtime else contextlib.nullcontext(False) as given:
            result = measure(hops, options.delay_ms, options.count, options.interval)
        print(json.dumps({**result, "host_realtime": given}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
