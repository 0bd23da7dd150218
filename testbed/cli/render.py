"""The tables the `testbed` command prints (rich): plans for --dry-run, status, host checks, probe results,
the cost model's predictions (plan) and what-if answers.

Which plan table is printed follows the plan's type (a network, a containers or a hosts plan), never the name
of the backend that made it."""

from __future__ import annotations

import shlex
from functools import singledispatch
from typing import Any

from rich.console import Console
from rich.table import Table

from testbed.api.types import ContainersPlan, HostsPlan, NetworkPlan, format_duration, format_fraction

AUTO_NOTE = "(shaper auto resolves to netem where every kernel has it; shown: userspace-delay)"


@singledispatch
def print_plan(plan: Any, out: Console, requested_shaper: str, options: Any) -> None:
    """Print what `up` would build; `requested_shaper` is what the user asked for (maybe auto)."""
    raise TypeError(f"no table for a {type(plan).__name__}")


def _delay_text(line: Any) -> str:
    """A delay line's direction as the plan tables show it: latency ±jitter loss."""
    return (f"{format_duration(line.latency)} ±{format_duration(line.jitter)} "
            f"loss {format_fraction(line.loss)}")


@print_plan.register
def _(plan: NetworkPlan, out: Console, requested_shaper: str, options: Any) -> None:
    out.print(f"[bold]plan[/bold] {plan.topology}: shaper {plan.shaper}, prefix {plan.prefix!r}")
    table = Table("namespace", "role", "dc", title="namespaces")
    for space in plan.namespaces:
        table.add_row(space.name, space.role + (" (ip_forward)" if space.forwarding else ""), space.dc)
    out.print(table)
    table = Table("end a", "end b", title="veth pairs")
    for pair in plan.veths:
        table.add_row(*[f"{i.ns}/{i.ifname}" + (f" {i.address}" if i.address else "") +
                        (f" master {i.master}" if i.master else "") for i in (pair.a, pair.b)])
    out.print(table)
    table = Table("namespace", "destination", "via", title="routes")
    for route in plan.routes:
        table.add_row(route.ns, route.dst, route.gateway)
    out.print(table)
    table = Table("link end", "egress", "tc", "userspace delay line", "not applied", title="shaping")
    for end in plan.link_ends:
        line = end.shaping.delay_line
        table.add_row(end.key, f"{end.ns}/{end.ifname}", "\n".join(o.describe() for o in end.shaping.tc) or "-",
                      _delay_text(line) if line else "-",
                      ", ".join(end.shaping.not_applied) or "-")
    out.print(table)
    if requested_shaper == "auto":
        out.print(AUTO_NOTE)


@print_plan.register
def _(plan: HostsPlan, out: Console, requested_shaper: str, options: Any) -> None:
    out.print(f"[bold]plan[/bold] {plan.network.topology} on hosts of {plan.inventory_file}: shaper "
              f"{plan.network.shaper}, prefix {plan.network.prefix!r}")
    table = Table("node", "host", "address", "interface", "workdir", "commands (run over SSH)", "delay line",
                  title="hosts")
    for item in plan.hosts:
        lines = [f"{d.key} from {','.join(d.sources)}: {_delay_text(d)}" for d in item.delay_line]
        table.add_row(item.node.name, item.host.name, item.host.address, item.host.interface, item.workdir,
                      "\n".join(("sudo -n " if item.host.sudo else "") + shlex.join(c) for c in item.apply),
                      "\n".join(lines) or "-")
    out.print(table)
    out.print("intra-DC traffic is the hosts' own network (unshaped); a link's bandwidth applies per sending host")
    if requested_shaper == "auto":
        out.print(AUTO_NOTE)


