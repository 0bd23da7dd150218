"""mkdocs hook: the pages that come from the code, generated at build time and never committed.

Written here rather than by a script whose output is committed: a generated page then cannot drift from the code
or be edited by hand, and no test has to compare two copies. Every function below returns a page's markdown;
tests/docs/test_docs.py calls them without mkdocs.

Pages: reference/cli.md (every command and option, walked from the click tree typer builds), reference/formats.md
(topology, experiment, scenario and inventory files: a table per model and its JSON Schema, from the pydantic
models), reference/strategies.md (the built-in workload's strategies and options, from testbed.spec.strategies),
reference/environment.md (every TESTBED_* variable the code reads, described below), gallery/<name>.md (one per
shipped experiment and scenario, from the file's own header) and changelog.md (CHANGELOG.md).
"""

from __future__ import annotations

import csv
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "gallery" / "results"  # measured results kept by hand, one per gallery page (optional)

# What each TESTBED_* variable the code reads is for, in a user's words; a variable not here takes the comment
# testbed/settings.py or testbed/rankenv.py gives it, and tests/docs/test_docs.py fails on one that has neither.
ENVIRONMENT: dict[str, tuple[str, str]] = {
    # name: (who sets it, what it does)
    "TESTBED_PREFIX": ("user", "name prefix of every namespace, interface, container and network (`--prefix`; "
                               "default `tb-`)"),
    "TESTBED_STATE_DIR": ("user", "where the state file lives (default `/run/testbed`, or `/dev/shm/testbed` "
                                  "where `/run` is on a disk)"),
    "TESTBED_LOG_DIR": ("user", "where an unexpected failure's traceback is written (default "
                                "`~/.local/state/testbed`)"),
    "TESTBED_IMAGE": ("user", "the docker image of `--backend docker` (default `testbed:latest`)"),
    "TESTBED_DELAY_LINE_RT": ("user", "`0` runs the userspace delay line without `SCHED_FIFO`"),
    "TESTBED_PROBE_RT": ("user", "`0` runs the probe's pinger and echo without `SCHED_FIFO`"),
    "TESTBED_DELAY_LINE_COMPENSATE": ("user", "`0` makes the delay line aim each packet at its due time itself, "
                                              "not ahead of it by its own measured release path"),
    "TESTBED_DELAY_LINE_BATCH": ("user", "`0` makes the delay line watch its queue all the time instead of "
                                         "reading what arrived in one batch when it wakes for the head"),
    "TESTBED_DELAY_LINE_WARM": ("user", "`0` makes the delay line release a packet after a sleep without first "
                                        "sending a verdict that accepts nothing (which warms the verdict's path)"),
    "TESTBED_GSO": ("user", "`0` leaves every interface of a netns testbed at the kernel's 64 KiB GSO size, "
                            "whatever its links' rates"),
    "TESTBED_OWNERS_DIR": ("user", "where the lock files that say which process holds a testbed live (default "
                                   "`testbed-owners/` in the state's root)"),
    "TESTBED_THREADS_PER_RANK": ("user, rank", "intra-op threads per rank (default 1)"),
    "TESTBED_DIST_BACKEND": ("user, rank", "`gloo` or `nccl`: the process-group backend outright (default: NCCL "
                                           "where every rank has a GPU of its own, else gloo)"),
    "TESTBED_NUM_DCS": ("harness", "number of DCs"),
    "TESTBED_DC_SIZES": ("harness", "ranks per DC, comma-separated, e.g. `2,1,2` (always set)"),
    "TESTBED_NODES_PER_DC": ("harness", "ranks per DC, set only when every DC holds the same number"),
    "TESTBED_DC": ("harness", "this rank's DC (ranks are numbered DC by DC)"),
    "TESTBED_METRICS_DIR": ("harness", "where `rank<r>.jsonl` goes (`testbed.steplog` writes nothing without it)"),
    "TESTBED_LINK_RTT_MS": ("harness", "the inter-DC round trip, for the overlap schedule's look-ahead"),
    "TESTBED_PG_TIMEOUT": ("harness", "the process groups' timeout in seconds (the longest declared partition "
                                      "plus 60 s, at least 300 s)"),
    "TESTBED_GPU_SHARERS": ("harness", "how many ranks share this machine's GPUs"),
    "TESTBED_GPU_SLOT": ("harness", "this rank's place among them"),
    "TESTBED_TOKENS_PER_STEP": ("harness", "`run --tokens-per-step N`: tokens per step of all ranks together, for "
                                           "the figures of a script that does not report its own"),
    "TESTBED_CHECKPOINT_DIR": ("harness", "where a cell with `checkpoint_every` writes its checkpoints"),
    "TESTBED_CHECKPOINT_EVERY": ("harness", "steps between checkpoints"),
    "TESTBED_CHECKPOINT_LOCAL": ("harness", "every rank checkpoints its own state (docker, ssh: no shared files)"),
    "TESTBED_SDC": ("harness", "the silent data corruptions this rank injects"),
    "TESTBED_SDC_CHECK": ("harness", "turns the SDC checks on"),
    "TESTBED_SDC_REPLAY": ("harness", "share of steps replayed unasked (`sdc_replay`)"),
    "TESTBED_SDC_BUDDY": ("harness", "replays by buddies (`sdc_replay_by: buddy`)"),
    "TESTBED_ROUTER": ("harness", "inside a docker DC router: its configuration"),
    "TESTBED_NODE": ("harness", "the node a process runs on"),
    "TESTBED_NEIGH_RECORD": ("harness", "where `up` records the ARP table limit it raised"),
}


