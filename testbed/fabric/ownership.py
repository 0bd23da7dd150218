"""Who holds a testbed: the process that brings it up, runs on it or takes it down. It holds an flock on
<prefix>.lock, with its pid, command line and start time written in that file; the kernel drops the lock when the
process ends (a crash and SIGKILL included), so a testbed whose holder is gone is stale and the next command
cleans it up, while one whose holder lives is left alone. The lock files are the host's (owners_dir(), not the
state directory): namespaces, containers and the neighbour table are too, whichever state directory a process
uses.

Who holds it when: `testbed run` (and `probe TOPOLOGY`, `calibrate`: every command that brings a testbed up and
takes it down again) from bring-up to the end of its tear-down; `testbed up` while it brings the testbed up, then
nobody (the testbed stays for the user's later commands, and `down` from any shell removes it); `down` and `clean`
while they take it down. A command that finds the lock held by a live process refuses in one line naming it."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from testbed import settings
from testbed.fabric.errors import FabricError
from testbed.fabric.state import runtime_root, state_dir, state_path
from testbed.waiting import proc_stat

OWNERS_DIR_ENV = settings.OWNERS_DIR
LOCK_SUFFIX = ".lock"
RECORD_WAIT_S = 1.0  # how long a new holder may take to write its record after taking the lock

_held: dict[str, int] = {}  # lock file -> its descriptor, for the testbeds this process holds


@dataclass(frozen=True)
class Owner:
    """The process holding a testbed, as it wrote itself into the lock file."""

    prefix: str
    pid: int
    pid_start: int  # the process's start in clock ticks after boot: a pid used again is not the owner
    command: str
    started: str  # when it took the testbed, UTC, ISO 8601
    auto: bool = False  # the prefix was chosen for a run (testbed.fabric.ownership.claim_free)

    def describe(self) -> str:
        when = self.started.replace("T", " ").split(".")[0].removesuffix("+00:00")
        return f"pid {self.pid} ({self.command}) since {when} UTC"

    def lives(self) -> bool:
        stat = proc_stat(self.pid)
        return stat is not None and stat.running and stat.start == self.pid_start


class HeldElsewhere(FabricError):
    """Another live process holds the testbed: one line naming it."""

    def __init__(self, prefix: str, owner: Owner, doing: str) -> None:
        self.prefix, self.owner = prefix, owner
        super().__init__(f"testbed {prefix} is held by {owner.describe()}: {doing} (wait for it to end, or give "
                         f"another --prefix; `testbed clean --force --prefix {prefix}` removes it anyway)")


def owners_dir() -> Path:
    """Where the lock files are: $TESTBED_OWNERS_DIR, else testbed-owners/ in runtime_root() (one per host), or
    where this process may not write there (not root: it builds no namespaces) owners/ in the state directory."""
    if os.environ.get(OWNERS_DIR_ENV):
        return Path(os.environ[OWNERS_DIR_ENV])
    shared = runtime_root() / "testbed-owners"
    if os.access(shared if shared.is_dir() else shared.parent, os.W_OK):
        return shared
    return state_dir() / "owners"


def lock_path(prefix: str) -> Path:
    return owners_dir() / f"{prefix.rstrip('-') or 'testbed'}{LOCK_SUFFIX}"


def process_start(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks after boot (None: no such process)."""
    stat = proc_stat(pid)
    return None if stat is None else stat.start


def command_line(argv: list[str] | None = None) -> str:
    """This process's command as a user typed it: `testbed run x.yaml`, not the interpreter's path."""
    argv = list(sys.argv if argv is None else argv)
    head = argv[0] if argv else "python"
    if head.endswith(("/testbed", "testbed/cli/__main__.py", "testbed/__main__.py")) or head == "testbed":
        return " ".join(["testbed", *argv[1:]])
    return " ".join([Path(head).name, *argv[1:]])


def holds(prefix: str) -> bool:
    """Whether this process holds `prefix`."""
    return str(lock_path(prefix)) in _held


