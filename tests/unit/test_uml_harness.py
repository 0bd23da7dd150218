"""tests/uml/harness.py's choices made before a boot (no root, no UML): where the kernel keeps its memory."""

from __future__ import annotations

from tests.uml import harness


def test_uml_keeps_its_memory_in_dev_shm_where_it_can_and_on_disk_where_it_cannot(tmp_path, monkeypatch):
    work = tmp_path / "work"
    monkeypatch.setattr(harness, "SHM", tmp_path)  # writable and executable: used
    assert harness.memory_dir(work) == tmp_path
    monkeypatch.setattr(harness, "SHM", tmp_path / "absent")
    assert harness.memory_dir(work) == work
    monkeypatch.setenv("TMP", "/elsewhere")  # UML reads TMP before TMPDIR: it must not win
    monkeypatch.setattr(harness, "SHM", tmp_path)
    env = harness._kernel_env(work)
    assert env["TMPDIR"] == str(tmp_path) and "TMP" not in env and "TEMP" not in env
