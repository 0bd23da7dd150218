"""Pure functions from a spec to plain data: what to create in the kernel, and in which order.

Nothing here touches the kernel, so all of it is testable without root and printable with --dry-run.
"""

DEFAULT_PREFIX = "tb-"  # every kernel object, container and network of a testbed carries a prefix; this one by default

# A testbed's namespaces are PREFIX + a DC name (no "-" in it) + "-" + sw, gw or a node's index: so `tb-`'s are
# told apart from those of `tb-m15-` (prefix `tb-` would otherwise claim `tb-m15-east-0` as well).
_OWN_SUFFIX = r"[a-z][a-z0-9_]{0,11}-(?:sw|gw|[0-9]+)"


def owned_by(name: str, prefix: str) -> bool:
    """Whether namespace `name` (or a file named after one) is a testbed's with exactly this prefix."""
    import re

    return name.startswith(prefix) and re.fullmatch(_OWN_SUFFIX, name[len(prefix):]) is not None
