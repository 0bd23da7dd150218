"""A minimal nfnetlink_queue client over a raw AF_NETLINK socket (no libnetfilter_queue, no payload copies).

Metadata-only copy mode: packets stay in the kernel, userspace sees (queue, packet id, receive timestamp)
and answers with verdicts, many at once with NFQNL_MSG_VERDICT_BATCH (accepts every id up to the one
given). Message layouts follow include/uapi/linux/netfilter/nfnetlink_queue.h; netfilter attribute
payloads are big-endian.

Reading costs one recvmmsg() for up to READ_SLOTS packets (libc's, through ctypes; one recv() a packet where libc
lacks it) and a few struct reads a packet (a packet is a plain tuple); a batch verdict is one send() of a message
built once per queue, only the id written into it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from typing import NamedTuple

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
_LENGTH_KIND = struct.Struct("=IH")
_QUEUE = struct.Struct("!H")
_ID = struct.Struct("!I")
_STAMP = struct.Struct("!QQ")
_PACKET = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET
_ATTRS_AT = _NLMSGHDR.size + _NFGENMSG.size  # a message's first attribute, from its start
_UINT = struct.Struct("=I")
READ_SLOTS, READ_SLOT = 64, 4096  # messages one recvmmsg() reads at most, bytes for each (a queued packet's: ~100)


def _attr(kind: int, payload: bytes) -> bytes:
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def _message(msg_type: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack("!H", queue) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0) + body


class Packet(NamedTuple):
    """One queued packet's metadata (a tuple: the worker unpacks it)."""

    queue: int
    packet_id: int
    timestamp: float | None  # kernel receive time, CLOCK_REALTIME seconds


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.c_void_p),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", _MsgHdr), ("length", ctypes.c_uint)]


class _ManyReader:
    """recvmmsg(2) on one socket, non-blocking: READ_SLOTS messages into slots of one buffer per system call."""

    def __init__(self, fd: int) -> None:
        """Raises AttributeError where libc has no recvmmsg."""
        call = ctypes.CDLL(None, use_errno=True).recvmmsg
        call.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
        call.restype = ctypes.c_int
        self.buf = bytearray(READ_SLOTS * READ_SLOT)
        self.headers = bytearray(ctypes.sizeof(_MMsgHdr) * READ_SLOTS)  # the kernel writes each length here
        self._pins = (ctypes.c_char * len(self.buf)).from_buffer(self.buf)  # its address, and no resize while held
        self._vecs = (_IoVec * READ_SLOTS)()
        messages = (_MMsgHdr * READ_SLOTS).from_buffer(self.headers)
        for slot in range(READ_SLOTS):
            self._vecs[slot].base = ctypes.addressof(self._pins) + slot * READ_SLOT
            self._vecs[slot].length = READ_SLOT
            messages[slot].hdr.iov = ctypes.addressof(self._vecs[slot])
            messages[slot].hdr.iovlen = 1
        self._messages = messages
        self._call = call
        self._args = (fd, ctypes.addressof(messages), READ_SLOTS, socket.MSG_DONTWAIT, None)
        self.stride, self.length_at = ctypes.sizeof(_MMsgHdr), _MMsgHdr.length.offset

    def read(self, slots: int = READ_SLOTS) -> int:
        """How many messages came, `slots` at most (0: none waiting); message i is in buf at i * READ_SLOT, its
        length at headers[i * stride + length_at]."""
        fd, messages, _, flags, timeout = self._args
        got = self._call(fd, messages, min(slots, READ_SLOTS), flags, timeout)
        if got >= 0:
            return got
        code = ctypes.get_errno()
        if code in (errno.EAGAIN, errno.EINTR):
            return 0
        raise OSError(code, f"recvmmsg on the nfqueue socket: {os.strerror(code)}")


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
        self._accepts: dict[int, bytearray] = {}  # queue -> its batch verdict, the id written in at each send
        self.more = False  # whether the last receive() stopped at its `most` with the queue perhaps not empty
        try:
            self._many: _ManyReader | None = _ManyReader(self.sock.fileno())
        except AttributeError:
            self._many = None

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

    def receive(self, most: int = 4096) -> list[Packet]:
        """Read what is waiting (non-blocking), stopping once `most` messages are read (a recvmmsg() reads
        READ_SLOTS at once); returns the queued packets' metadata in arrival order. `more` then says whether it
        stopped at `most` (the queue may hold more) rather than at an empty queue."""
        packets: list[Packet] = []
        self.more = True
        many = self._many
        if many is not None:
            buf, headers, stride, length_at, length = many.buf, many.headers, many.stride, many.length_at, _UINT.unpack_from
            read = 0
            while read < most:
                slots = min(READ_SLOTS, most - read)
                got = many.read(slots)
                read += got
                for slot in range(got):
                    start = slot * READ_SLOT
                    _parse_into(buf, start + length(headers, slot * stride + length_at)[0], packets, start)
                if got < slots:  # the queue was empty before the slots were full
                    self.more = False
                    break
            return packets
        recv_into, buf, room = self.sock.recv_into, self._buf, len(self._buf)
        for _ in range(most):
            try:
                size = recv_into(buf, room, socket.MSG_DONTWAIT)
            except BlockingIOError:
                self.more = False
                break
            _parse_into(buf, size, packets)
        return packets

    def verdict(self, queue: int, packet_id: int, verdict: int) -> None:
        self.sock.send(_message(NFQNL_MSG_VERDICT, queue, _attr(NFQA_VERDICT_HDR,
                                                                struct.pack("!II", verdict, packet_id))))

    def accept_up_to(self, queue: int, packet_id: int) -> None:
        """Accept every packet of `queue` with an id up to `packet_id`, in one message."""
        message = self._accepts.get(queue)
        if message is None:
            message = self._accepts[queue] = bytearray(_message(NFQNL_MSG_VERDICT_BATCH, queue, _attr(
                NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, 0))))
        _ID.pack_into(message, len(message) - _ID.size, packet_id)  # the id ends the message (verdict, id)
        self.sock.send(message)


