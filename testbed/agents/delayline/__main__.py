"""`python -m testbed.agents.delayline supervise|worker CONFIG`: a delay line's two processes."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "worker":
        from testbed.agents.delayline.worker import worker

        return worker(argv[1])
    if len(argv) == 2 and argv[0] == "supervise":
        from testbed.agents.delayline.supervisor import supervise

        return supervise(argv[1])
    print("usage: python -m testbed.agents.delayline supervise|worker CONFIG", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