@print_plan.register
def _(plan: ContainersPlan, out: Console, requested_shaper: str, options: Any) -> None:
    out.print(f"[bold]plan[/bold] {plan.topology} as containers of {options.image}: shaper {plan.shaper} "
              f"(auto: each router decides on the docker host's kernel), label testbed={plan.prefix}")
    table = Table("network", "role", "subnet", "gateway (claimed by the DC router)", title="docker networks")
    for net in plan.networks:
        table.add_row(net.name, net.role, net.subnet, net.gateway if net.role == "lan" else "-")
    out.print(table)
    table = Table("container", "role", "addresses", "capabilities", "routes", "shapes (egress) / delays (ingress)",
                  title="containers")
    for spec in plan.containers:
        config = spec.router
        addresses = "\n".join(f"{a.network} {a.address}" for a in spec.attachments)
        routes = "\n".join(f"{r.dst} via {r.via}" for r in config.routes) if config else ""
        ends = ([f"{e.key} on {e.ifname}" for e in config.egress] +
                [f"{e.key} from {e.ifname}" for e in config.ingress]) if config else []
        table.add_row(plan.container_name(spec), spec.role, addresses, ", ".join(spec.cap_add) or "none",
                      routes or "default via .1", "\n".join(ends) or "-")
    out.print(table)
    out.print("intra-DC access links are not shaped in containers (nodes have no capabilities)")


def plan_rows(plan: Any) -> list[dict[str, Any]]:
    """`up --dry-run --output csv`: one row per link end (a network plan), host (hosts) or container."""
    import dataclasses

    if isinstance(plan, NetworkPlan):
        return [{"link_end": end.key, "kind": end.kind, "namespace": end.ns, "interface": end.ifname,
                 **end.shaping.params.describe(), "tc": "; ".join(o.describe() for o in end.shaping.tc),
                 "delay_line": _delay_text(end.shaping.delay_line) if end.shaping.delay_line else "",
                 "not_applied": ", ".join(end.shaping.not_applied)} for end in plan.link_ends]
    return [dataclasses.asdict(item) for item in (plan.hosts if isinstance(plan, HostsPlan) else plan.containers)]


def status_tables(info: dict[str, Any]) -> list[Table]:
    """The nodes and links of `testbed status` (from Testbed.describe())."""
    nodes = Table("node", "dc", "namespace", "address", title="nodes")
    for node in info["nodes"]:
        nodes.add_row(node["name"], node["dc"], node["namespace"], node["address"])
    from testbed.api.types import value_label

    links = Table("link", "latency", "bandwidth", "jitter", "loss", "queue", "mechanism", title="links")
    for link in info["links"]:
        shown = {name: value_label(f"links[*].{name}", link[name]) if link[name] != "unlimited" else "unlimited"
                 for name in ("latency", "bandwidth", "jitter", "loss")}  # '10 ms', '1 Gbit/s', '0 %'
        composed = info.get("composed", {}).get(link["key"])  # a routed pair on real hosts: its hops end to end
        key = link["key"] + (f" (composed: {' + '.join(composed)})" if composed else "")
        links.add_row(key, shown["latency"], shown["bandwidth"], shown["jitter"], shown["loss"],
                      f"{link['queue']:,}" if isinstance(link["queue"], int) else str(link["queue"]), link["mechanism"])
    lines = Table("direction", "latency", "own path taken back", "residual p50", "packets", "least delay", "note",
                  title="userspace delay lines (since they started)")
    for key, figures in sorted(info.get("delay_lines", {}).items()):
        lines.add_row(key, _fmt(figures["latency_ms"], ".3f", " ms"), _fmt(figures["compensation_ms"], "+.3f", " ms"),
                      _fmt(figures["residual_ms"], "+.3f", " ms"), f"{figures['packets']:,}",
                      _fmt(figures["least_ms"], ".3f", " ms"), figures.get("note") or "-")
    return [nodes, links] + ([lines] if info.get("delay_lines") else [])


