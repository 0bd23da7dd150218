"""Where state lives: /run/testbed where /run is in memory, /dev/shm/testbed where /run is on a disk (this microVM),
$TESTBED_STATE_DIR over both."""

from pathlib import Path

from testbed.fabric import state

LAPTOP = """\
sysfs /sys sysfs rw,nosuid 0 0
/dev/nvme0n1p2 / ext4 rw,relatime 0 0
tmpfs /run tmpfs rw,nosuid,nodev,size=3264740k,mode=755 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
"""
MICROVM = """\
/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
/dev/vdb /srv/my\\040data ext4 rw 0 0
"""


def test_mount_type_takes_the_longest_mount_point_above_the_path():
    assert state.mount_type("/run", LAPTOP) == "tmpfs"
    assert state.mount_type("/run/testbed", LAPTOP) == "tmpfs"
    assert state.mount_type("/runner", LAPTOP) == "ext4"  # /run is not a prefix of /runner
    assert state.mount_type("/run", MICROVM) == "ext4"
    assert state.mount_type("/srv/my data/x", MICROVM) == "ext4"
    assert state.mount_type("/dev/shm", MICROVM) == "tmpfs"


def test_runtime_root_is_run_where_it_is_in_memory_else_dev_shm():
    assert state.runtime_root(LAPTOP) == Path("/run")
    assert state.runtime_root(MICROVM) == Path("/dev/shm")
    assert state.runtime_root("/dev/vda / ext4 rw 0 0\n") == Path("/run")  # nothing in memory: /run as ever


def test_state_dir_follows_the_environment_then_the_runtime_root(monkeypatch):
    monkeypatch.setenv(state.STATE_DIR_ENV, "/somewhere/else")
    assert state.state_dir() == Path("/somewhere/else")
    monkeypatch.delenv(state.STATE_DIR_ENV)
    monkeypatch.setattr(state, "runtime_root", lambda mounts=None: Path("/dev/shm"))
    assert state.state_dir() == Path("/dev/shm/testbed")
