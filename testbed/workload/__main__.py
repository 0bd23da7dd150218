"""`python -m testbed.workload --strategy hier-dp --steps 6 ...` under torchrun (or the testbed runner).

The flags, their types, ranges and help come from testbed.spec.strategies, the options' one definition."""

from __future__ import annotations

import argparse
import sys

from testbed.spec.strategies import OPTIONS, OptionDef, Options, check_option, problem_of


def _parse(definition: OptionDef):
    def parse(text: str):
        try:
            return check_option(definition.name, text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = definition.name
    return parse


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(prog="python -m testbed.workload",
                                  description="Train a small GPT across emulated DCs with one strategy.")
    for definition in OPTIONS.values():
        flag = "--" + definition.name.replace("_", "-")
        used = "" if len(definition.strategies) > 3 else f" [{', '.join(definition.strategies)}]"
        help = f"{definition.help}{used} (default: {definition.default})"
        if definition.annotation is bool:
            out.add_argument(flag, action=argparse.BooleanOptionalAction, default=definition.default, help=help)
        else:
            out.add_argument(flag, type=_parse(definition), default=definition.default, help=help,
                             metavar="|".join(map(str, definition.choices)) if definition.choices else None)
    return out


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    args = vars(parser().parse_args(argv))
    try:
        opts = Options(**{name: args[name] for name in OPTIONS})
    except ValidationError as error:
        field, problem = problem_of(error)
        print(f"testbed.workload: error: --{field.replace('_', '-')}: {problem}", file=sys.stderr)
        return 2
    from testbed.spec.strategies import TORCHFT
    from testbed.workload.layout import LayoutError

    if opts.strategy in TORCHFT:  # every DC a replica group of its own
        from testbed.workload.replica import train_replica_group as train
    else:
        from testbed.workload.run import train
    try:
        train(opts)
    except (LayoutError, ValueError) as error:
        print(f"testbed.workload: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