def hosts_table(rows: list, title: str) -> Table:
    """What each host has and lacks (testbed.fabric.ssh.checks.HostCheck rows)."""
    table = Table("dc", "host", "address", "python", "torch", "tc", "netem", "clock offset", "problems", title=title)
    for r in rows:
        offset = "-" if r.clock_offset_ms is None else f"{r.clock_offset_ms:+.1f} ms"
        table.add_row(r.dc, r.host, r.address, r.python or "-", r.torch or "-", r.tc or "-", r.netem or "-", offset,
                      r.problems if r.reachable else "unreachable")
    return table


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def probe_table(records: list[dict], info: dict) -> Table:
    """Every DC pair's RTT and goodput against what is configured (testbed.runner.probe records); the RTT's error
    is against applied + floor (testbed.runner.fidelity)."""
    table = Table("pair", "RTT configured", "RTT applied", "floor", "p50", "p99", "p50 error", "delay line adds",
                  "loss cfg/meas", "rate", "goodput expected", "goodput", "error", "not applied",
                  title=f"probe: {info['topology']} (shaper {info['shaper']})")
    for r in records:
        table.add_row(
            f"{r['src']} -> {r['dst']}", _fmt(r["rtt_configured_ms"], ".3f", " ms"),
            _fmt(r["rtt_applied_ms"], ".3f", " ms"), _floor(r),
            _fmt(r["rtt_p50_ms"], ".3f", " ms"),
            _fmt(r["rtt_p99_ms"], ".3f", " ms"), _fmt(r["rtt_p50_error_ms"], "+.3f", " ms")
            + (f" (host steal {r['host_steal']:.0%})" if r.get("host_steal_note") else ""),
            _fmt(r.get("delay_line_residual_ms"), "+.3f", " ms") + (f" ({r['delay_line_note']})"
                                                                     if r.get("delay_line_note") else ""),
            f"{r['loss_configured'] * 100:.2f}% / {_fmt(r['ping_loss'] and r['ping_loss'] * 100, '.2f', '%')}",
            _fmt(r["rate_configured_mbps"], ",.0f", " Mbit/s"), _fmt(r["goodput_expected_mbps"], ",.1f", " Mbit/s"),
            _fmt(r["goodput_mbps"], ",.1f", " Mbit/s") + _retransmits(r.get("flow_retransmits")),
            _fmt(r["goodput_error"] and r["goodput_error"] * 100, "+.1f", "%"), r["not_applied"] or "-")
    return table


def _floor(record: dict) -> str:
    """The floor a pair is held against and what it is: "(path)", the same path unshaped, with the DCs' own beside
    it; "(DCs)", their own round trips (where a link end delays marked pings too)."""
    floor = _fmt(record.get("rtt_floor_ms"), ".3f", " ms")
    if record.get("rtt_floor_of") == "path":
        return f"{floor} (path; DCs {_fmt(record.get('rtt_dc_floor_ms'), '.3f')})"
    return f"{floor} (DCs)" if record.get("rtt_floor_of") == "dcs" else floor


def _retransmits(count: int | None) -> str:
    """A flow's retransmitted segments beside its goodput, where there were any."""
    return f" ({count} retx)" if count else ""


def _percent(value: Any) -> str:
    return "-" if value is None else f"{value:.0%}"


def print_prediction(result: dict[str, Any], out: Console) -> None:
    """`testbed plan`: every cell's prediction, the fastest strategy per sweep point (or a tie, where strategies
    lie within the model's error of each other), and what --search found."""
    from rich.markup import escape

    calibration = result["calibration"]
    error = result.get("model_error")
    which = "the shipped reference calibration" if calibration["reference"] else f"calibration {calibration['file']}"
    out.print(f"[bold]plan[/bold] {escape(result['experiment'])}: {escape(which)}, {escape(calibration['provenance'])}"
              + (f"; model error {error:.1%} (its median over the calibration's benchmarks)" if error is not None
                 else ""), highlight=False)
    if calibration["reference"]:
        out.print("[dim]figures of that machine, not of this one: `testbed calibrate EXPERIMENT -o FILE` (root) "
                  "measures yours; `--calibration FILE` uses it[/dim]", highlight=False)
    table = Table("cell", "step s", "tokens/s", "vs single site", "exposed s", "inter-DC MB/step",
                  "where the time goes", title="predicted")
    for cell in result["cells"]:
        table.add_row(escape(cell["cell"]), f"{cell['step_s_predicted']:.3f}", f"{cell['tokens_per_s_predicted']:,.0f}",
                      "baseline" if cell["baseline"] else _percent(cell.get("efficiency_vs_single_site_predicted")),
                      f"{cell['exposed_s_predicted']:.3f}", f"{cell['inter_dc_bytes_predicted'] / 1e6:,.2f}",
                      escape(cell["explain"]))
    out.print(table)
    for line in verdict_lines(result):
        out.print(line, highlight=False)
    for point, found in result.get("search", {}).items():
        best = found["recommended"]
        label = result.get("points", {}).get(point, {}).get("label") or point or "every cell"
        options = ", ".join(f"{k}={v}" for k, v in best["options"].items()) or "its defaults"
        out.print(f"recommended at {escape(label)} ({found['candidates']} configurations): "
                  f"[bold]{best['strategy']}[/bold] with {escape(options)}: {best['tokens_per_s_predicted']:,.0f} "
                  "tokens/s predicted", highlight=False)


