"""The `testbed` commands: up, status, exec, shape, fault, probe, run, compose, report, compare, check, calibrate,
plan, whatif, hosts, down, clean. Thin: each parses its options, calls testbed.api (the use cases) and prints
what it returns (tables: render.py); an api.UserError is one red line and its exit status. testbed.api imports
what a command needs when it runs, so `testbed --help` stays fast."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from testbed import api
from testbed.api import DEFAULT_PREFIX, settings

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
    given = {"inventory": inventory, "known_hosts": known_hosts, "accept_new": accept_new, "image": image,
             "adopt": adopt}
    unset = {"inventory": None, "known_hosts": KNOWN_HOSTS, "accept_new": False, "image": None, "adopt": False}
    chosen = {key: value for key, value in given.items() if value != unset[key]}
    return _guard(lambda: api.backend(name, **chosen))


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)  # links[a,b] is no markup
    raise typer.Exit(code)


def _guard(fn: Any) -> Any:
    """Run `fn` (a call of testbed.api), turning a UserError into one red line and its exit status (no
    traceback; an inventory's hosts table first) and Ctrl-C into `interrupted` (exit 130)."""
    try:
        return fn()
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/yellow]")
        raise typer.Exit(130) from None
    except Exception as error:
        user = api.as_user_error(error)
        if user is None:
            raise
        if user.rows is not None:
            from testbed.cli.render import hosts_table

            out.print(hosts_table(user.rows, "hosts"))
        _fail(str(user), user.code)


def _progress(message: str) -> None:
    err.print(f"[dim]{escape(message)}[/dim]")


def _seconds(command: str, flag: str, value: str, *, zero: bool = False) -> float:
    """A duration option (`10min`, `2s`) in seconds, parsed as a file's durations are (api.seconds): a bare number,
    a unit that reads two ways or a negative one is refused in one line (exit 2), and 0 too unless `zero`."""
    return _guard(lambda: api.seconds(command, flag, value, zero=zero))


def _dead(dead: list[str], what: str = "not running") -> None:
    if dead:
        _fail(api.dead_delay_lines_line(dead, what), 1)


@app.command()
def up(topology: Path = typer.Argument(..., help="Topology YAML file."),
       dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; create nothing (no root needed)."),
       shaper: str = typer.Option("auto", help="auto | netem | userspace-delay"),
       backend: str = BackendOption, inventory: Optional[Path] = InventoryOption,
       known_hosts: Path = KnownHostsOption, accept_new: bool = AcceptNewOption,
       image: Optional[str] = ImageOption, prefix: str = PrefixOption,
       output: str = typer.Option("table", "--output", metavar="table|json|csv", help="With --dry-run: table (for "
                                  "people) | json (the whole plan) | csv (one row per link end, host or container)."),
       replace: bool = typer.Option(False, "--replace", help="Tear down a testbed of the same prefix that is still "
                                    "up and bring this one up instead (without it, `up` refuses to).")
       ) -> None:
    """Bring a topology up (namespaces here, containers, or shaping on inventory hosts over SSH). A testbed of the
    same prefix that is still up (someone's, from an earlier `up`) is refused unless --replace; what a crashed run
    left is cleaned first."""
    _guard(lambda: api.check_shaper(shaper))
    chosen = _backend(backend, inventory, known_hosts, accept_new, image)
    spec = _guard(lambda: api.load_topology(topology))
    shown = _output(output)
    if dry_run:
        from testbed.cli.render import plan_rows, print_csv, print_plan

        plan = _guard(lambda: api.dry_run(spec, prefix=prefix, shaper=shaper, backend=chosen, source=topology))
        if shown == "json":
            from dataclasses import asdict

            print(json.dumps(asdict(plan), indent=1, default=str))
        elif shown == "csv":
            print_csv(plan_rows(plan))
        else:
            print_plan(plan, out, shaper, chosen.options)
        return
    api.handle_signals()
    brought = _guard(lambda: api.up(spec, prefix=prefix, shaper=shaper, backend=chosen, on_progress=_progress,
                                    source=topology, replace=replace))
    out.print(f"[green]up[/green] {brought['name']}: {brought['dcs']} DCs, {brought['nodes']} nodes, shaper "
              f"{brought['shaper']}")
    for key, names in brought["not_applied"].items():
        out.print(f"[yellow]not applied[/yellow] {key}: {', '.join(names)} ({brought['not_applied_reason']})")


@app.command()
def status(output: str = OutputOption, as_json: bool = JsonOption, prefix: str = PrefixOption) -> None:
    """Nodes, addresses, links with their configured parameters and the shaper in use."""
    shown = _output(output, as_json)
    info = _guard(lambda: api.status(prefix=prefix))
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
    _dead(info["dead_delay_lines"])


