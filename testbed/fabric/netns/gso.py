"""Set the largest unit an interface passes whole (IFLA_GSO_IPV4_MAX_SIZE and IFLA_GRO_IPV4_MAX_SIZE, kernel 6.3
and later; testbed.plan.gso says why and how large).

A raw rtnetlink request, as nfqueue.py speaks nfnetlink: pyroute2 0.9.7 has no name for these two attributes, and
iproute2 learnt them only in 6.3. A kernel older than 6.3 ignores attributes it does not know (rtnetlink's
lenient parsing), so its interfaces keep 64 KiB, as does TCP over them."""

from __future__ import annotations

import os
import socket
import struct

from testbed.fabric.netns.namespaces import entered

RTM_NEWLINK, NLM_F_REQUEST, NLM_F_ACK, NLMSG_ERROR = 16, 1, 4, 2
IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE = 63, 64
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
    """Give every interface of namespace `ns` in `interfaces` (name -> index) the limit `size` (bytes); raises
    OSError with the kernel's errno."""
    with entered(ns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    with sock:
        sock.bind((0, 0))
        for seq, (ifname, index) in enumerate(interfaces.items(), 1):
            sock.send(request(index, size, seq))
            while True:
                reply = sock.recv(65536)
                _, kind, _, got, _ = _HEADER.unpack_from(reply)
                if kind == NLMSG_ERROR and got == seq:
                    (code,) = struct.unpack_from("=i", reply, _HEADER.size)
                    if code:
                        raise OSError(-code, f"{ns}/{ifname}: setting its GSO size to {size} bytes: "
                                             f"{os.strerror(-code)}")
                    break
