"""Probe agent, run inside a node: `python -m testbed.agents.probe serve|rtt|send|pair ...`; prints JSON.

- serve: a UDP echo and a TCP sink on one port. The sink times what it receives and, when the sender
  half-closes, answers with its own measurement (goodput is measured where bytes arrive).
- rtt:   UDP pings with sequence numbers; prints every round-trip time and how many were lost. The gaps between
  pings are random, uniform within SPREAD of the interval (the mean is the interval): pings at a fixed period
  phase-lock with a round trip that is a multiple of it (each reply arrives as the next ping leaves) and read that
  coincidence, not the path (RFC 2330, 11.1). Here at 5 ms apart, a 5 ms link read +0.069 ms (median of 6) and
  +0.041 randomly spaced; 20 ms, +0.050 and +0.036; 1 ms (no multiple), 0.033 and 0.034 (2026-11-29, medians of 4-6).
  A round trip is the network's: from just before the send to the kernel's receive time of the answer
  (SO_TIMESTAMPNS, as iputils ping), less how long the echo held the ping, from its kernel's receive time to its
  answer (TWAMP's turnaround, RFC 5357, appended to the answer). The wake-ups of two processes are then not in it:
  with them a DC's own round trip read 0.073-0.079 ms here, without them 0.022-0.025 (kernel ping 0.018-0.021), and
  the chain's pairs 0.028-0.035 ms above configured + that (median of 12 pairs), without them 0.025-0.030 (3 runs
  alternating, 2026-11-29). `--dscp N` marks the pings, and the echo answers with the ping's mark: with UNSHAPED_DSCP
  (testbed.plan.delayline) both cross the shaping undelayed, the floor `testbed probe` holds a pair against.
  `--user-time` (for `serve`, `rtt` and `pair`) times arrivals in user space and reports no turnaround: on a node
  whose own kernel runs the delay line (ssh, Slurm) the kernel's receive time predates the delay.
- send:  one TCP flow for N seconds; prints the sink's measurement.
- pair:  rtt, then (with --seconds above 0) send, from one process: {"rtt": ..., "flow": ... or null}. A probe
  of a DC pair is one start of this agent (a docker exec, a command over ssh, ~1 s in user-mode Linux).
Only the standard library, so it starts fast in any namespace.

The pinger and the echo's thread run SCHED_FIFO (below the delay line's priority) unless $TESTBED_PROBE_RT is 0:
a round trip then times the network, not how long a machine whose cores are busy takes to wake two processes
(eight busy torch processes on two cores added up to 1.4 ms to the median and 10 ms to the p99 here;
bench/delay_line_priority.py --part probe). The TCP flow and its sink stay ordinary processes.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import sys
import threading
import time

from testbed import settings
from testbed.agents.realtime import fifo
from testbed.plan.delayline import DSCP_BITS

PING = struct.Struct("!QQ")  # sequence, send time in ns (the realtime clock, as the kernel's receive time)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # asm-generic/socket.h; the module lacks the name
TIMESPEC = struct.Struct("@qq")  # struct timespec on a 64-bit kernel: seconds, nanoseconds
ANCILLARY_SPACE = socket.CMSG_SPACE(TIMESPEC.size) + socket.CMSG_SPACE(4)  # a receive time and a TOS byte
TOS = struct.Struct("@i")  # IP_TOS as sendmsg's ancillary data takes it
DWELL = struct.Struct("!Q")  # what an echo appends to a ping: ns from its kernel's receive time to its answer
CHUNK = 256 * 1024
RT_ENV, RT_PRIORITY = settings.PROBE_RT, 5  # the delay line's worker runs at 10: it must not wait for a probe
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
# struct tcp_info (linux/tcp.h), the fields a flow's shortfall is read from, by offset; a kernel older than a
# field returns a shorter struct and the field is left out.
TCP_INFO_FIELDS = {"rto_us": (8, "I"), "snd_cwnd": (80, "I"), "total_retrans": (100, "I"),
                   "bytes_received": (128, "Q"), "min_rtt_us": (148, "I"), "busy_us": (168, "Q"),
                   "rwnd_limited_us": (176, "Q"), "sndbuf_limited_us": (184, "Q"), "bytes_retrans": (208, "Q")}


def tcp_info(sock: socket.socket) -> dict[str, int]:
    """A flow's figures from the kernel's TCP_INFO: the sender's retransmissions and how long the receiver's window
    or its own buffer limited it; the receiver's bytes received in order."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return {name: struct.unpack_from(f"={kind}", raw, offset)[0] for name, (offset, kind) in TCP_INFO_FIELDS.items()
            if offset + struct.calcsize(kind) <= len(raw)}


def realtime() -> str:
    """SCHED_FIFO for the calling thread unless $TESTBED_PROBE_RT is 0; what it runs as ('fifo' or 'other')."""
    return fifo(RT_ENV, RT_PRIORITY)