def code_environment() -> set[str]:
    """Every TESTBED_* name the package's code mentions."""
    names: set[str] = set()
    for path in (ROOT / "testbed").rglob("*.py"):
        names.update(re.findall(r"\bTESTBED_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    return names


def named_in_code() -> dict[str, tuple[str, str]]:
    """The variables testbed.settings (what testbed reads from its own environment) and testbed.rankenv (what a
    rank is told) name, with the comment the code gives each: {name: (who, comment)}."""
    out = {}
    for module, who in (("settings.py", "user"), ("rankenv.py", "harness")):
        path = ROOT / "testbed" / module
        if path.exists():
            for match in re.finditer(r'^\w+ = "(TESTBED_[A-Z0-9_]+)"[ \t]*(?:#[ \t]*(.*))?$', path.read_text(), re.M):
                out[match.group(1)] = (who, (match.group(2) or "").strip())
    return out


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


# --- commands ---------------------------------------------------------------------------------------------------

def _commands(group: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    import click

    out = []
    for name, command in group.commands.items():
        if getattr(command, "hidden", False):
            continue
        out.append(([*path, name], command))
        if isinstance(command, click.Group):
            out.extend(_commands(command, [*path, name]))
    return out


def cli_page() -> str:
    """Every command and option, from the command tree the CLI itself is built from."""
    import click
    import typer

    from testbed.cli.commands import app

    root = typer.main.get_command(app)
    lines = ["# Commands", "", "Generated from the command-line interface itself (`testbed COMMAND --help` says the "
             "same).", "", f"{_help(root)}", "", "| command | what it does |", "|---|---|"]
    commands = _commands(root, ["testbed"])
    for path, command in commands:
        anchor = "-".join(path)
        lines.append(f"| [`{' '.join(path)}`](#{anchor}) | {_cell(_help(command).split(chr(10))[0])} |")
    for path, command in commands:
        ctx = click.Context(command, info_name=" ".join(path))
        usage = " ".join([" ".join(path), *command.collect_usage_pieces(ctx)])
        lines += ["", f"## {' '.join(path)} {{#{'-'.join(path)}}}", "", _help(command), "", "```text", usage, "```"]
        if isinstance(command, click.Group):
            continue
        rows = []
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            name, text = record
            rows.append(f"| `{_cell(name)}` | {_cell(text)} |")
        if rows:
            lines += ["", "| argument or option | meaning |", "|---|---|", *rows]
    return "\n".join(lines) + "\n"


def _help(command: Any) -> str:
    text = (command.help or "").strip()
    return re.sub(r"\n\s*\n", "\n\n", text)


# --- file formats -----------------------------------------------------------------------------------------------

def _is_unit(schema: dict) -> bool:
    return any(s.get("type") == "string" and " with its unit" in s.get("description", "")
               for s in (schema, *schema.get("anyOf", ())))


def _type(schema: dict, defs: dict) -> str:
    if schema.get("type") == "string" and " with its unit" in schema.get("description", ""):
        return schema["description"].split(" with ")[0][2:] + f" (`{schema['description'].rsplit('e.g. ', 1)[1]}`)"
    if "$ref" in schema:
        return f"[{schema['$ref'].rsplit('/', 1)[1]}](#{schema['$ref'].rsplit('/', 1)[1].lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(s, defs) for s in schema["anyOf"])
    if "enum" in schema:
        return " | ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}), defs)}"
    if kind == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return f"mapping to {_type(schema['additionalProperties'], defs)}"
    return {"number": "number", "integer": "integer", "string": "text", "boolean": "true/false", "null": "none",
            "object": "mapping"}.get(kind, kind)


def _fields(title: str, schema: dict, defs: dict) -> list[str]:
    lines = [f"### {title}", ""]
    if schema.get("description"):
        lines += [schema["description"].strip(), ""]
    required = set(schema.get("required", ()))
    lines += ["| field | type | default | notes |", "|---|---|---|---|"]
    for name, field in schema.get("properties", {}).items():
        default = "required" if name in required else f"`{json.dumps(field.get('default'))}`"
        notes = "" if _is_unit(field) else field.get("description", "")
        bounds = [f"{k} {field[k]}" for k in ("minimum", "maximum", "exclusiveMinimum") if k in field]
        lines.append(f"| `{name}` | {_cell(_type(field, defs))} | {_cell(default)} | "
                     f"{_cell('; '.join(x for x in (notes, *bounds) if x))} |")
    return [*lines, ""]


UNIT_KINDS = {"parse_delay": ("duration", "20ms"), "parse_duration": ("duration", "30s"),
              "parse_distance": ("distance", "400km"), "parse_rate": ("rate", "1gbit"),
              "parse_fraction": ("fraction", "1%"), "parse_size": ("size", "4MiB"),
              "parse_at": ("step or time", "step 5")}


def _spec_models() -> dict[str, type]:
    """Every pydantic model of testbed.spec, by its schema title."""
    from pydantic import BaseModel

    import testbed.spec.experiment
    import testbed.spec.inventory
    import testbed.spec.scenario
    import testbed.spec.topology  # noqa: F401  (their models register as subclasses)

    found, todo = {}, list(BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("testbed.spec"):
            found[cls.model_config.get("title") or cls.__name__] = cls
    return found


def unit_fields(model: type) -> dict[str, tuple[str, str]]:
    """Fields a model parses with a unit (field: (kind, example)): the file holds text such as `20ms`, which the
    schema, describing the number it becomes, would not say. Read from the model's validators."""
    out = {}
    for validator in model.__pydantic_decorators__.field_validators.values():
        func = getattr(validator.func, "__func__", validator.func)
        names = set(func.__code__.co_names)
        for cell in func.__closure__ or ():
            value = cell.cell_contents
            if callable(value) and getattr(value, "__module__", "") == "testbed.spec.units":
                names.add(value.__name__)
        kinds = {UNIT_KINDS[n] for n in names if n in UNIT_KINDS}
        if len(kinds) == 1:
            out.update(dict.fromkeys(validator.info.fields, kinds.pop()))
    return out


def _with_units(schema: dict, models: dict[str, type]) -> dict:
    """The schema with every unit field described as the text a file holds."""
    for title, sub in [(schema.get("title"), schema), *schema.get("$defs", {}).items()]:
        model = models.get(title)
        for field, (kind, example) in (unit_fields(model) if model else {}).items():
            if field in sub.get("properties", {}):
                prop = sub["properties"][field]
                nullable = "anyOf" in prop and {"type": "null"} in prop["anyOf"]
                text = {"type": "string", "description": f"a {kind} with its unit, e.g. {example}"}
                sub["properties"][field] = {**({"anyOf": [text, {"type": "null"}]} if nullable else text),
                                            **{k: v for k, v in prop.items() if k in ("default", "title")}}
    return schema


def formats_page() -> str:
    """Topology, experiment, scenario and inventory files: a table of each model's fields and its JSON Schema."""
    from testbed.spec.experiment import Experiment
    from testbed.spec.inventory import Inventory
    from testbed.spec.scenario import Scenario
    from testbed.spec.topology import Topology
    from testbed.spec.units import units_table_markdown

    lines = ["# File formats", "",
             "Generated from the pydantic models that load the files: what is listed here is what is accepted. "
             "Any other key, a wrong unit or a value out of range is refused with one line naming the file and "
             "the field, exit status 2, before anything is built.", ""]
    lines += ["## Units", "", units_table_markdown().strip(), ""]
    models = _spec_models()
    for title, model, example in (("Topology", Topology, "topologies/two-dc.yaml"),
                                  ("Experiment", Experiment, "experiments/quickstart.yaml"),
                                  ("Scenario", Scenario, "scenarios/nemotron-340b-two-dc.yaml"),
                                  ("Inventory", Inventory, "inventories/example-two-dc.yaml")):
        schema = _with_units(model.model_json_schema(), models)
        defs = schema.get("$defs", {})
        lines += [f"## {title}", "", f"Example: `{example}`.", ""]
        lines += _fields(f"{title} (top level)", schema, defs)
        for name, sub in defs.items():
            if sub.get("properties"):
                lines += _fields(name, sub, defs)
        lines += [f'??? note "{title}: JSON Schema"', "", "    ```json",
                  *("    " + line for line in json.dumps(schema, indent=2).splitlines()), "    ```", ""]
    return "\n".join(lines)


def strategies_page() -> str:
    """The built-in workload's strategies and every option, from their one definition."""
    from testbed.spec.strategies import OPTIONS, STRATEGIES

    lines = ["# Strategies and workload options", "",
             "Generated from `testbed/spec/strategies.py`, the one definition that experiment files are checked "
             "against and the workload's own `python -m testbed.workload --help` is built from.", "",
             "| strategy | what it does | DC sizes |", "|---|---|---|"]
    for info in STRATEGIES.values():
        sizes = f"equal: {info.equal_dcs}" if info.equal_dcs else "any"
        lines.append(f"| `{info.name}` | {_cell(info.summary)} | {_cell(sizes)} |")
    lines += ["", "## Options", "",
              "Set in an experiment's `workload:` mapping, a strategy's `options:` or a sweep key "
              "(`workload.NAME`). An option a strategy does not read is refused.", "",
              "| option | default | read by | meaning |", "|---|---|---|---|"]
    for option in OPTIONS.values():
        if option.place == "harness":
            continue
        readers = "all" if set(option.strategies) == set(STRATEGIES) else ", ".join(option.strategies)
        choices = f" (one of {', '.join(map(str, option.choices))})" if option.choices else ""
        lines.append(f"| `{option.name}` | `{json.dumps(option.default, default=str)}` | {_cell(readers)} | "
                     f"{_cell(option.help + choices)} |")
    return "\n".join(lines) + "\n"


def environment_page() -> str:
    """Every TESTBED_* variable the code reads."""
    lines = ["# Environment variables", "",
             "Every `TESTBED_*` variable the code reads (the list is taken from the code; a test keeps the "
             "descriptions complete). *user*: you may set it; *harness*: the harness sets it for every rank, and "
             "a script of your own gets it too.", "", "| variable | set by | meaning |", "|---|---|---|"]
    named = named_in_code()
    for name in sorted(code_environment()):
        who, what = ENVIRONMENT.get(name, ("", ""))
        code_who, comment = named.get(name, ("", ""))
        lines.append(f"| `{name}` | {who or code_who} | {_cell(what or comment)} |")
    lines += ["", "Besides these, every rank gets torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, "
              "`LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`, and under an emulated testbed NCCL is kept on "
              "sockets over the shaped links (`NCCL_P2P_DISABLE`, `NCCL_SHM_DISABLE`, `NCCL_IB_DISABLE`, "
              "`NCCL_SOCKET_IFNAME`)."]
    return "\n".join(lines) + "\n"


# --- gallery ----------------------------------------------------------------------------------------------------

def shipped() -> list[tuple[str, Path]]:
    """(kind, file) of every shipped experiment and scenario."""
    return [("experiment", p) for p in sorted((ROOT / "experiments").glob("*.yaml"))] + \
           [("scenario", p) for p in sorted((ROOT / "scenarios").glob("*.yaml"))]


def _header(path: Path) -> str:
    """The comment block a shipped file opens with: the claim it mirrors, in its own words."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return " ".join(lines)


def _front_matter(text: str) -> tuple[dict, str]:
    match = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    if not match:
        return {}, text
    return yaml.safe_load(match.group(1)) or {}, text[match.end():]


def whatif_prediction(path: Path, out_dir: Path) -> tuple[str, Path]:
    """The cost model's answers for a scenario, computed now (markdown table), and the plot it drew."""
    from testbed.model.commands import whatif_scenario

    files = whatif_scenario(path, out_dir)["files"]
    with open(Path(files["plot"]).with_name("answers.csv")) as answers:
        rows = list(csv.DictReader(answers))

    def number(text: str, unit: str) -> str:
        return f"{float(text):,.0f} {unit}" if text not in ("", "nan") else "never"

    lines = ["| strategy | efficiency at the reference point | step | bandwidth for the target | "
             "distance for the target |", "|---|--:|--:|--:|--:|"]
    lines += [f"| `{r['strategy']}` | {float(r['efficiency']):.1%} | {float(r['step_s']):.2f} s | "
              f"{number(r['bandwidth_for_target_gbit'], 'Gbit/s')} | {number(r['distance_for_target_km'], 'km')} |"
              for r in rows]
    return "\n".join(lines), Path(files["plot"])


def plan_prediction(path: Path) -> str:
    """What `testbed plan` predicts for an experiment, computed now: per sweep point each strategy's tokens/s and
    the fastest (or a tie, within the model's error), and the calibration it used."""
    from testbed.model.commands import plan_experiment

    result = plan_experiment(path, None, with_search=False)
    cells = [c for c in result["cells"] if not c.get("baseline")]
    strategies = list(dict.fromkeys(c["strategy"] for c in cells))
    points: dict[str, dict[str, list[float]]] = {}
    for cell in cells:
        point = ", ".join(f"{k}={v}" for k, v in cell["sweep"].items()) or "(one point)"
        points.setdefault(point, {}).setdefault(cell["strategy"], []).append(cell["tokens_per_s_predicted"])
    labels = {key: info.get("label", key) for key, info in (result.get("points") or {}).items()}
    lines = ["| sweep point | " + " | ".join(f"`{s}` tokens/s" for s in strategies) + " | fastest |",
             "|---|" + "--:|" * len(strategies) + "---|"]
    for point, by_strategy in points.items():
        info = (result.get("points") or {}).get(point, {})
        best = info.get("best") or (result.get("best") or {}).get(point, "")
        tied = info.get("tied") or []
        verdict = f"tie: {', '.join([best, *tied])} (within the model's error)" if tied else f"`{best}`"
        row = [f"{sum(v) / len(v):,.0f}" if v else "" for v in (by_strategy.get(s, []) for s in strategies)]
        lines.append(f"| {_cell(labels.get(point, point))} | " + " | ".join(row) + f" | {_cell(verdict)} |")
    calibration = result.get("calibration") or {}
    if calibration.get("provenance"):
        lines += ["", f"Calibration: {'the reference calibration shipped with testbed, ' if calibration.get('reference') else ''}"
                  f"{_cell(calibration['provenance'])}."]
    if result.get("model_error") is not None:
        lines += ["", f"The model's error on this calibration: {result['model_error']:.1%}."]
    return "\n".join(lines)


def gallery_page(kind: str, path: Path, prediction: str = "") -> str:
    """A shipped file's page: its claim, the commands, the cost model's prediction where given (scenarios), and a
    measured result where docs/gallery/results has one."""
    data = yaml.safe_load(path.read_text())
    rel = path.relative_to(ROOT)
    result = RESULTS / f"{path.stem}.md"
    meta, body = _front_matter(result.read_text()) if result.exists() else ({}, "")
    lines = []
    if meta:
        lines += ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", ""]
    lines += [f"# {data.get('name', path.stem)}", "", f"*{kind}*: `{rel}`", ""]
    if data.get("description"):
        lines += [f"**{_cell(data['description'])}**", ""]
    if _header(path):
        lines += ["## The claim", "", _header(path), ""]
    lines += ["## Run it", "", "```sh"]
    if kind == "experiment":
        lines += [f".venv/bin/testbed plan {rel}      # predicted, no root, about a second",
                  f".venv/bin/testbed run {rel}       # measured, as root"]
    else:
        lines += [f".venv/bin/testbed whatif {rel}    # predicted at full scale, no root"]
    lines += ["```", ""]
    for claim in data.get("thresholds", []) or []:
        if claim.get("claim"):
            lines.append(f"- checked claim: {_cell(claim['claim'])}")
    for key in ("published", "assumed"):
        if data.get(key):
            lines += ["", f"**{key.capitalize()}**:", ""]
            values = data[key]
            items = values.items() if isinstance(values, dict) else enumerate(values)
            lines += [f"- {_cell(v) if isinstance(k, int) else f'`{k}`: {_cell(v)}'}" for k, v in items]
    if prediction and kind == "scenario":
        lines += ["", "## Predicted", "", "Computed by the cost model when this page was built "
                  "(`testbed whatif` gives the same):", "", prediction, "",
                  f"![predicted efficiency against distance and bandwidth](img/{path.stem}-whatif.png)"]
    elif prediction:
        lines += ["", "## Predicted", "", "Computed by the cost model when this page was built, without running "
                  "anything (`testbed plan` gives the same):", "", prediction]
    if body.strip():
        lines += ["", "## Measured", "", body.strip()]
        if meta:
            lines += ["", f"*Measured {meta.get('date', '')} on {meta.get('machine', '')}, "
                      f"code at {meta.get('commit', '')}.*"]
    elif kind == "experiment":
        lines += ["", "No measured result is kept for this page yet: run it and read its report."]
    lines += ["", f'??? note "{rel}"', "", "    ```yaml", *("    " + x for x in path.read_text().splitlines()),
              "    ```"]
    return "\n".join(lines) + "\n"


REPO_LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s]+)\)")


def changelog_page() -> str:
    """CHANGELOG.md as the site's changelog.md: its links are relative to the repository root (as GitHub shows the
    file), the site serves it from docs/, so a link to docs/X becomes X; a link elsewhere in the repository is left as
    written, and the strict build names it as the dead link it would be on the site."""
    text = (ROOT / "CHANGELOG.md").read_text()
    return REPO_LINK.sub(lambda m: "](" + (m.group(1)[len("docs/"):] if m.group(1).startswith("docs/")
                                            else m.group(1)) + ")", text)


# --- mkdocs hooks -----------------------------------------------------------------------------------------------

def pages(scratch: Path) -> dict[str, str | bytes]:
    """Every generated page (and picture): its path under docs/ and its content; `scratch` holds what the
    scenarios' predictions write."""
    out: dict[str, str | bytes] = {"reference/cli.md": cli_page(), "reference/formats.md": formats_page(),
           "reference/strategies.md": strategies_page(), "reference/environment.md": environment_page(),
           "changelog.md": changelog_page()}
    for kind, path in shipped():
        prediction = ""
        if kind == "scenario":
            prediction, plot = whatif_prediction(path, scratch / path.stem)
            out[f"gallery/img/{path.stem}-whatif.png"] = plot.read_bytes()
        else:
            prediction = plan_prediction(path)
        out[f"gallery/{path.stem}.md"] = gallery_page(kind, path, prediction)
    return out


def on_config(config: Any) -> Any:
    """The Gallery section of the nav lists every shipped experiment and scenario."""
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and "Gallery" in entry:
            entry["Gallery"] = [entry["Gallery"][0]] + [{path.stem: f"gallery/{path.stem}.md"}
                                                       for _, path in shipped()]
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    with tempfile.TemporaryDirectory(prefix="testbed-docs-") as scratch:
        for src, content in pages(Path(scratch)).items():
            files.append(File.generated(config, src, content=content))
    return files