def verdict_lines(result: dict[str, Any]) -> list[str]:
    """One line per sweep point: the fastest strategy and by how much, or a tie within the model's error."""
    from rich.markup import escape

    error = result.get("model_error")
    lines = []
    for verdict in result.get("points", {}).values():
        where = escape(verdict["label"])
        if verdict["tied"]:
            names = ", ".join(escape(n) for n in [verdict["best"], *verdict["tied"]])
            lines.append(f"at {where}: [bold]tie[/bold] between {names} (within model error: "
                         f"{verdict['gap']:.1%} apart, the model's error is {error:.1%})")
        elif verdict["runner_up"] is not None:
            lines.append(f"best at {where}: [bold]{escape(verdict['best'])}[/bold] ({verdict['gap']:.1%} ahead of "
                         f"{escape(verdict['runner_up'])}" + (f", beyond the model's error of {error:.1%})"
                                                             if error is not None else ")"))
        else:
            lines.append(f"at {where}: only {escape(verdict['best'])}")
    return lines


def whatif_table(result: dict[str, Any]) -> Table:
    """`testbed whatif`: each strategy at the scenario's reference point, and what it takes to reach the target."""
    import math

    def fmt(value: Any, cap: float | None = None) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "never"
        return f">= {cap:,.0f}" if cap is not None and value >= cap else f"{value:,.0f}"

    scenario = result["scenario"]
    table = Table("strategy", "efficiency", "step s", "bandwidth for target (Gbit/s)", "distance for target (km)",
                  title=f"{scenario.name} at the reference point (target {scenario.target_efficiency:.0%})")
    for row in result["answers"]:
        table.add_row(row["strategy"], f"{row['efficiency']:.1%}", f"{row['step_s']:,.2f}",
                      fmt(row["bandwidth_for_target_gbit"]), fmt(row["distance_for_target_km"], 20_000))
    return table


def print_csv(rows: list[dict[str, Any]]) -> None:
    """Rows as CSV on stdout: the union of their keys in first-seen order, nested values as JSON."""
    import csv
    import json
    import sys

    columns = list(dict.fromkeys(key for row in rows for key in row))
    writer = csv.DictWriter(sys.stdout, columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v, default=str) if isinstance(v, (dict, list, tuple)) else v
                         for k, v in row.items()})


def compare_table(frame: Any) -> Table:
    """`testbed compare`: two runs' figures per strategy and sweep point, for people (labels, %, MB, separators)."""
    from testbed.api.types import key_label, value_label

    def cell(column: str, value: Any) -> str:
        if value is None or value != value:  # NaN
            return "-"
        if column.startswith(("links[", "workload.")):
            return value_label(column, value)
        if column.endswith("B/A") or column.startswith("scaling_efficiency"):
            return f"{value:.1%}" if column.startswith("scaling_efficiency") else f"{value:.2f}×"
        if column.startswith("tokens_per_s"):
            return f"{value:,.0f}"
        if column.startswith("inter_dc_gb_per_step"):
            return f"{value * 1e3:,.2f}"
        if column == "baseline":
            return "single site" if str(value) == "True" else ""
        return str(value)

    names = {"tokens_per_s": "tokens/s", "scaling_efficiency": "efficiency", "inter_dc_gb_per_step":
             "inter-DC MB/step"}

    def header(column: str) -> str:
        if column.startswith(("links[", "workload.")):
            return key_label(column)
        for key, name in names.items():
            if column.startswith(key):
                return name + column[len(key):]
        return column

    table = Table(*[header(c) for c in frame.columns], title="A against B")
    for row in frame.to_dict("records"):
        table.add_row(*[cell(c, row[c]) for c in frame.columns])
    return table