def _udp_echo(sock: socket.socket, kernel_time: bool) -> None:
    """Answer every ping with itself and how long it stayed here (TWAMP's turnaround, RFC 5357): from the kernel's
    receive time to just before the answer's send, the echo's own wake-up, which the pinger takes off (0 without
    `kernel_time`: where this node's own kernel delays what it receives, its receive time predates the delay)."""
    realtime()  # this thread only: the TCP sink's threads stay ordinary
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1 if kernel_time else 0)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    while True:
        data, ancillary, _, peer = sock.recvmsg(2048, ANCILLARY_SPACE)
        received, mark = arrival_ns(ancillary), tos_of(ancillary) & DSCP_BITS  # the mark, not the ECN bits
        if len(data) == PING.size:
            dwell = time.time_ns() - received if received is not None else 0
            data += DWELL.pack(max(0, dwell))
        # the answer carries the ping's mark: a ping marked to skip the shaping (UNSHAPED_DSCP) comes back unshaped
        sock.sendmsg([data], [(socket.IPPROTO_IP, socket.IP_TOS, TOS.pack(mark))] if mark else [], 0, peer)


def _received(conn: socket.socket, read: int) -> int:
    """Bytes the kernel has received in order on `conn` so far (TCP_INFO's bytes_received), or `read`, what the
    sink has read, on a kernel without it (before 4.6)."""
    return tcp_info(conn).get("bytes_received", read)


def _window(marks: list[tuple[float, int, int]], warmup: float) -> tuple[tuple[float, int, int], tuple[float, int, int]]:
    """The marks that bound the steady part of a flow: the first one `warmup` seconds in (slow start skipped), and
    the last one before the flow's tail (the kernel had not yet received the last byte)."""
    start = next((m for m in marks if m[0] - marks[0][0] >= warmup), marks[0])
    final = marks[-1][1]
    stop = next((m for m in reversed(marks) if m[1] < final and m[0] > start[0]), marks[-1])
    return start, stop


def flow_figures(marks: list[tuple[float, int, int]], warmup: float) -> dict:
    """A flow's figures from the sink's marks (time, bytes the kernel had received, bytes read), the last at EOF:
    goodput by the kernel's count over the steady window, and by reads from the same start to EOF (the figure
    before 2026-11-28)."""
    (start_t, start_b, start_read), (stop_t, stop_b, _) = _window(marks, warmup)
    end, total = marks[-1][0], marks[-1][2]
    seconds = max(stop_t - start_t, 1e-9)
    return {"bytes": total, "window_bytes": stop_b - start_b, "window_seconds": seconds,
            "goodput_bps": (stop_b - start_b) * 8 / seconds, "duration": end - marks[0][0],
            "read_goodput_bps": (total - start_read) * 8 / max(end - start_t, 1e-9)}


def _sink(conn: socket.socket, warmup: float) -> None:
    """Goodput where bytes arrive, from the kernel's count of bytes received at each mark, not from what this
    process has read by then: a reader the machine leaves waiting reads a backlog later, and counting reads puts a
    stall's backlog inside the window or its wait at the end of it (test_probe_agent builds both). `read_goodput_bps`
    is the figure by reads, for comparison; `reader_gap_max_s` the longest the reader went between two reads."""
    marks: list[tuple[float, int, int]] = []  # (time, bytes the kernel had received, bytes read)
    total, gap, last = 0, 0.0, None
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with conn:
        while True:
            n = conn.recv_into(view)
            now = time.monotonic()
            if last is not None:
                gap = max(gap, now - last)
            last = now
            if n == 0:
                break
            total += n
            if not marks or now - marks[-1][0] >= 0.01:
                marks.append((now, _received(conn, total), total))
        marks.append((time.monotonic(), _received(conn, total), total))
        result = {**flow_figures(marks, warmup), "reader_gap_max_s": gap}
        conn.sendall(json.dumps(result).encode())


def serve(port: int, warmup: float, kernel_time: bool = True) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", port))
    threading.Thread(target=_udp_echo, args=(udp, kernel_time), daemon=True).start()
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("0.0.0.0", port))
    tcp.listen(8)
    print(json.dumps({"ready": port}), flush=True)
    while True:
        conn, _ = tcp.accept()
        threading.Thread(target=_sink, args=(conn, warmup), daemon=True).start()


SPREAD = 0.5  # a gap between two pings is the interval times U(1 - SPREAD, 1 + SPREAD)


