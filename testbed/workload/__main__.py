"""`python -m testbed.workload --strategy hier-dp --steps 6 ...` under torchrun (or the testbed runner)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from testbed.workload.options import Options

OPTIONAL_TYPES = {"seq_len": int, "compute_ms": float, "device_tflops": float, "metrics_dir": str, "dump_dir": str}
CHOICES = {"strategy": ("flat-dp", "hier-dp", "hier-dp-overlap", "pp", "diloco", "streaming-diloco"),
           "schedule": ("gpipe", "1f1b", "interleaved-1f1b", "overlap"),
           "compression": ("none", "fp16", "bf16", "int8"), "optimizer": ("adamw", "sgd")}


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(prog="python -m testbed.workload",
                                  description="Train a small GPT across emulated DCs with one strategy.")
    for field in dataclasses.fields(Options):
        flag = "--" + field.name.replace("_", "-")
        if field.type in ("bool", bool):
            out.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            kind = OPTIONAL_TYPES.get(field.name) or type(field.default)
            out.add_argument(flag, type=kind, default=field.default, choices=CHOICES.get(field.name))
    return out


def main(argv: list[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    opts = Options(**{f.name: args[f.name] for f in dataclasses.fields(Options)})
    from testbed.workload.layout import LayoutError
    from testbed.workload.run import train

    try:
        train(opts)
    except (LayoutError, ValueError) as error:
        print(f"testbed.workload: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
