"""Pure functions from a spec to plain data: what to create in the kernel, and in which order.

Nothing here touches the kernel, so all of it is testable without root and printable with --dry-run.
"""

DEFAULT_PREFIX = "tb-"  # every kernel object, container and network of a testbed carries a prefix; this one by default
