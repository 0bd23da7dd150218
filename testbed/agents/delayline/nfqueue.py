"""A minimal nfnetlink_queue client over a raw AF_NETLINK socket (no libnetfilter_queue, no payload copies).

Metadata-only copy mode: packets stay in the kernel, userspace sees (queue, packet id, receive timestamp)
and answers with verdicts, many at once with NFQNL_MSG_VERDICT_BATCH (accepts every id up to the one
given). Message layouts follow include/uapi/linux/netfilter/nfnetlink_queue.h; netfilter attribute
payloads are big-endian.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 1, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR, NFQA_TIMESTAMP = 1, 2, 4
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_GSO = 1, 4
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2

_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct("=BBH")  # res_id is big-endian: packed separately
_NLATTR = struct.Struct("=HH")


def _attr(kind: int, payload: bytes) -> bytes:
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def _message(msg_type: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack("!H", queue) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0) + body


@dataclass(frozen=True)
class Packet:
    queue: int
    packet_id: int
    timestamp: float | None  # kernel receive time, CLOCK_REALTIME seconds


class QueueSocket:
    """One netlink socket bound to one or more NFQUEUE numbers."""

    def __init__(self, rcvbuf: int = 64 * 1024 * 1024, timestamps: bool = False) -> None:
        """`timestamps`: make the kernel stamp received packets, so queued packets carry NFQA_TIMESTAMP."""
        self._stamps = enable_receive_timestamps() if timestamps else None
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self._seq = 0
        self._buf = bytearray(4 * 1024 * 1024)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()
        if self._stamps is not None:
            self._stamps.close()

    def _request(self, msg_type: int, queue: int, attrs: bytes) -> None:
        """Send a config request and wait for its acknowledgement; raises OSError with the kernel's errno."""
        self._seq += 1
        self.sock.send(_message(msg_type, queue, attrs, NLM_F_REQUEST | NLM_F_ACK, self._seq))
        while True:
            code = ack_code(self.sock.recv(65536), self._seq)
            if code is None:
                continue
            if code != 0:
                raise OSError(-code, f"nfqueue config of queue {queue}: {os.strerror(-code)}")
            return

    def bind(self, queue: int, maxlen: int, gso: bool) -> None:
        """Bind `queue` in metadata-only mode; GSO units stay whole unless `gso` is off (per-packet loss)."""
        self._request(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)))
        params = _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
        params += _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
        flags = NFQA_CFG_F_GSO if gso else 0
        params += _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO)) + _attr(NFQA_CFG_FLAGS,
                                                                                 struct.pack("!I", flags))
        self._request(NFQNL_MSG_CONFIG, queue, params)

    def receive(self) -> list[Packet]:
        """Read what is waiting (non-blocking); returns the queued packets' metadata in arrival order."""
        packets: list[Packet] = []
        while True:
            try:
                size = self.sock.recv_into(self._buf, len(self._buf), socket.MSG_DONTWAIT)
            except BlockingIOError:
                return packets
            packets += parse_packets(self._buf, size)
            if len(packets) > 4096:
                return packets

    def verdict(self, queue: int, packet_id: int, verdict: int) -> None:
        self.sock.send(_message(NFQNL_MSG_VERDICT, queue, _attr(NFQA_VERDICT_HDR,
                                                                struct.pack("!II", verdict, packet_id))))

    def accept_up_to(self, queue: int, packet_id: int) -> None:
        """Accept every packet of `queue` with an id up to `packet_id`, in one message."""
        self.sock.send(_message(NFQNL_MSG_VERDICT_BATCH, queue, _attr(NFQA_VERDICT_HDR,
                                                                      struct.pack("!II", NF_ACCEPT, packet_id))))


def parse_packets(data: bytes | bytearray, size: int | None = None) -> list[Packet]:
    """The queued packets' metadata in the first `size` bytes of what one recv() returned (several netlink
    messages; anything but a queued packet is skipped), in arrival order."""
    size = len(data) if size is None else size
    packets = []
    offset = 0
    while offset + _NLMSGHDR.size <= size:
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > size:
            break  # a truncated message: nothing more can be read safely
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            packets.append(_parse_packet(data, offset, length))
        offset += (length + 3) & ~3
    return packets


def ack_code(data: bytes | bytearray, seq: int) -> int | None:
    """The kernel's answer to request `seq` in a recv()'s bytes: 0 (done) or -errno; None if it is not there."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _, got, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            return None
        if kind == NLMSG_ERROR and got == seq:
            (code,) = struct.unpack_from("=i", data, offset + _NLMSGHDR.size)
            return code
        offset += (length + 3) & ~3
    return None


def _parse_packet(view: bytes | bytearray, offset: int, length: int) -> Packet:
    (queue,) = struct.unpack_from("!H", view, offset + _NLMSGHDR.size + 2)
    pos = offset + _NLMSGHDR.size + _NFGENMSG.size
    end = offset + length
    packet_id, stamp = -1, None
    while pos + _NLATTR.size <= end:
        alen, akind = _NLATTR.unpack_from(view, pos)
        if alen < _NLATTR.size:
            break
        akind &= 0x3FFF
        if akind == NFQA_PACKET_HDR:
            (packet_id,) = struct.unpack_from("!I", view, pos + 4)
        elif akind == NFQA_TIMESTAMP:
            sec, usec = struct.unpack_from("!QQ", view, pos + 4)
            stamp = sec + usec * 1e-6
        pos += (alen + 3) & ~3
    return Packet(queue, packet_id, stamp)


def enable_receive_timestamps() -> socket.socket:
    """Ask the kernel to timestamp received packets (a global switch any SO_TIMESTAMPNS socket turns on).

    Keep the returned socket open for as long as timestamps are wanted.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMPNS", 35), 1)
    return sock
