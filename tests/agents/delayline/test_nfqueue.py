"""The delay line's nfqueue client against bytes a kernel sent (no kernel, no root).

Recorded 2026-11-23 on this project's machine (Linux 6.18): three UDP packets queued to NFQUEUE 7 in metadata-only
copy mode with receive timestamps on, each as recv() returned it, and the kernel's answer when a second socket
tried to bind queue 7 (EPERM, with our request echoed). Requests are checked as tables of input and expected
bytes, laid out by include/uapi/linux/netfilter/nfnetlink_queue.h (pyroute2's request tests do the same)."""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from testbed.agents.delayline import nfqueue
from testbed.agents.delayline.nfqueue import Packet, ack_code, parse_packets

QUEUED = [bytes.fromhex(text) for text in (
    "54000000000300000000000000000000020000070b0001000000000108000000080005000000000210000900000600005a7383f1a7600"
    "00014000400000000006b0464d900000000000a287708000e0000000001",
    "54000000000300000000000000000000020000070b0001000000000208000000080005000000000210000900000600005a7383f1a7600"
    "00014000400000000006b0464d900000000000aecd708000e0000000001",
    "54000000000300000000000000000000020000070b0001000000000308000000080005000000000210000900000600005a7383f1a7600"
    "00014000400000000006b0464d900000000000bb19d08000e0000000001",
)]
REFUSED_BIND = bytes.fromhex("300000000200000029000000e5af8ee1ffffffff1c000000020305002900000000000000000000070800010001"
                             "000000")
STAMPS = [1795450073.665719, 1795450073.715991, 1795450073.766365]


def test_each_recorded_packet_gives_its_queue_id_and_receive_time():
    for number, data in enumerate(QUEUED):
        (packet,) = parse_packets(data)
        assert packet == Packet(7, number + 1, pytest.approx(STAMPS[number], abs=1e-6))


def test_several_messages_in_one_read_come_out_in_order_and_others_are_skipped():
    data = QUEUED[0] + REFUSED_BIND + QUEUED[1] + QUEUED[2]  # an error message among them is not a packet
    assert [p.packet_id for p in parse_packets(data)] == [1, 2, 3]
    buffer = bytearray(4096)  # as receive() reads: into a larger buffer, with the size recv_into returned
    buffer[:len(data)] = data
    assert [p.packet_id for p in parse_packets(buffer, len(data))] == [1, 2, 3]


def test_a_cut_message_stops_the_parse_instead_of_reading_past_it():
    data = QUEUED[0] + QUEUED[1][:40]
    assert [p.packet_id for p in parse_packets(data)] == [1]
    assert parse_packets(b"\x00" * 8) == [] and parse_packets(b"\x00" * 16) == []  # a zero length ends it


def test_a_packet_without_a_timestamp_is_stamped_none():
    data = bytearray(QUEUED[0])
    timestamp_type = 16 + 4 + 12 + 8 + 16 + 2  # after the headers, PACKET_HDR, IFINDEX_INDEV and HWADDR
    struct.pack_into("=H", data, timestamp_type, 10)  # NFQA_PAYLOAD: an attribute the parser does not read
    (packet,) = parse_packets(bytes(data))
    assert (packet.packet_id, packet.timestamp) == (1, None)


def test_the_kernels_answer_to_a_request_is_found_by_its_sequence_number():
    assert ack_code(REFUSED_BIND, 41) == -errno.EPERM
    assert ack_code(REFUSED_BIND, 42) is None
    assert ack_code(QUEUED[0], 0) is None  # a queued packet is no answer


def test_the_bind_request_is_what_the_kernel_echoed():
    request = nfqueue._message(nfqueue.NFQNL_MSG_CONFIG, 7,
                               nfqueue._attr(nfqueue.NFQA_CFG_CMD, struct.pack("!BxH", nfqueue.NFQNL_CFG_CMD_BIND, 0)),
                               nfqueue.NLM_F_REQUEST | nfqueue.NLM_F_ACK, 41)
    assert request == REFUSED_BIND[20:]  # nlmsgerr: the error code, then the request it answers


REQUESTS = [
    ("accept every packet of queue 7 up to id 3 (one batch verdict)",
     lambda: nfqueue._message(nfqueue.NFQNL_MSG_VERDICT_BATCH, 7,
                              nfqueue._attr(nfqueue.NFQA_VERDICT_HDR, struct.pack("!II", nfqueue.NF_ACCEPT, 3))),
     "20000000" "0303" "0100" "00000000" "00000000" "00000007" "0c00" "0200" "00000001" "00000003"),
    ("drop packet 9 of queue 300 (one verdict)",
     lambda: nfqueue._message(nfqueue.NFQNL_MSG_VERDICT, 300,
                              nfqueue._attr(nfqueue.NFQA_VERDICT_HDR, struct.pack("!II", nfqueue.NF_DROP, 9))),
     "20000000" "0103" "0100" "00000000" "00000000" "0000012c" "0c00" "0200" "00000000" "00000009"),
    ("an attribute whose payload needs padding to 4 bytes",
     lambda: nfqueue._attr(nfqueue.NFQA_CFG_PARAMS, struct.pack("!IB", 0, nfqueue.NFQNL_COPY_META)),
     "0900" "0200" "00000000" "01" "000000"),
]