def arrival_ns(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """When the kernel received a datagram (ns, the realtime clock), from recvmsg's ancillary data with
    SO_TIMESTAMPNS on; None where it is not there."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            seconds, nanoseconds = TIMESPEC.unpack_from(data)
            return seconds * 1_000_000_000 + nanoseconds
    return None


def tos_of(ancillary: list[tuple[int, int, bytes]]) -> int:
    """A datagram's IP TOS byte, from recvmsg's ancillary data with IP_RECVTOS on (0 where it is not there)."""
    for level, kind, data in ancillary:
        if level == socket.IPPROTO_IP and kind == socket.IP_TOS and data:
            return data[0]
    return 0


def rtt(target: str, port: int, count: int, interval: float, timeout: float, dscp: int = 0,
        kernel_time: bool = True) -> dict:
    """Ping `target`'s echo; with `kernel_time` an answer's arrival is its kernel's receive time, else when the
    pinger has it (a node whose own kernel delays what it receives: its receive time predates the delay)."""
    scheduling = realtime()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1 if kernel_time else 0)
    if dscp:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    sock.connect((target, port))
    sent: dict[int, int] = {}
    rtts: list[float] = []
    received: set[int] = set()
    deadline_after_last = timeout
    next_send = time.monotonic()
    seq = 0
    last_send = 0.0
    while True:
        now = time.monotonic()
        if seq < count and now >= next_send:
            stamp = time.time_ns()
            sock.send(PING.pack(seq, stamp))
            sent[seq] = stamp
            seq += 1
            last_send = now
            next_send += interval * random.uniform(1 - SPREAD, 1 + SPREAD)
        if seq >= count and (len(received) == count or now - last_send > deadline_after_last):
            break
        wait = max(0.0, min(next_send - time.monotonic(), 0.05)) if seq < count else 0.05
        sock.settimeout(wait if wait > 0 else 1e-4)
        try:
            data, ancillary, _, _ = sock.recvmsg(64, ANCILLARY_SPACE)
        except (TimeoutError, BlockingIOError):
            continue
        arrival = arrival_ns(ancillary) or time.time_ns()
        number, stamp = PING.unpack(data[: PING.size])
        dwell = DWELL.unpack_from(data, PING.size)[0] if len(data) >= PING.size + DWELL.size else 0
        if number in sent and number not in received and stamp == sent[number]:
            received.add(number)
            rtts.append((arrival - stamp - dwell) / 1e9)
    return {"sent": count, "received": len(received), "rtts": rtts, "lost": sorted(set(range(count)) - received),
            "scheduling": scheduling}


def send(target: str, port: int, seconds: float, pace_bps: float = 0.0) -> dict:
    """One TCP flow; `pace_bps` caps it below the link rate (a flow that does not fill the queue)."""
    sock = socket.create_connection((target, port), timeout=30)
    if pace_bps > 0:
        sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, int(pace_bps / 8))
    payload = b"\0" * CHUNK
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < seconds:
        sock.sendall(payload)
        sent += len(payload)
    sock.shutdown(socket.SHUT_WR)
    reply = b""
    while chunk := sock.recv(4096):
        reply += chunk
    info = tcp_info(sock)  # after the sink's answer: every byte sent has been acknowledged
    sock.close()
    result = json.loads(reply)
    result["sent_bytes"] = sent
    result["tcp"] = info
    return result


def _pinger_options(parser: argparse.ArgumentParser) -> None:
    """What `rtt` and `pair` take: the target and how to ping it."""
    parser.add_argument("target")
    parser.add_argument("--port", type=int, default=5201)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--dscp", type=int, default=0, choices=range(64), metavar="0-63",
                        help="mark the pings (and their answers) with this DSCP")
    _time_option(parser)


def _time_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--user-time", action="store_true",
                        help="time arrivals in user space (a node whose own kernel delays what it receives)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="testbed.agents.probe")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_serve = sub.add_parser("serve")
    p_serve.add_argument("--port", type=int, default=5201)
    p_serve.add_argument("--warmup", type=float, default=0.5)
    _time_option(p_serve)
    _pinger_options(sub.add_parser("rtt"))
    p_send = sub.add_parser("send")
    p_send.add_argument("target")
    p_send.add_argument("--port", type=int, default=5201)
    p_send.add_argument("--seconds", type=float, default=3.0)
    p_send.add_argument("--pace", type=float, default=0.0, help="pacing cap in bits/s (0 = none)")
    p_pair = sub.add_parser("pair")
    _pinger_options(p_pair)
    p_pair.add_argument("--seconds", type=float, default=3.0, help="of TCP flow after the pings (0 = none)")
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        serve(args.port, args.warmup, not args.user_time)
        return 0
    if args.cmd == "rtt":
        result = rtt(args.target, args.port, args.count, args.interval, args.timeout, args.dscp, not args.user_time)
    elif args.cmd == "send":
        result = send(args.target, args.port, args.seconds, args.pace)
    else:
        result = {"rtt": rtt(args.target, args.port, args.count, args.interval, args.timeout, args.dscp,
                             not args.user_time),
                  "flow": send(args.target, args.port, args.seconds) if args.seconds > 0 else None}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
