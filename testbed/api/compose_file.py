"""A docker compose file for a topology (and the experiment its controller runs, or a probe), or for an
experiment alone (its own topology): the same testbed on a laptop, without root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.api.errors import UserError, user_errors


def compose(topology: Path, experiment: Path | None = None, *, output: Path | None = None, shaper: str = "auto",
            prefix: str) -> dict[str, Any]:
    """The compose file: text (YAML, headed by the command that makes it again), services and networks (their
    names); written to `output` when given. `topology` may be an experiment file (then it is the experiment,
    on its own topology); an experiment given beside a topology must run that topology."""
    from testbed.plan.compose import compose_document, render
    from testbed.plan.containers import build_containers_plan
    from testbed.spec.experiment import load_experiment
    from testbed.spec.topology import load_topology

    words = ["testbed", "compose", str(topology)] + ([str(experiment)] if experiment else [])
    topology_of_experiment = None
    with user_errors():
        if experiment is None and _is_experiment(topology):  # testbed compose EXPERIMENT: its own topology
            experiment = topology
            parsed, spec = load_experiment(experiment)
            if not isinstance(parsed.topology, dict):
                topology = topology_of_experiment = experiment.parent / parsed.topology
        else:
            spec = load_topology(topology)
        if experiment is not None and topology_of_experiment is None and topology != experiment:
            parsed, used = load_experiment(experiment)
            if used.model_dump() != spec.model_dump():
                raise UserError(f"{experiment}: topology: the experiment runs {used.name!r}, not {topology} "
                                f"({spec.name!r})")
            if not isinstance(parsed.topology, dict):
                topology_of_experiment = experiment.parent / parsed.topology
    try:
        plan = build_containers_plan(spec, shaper, prefix)
    except ValueError as error:
        raise UserError(f"{topology}: {error}") from None
    target = output or Path("compose") / "stdout.yml"
    document = compose_document(plan, target, topology, experiment, topology_of_experiment)
    text = render(document, " ".join(words + (["-o", str(output)] if output else [])))
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    return {"text": text, "services": list(document["services"]), "networks": list(document["networks"]),
            "file": output}


def _is_experiment(path: Path) -> bool:
    """Whether a YAML file is an experiment (it names strategies) rather than a topology."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return False  # the topology loader says what is wrong with it
    return isinstance(data, dict) and "strategies" in data