@pytest.mark.parametrize("what,build,expected", REQUESTS, ids=[r[0] for r in REQUESTS])
def test_requests_are_laid_out_as_the_uapi_header_says(what, build, expected):
    assert build().hex() == expected


def test_binding_sends_the_command_then_the_copy_mode_and_gso_flag(monkeypatch):
    sent: list[tuple[int, bytes]] = []
    socket = nfqueue.QueueSocket.__new__(nfqueue.QueueSocket)
    monkeypatch.setattr(socket, "_request", lambda kind, queue, attrs: sent.append((kind, attrs)), raising=False)
    socket.bind(7, 5000, gso=False)
    (cmd_kind, cmd), (params_kind, params) = sent
    assert cmd_kind == params_kind == nfqueue.NFQNL_MSG_CONFIG
    assert cmd == bytes.fromhex("0800" "0100" "01000000")  # BIND, pf 0
    assert params.hex() == ("0900" "0200" "00000000" "01" "000000"  # copy metadata only, range 0
                            "0800" "0300" "00001388"  # queue length 5000
                            "0800" "0400" "00000004" "0800" "0500" "00000000")  # mask GSO, flags: GSO off


def _socket_with(messages: list[bytes], many: bool) -> tuple[nfqueue.QueueSocket, socket.socket]:
    """A QueueSocket reading from one end of a datagram pair, with `messages` waiting (each as recv() returned it)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    queue = nfqueue.QueueSocket.__new__(nfqueue.QueueSocket)
    queue.sock, queue._buf = ours, bytearray(4096)
    queue._many = nfqueue._ManyReader(ours.fileno()) if many else None
    for message in messages:
        theirs.send(message)
    return queue, theirs


@pytest.mark.parametrize("many", [True, False], ids=["recvmmsg", "recv"])
def test_a_read_returns_every_waiting_packet_in_order_then_nothing(many):
    """More packets than one recvmmsg() takes, with a message that is no packet among them: every packet once, in
    the order queued; the next read finds none (recv() one by one where libc has no recvmmsg: the same)."""
    count = nfqueue.READ_SLOTS * 2 + 5
    messages = []
    for number in range(count):
        data = bytearray(QUEUED[number % 3])
        struct.pack_into("!I", data, 24, number + 1)  # the packet id, first in NFQA_PACKET_HDR
        messages.append(bytes(data))
    messages.insert(7, REFUSED_BIND)
    queue, theirs = _socket_with(messages, many)
    try:
        packets = queue.receive()
        assert [packet.packet_id for packet in packets] == list(range(1, count + 1))
        assert {packet.queue for packet in packets} == {7}
        assert packets[0].timestamp == pytest.approx(STAMPS[0], abs=1e-6)
        assert queue.receive() == []
    finally:
        queue.sock.close()
        theirs.close()


def test_a_batch_verdict_is_the_uapi_message_with_each_id_written_in():
    sent: list[bytes] = []
    queue = nfqueue.QueueSocket.__new__(nfqueue.QueueSocket)
    queue._accepts = {}
    queue.sock = type("Sent", (), {"send": staticmethod(lambda data: sent.append(bytes(data)))})()
    for number, packet_id in [(7, 3), (300, 9), (7, 2**32 - 1), (7, 4)]:
        queue.accept_up_to(number, packet_id)
    assert sent == [nfqueue._message(nfqueue.NFQNL_MSG_VERDICT_BATCH, number, nfqueue._attr(
        nfqueue.NFQA_VERDICT_HDR, struct.pack("!II", nfqueue.NF_ACCEPT, packet_id)))
        for number, packet_id in [(7, 3), (300, 9), (7, 2**32 - 1), (7, 4)]]


@pytest.mark.parametrize("many", [True, False], ids=["recvmmsg", "recv"])
def test_a_bounded_read_takes_that_many_messages_and_says_more_may_wait(many):
    """A read that can wait takes a few messages at a time (the worker releases what is due between two): `most`
    messages, in order, with `more` set while the queue was not found empty; the last bite finds it empty."""
    count = 11
    messages = []
    for number in range(count):
        data = bytearray(QUEUED[number % 3])
        struct.pack_into("!I", data, 24, number + 1)
        messages.append(bytes(data))
    queue, theirs = _socket_with(messages, many)
    try:
        bites = []
        while True:
            bites.append([packet.packet_id for packet in queue.receive(4)])
            if not queue.more:
                break
        assert bites == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]]
    finally:
        queue.sock.close()
        theirs.close()