def parse_packets(data: bytes | bytearray, size: int | None = None) -> list[Packet]:
    """The queued packets' metadata in the first `size` bytes of what one recv() returned (several netlink
    messages; anything but a queued packet is skipped), in arrival order."""
    packets: list[Packet] = []
    _parse_into(data, len(data) if size is None else size, packets)
    return packets


def _parse_into(data: bytes | bytearray, size: int, packets: list[Packet], offset: int = 0) -> None:
    """parse_packets of data[offset:size], appending to `packets`."""
    while offset + _NLMSGHDR.size <= size:
        length, kind = _LENGTH_KIND.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > size:
            break  # a truncated message: nothing more can be read safely
        if kind == _PACKET:
            packets.append(_parse_packet(data, offset, length))
        offset += (length + 3) & ~3


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
    """One queued packet's message: its queue, then its attributes up to the timestamp (the kernel puts the packet
    header first, the timestamp before the attributes this client never reads)."""
    (queue,) = _QUEUE.unpack_from(view, offset + _NLMSGHDR.size + 2)
    pos = offset + _ATTRS_AT
    end = offset + length
    packet_id, stamp = -1, None
    unpack_attr = _NLATTR.unpack_from
    while pos + _NLATTR.size <= end:
        alen, akind = unpack_attr(view, pos)
        if alen < _NLATTR.size:
            break
        akind &= 0x3FFF
        if akind == NFQA_PACKET_HDR:
            (packet_id,) = _ID.unpack_from(view, pos + 4)
        elif akind == NFQA_TIMESTAMP:
            sec, usec = _STAMP.unpack_from(view, pos + 4)
            stamp = sec + usec * 1e-6
            if packet_id >= 0:
                break
        pos += (alen + 3) & ~3
    return Packet(queue, packet_id, stamp)


def enable_receive_timestamps() -> socket.socket:
    """Ask the kernel to timestamp received packets (a global switch any SO_TIMESTAMPNS socket turns on).

    Keep the returned socket open for as long as timestamps are wanted.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMPNS", 35), 1)
    return sock