@app.command(name="exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(node: str = typer.Argument(..., help="Node name, e.g. east-0"),
          command: list[str] = typer.Argument(..., help="Command and arguments (after --)."),
          prefix: str = PrefixOption) -> None:
    """Run a command inside a node: testbed exec east-0 -- ping 198.18.1.2"""
    raise typer.Exit(_guard(lambda: api.exec_(node, command, prefix=prefix)))


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
    def shaped(key: str, params: dict[str, str]) -> None:
        out.print(f"[green]shaped[/green] {key}: " + ", ".join(f"{k} {v}" for k, v in params.items()))

    _guard(lambda: api.shape(a, b, prefix=prefix, latency=latency, distance=distance, bandwidth=bandwidth,
                             jitter=jitter, loss=loss, one_way=one_way, on_shaped=shaped))


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
    if clear:
        if kind is not None:
            _fail("testbed fault: --clear: restores every fault in force; give no KIND")
        cleared = _guard(lambda: api.clear_faults(prefix=prefix))
        out.print(f"[green]cleared[/green] {len(cleared)} faults" + (f" ({', '.join(cleared)})" if cleared else ""))
        return
    api.handle_signals()  # Ctrl-C and SIGTERM clear the fault before the command ends (SIGKILL: `fault --clear`)
    record = _guard(lambda: api.fault(kind, a, b, prefix=prefix, duration=for_, loss=loss, latency=latency,
                                      jitter=jitter, bandwidth=bandwidth, period=period, down=down))
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
    shown = _output(output, as_json)
    flow = _seconds("probe", "--seconds", seconds, zero=True)
    chosen_backend = _backend(backend, inventory, known_hosts, accept_new, image, adopt)
    api.handle_signals()
    result = _guard(lambda: api.probe(topology, prefix=prefix, pings=pings, flow_seconds=flow, out_dir=out_dir,
                                      shaper=shaper, backend=chosen_backend, on_progress=_progress,
                                      on_pair=lambda a, b: err.print(f"[dim]probing {a} -> {b}[/dim]")))
    if result["report"] is not None:
        err.print(f"report: {result['report']}")
    if shown == "json":
        print(json.dumps({"testbed": result["testbed"], "pairs": result["pairs"]}, indent=1))
    elif shown == "csv":
        from testbed.cli.render import print_csv

        print_csv(result["pairs"])
    else:
        from testbed.cli.render import probe_table

        out.print(probe_table(result["pairs"], result["testbed"]))
    _dead(result["dead_delay_lines"], "died during the probe")


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
    limit = _seconds("run", "--timeout", timeout)
    chosen_backend = _backend(backend, inventory, known_hosts, accept_new, image, adopt)
    api.handle_signals()
    progress = api.run_progress(err)
    # compose's containers (--adopt) carry the prefix `testbed compose` gave them, tb- unless told otherwise
    prefix = prefix or os.environ.get(settings.PREFIX) or (DEFAULT_PREFIX if adopt else None)

    def ran() -> Path:
        try:
            if topology is not None:
                command = ([str(experiment)] if experiment else []) + list(ctx.args)
                return api.run_command(topology, command, out_dir, prefix=prefix, shaper=shaper,
                                       ranks_per_node=ranks_per_node, timeout=limit, progress=progress,
                                       backend=chosen_backend, baseline=baseline, warmup_steps=warmup_steps,
                                       tokens_per_step=tokens_per_step)
            if experiment is None:
                _fail("give an experiment file, or --topology T -- COMMAND")
            if ctx.args:  # words after the experiment belong to --topology's command alone
                _fail(f"testbed run: {' '.join(ctx.args)}: no such option or argument of an experiment's run ({experiment}"
                      "; a command after -- needs --topology; `testbed plan` predicts without running)")
            return api.run(experiment, out_dir, prefix=prefix, shaper=shaper, resume=resume, only=only,
                           progress=progress, backend=chosen_backend, launcher=launcher)
        finally:
            progress.stop()  # before any line about how it ended

    run_dir = _guard(ran)
    report = _guard(lambda: api.report(run_dir))
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
    output = output or output_alias
    made = _guard(lambda: api.compose(topology, experiment, output=output, shaper=shaper, prefix=prefix))
    if output is None:
        print(made["text"], end="")
        return
    err.print(f"wrote {output}: {len(made['services'])} services, {len(made['networks'])} networks")


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run directory (results/<experiment>/<run>).")) -> None:
    """Rebuild the tables, plots and report of a run directory."""
    out.print(f"report: {_guard(lambda: api.report(run_dir))}")