def claim(prefix: str, doing: str = "not touched while it lives", *, auto: bool = False) -> None:
    """Hold testbed `prefix` for this process (nothing to do when it already does). HeldElsewhere while another
    live process holds it; a lock kept by a dead holder's leftover (a child it forked) is taken over."""
    path = lock_path(prefix)
    if str(path) in _held:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(20):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            inode = os.fstat(fd).st_ino
            os.close(fd)
            owner = _live_owner(path)
            if owner is not None:
                raise HeldElsewhere(prefix, owner, doing) from None
            _unlink_if(path, inode)  # its holder is gone: a fresh file, whoever keeps the old one
            continue
        if not _same_file(fd, path):  # released and removed between our open and our lock: open it again
            os.close(fd)
            continue
        me = Owner(prefix, os.getpid(), process_start(os.getpid()) or 0, command_line(),
                   datetime.now(UTC).isoformat(timespec="seconds"), auto)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(me)).encode(), 0)
        _held[str(path)] = fd
        return
    raise FabricError(f"{path}: could not take the testbed's lock (it changed hands 20 times)")


def release(prefix: str) -> None:
    """Let testbed `prefix` go (nothing to do when this process does not hold it); its lock file is removed
    first, while still held, so that nothing is left once a testbed is down."""
    path = lock_path(prefix)
    fd = _held.pop(str(path), None)
    if fd is None:
        return
    if _same_file(fd, path):
        path.unlink(missing_ok=True)
    os.close(fd)


def holder(prefix: str) -> Owner | None:
    """The live process holding `prefix`, this one included; None when none does."""
    return _live_owner(lock_path(prefix), wait=0.0)


def live_owners() -> list[Owner]:
    """Every testbed on this host held by a live process (this one's included), by prefix."""
    try:
        paths = sorted(owners_dir().glob(f"*{LOCK_SUFFIX}"))
    except OSError:
        return []
    owners = [_live_owner(path, wait=0.0) for path in paths]
    return sorted((o for o in owners if o is not None), key=lambda o: o.prefix)


def claim_free(base: str, doing: str = "not touched while it lives") -> str:
    """Hold the first prefix `<base>runN-` (N = 1, 2, ...) that no live process holds and no testbed of someone
    else's uses (one that `testbed up --prefix` brought up), and return it. What a dead run left there is stale:
    bring_up cleans it."""
    for n in range(1, 1000):
        prefix = f"{base}run{n}-"
        if _live_owner(lock_path(prefix), wait=0.0) is not None:
            continue
        record = _read(lock_path(prefix))
        if (record is not None and not record.auto) or (record is None and state_path(prefix).exists()):
            continue  # brought up by hand under this name: not a run's to replace
        try:
            claim(prefix, doing, auto=True)
        except HeldElsewhere:
            continue
        return prefix
    raise FabricError(f"no free testbed prefix {base}runN- for N up to 999 ({owners_dir()})")


def stale_runs() -> list[str]:
    """Prefixes of testbeds a run brought up under a prefix of its own (claim_free) whose run is gone."""
    try:
        paths = sorted(owners_dir().glob(f"*{LOCK_SUFFIX}"))
    except OSError:
        return []
    out = []
    for path in paths:
        record = _read(path)
        if record is not None and record.auto and _live_owner(path, wait=0.0) is None:
            out.append(record.prefix)
    return out


def _read(path: Path) -> Owner | None:
    try:
        return Owner(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _locked(path: Path) -> bool:
    """Whether some process holds an flock on `path` (read from /proc/locks: taking it to see would get in the way
    of a holder that is just starting)."""
    try:
        stat = path.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return False
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device:
            return True
    return False


def _live_owner(path: Path, wait: float = RECORD_WAIT_S) -> Owner | None:
    """The holder of lock file `path` when it is locked by a live process that wrote itself in; a holder that has
    just taken the lock gets `wait` seconds to write its record."""
    deadline = time.monotonic() + wait
    while True:
        if not _locked(path):
            return None
        record = _read(path)
        if record is not None and record.lives():
            return record
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == path.stat().st_ino
    except OSError as error:
        if error.errno == errno.ENOENT:
            return False
        raise


def _unlink_if(path: Path, inode: int) -> None:
    try:
        if path.stat().st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass
