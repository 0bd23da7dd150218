"""LatestWriter: the delay line's stats and the fault driver's faults.json are written from a thread of their own."""

import threading
import time

from testbed.atomic import LatestWriter


def _stuck_writer():
    written: list[str] = []
    gate = threading.Event()

    def slow(path, text):
        gate.wait(5)  # the file system is stuck until the test lets it go
        written.append(text)

    return written, gate, slow


def test_a_slow_write_does_not_hold_the_caller_and_the_latest_text_wins(tmp_path):
    """A write stuck for 0.3 s (a busy ext4 journal took that here) costs submit() nothing, and the texts submitted
    meanwhile collapse into the newest."""
    written, gate, slow = _stuck_writer()
    writer = LatestWriter(tmp_path / "stats", write=slow)
    started = time.monotonic()
    for n in range(50):
        writer.submit(f"figures {n}")
    assert time.monotonic() - started < 0.05  # the caller went on
    time.sleep(0.3)
    gate.set()
    assert writer.flush(timeout=5)
    assert written[-1] == "figures 49" and len(written) <= 2, written  # at most the one taken first, then the newest


def test_flush_waits_for_the_write_in_progress_and_close_ends_the_thread(tmp_path):
    written, gate, slow = _stuck_writer()
    writer = LatestWriter(tmp_path / "record", write=slow)
    writer.submit("first")
    assert not writer.flush(timeout=0.2)  # stuck: not on file yet
    gate.set()
    assert writer.close(timeout=5) and written == ["first"]
    writer._thread.join(timeout=5)
    assert not writer._thread.is_alive()
    writer.submit("after close")  # written at once, in the caller's thread
    assert written == ["first", "after close"]


def test_it_writes_the_file_atomically(tmp_path):
    path = tmp_path / "sub" / "faults.json"
    writer = LatestWriter(path)
    writer.submit('{"a": 1}')
    assert writer.close(timeout=5)
    assert path.read_text() == '{"a": 1}' and [p.name for p in path.parent.iterdir()] == ["faults.json"]