@app.command()
def compare(first: Path = typer.Argument(..., help="A run directory (A)."),
            second: Path = typer.Argument(..., help="A run directory (B)."), output: str = OutputOption) -> None:
    """Put two runs side by side (throughput and efficiency per strategy and sweep point)."""
    shown = _output(output)
    frame = _guard(lambda: api.compare(first, second))
    if shown == "json":
        print(frame.to_json(orient="records", indent=1))
    elif shown == "csv":
        print(frame.to_csv(index=False), end="")
    elif frame.empty:
        out.print("nothing in common to compare")
    else:
        from testbed.cli.render import compare_table

        out.print(compare_table(frame))


def _print_failed(cells: dict[str, Any]) -> bool:
    """Say which cells failed, if any (stderr); True when none did."""
    for result in cells["failed"]:
        err.print(f"[red]FAIL:[/red] cell {escape(result['cell']['id'])}: {escape(result['reason'])}", highlight=False,
                  soft_wrap=True)
    if cells["failed"]:
        err.print(f"[red]{len(cells['failed'])} of {cells['total']} cells failed[/red]")
    return not cells["failed"]


def _cells_passed(run_dir: Path) -> bool:
    """Say which cells of a run failed, if any (stderr); True when none did."""
    return _print_failed(api.cells(run_dir))


def _gate(run_dir: Path, junit: Optional[Path] = None, against: Optional[Path] = None,
          tolerance: str = "5%", rebuild: bool = True, shown: str = "table") -> bool:
    """Print every threshold's verdict (and regressions against `against`), write JUnit; True when every
    cell completed, every threshold held and nothing regressed. `rebuild`: the report first (a run has
    just written it)."""
    verdict = _guard(lambda: api.check(run_dir, junit=junit, against=against, tolerance=tolerance, rebuild=rebuild))
    _print_failed(verdict["cells"])
    checks, regressed = verdict["thresholds"], verdict["regressions"]
    if shown == "json":
        print(json.dumps({"thresholds": checks, "regressions": regressed}, indent=1, default=str))
    elif shown == "csv":
        from testbed.cli.render import print_csv

        print_csv([{"kind": "threshold", **item} for item in checks]
                  + [{"kind": "regression", **item} for item in regressed or []])
    else:
        from testbed.api.types import check_line, regression_line

        for item in checks:
            out.print(check_line(item), highlight=False, soft_wrap=True, markup=False)
        if not checks:
            out.print("no thresholds in this experiment")
        if regressed is not None:
            out.print(f"against {against} (tolerance {verdict['tolerance']:.0%}):", highlight=False, markup=False)
            for item in regressed:
                out.print(regression_line(item), highlight=False, soft_wrap=True, markup=False)
    if junit is not None:
        err.print(f"junit: {junit}")
    return verdict["passed"]


@app.command()
def check(run_dir: Path = typer.Argument(..., help="A run directory (results/<experiment>/<run>)."),
          junit: Optional[Path] = typer.Option(None, "--junit", help="Also write the verdicts as JUnit XML here."),
          against: Optional[Path] = typer.Option(None, "--against", help="An earlier run of the same experiment: "
                                                 "fail when a figure regressed against it."),
          tolerance: str = typer.Option("5%", "--tolerance", help="With --against: how much worse a figure may be."),
          output: str = OutputOption) -> None:
    """Exit 1 when a cell failed, a threshold of the experiment is missed or (with --against) a figure
    regressed: tokens/s fell, or inter-DC bytes per step rose, by more than the tolerance (nightly CI)."""
    shown = _output(output)
    if not _gate(run_dir, junit, against, tolerance, shown=shown):
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
    output = output_alias or output
    chosen_backend = _backend(backend, inventory, known_hosts, accept_new, image)
    api.handle_signals()
    calibration = _guard(lambda: api.calibrate(target, output, prefix=prefix, shaper=shaper, backend=chosen_backend))
    fit = calibration["fit"]
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
    shown = _output(output, as_json)
    result = _guard(lambda: api.plan(experiment, calibration, search=search))
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
    shown = _output(output)
    result = _guard(lambda: api.whatif(scenario, out_dir))
    from testbed.cli.render import print_csv, whatif_table

    files = "\n".join(f"{name}: {path}" for name, path in result["files"].items() if name != "answers")
    if shown == "json":
        keep = ("answers", "reference", "recommendation", "scale", "checks")
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
    for check in result["checks"]:  # the scenario's published figures, PASS/FAIL each
        out.print(check["line"], highlight=False, markup=False)
    out.print(files, highlight=False, markup=False)


hosts_app = typer.Typer(help="Real hosts over SSH (inventory files).", no_args_is_help=True)
app.add_typer(hosts_app, name="hosts")
slurm_app = typer.Typer(help="Slurm: the Prolog and Epilog a site's admin installs for --backend slurm.",
                        no_args_is_help=True)
app.add_typer(slurm_app, name="slurm")


