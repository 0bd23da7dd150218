"""What the `testbed` command prints when something unexpected breaks: one line, and where the traceback went."""

from __future__ import annotations

import pytest

from testbed import cli


def test_an_unexpected_exception_is_one_line_and_a_log_file(monkeypatch, tmp_path, capsys):
    def broken() -> None:
        raise RuntimeError("the disk is on fire\nand a second line [/__w/pytorch/gloo/pair.cc:538]")

    monkeypatch.setattr(cli, "app", broken)
    monkeypatch.setenv("TESTBED_LOG_DIR", str(tmp_path / "logs"))
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == cli.EXIT_INTERNAL
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert ("unexpected RuntimeError: the disk is on fire and a second line [/__w/pytorch/gloo/pair.cc:538] (full "
            "traceback: ") in lines[0]  # as written: text in brackets is not read as markup
    (log,) = (tmp_path / "logs").glob("crash-*.log")
    assert str(log) in lines[0]
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "in broken" in text


def test_exits_and_interrupts_are_not_crashes(monkeypatch, tmp_path):
    monkeypatch.setenv("TESTBED_LOG_DIR", str(tmp_path))
    for raised in (SystemExit(2), KeyboardInterrupt()):
        def app(raised=raised) -> None:
            raise raised

        monkeypatch.setattr(cli, "app", app)
        with pytest.raises(type(raised)):
            cli.main()
    assert not list(tmp_path.iterdir())
