"""Set the largest unit an interface passes whole (IFLA_GSO_IPV4_MAX_SIZE and IFLA_GRO_IPV4_MAX_SIZE, kernel 6.3
and later; testbed.plan.gso says why and how large).

A raw rtnetlink request, as nfqueue.py speaks nfnetlink: pyroute2 0.9.7 has no name for these two attributes, and
iproute2 learnt them only in 6.3. A kernel older than 6.3 ignores attributes it does not know (rtnetlink's
lenient parsing), so its interfaces keep 64 KiB, as does TCP over them."""

from __future__ import annotations

import os
import socket
import struct

from testbed.agents.delayline.nfqueue import ack_code
from testbed.fabric.errors import FabricError
from testbed.fabric.netns.namespaces import entered

RTM_NEWLINK, NLM_F_REQUEST, NLM_F_ACK = 16, 1, 4
IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE = 63, 64
ANSWER_TIMEOUT = 5.0  # seconds the kernel has to acknowledge a request
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_U32_ATTR = struct.Struct("=HHI")


def request(index: int, size: int, seq: int) -> bytes:
    """The RTM_NEWLINK message that sets interface `index`'s GSO and GRO IPv4 limits to `size` bytes."""
    body = _IFINFO.pack(socket.AF_UNSPEC, 0, index, 0, 0)
    body += _U32_ATTR.pack(_U32_ATTR.size, IFLA_GSO_IPV4_MAX_SIZE, size)
    body += _U32_ATTR.pack(_U32_ATTR.size, IFLA_GRO_IPV4_MAX_SIZE, size)
    return _HEADER.pack(_HEADER.size + len(body), RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + body


def set_gso_max(ns: str, interfaces: dict[str, int], size: int) -> None:
    """Give every interface of namespace `ns` in `interfaces` (name -> index) the limit `size` (bytes); a
    FabricError naming the interface and the kernel's reason where it refuses or does not answer."""
    with entered(ns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    with sock:
        sock.settimeout(ANSWER_TIMEOUT)
        sock.bind((0, 0))
        for seq, (ifname, index) in enumerate(interfaces.items(), 1):
            where = f"{ns}/{ifname}: setting its GSO size to {size} bytes"
            try:
                sock.send(request(index, size, seq))
                code = None
                while code is None:
                    code = ack_code(sock.recv(65536), seq)
            except OSError as error:  # a timeout included
                raise FabricError(f"{where}: {error.strerror or error}") from None
            if code:
                raise FabricError(f"{where}: {os.strerror(-code)}")
