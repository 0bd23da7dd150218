"""Units: every quantity carries its unit, no unit reads two ways, and a link's values stay within what a real
link can have."""

import pytest

from testbed.spec import units
from testbed.spec.link import LinkParams, check_link, memory_total


@pytest.mark.parametrize("text,seconds", [("10ms", 0.01), ("5us", 5e-6), ("5µs", 5e-6), ("1.5s", 1.5), ("0", 0.0),
                                          (0, 0.0), ("250 ns", 250e-9), ("0ms", 0.0), ("2min", 120.0), ("1h", 3600.0),
                                          ("10MS", 0.01)])
def test_durations(text, seconds):
    assert units.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text,bps", [("400gbit", 4e11), ("1gbit", 1e9), ("100mbit", 1e8), ("2.5Gbit", 2.5e9),
                                      ("64kbit", 64e3), ("10Gbit/s", 1e10), ("1tbit", 1e12), ("300bit", 300.0)])
def test_rates(text, bps):
    assert units.parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("text,fraction", [("0.1%", 0.001), ("0%", 0.0), ("100%", 1.0), (0.02, 0.02), (1, 1.0)])
def test_fractions(text, fraction):
    assert units.parse_fraction(text) == pytest.approx(fraction)


@pytest.mark.parametrize("text,size", [("4MiB", 4194304.0), ("4MB", 4e6), ("512B", 512.0), ("256kB", 256e3)])
def test_sizes(text, size):  # a what-if scenario's transport window
    assert units.parse_size(text) == pytest.approx(size)


@pytest.mark.parametrize("text,metres", [("1000km", 1e6), ("800m", 800.0), ("10mi", 16093.44), ("40000km", 4e7)])
def test_distances(text, metres):
    assert units.parse_distance(text) == pytest.approx(metres)


def test_distance_becomes_fibre_delay():
    assert units.fibre_delay(units.parse_distance("1000km")) == pytest.approx(4.9e-3)
    assert units.fibre_delay(units.parse_distance("10km")) == pytest.approx(49e-6)


@pytest.mark.parametrize("parser,value,needles", [
    # a bare number: refused, with the value and an example in its unit
    (units.parse_duration, 5, ("5 has no unit", "e.g. 5ms")),
    (units.parse_duration, "5", ("'5' has no unit", "e.g. 5ms")),
    (units.parse_distance, 800, ("800 has no unit", "e.g. 800km")),
    (units.parse_rate, 1000000000, ("has no unit", "as bits per second it would be 1gbit")),
    (units.parse_size, 512, ("512 has no unit", "e.g. 512MiB")),
    # a unit that reads two ways: both readings named
    (units.parse_duration, "5m", ("reads two ways: minutes, or metres", "5min")),
    (units.parse_rate, "10Gbps", ("gigabits per second as networking writes it", "gigabytes per second as tc reads",
                                  "man tc", "10gbit for bits", "80gbit for bytes")),
    (units.parse_rate, "64kbps", ("kilobytes per second as tc reads", "64kbit")),
    (units.parse_rate, "100mbps", ("megabits", "megabytes", "100mbit")),
    (units.parse_size, "4mb", ("megabits or megabytes", "4MB or 4MiB")),
    (units.parse_size, "4Mb", ("megabits or megabytes",)),
    # words that are no unit
    (units.parse_duration, "10 parsecs", ("expected a duration such as 5ms", "ns, us")),
    (units.parse_duration, "-5ms", ("negative",)),
    (units.parse_duration, "10sec", ("expected a duration",)),
    (units.parse_rate, "fast", ("expected a rate such as 1gbit",)),
    (units.parse_rate, "0gbit", ("more than 0",)),
    (units.parse_fraction, "150%", ("between 0% and 100%",)),
    (units.parse_fraction, 5, ("would be 500%", "write 5%", "0.05")),
    (units.parse_fraction, "5", ("would be 500%",)),
    (units.parse_fraction, "five%", ("percentage",)),
    (units.parse_distance, "10 furlongs", ("distance",)),
    (units.parse_size, "4 bushels", ("size",)),
    (units.parse_duration, True, ("duration",)),
    # values no real link has
    (units.parse_delay, "10s", ("longer than any real link", "geostationary", "300ms")),
    (units.parse_delay, "301ms", ("300ms",)),
    (units.parse_distance, "90000km", ("longer than any fibre route", "40000km")),
])
def test_bad_values_name_the_problem(parser, value, needles):
    with pytest.raises(ValueError) as caught:
        parser(value)
    message = str(caught.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_numbers_testbed_wrote_itself_are_si():
    assert units.parse_duration(0.01, si=True) == 0.01
    assert units.parse_rate(1e9, si=True) == 1e9
    assert units.parse_distance(800.0, si=True) == 800.0
    with pytest.raises(ValueError, match="reads two ways"):  # a unit is still read one way only
        units.parse_duration("5m", si=True)


def test_the_delay_bound_and_the_unusual_band():
    assert units.parse_delay("300ms") == pytest.approx(0.3)
    assert units.unusual_delay(0.150) is None
    assert "ITU-T G.114" in units.unusual_delay(0.151)


def test_jitter_beyond_the_latency_is_refused():
    assert check_link(LinkParams(latency=0.005, jitter=0.005)) is None
    field, problem = check_link(LinkParams(latency=0.002, jitter=0.005))
    assert field == "jitter" and "more than the latency (2ms)" in problem


def test_a_queue_beyond_a_share_of_memory_is_refused(monkeypatch):
    memory = memory_total()
    assert memory is not None and memory > 2**28  # /proc/meminfo read: this machine has more than 256 MiB
    limit = int(units.QUEUE_MEMORY_SHARE * memory / 1514)
    assert check_link(LinkParams(queue=limit)) is None
    field, problem = check_link(LinkParams(queue=limit + 1))
    assert field == "queue" and "of this machine's memory" in problem
    # auto: bandwidth x round trip at 400 Gbit/s and 300 ms one way is 30 GB
    auto = LinkParams(latency=0.3, bandwidth=4e11)
    monkeypatch.setattr("testbed.spec.link.memory_total", lambda: 24 * 2**30)
    field, problem = check_link(auto)
    assert field == "queue" and "auto sizes it" in problem and "400gbit" in problem
    monkeypatch.setattr("testbed.spec.link.memory_total", lambda: None)  # unreadable: not checked
    assert check_link(auto) is None


def test_formatting_round_trips_readably():
    assert units.format_duration(0.0105) == "10.5ms"
    assert units.format_rate(1e9) == "1gbit"
    assert units.format_rate(None) == "unlimited"
    assert units.format_fraction(0.001) == "0.1%"
    for text in ("10.5ms", "250us", "2s"):
        assert units.format_duration(units.parse_duration(text)) == text
    assert units.parse_rate(units.format_rate(2.5e9)) == 2.5e9


def test_the_table_of_units_lists_what_the_parsers_accept_and_refuse():
    table = units.units_table_markdown()
    for kind in units.KINDS:
        for spelling in kind.units:
            assert f"`{spelling}`" in table
            units._parse(f"1{spelling}", kind, si=False)  # every listed unit parses
        for spelling in kind.two_ways:
            assert f"`{spelling}`" in table
            with pytest.raises(ValueError, match="reads two ways"):
                units._parse(f"1{spelling}", kind, si=False)
    for what, bound, _ in units.BOUNDS:
        assert f"| {what} | {bound} |" in table
    assert "300ms" in table and "40000km" in table and "150ms" in table