@slurm_app.command("prolog")
def slurm_prolog() -> None:
    """As slurmd's Prolog (root, each node, a job's start): shape the node as a testbed job's plan says."""
    raise typer.Exit(api.slurm_hook("prolog"))


@slurm_app.command("epilog")
def slurm_epilog() -> None:
    """As slurmd's Epilog (root, each node, a job's end): restore what testbed changed, whatever became of the job."""
    raise typer.Exit(api.slurm_hook("epilog"))


@hosts_app.command("check")
def hosts_check(inventory: Path = typer.Option(..., "--inventory", help="Inventory YAML file."),
                known_hosts: Path = KnownHostsOption, accept_new: bool = AcceptNewOption,
                output: str = OutputOption, as_json: bool = JsonOption) -> None:
    """Connect to every host and show what it has (python, torch, tc, netem, clock offset) and lacks."""
    from dataclasses import asdict

    from testbed.cli.render import hosts_table

    shown = _output(output, as_json)
    rows = _guard(lambda: api.check_hosts(inventory, known_hosts=known_hosts, accept_new=accept_new))
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
def emulate(scenario: Path = typer.Argument(..., help="Scenario YAML file (scenarios/)."),
            points: str = typer.Option("distance", "--points", metavar="reference|distance|bandwidth|all",
                                       help="Which points: the reference; every sweep distance at the reference "
                                            "bandwidth (distance, with the reference); every bandwidth at the "
                                            "reference distance; both sweeps."),
            dry_run: bool = typer.Option(False, "--dry-run", help="Print the scale model it would run, group by "
                                                                  "group beside the full scale (no root)."),
            out_dir: Path = typer.Option(Path("results"), "-o", "--out", help="Results root."),
            resume: bool = typer.Option(False, "--resume", help="Continue the latest scale-model run of it."),
            launcher: str = typer.Option("auto", "--launcher", help="As `testbed run --launcher`."),
            shaper: str = typer.Option("auto", help="auto | netem | userspace-delay"),
            backend: str = BackendOption, inventory: Optional[Path] = InventoryOption,
            known_hosts: Path = KnownHostsOption, accept_new: bool = AcceptNewOption,
            image: Optional[str] = ImageOption,
            prefix: Optional[str] = typer.Option(None, "--prefix", show_default="a free tb-runN-",
                                                 help="Name prefix of every kernel object."),
            output: str = OutputOption) -> None:
    """Run a scenario's scale model: laptop-scale cells whose dimensionless groups match the full scale's, each with
    its single-site baseline; emulate.csv and a report set measured efficiency beside both predictions."""
    shown = _output(output)
    if dry_run:
        from testbed.cli.render import print_csv

        rows = _guard(lambda: api.emulate_dry_run(scenario, points))
        if shown == "json":
            print(json.dumps(rows, indent=1))
        elif shown == "csv":
            print_csv(rows)
        else:
            from rich.table import Table

            grid = Table("strategy", "point", "group", "full scale", "scale model", "unmatched")
            for row in rows:
                grid.add_row(row["strategy"], f"{row['distance_km']:g} km, {row['bandwidth_gbit']:g} Gbit/s",
                             row["group"], _num(row["full_scale"]), _num(row["scale_model"]), row["unmatched"])
            out.print(grid)
        return
    chosen_backend = _backend(backend, inventory, known_hosts, accept_new, image)
    api.handle_signals()
    progress = api.run_progress(err)
    try:
        result = _guard(lambda: api.emulate(scenario, out_dir, points=points, prefix=prefix, shaper=shaper,
                                            backend=chosen_backend, launcher=launcher, resume=resume,
                                            progress=progress))
    finally:
        progress.stop()
    if shown == "json":
        print(json.dumps({**{k: str(result[k]) for k in ("run_dir", "csv", "report")}, "rows": result["rows"]},
                         indent=1, default=str))
    elif shown == "csv":
        from testbed.cli.render import print_csv

        print_csv(result["rows"])
    else:
        out.print(f"[green]done[/green]: {result['run_dir']}\nemulate.csv: {result['csv']}\n"
                  f"report: {result['report']}", highlight=False)
    if any(row["status"] != "ok" for row in result["rows"]):
        raise typer.Exit(1)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


@app.command()
def down(prefix: str = PrefixOption) -> None:
    """Tear the testbed down (namespaces, interfaces, delay lines, state); refused while a live process holds it
    (a `testbed run` on it)."""
    removed = _guard(lambda: api.down(prefix=prefix))
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
    removed = _guard(lambda: api.clean(prefix=prefix, images=images, force=force))
    out.print(f"[green]clean[/green]: removed {len(removed)} objects"
              + (f" ({', '.join(removed[:6])}{' ...' if len(removed) > 6 else ''})" if removed else ""))
