"""The `testbed` commands: up, status, exec, shape, probe, run, compose, report, compare, check, calibrate,
plan, whatif, hosts, down, clean. Thin: each parses its options, calls the fabric, runner or collect, and prints (tables: render.py).
Heavy modules are imported inside the commands, so `testbed --help` stays fast."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from testbed import settings
from testbed.plan import DEFAULT_PREFIX

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Emulate multi-data-center training: DCs as namespaces, links shaped like DC optical transport.")

out = Console(emoji=False)  # "east-0:up:" is a link name, not an emoji
err = Console(stderr=True, emoji=False)
PIPED_WIDTH = 100_000  # stdout not a terminal: tables at their full width, never cut or wrapped


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"testbed {version('testbed')}")
        except PackageNotFoundError:
            print("testbed (not installed: run from a source tree)")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _everything(ctx: typer.Context,
                version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                             help="Print the version and exit.")) -> None:
    """Before every command: full-width output where stdout is not a terminal; bare `testbed` prints help."""
    if not out.is_terminal:
        out.width = PIPED_WIDTH
    if ctx.invoked_subcommand is None:
        print(ctx.get_help())
        raise typer.Exit()

PrefixOption = typer.Option(os.environ.get(settings.PREFIX, DEFAULT_PREFIX), "--prefix",
                            help=f"Name prefix of every kernel object (env {settings.PREFIX}).")
BackendOption = typer.Option("netns", "--backend", help="netns (namespaces on this machine) | docker (containers) "
                                                      "| ssh (inventory hosts)")
KNOWN_HOSTS = Path("~/.ssh/known_hosts")
ImageOption = typer.Option(None, "--image", show_default=os.environ.get(settings.IMAGE, "testbed:latest"),
                           help=f"With --backend docker: the image (compose/Dockerfile; env {settings.IMAGE}).")
AdoptOption = typer.Option(False, "--adopt", help="With --backend docker: use the containers `docker compose up` "
                                                  "started from a `testbed compose` file; never remove them.")
InventoryOption = typer.Option(None, "--inventory", help="With --backend ssh: the inventory YAML file.")
KnownHostsOption = typer.Option(KNOWN_HOSTS, "--known-hosts", help="Host keys to verify against.")
AcceptNewOption = typer.Option(False, "--accept-new", help="Record unknown host keys (a changed key is still refused).")
OutputOption = typer.Option("table", "--output", metavar="table|json|csv",
                            help="table (for people) | json | csv (for programs).")
JsonOption = typer.Option(False, "--json", hidden=True, help="Same as --output json.")
OUTPUTS = ("table", "json", "csv")


def _output(output: str, as_json: bool = False) -> str:
    """The output format asked for (--json: an alias of --output json); a bad one is refused (exit 2)."""
    if as_json:
        return "json"
    if output not in OUTPUTS:
        _fail(f"--output: expected table, json or csv, got {output!r}")
    return output


def _backend(name: str, inventory: Optional[Path] = None, known_hosts: Path = KNOWN_HOSTS, accept_new: bool = False,
             image: Optional[str] = None, adopt: bool = False) -> Any:
    """The backend `name` with the options the user set (an option it does not take is refused: exit 2)."""
    from testbed.fabric.lifecycle import make_backend

    given = {"inventory": inventory, "known_hosts": known_hosts, "accept_new": accept_new, "image": image,
             "adopt": adopt}
    unset = {"inventory": None, "known_hosts": KNOWN_HOSTS, "accept_new": False, "image": None, "adopt": False}
    chosen = {key: value for key, value in given.items() if value != unset[key]}
    return _guard(lambda: make_backend(name, **chosen))


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)  # links[a,b] is no markup
    raise typer.Exit(code)


def _guard(fn: Any) -> Any:
    """Run `fn`, turning spec/fabric errors into one red line and exit code 2 (no traceback)."""
    from pyroute2 import NetlinkError

    from testbed.fabric.errors import FabricError
    from testbed.spec.errors import SpecError

    try:
        return fn()
    except (SpecError, FabricError) as error:
        rows = getattr(error, "rows", None)
        if rows is not None:
            from testbed.cli.render import hosts_table

            out.print(hosts_table(rows, "hosts"))
        _fail(str(error))
    except NetlinkError as error:
        _fail(f"the kernel refused a request: {os.strerror(error.code)} ({error})")
    except PermissionError as error:
        detail = " ".join(str(x) for x in (error.strerror or error, error.filename or "") if x).strip()
        _fail(f"permission denied ({detail}): network namespaces and tc need root "
              "(or CAP_SYS_ADMIN and CAP_NET_ADMIN)")
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/yellow]")
        raise typer.Exit(130) from None
    except Exception as error:
        if type(error).__module__.startswith("paramiko"):  # a connection lost mid-way, say
            _fail(f"SSH: {error or type(error).__name__}")
        raise


def _progress(message: str) -> None:
    err.print(f"[dim]{message}[/dim]")


def _seconds(command: str, flag: str, value: str, *, zero: bool = False) -> float:
    """A duration option (`10min`, `2s`) in seconds, parsed as a file's durations are: a bare number, a unit that
    reads two ways or a negative one is refused in one line (exit 2), and 0 too unless `zero`."""
    from testbed.spec import units

    try:
        seconds = units.parse_duration(value, unit_hint="s")
    except ValueError as error:
        _fail(f"testbed {command}: {flag}: {error}")
    if seconds == 0 and not zero:
        _fail(f"testbed {command}: {flag}: must be more than 0, got {value!r}")
    return seconds


def _dead(dead: list[str], what: str = "not running") -> None:
    if dead:
        _fail(f"delay line {what} in {', '.join(dead)}: " + ("those links are dark; run `testbed up` again"
                                                               if what == "not running" else "results are not valid"), 1)


@app.command()
def up(topology: Path = typer.Argument(..., help="Topology YAML file."),
       dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; create nothing (no root needed)."),
       shaper: str = typer.Option("auto", help="auto | netem | userspace-delay"),
       backend: str = BackendOption, inventory: Optional[Path] = InventoryOption,
       known_hosts: Path = KnownHostsOption, accept_new: bool = AcceptNewOption,
       image: Optional[str] = ImageOption, prefix: str = PrefixOption,
       output: str = typer.Option("table", "--output", metavar="table|json|csv", help="With --dry-run: table (for "
                                  "people) | json (the whole plan) | csv (one row per link end, host or container).")
       ) -> None:
    """Bring a topology up (namespaces here, containers, or shaping on inventory hosts over SSH); cleans a stale
    one first."""
    from testbed.fabric import cancel
    from testbed.fabric.lifecycle import bring_up, plan_of, tear_down
    from testbed.plan.shaping import SHAPERS
    from testbed.spec.topology import load_topology

    if shaper not in ("auto", *SHAPERS):
        _fail(f"--shaper: expected auto, netem or userspace-delay, got {shaper!r}")
    chosen = _backend(backend, inventory, known_hosts, accept_new, image)
    spec = _guard(lambda: load_topology(topology))
    shown = _output(output)
    if dry_run:
        from testbed.cli.render import plan_rows, print_csv, print_plan

        plan = _guard(lambda: plan_of(chosen, spec, shaper, prefix, topology))
        if shown == "json":
            from dataclasses import asdict

            print(json.dumps(asdict(plan), indent=1, default=str))
        elif shown == "csv":
            print_csv(plan_rows(plan))
        else:
            print_plan(plan, out, shaper, chosen.options)
        return
    cancel.install()
    testbed = _guard(lambda: bring_up(spec, prefix=prefix, shaper=shaper, topology_file=topology,
                                      on_progress=_progress, backend=chosen))
    if cancel.requested():  # a stop that landed where it could not interrupt: honour it now
        tear_down(prefix)
        err.print("[yellow]interrupted[/yellow]")
        raise typer.Exit(130)
    nodes = len(testbed.plan.nodes)
    out.print(f"[green]up[/green] {spec.name}: {len(spec.dcs)} DCs, {nodes} nodes, shaper {testbed.plan.shaper}")
    for key, names in testbed.plan.not_applied().items():
        out.print(f"[yellow]not applied[/yellow] {key}: {', '.join(names)} ({testbed.fabric.not_applied_reason()})")


@app.command()
def status(output: str = OutputOption, as_json: bool = JsonOption, prefix: str = PrefixOption) -> None:
    """Nodes, addresses, links with their configured parameters and the shaper in use."""
    from testbed.fabric.lifecycle import attach

    shown = _output(output, as_json)
    testbed = _guard(lambda: attach(prefix))
    info = testbed.describe()
    dead = testbed.fabric.dead_delay_lines()
    info["dead_delay_lines"] = dead
    from testbed.runner.fidelity import below_compensation
    from testbed.runner.probe import delay_line_figures

    info["delay_lines"] = {key: {**figures, "note": below_compensation(key, figures)}
                           for key, figures in delay_line_figures(testbed.fabric).items()}
    if shown == "json":
        print(json.dumps(info, indent=1))
    elif shown == "csv":
        from testbed.cli.render import print_csv

        print_csv(info["links"])
    else:
        from testbed.cli.render import status_tables

        out.print(f"[bold]{info['topology']}[/bold] backend {info['backend']}, shaper {info['shaper']}, "
                  f"{info['summary']}")
        for table in status_tables(info):
            out.print(table)
    _dead(dead)


@app.command(name="exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(node: str = typer.Argument(..., help="Node name, e.g. east-0"),
          command: list[str] = typer.Argument(..., help="Command and arguments (after --)."),
          prefix: str = PrefixOption) -> None:
    """Run a command inside a node: testbed exec east-0 -- ping 198.18.1.2"""
    from testbed.fabric.lifecycle import attach

    testbed = _guard(lambda: attach(prefix))
    try:
        code = _guard(lambda: testbed.fabric.exec(node, command))
    except OSError as error:  # the command could not be started in the node
        _fail(f"{node}: {command[0]}: {error.strerror or error}", 127)
    raise typer.Exit(code)


@app.command()
def shape(a: str = typer.Argument(..., help="DC at one end"), b: str = typer.Argument(..., help="DC at the other"),
          latency: Optional[str] = typer.Option(None, help="One-way latency, e.g. 20ms"),
          distance: Optional[str] = typer.Option(None, help="Fibre distance, e.g. 1000km (sets latency)"),
          bandwidth: Optional[str] = typer.Option(None, help="e.g. 500mbit"),
          jitter: Optional[str] = typer.Option(None, help="e.g. 1ms"),
          loss: Optional[str] = typer.Option(None, help="e.g. 0.1%"),
          one_way: bool = typer.Option(False, "--one-way", help="Change only the a->b direction."),
          prefix: str = PrefixOption) -> None:
    """Change a live link with `tc change` (and the delay line's config): testbed shape east west --latency 20ms"""
    from testbed.fabric.lifecycle import attach
    from testbed.plan.network import direction_key
    from testbed.spec import units

    def parse(name: str, value: str | None, parser: Any) -> Any:
        if value is None:
            return None
        try:
            return parser(value)
        except ValueError as error:
            _fail(f"testbed shape: --{name}: {error}")

    changes = {"latency": parse("latency", latency, units.parse_delay),
               "bandwidth": parse("bandwidth", bandwidth, units.parse_rate),
               "jitter": parse("jitter", jitter, units.parse_delay),
               "loss": parse("loss", loss, units.parse_fraction)}
    if distance is not None:
        if latency is not None:
            _fail("testbed shape: --distance: give --latency or --distance, not both")
        changes["latency"] = units.fibre_delay(parse("distance", distance, units.parse_distance))
    changes = {key: value for key, value in changes.items() if value is not None}
    if not changes:
        _fail("testbed shape: nothing to change: give --latency, --distance, --bandwidth, --jitter or --loss")
    if changes.get("jitter", 0.0) > changes.get("latency", float("inf")):
        _fail(f"testbed shape: --jitter: {jitter} is more than the latency ({latency or distance}): jitter is the "
              "half-width of a spread around the latency, so the delay would go below zero")
    testbed = _guard(lambda: attach(prefix))
    keys = [direction_key(a, b)] + ([] if one_way else [direction_key(b, a)])
    known = {end.key for end in testbed.plan.link_ends if end.kind == "inter-dc"}
    for key in keys:
        if key not in known:
            _fail(f"no direct link {key} (links: {', '.join(sorted(known))})")
    for key in keys:  # each direction as it would be, against what it carries now: nothing changes if one is refused
        _refuse_shape(key, testbed.plan.link_end(key).shaping.params, changes,
                      {"latency": latency, "distance": distance, "bandwidth": bandwidth, "jitter": jitter})
    for key in keys:
        params = _guard(lambda key=key: testbed.change(key, **changes))
        out.print(f"[green]shaped[/green] {key}: " + ", ".join(f"{k} {v}" for k, v in params.describe().items()))


def _refuse_shape(key: str, now: Any, changes: dict[str, float], given: dict[str, str | None]) -> None:
    """Refuse (exit 2) a `shape` that would give direction `key` (carrying `now`) what no real link has: a jitter
    beyond its latency as it is now, a latency below its jitter now, or a queue beyond this machine's memory."""
    from dataclasses import replace

    from testbed.spec import units
    from testbed.spec.link import check_link

    problem = check_link(replace(now, **changes))
    if problem is None:
        return
    field, why = problem
    spread = "jitter is the half-width of a spread around the latency, so the delay would go below zero"
    if field == "jitter" and "jitter" in changes:
        _fail(f"testbed shape: --jitter: {given['jitter']} is more than {key}'s latency now "
              f"({units.format_duration(now.latency)}): {spread} (give --latency too)")
    if field == "jitter":
        flag = "distance" if given["distance"] is not None else "latency"
        what = (f"{given['distance']} of fibre ({units.format_duration(changes['latency'])} one way)"
                if flag == "distance" else given["latency"])
        _fail(f"testbed shape: --{flag}: {what} is less than {key}'s jitter now ({units.format_duration(now.jitter)}):"
              f" {spread} (give a smaller --jitter too)")
    flags = [f"--{name}: " for name in ("bandwidth", "latency", "distance", "jitter") if given[name] is not None]
    _fail(f"testbed shape: {flags[0] if flags else ''}{key}'s queue: {why}")


@app.command()
def fault(kind: Optional[str] = typer.Argument(None, help="partition | loss-burst | latency | bandwidth | flap"),
          a: Optional[str] = typer.Argument(None, help="DC at one end"),
          b: Optional[str] = typer.Argument(None, help="DC at the other"),
          for_: Optional[str] = typer.Option(None, "--for", help="How long, e.g. 3s"),
          loss: Optional[str] = typer.Option(None, help="loss-burst: e.g. 20%"),
          latency: Optional[str] = typer.Option(None, help="latency: one-way, e.g. 80ms"),
          jitter: Optional[str] = typer.Option(None, help="latency: e.g. 5ms"),
          bandwidth: Optional[str] = typer.Option(None, help="bandwidth: e.g. 10mbit"),
          period: Optional[str] = typer.Option(None, help="flap: e.g. 1s"),
          down: Optional[str] = typer.Option(None, help="flap: how long each period the link is down, e.g. 200ms"),
          clear: bool = typer.Option(False, "--clear", help="Restore every link fault still in force (after a "
                                                            "fault command was killed)."),
          prefix: str = PrefixOption) -> None:
    """A link fault on a running testbed, by hand: testbed fault partition east west --for 3s"""
    from testbed.fabric.lifecycle import attach

    if clear:
        if kind is not None:
            _fail("testbed fault: --clear: restores every fault in force; give no KIND")
        testbed = _guard(lambda: attach(prefix))
        cleared = _guard(testbed.clear_faults)
        out.print(f"[green]cleared[/green] {len(cleared)} faults" + (f" ({', '.join(cleared)})" if cleared else ""))
        return

    from testbed.runner.faults import FaultDriver
    from testbed.spec.errors import SpecError, did_you_mean
    from testbed.spec.faults import LINK_KINDS, Fault
    from testbed.spec.loader import validate_data

    if kind not in LINK_KINDS or a is None or b is None:
        _fail(f"testbed fault: KIND A B: give one of {', '.join(LINK_KINDS)} and the two DCs of a link (or --clear)"
              + (f"; {kind!r} is no kind{did_you_mean(kind, LINK_KINDS)}" if kind is not None and kind not in LINK_KINDS else ""))
    given = {"duration": for_, "loss": loss, "latency": latency, "jitter": jitter, "bandwidth": bandwidth,
             "period": period, "down": down}
    try:
        data = {"kind": kind, "between": [a, b], "at": 0, **{k: v for k, v in given.items() if v is not None}}
        spec = validate_data(Fault, data, "testbed fault")
    except SpecError as error:
        flag = "--for" if error.field == "duration" else f"--{error.field}"
        problem = error.problem.replace("needs duration", "needs --for").replace(", duration", ", --for")
        _fail(f"testbed fault: {flag}: {problem}")
    testbed = _guard(lambda: attach(prefix))
    known = {end.key for end in testbed.plan.link_ends if end.kind == "inter-dc"}
    if f"{a}->{b}" not in known:
        _fail(f"no direct link between {a} and {b} (links: {', '.join(sorted(known))})")
    from testbed.fabric import cancel

    cancel.install()  # Ctrl-C and SIGTERM clear the fault before the command ends (SIGKILL: `fault --clear`)
    _guard(testbed.fabric.prepare_link_faults)
    driver = FaultDriver(testbed, [spec], "by-hand", 0, None, None, clock_at_start=True)
    try:
        driver.start()
        driver.wait()
    except KeyboardInterrupt:
        pass
    finally:
        record = driver.stop()
    for entry in record["faults"]:
        out.print(f"{entry['kind']} {entry['target']}: applied at {entry['applied_at']}s, "
                  f"cleared at {entry['cleared_at']}s")
    if record["errors"]:
        _fail("; ".join(record["errors"]))


@app.command()
def probe(topology: Optional[Path] = typer.Argument(None, help="Bring this topology up, probe, tear down. "
                                                                "Without it: probe the running testbed."),
          output: str = OutputOption, as_json: bool = JsonOption,
          pings: int = typer.Option(200, help="Pings per DC pair (>= 100 for a meaningful p99)."),
          seconds: str = typer.Option("3s", "--seconds", help="How long the TCP flow of each direction runs, e.g. "
                                                          "2s (0: pings only)."),
          out_dir: Optional[Path] = typer.Option(None, "-o", "--out", help="Write probe.json and probe.md here."),
          shaper: str = typer.Option("auto", help="With TOPOLOGY: auto | netem | userspace-delay"),
          backend: str = BackendOption, inventory: Optional[Path] = InventoryOption,
          known_hosts: Path = KnownHostsOption, accept_new: bool = AcceptNewOption,
          image: Optional[str] = ImageOption, adopt: bool = AdoptOption, prefix: str = PrefixOption) -> None:
    """Measure RTT (p50/p99) and TCP goodput for every DC pair against what is configured."""
    from testbed.cli.render import probe_table
    from testbed.collect.probe import write_probe_report
    from testbed.fabric import cancel
    from testbed.fabric.lifecycle import attach, bring_up, tear_down
    from testbed.runner.probe import as_records, probe_all
    from testbed.spec.topology import load_topology

    shown = _output(output, as_json)
    flow = _seconds("probe", "--seconds", seconds, zero=True)
    chosen_backend = _backend(backend, inventory, known_hosts, accept_new, image, adopt)
    cancel.install()
    own = topology is not None
    try:
        if own:
            spec = _guard(lambda: load_topology(topology))
            testbed = _guard(lambda: bring_up(spec, prefix=prefix, shaper=shaper, topology_file=topology,
                                              on_progress=_progress, backend=chosen_backend))
        else:
            testbed = _guard(lambda: attach(prefix))
        _dead(testbed.fabric.dead_delay_lines())
        results = _guard(lambda: probe_all(testbed.fabric, testbed.plan, testbed.topology, pings=pings,
                                           seconds=flow, applied=testbed.fabric.delay_applied,
                                           on_pair=lambda a, b: err.print(f"[dim]probing {a} -> {b}[/dim]")))
        dead = testbed.fabric.dead_delay_lines()
        info = testbed.describe()
    finally:
        from testbed.fabric.ownership import holds

        if own and holds(prefix):  # not one that another process holds (bring_up refused it)
            tear_down(prefix)
    records = as_records(results)
    if out_dir is not None:
        path = write_probe_report(out_dir, info, records)
        err.print(f"report: {path}")
    if shown == "json":
        print(json.dumps({"testbed": info, "pairs": records}, indent=1))
    elif shown == "csv":
        from testbed.cli.render import print_csv

        print_csv(records)
    else:
        out.print(probe_table(records, info))
    _dead(dead, "died during the probe")


def _ready_the_report() -> None:
    """Import the report's pandas and matplotlib and pay matplotlib's first use: a run does this while its fork
    server imports torch, after its files were accepted (~2 s here off every run's wall time)."""
    from testbed.collect.report import warm

    warm()


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(ctx: typer.Context,
        experiment: Optional[Path] = typer.Argument(None, help="Experiment YAML file."),
        out_dir: Path = typer.Option(Path("results"), "-o", "--out", help="Results root."),
        resume: bool = typer.Option(False, "--resume", help="Continue the latest run of this experiment."),
        only: Optional[str] = typer.Option(None, "--only", help="Run only cells whose id matches (glob or substring)."),
        topology: Optional[Path] = typer.Option(None, "--topology",
                                                help="Bring your own workload: run the command after -- on every rank."),
        ranks_per_node: int = typer.Option(1, "--ranks-per-node"),
        launcher: str = typer.Option("auto", "--launcher",
                                     help="How ranks of the built-in workload start: fork (from one process that "
                                          "imported torch once; netns only), exec (a fresh python each), auto "
                                          "(fork where the backend can). Your own command is always exec'd."),
        timeout: str = typer.Option("1h", "--timeout", help="With --topology: how long before the run is stopped, "
                                    "e.g. 10min."),
        baseline: bool = typer.Option(False, "--baseline", help="With --topology: first run the command with every "
                                      "inter-DC link unshaped, for efficiency (your optimizer's steps, or those "
                                      "testbed.steplog reports)."),
        warmup_steps: int = typer.Option(2, "--warmup-steps", min=0, help="With --topology: reported steps left out "
                                         "of the figures."),
        tokens_per_step: Optional[int] = typer.Option(None, "--tokens-per-step", min=1, help="With --topology: tokens "
                                                      "all ranks together train on per optimizer step, for tokens/s "
                                                      "(step times and efficiency need no line of your script)."),
        shaper: str = typer.Option("auto", help="auto | netem | userspace-delay"),
        backend: str = BackendOption, inventory: Optional[Path] = InventoryOption,
        known_hosts: Path = KnownHostsOption, accept_new: bool = AcceptNewOption,
        check_: bool = typer.Option(False, "--check", help="Then check the thresholds (as `testbed check`): "
                                                            "exit 1 when one is missed."),
        image: Optional[str] = ImageOption, adopt: bool = AdoptOption,
        prefix: Optional[str] = typer.Option(None, "--prefix", show_default="a free tb-runN-", help="Name prefix of "
                                             f"every kernel object (env {settings.PREFIX}); without either, one of the "
                                             "run's own, so that runs go side by side (with --adopt: tb-).")) -> None:
    """Run an experiment cell by cell (or, with --topology, your own torchrun-style command) and report.
    Exit 1 when a cell failed (or, with --check, a threshold was missed, or the disk is full)."""
    from testbed.fabric import cancel
    from testbed.runner.experiment import run_command, run_experiment
    from testbed.runner.progress import RunProgress
    from testbed.runner.space import OutOfSpace

    limit = _seconds("run", "--timeout", timeout)
    chosen_backend = _backend(backend, inventory, known_hosts, accept_new, image, adopt)
    cancel.install()
    progress = RunProgress(err)
    # compose's containers (--adopt) carry the prefix `testbed compose` gave them, tb- unless told otherwise
    prefix = prefix or os.environ.get(settings.PREFIX) or (DEFAULT_PREFIX if adopt else None)
    try:
        if topology is not None:
            command = ([str(experiment)] if experiment else []) + list(ctx.args)
            if not command:
                _fail("--topology needs a command after --, e.g. testbed run --topology T -- python train.py")
            run_dir = _guard(lambda: run_command(topology, command, out_dir, prefix=prefix, shaper=shaper,
                                                 ranks_per_node=ranks_per_node, timeout=limit, progress=progress,
                                                 backend=chosen_backend, baseline=baseline, warmup_steps=warmup_steps,
                                                 tokens_per_step=tokens_per_step))
        else:
            if experiment is None:
                _fail("give an experiment file, or --topology T -- COMMAND")
            run_dir = _guard(lambda: run_experiment(experiment, out_dir, prefix=prefix, shaper=shaper, resume=resume,
                                                    only=only, progress=progress, backend=chosen_backend,
                                                    launcher=launcher, meanwhile=_ready_the_report))
    except OutOfSpace as error:
        progress.stop()
        _fail(str(error), 1)
    finally:
        progress.stop()
    _build_report(run_dir)
    report = run_dir / "report.html"
    out.print(f"[green]done[/green]: {run_dir}" + (f"\nreport: {report}" if report.exists() else ""))
    passed = _gate(run_dir, rebuild=False) if check_ else _cells_passed(run_dir)
    if not passed:
        raise typer.Exit(1)


@app.command()
def compose(topology: Path = typer.Argument(..., help="Topology YAML file, or an experiment (its own topology, "
                                                      "inline or a file)."),
            experiment: Optional[Path] = typer.Argument(None, help="Experiment the controller runs (its topology "
                                                                   "must be TOPOLOGY); without it, a probe."),
            output: Optional[Path] = typer.Option(None, "-o", "--out", help="Compose file to write (else stdout)."),
            output_alias: Optional[Path] = typer.Option(None, "--output", hidden=True, help="Same as --out."),
            shaper: str = typer.Option("auto", help="auto | netem | userspace-delay (auto: each router decides "
                                                    "on the docker host's kernel)"),
            prefix: str = PrefixOption) -> None:
    """Write a docker compose file for a topology (and an experiment), or for an experiment alone: the same
    testbed on a laptop."""
    from testbed.plan.compose import compose_document, render
    from testbed.plan.containers import build_containers_plan
    from testbed.spec.experiment import load_experiment
    from testbed.spec.topology import load_topology

    output = output or output_alias
    words = ["testbed", "compose", str(topology)] + ([str(experiment)] if experiment else [])
    topology_of_experiment = None
    if experiment is None and _is_experiment(topology):  # testbed compose EXPERIMENT: its own topology
        experiment = topology
        parsed, spec = _guard(lambda: load_experiment(experiment))
        if not isinstance(parsed.topology, dict):
            topology = topology_of_experiment = experiment.parent / parsed.topology
    else:
        spec = _guard(lambda: load_topology(topology))
    if experiment is not None and topology_of_experiment is None and topology != experiment:
        parsed, used = _guard(lambda: load_experiment(experiment))
        if used.model_dump() != spec.model_dump():
            _fail(f"{experiment}: topology: the experiment runs {used.name!r}, not {topology} ({spec.name!r})")
        if not isinstance(parsed.topology, dict):
            topology_of_experiment = experiment.parent / parsed.topology
    try:
        plan = build_containers_plan(spec, shaper, prefix)
    except ValueError as error:
        _fail(f"{topology}: {error}")
    target = output or Path("compose") / "stdout.yml"
    document = compose_document(plan, target, topology, experiment, topology_of_experiment)
    text = render(document, " ".join(words + (["-o", str(output)] if output else [])))
    if output is None:
        print(text, end="")
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    err.print(f"wrote {output}: {len(document['services'])} services, {len(document['networks'])} networks")


def _is_experiment(path: Path) -> bool:
    """Whether a YAML file is an experiment (it names strategies) rather than a topology."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return False  # the topology loader says what is wrong with it
    return isinstance(data, dict) and "strategies" in data


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run directory (results/<experiment>/<run>).")) -> None:
    """Rebuild the tables, plots and report of a run directory."""
    if not (run_dir / "manifest.json").exists():
        _fail(f"{run_dir}: not a run directory (no manifest.json)")
    out.print(f"report: {_build_report(run_dir)}")


def _build_report(run_dir: Path) -> Path:
    """build_report, with a full disk as one line (exit 1) that says the cells are kept and how to finish."""
    from testbed.collect.report import build_report  # pandas and matplotlib: not for a file refused at load time
    from testbed.runner.space import OutOfSpace, kept_cells, stop_when_full

    try:
        with stop_when_full(run_dir, len(kept_cells(run_dir))):
            return build_report(run_dir)
    except OutOfSpace as error:
        _fail(str(error), 1)
        raise


@app.command()
def compare(first: Path = typer.Argument(..., help="A run directory (A)."),
            second: Path = typer.Argument(..., help="A run directory (B)."), output: str = OutputOption) -> None:
    """Put two runs side by side (throughput and efficiency per strategy and sweep point)."""
    from testbed.collect.compare import compare_runs

    shown = _output(output)
    for path in (first, second):
        if not (path / "manifest.json").exists():
            _fail(f"{path}: not a run directory (no manifest.json)")
    frame = compare_runs(first, second)
    if shown == "json":
        print(frame.to_json(orient="records", indent=1))
    elif shown == "csv":
        print(frame.to_csv(index=False), end="")
    elif frame.empty:
        out.print("nothing in common to compare")
    else:
        from testbed.cli.render import compare_table

        out.print(compare_table(frame))


def _cells_passed(run_dir: Path) -> bool:
    """Say which cells failed, if any (stderr); True when none did."""
    from testbed.collect.frames import load_results

    results = load_results(run_dir)
    failed = [r for r in results if r["status"] != "ok"]
    for result in failed:
        err.print(f"[red]FAIL:[/red] cell {escape(result['cell']['id'])}: {escape(result['reason'])}", highlight=False,
                  soft_wrap=True)
    if failed:
        err.print(f"[red]{len(failed)} of {len(results)} cells failed[/red]")
    return not failed


def _gate(run_dir: Path, junit: Optional[Path] = None, against: Optional[Path] = None,
          tolerance: float = 0.05, rebuild: bool = True, shown: str = "table") -> bool:
    """Print every threshold's verdict (and regressions against `against`), write JUnit; True when every
    cell completed, every threshold held and nothing regressed. `rebuild`: the report first (a run has
    just written it)."""
    from testbed.collect.frames import load_points, load_results
    from testbed.collect.gates import check_line, regression_line, regressions, write_junit
    from testbed.collect.report import build_report

    if rebuild:
        build_report(run_dir)
    cells_ok = _cells_passed(run_dir)
    checks = json.loads((run_dir / "thresholds.json").read_text())
    regressed = None if against is None else regressions(load_points(run_dir), load_points(against), tolerance)
    if shown == "json":
        print(json.dumps({"thresholds": checks, "regressions": regressed}, indent=1, default=str))
    elif shown == "csv":
        from testbed.cli.render import print_csv

        print_csv([{"kind": "threshold", **item} for item in checks]
                  + [{"kind": "regression", **item} for item in regressed or []])
    else:
        for item in checks:
            out.print(check_line(item), highlight=False, soft_wrap=True, markup=False)
        if not checks:
            out.print("no thresholds in this experiment")
        if regressed is not None:
            out.print(f"against {against} (tolerance {tolerance:.0%}):", highlight=False, markup=False)
            for item in regressed:
                out.print(regression_line(item), highlight=False, soft_wrap=True, markup=False)
    if junit is not None:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        write_junit(junit, manifest["experiment"], load_results(run_dir), checks, regressed,
                    str(against) if against is not None else None)
        err.print(f"junit: {junit}")
    return cells_ok and all(item["passed"] for item in checks + (regressed or []))


@app.command()
def check(run_dir: Path = typer.Argument(..., help="A run directory (results/<experiment>/<run>)."),
          junit: Optional[Path] = typer.Option(None, "--junit", help="Also write the verdicts as JUnit XML here."),
          against: Optional[Path] = typer.Option(None, "--against", help="An earlier run of the same experiment: "
                                                 "fail when a figure regressed against it."),
          tolerance: str = typer.Option("5%", "--tolerance", help="With --against: how much worse a figure may be."),
          output: str = OutputOption) -> None:
    """Exit 1 when a cell failed, a threshold of the experiment is missed or (with --against) a figure
    regressed: tokens/s fell, or inter-DC bytes per step rose, by more than the tolerance (nightly CI)."""
    from testbed.spec import units

    shown = _output(output)
    for path in (run_dir, against):
        if path is not None and not (path / "manifest.json").exists():
            _fail(f"{path}: not a run directory (no manifest.json)")
    try:
        fraction = units.parse_fraction(tolerance)
    except ValueError as error:
        _fail(f"testbed check: --tolerance: {error}")
    if against is not None:
        names = [json.loads((p / "manifest.json").read_text())["experiment"] for p in (run_dir, against)]
        if names[0] != names[1]:
            _fail(f"--against: {against} is a run of {names[1]!r}, not of {names[0]!r}")
    if not _gate(run_dir, junit, against, fraction, shown=shown):
        raise typer.Exit(1)


@app.command()
def calibrate(target: Path = typer.Argument(..., help="A topology, or an experiment (its topology; its model is "
                                                      "profiled when it runs real compute)."),
              output: Path = typer.Option(Path("calibration.json"), "-o", "--out", help="Calibration file to write "
                                          "(`plan --calibration` reads it)."),
              output_alias: Optional[Path] = typer.Option(None, "--output", hidden=True, help="Same as --out."),
              shaper: str = typer.Option("auto", help="auto | netem | userspace-delay"),
              backend: str = BackendOption, inventory: Optional[Path] = InventoryOption,
              known_hosts: Path = KnownHostsOption, accept_new: bool = AcceptNewOption,
              image: str = ImageOption, prefix: str = PrefixOption) -> None:
    """Measure the cost model's calibration on this machine's emulated links: collective micro-benchmarks per DC
    pair (and the model's compute), fitted; `plan` and `whatif` accept the file."""
    from testbed.fabric import cancel
    from testbed.runner.calibrate import calibrate_file

    output = output_alias or output
    chosen_backend = _backend(backend, inventory, known_hosts, accept_new, image)
    cancel.install()
    calibration = _guard(lambda: calibrate_file(target, output, prefix=prefix, shaper=shaper, backend=chosen_backend))
    fit = calibration.fit
    out.print(f"[green]calibrated[/green]: {output} ({fit.get('samples')} measurements, median error "
              f"{fit.get('median_abs_error', 0):.1%}, p90 {fit.get('p90_abs_error', 0):.1%}); "
              f"`testbed plan EXPERIMENT --calibration {output}` uses it in place of the shipped reference",
              highlight=False)


@app.command(name="plan")
def plan_(experiment: Path = typer.Argument(..., help="Experiment YAML file."),
          calibration: Optional[Path] = typer.Option(None, "--calibration", help="A file from `testbed calibrate` "
                                                     "(or a run's calibration.json); without it, the shipped "
                                                     "reference calibration (its machine and date are printed)."),
          output: str = OutputOption, as_json: bool = JsonOption,
          search: bool = typer.Option(False, "--search", help="Explore strategy options; recommend one per point.")
          ) -> None:
    """Predict every cell of an experiment without building anything (no root) and name the fastest strategy
    at each sweep point."""
    from testbed.model.calibration import CalibrationError
    from testbed.model.commands import plan_experiment
    from testbed.model.predict import NoComputeProfile
    from testbed.spec.errors import SpecError

    shown = _output(output, as_json)
    try:  # not _guard: its SSH error type would import paramiko, and plan must start fast
        result = plan_experiment(experiment, calibration, with_search=search)
    except (SpecError, CalibrationError) as error:
        _fail(str(error))
    except NoComputeProfile as error:
        _fail(f"{experiment}: {error}")
    if shown == "json":
        print(json.dumps(result, indent=1, default=str))
        return
    from testbed.cli.render import print_csv, print_prediction

    if shown == "csv":
        print_csv([{k: v for k, v in cell.items() if k != "link_bytes_predicted"} for cell in result["cells"]])
        return

    print_prediction(result, out)


@app.command()
def whatif(scenario: Path = typer.Argument(..., help="Scenario YAML file (scenarios/)."),
           out_dir: Optional[Path] = typer.Option(None, "-o", "--out", help="Where the table, plot and report go "
                                                  "(default results/whatif/<name>)."),
           output: str = OutputOption) -> None:
    """Predicted scaling efficiency per strategy against distance and inter-DC bandwidth, at real scale: the
    answers at the scenario's reference point, a recommendation, and a plot with the point marked."""
    from testbed.model.commands import whatif_scenario
    from testbed.spec.errors import SpecError

    shown = _output(output)
    try:
        result = whatif_scenario(scenario, out_dir)
    except SpecError as error:
        _fail(str(error))
    from testbed.cli.render import print_csv, whatif_table

    files = "\n".join(f"{name}: {path}" for name, path in result["files"].items() if name != "answers")
    if shown == "json":
        keep = ("answers", "reference", "recommendation", "scale")
        print(json.dumps({"scenario": result["scenario"].name, **{k: result[k] for k in keep},
                          "files": {k: str(v) for k, v in result["files"].items()}}, indent=1))
        return
    if shown == "csv":
        print_csv(result["answers"])
        err.print(files, highlight=False, markup=False)
        return
    out.print(f"reference point: {result['reference']['text']}", highlight=False)
    out.print(whatif_table(result))
    out.print(f"[bold]{escape(result['recommendation']['line'])}[/bold]", highlight=False)
    out.print(f"[dim]{escape(result['scale'])}[/dim]", highlight=False)
    out.print(files, highlight=False, markup=False)


hosts_app = typer.Typer(help="Real hosts over SSH (inventory files).", no_args_is_help=True)
app.add_typer(hosts_app, name="hosts")


@hosts_app.command("check")
def hosts_check(inventory: Path = typer.Option(..., "--inventory", help="Inventory YAML file."),
                known_hosts: Path = KnownHostsOption, accept_new: bool = AcceptNewOption,
                output: str = OutputOption, as_json: bool = JsonOption) -> None:
    """Connect to every host and show what it has (python, torch, tc, netem, clock offset) and lacks."""
    from dataclasses import asdict

    from testbed.cli.render import hosts_table
    from testbed.fabric.ssh.checks import check_inventory
    from testbed.spec.inventory import load_inventory

    shown = _output(output, as_json)
    spec = _guard(lambda: load_inventory(inventory))
    rows = check_inventory(spec, inventory.parent, known_hosts.expanduser(), accept_new)
    if shown == "json":
        print(json.dumps([asdict(r) for r in rows], indent=1))
    elif shown == "csv":
        from testbed.cli.render import print_csv

        print_csv([asdict(r) for r in rows])
    else:
        out.print(hosts_table(rows, f"hosts of {inventory}"))
    unreachable = [r for r in rows if not r.reachable]
    for r in unreachable:
        err.print(f"[red]error:[/red] {r.problems}", highlight=False, soft_wrap=True)
    if unreachable:
        raise typer.Exit(2)
    if any(r.problems for r in rows):
        raise typer.Exit(1)


@app.command()
def down(prefix: str = PrefixOption) -> None:
    """Tear the testbed down (namespaces, interfaces, delay lines, state); refused while a live process holds it
    (a `testbed run` on it)."""
    from testbed.fabric.lifecycle import tear_down

    removed = _guard(lambda: tear_down(prefix))
    out.print(f"[green]down[/green]: removed {len(removed)} objects")


@app.command()
def clean(prefix: str = PrefixOption,
          images: bool = typer.Option(False, "--images", help="Also remove docker images labelled testbed "
                                                              "(compose/Dockerfile builds, the offline base)."),
          force: bool = typer.Option(False, "--force", help="Also while a live process holds the testbed (a "
                                                            "`testbed run` on it: it fails).")
          ) -> None:
    """Remove every object with the prefix, even without a state file (after a crash or SIGKILL), and what runs
    that are gone left under prefixes of their own; refused while a live process holds the testbed, unless --force."""
    from testbed.fabric.lifecycle import tear_down
    from testbed.fabric.ownership import stale_runs

    removed = _guard(lambda: tear_down(prefix, force=force))
    for left in stale_runs():
        removed += _guard(lambda left=left: tear_down(left))
    if images:
        from testbed.fabric.docker.engine import remove_images

        removed += _guard(remove_images)
    out.print(f"[green]clean[/green]: removed {len(removed)} objects"
              + (f" ({', '.join(removed[:6])}{' ...' if len(removed) > 6 else ''})" if removed else ""))
