import pytest

from testbed.spec import units


@pytest.mark.parametrize("text,seconds", [("10ms", 0.01), ("5us", 5e-6), ("1.5s", 1.5), ("0", 0.0), (2, 2.0),
                                          ("250 ns", 250e-9), ("0ms", 0.0)])
def test_durations(text, seconds):
    assert units.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text,bps", [("400gbit", 4e11), ("1gbit", 1e9), ("100mbit", 1e8), ("2.5Gbit", 2.5e9),
                                      ("64kbps", 64e3)])
def test_rates(text, bps):
    assert units.parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("text,fraction", [("0.1%", 0.001), ("0%", 0.0), ("100%", 1.0), (0.02, 0.02)])
def test_fractions(text, fraction):
    assert units.parse_fraction(text) == pytest.approx(fraction)


@pytest.mark.parametrize("text,size", [("4MiB", 4194304.0), ("4MB", 4e6), ("512", 512.0), (1e6, 1e6)])
def test_sizes(text, size):  # a what-if scenario's transport window
    assert units.parse_size(text) == pytest.approx(size)


def test_distance_becomes_fibre_delay():
    assert units.fibre_delay(units.parse_distance("1000km")) == pytest.approx(4.9e-3)
    assert units.fibre_delay(units.parse_distance("10km")) == pytest.approx(49e-6)


@pytest.mark.parametrize("parser,value,needle", [
    (units.parse_duration, "10 parsecs", "duration"),
    (units.parse_duration, "-5ms", "negative"),
    (units.parse_rate, "fast", "bandwidth"),
    (units.parse_rate, "0gbit", "positive"),
    (units.parse_fraction, "150%", "between"),
    (units.parse_distance, "10 furlongs", "distance"),
    (units.parse_size, "4 bushels", "size"),
    (units.parse_duration, True, "duration"),
])
def test_bad_values_name_the_problem(parser, value, needle):
    with pytest.raises(ValueError, match=needle):
        parser(value)


def test_formatting_round_trips_readably():
    assert units.format_duration(0.0105) == "10.5ms"
    assert units.format_rate(1e9) == "1gbit"
    assert units.format_rate(None) == "unlimited"
    assert units.format_fraction(0.001) == "0.1%"
