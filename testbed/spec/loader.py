"""Read a YAML file into a pydantic model, turning every failure into one SpecError line (and saying once on
stderr what is legal but unusual)."""

from __future__ import annotations

import re
import sys
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from testbed.spec.errors import SpecError, closest, in_words, written

Model = TypeVar("Model", bound=BaseModel)


def field_path(loc: tuple[Any, ...]) -> str:
    """('links', 0, 'latency') -> 'links[0].latency'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (list[LinkSpec], ReverseOverrides | None, ...), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the mapping at loc[:-1] takes (for did-you-mean on an unknown key at loc)."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part)) if current is not None else None
        current = _model_in(field.annotation) if field is not None else None
    return list(current.model_fields) if current is not None else []


# what each top level holds, for a file that holds something else (or nothing)
WHAT = {"Topology": "a topology with name, dcs and links (e.g. dcs: [{name: east, nodes: 2}])",
        "Experiment": "an experiment with name, topology and strategies (e.g. strategies: [flat-dp])",
        "Scenario": "a what-if scenario with name, model, gpu, intra, reference, sweep and strategies",
        "Inventory": "an inventory with its hosts"}


# Model-level checks name their field themselves as "field: problem" (brackets may hold spaces: links[a, b]).
_NAMED = re.compile(r"^((?:[A-Za-z_]|\[[^\]]*\])(?:[^\s:\[]|\[[^\]]*\])*): (.*)$")


def _from_validation_error(model: type[BaseModel], source: str | Path | None, error: ValidationError) -> SpecError:
    errors = error.errors()
    first = errors[0]
    if first.get("type") == "missing":  # a key spelt otherwise: name the misspelling, with the key meant
        parent, name = tuple(first.get("loc", ()))[:-1], str(tuple(first.get("loc", ("",)))[-1])
        first = next((e for e in errors if e.get("type") == "extra_forbidden" and tuple(e["loc"])[:-1] == parent
                      and closest(str(e["loc"][-1]), [name]) == name), first)
    loc = tuple(part for part in first.get("loc", ()) if part != "__root__")
    problem = in_words(first, known_keys(model, loc))
    named = _NAMED.match(problem)
    if named and first.get("type") == "value_error":
        inner, problem = named.groups()
        path = field_path(loc)
        joined = f"{path}{inner}" if inner.startswith("[") else f"{path}.{inner}"
        return SpecError(source, joined if path else inner, problem)
    return SpecError(source, field_path(loc), problem)


_said: set[str] = set()


def say_unusual(source: str | Path | None, field: str, message: str) -> None:
    """'warning: file: field: message' on stderr, once per process."""
    line = f"warning: {source if source is not None else '<input>'}: {field}: {message}"
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr)


def validate_data(model: type[Model], data: Any, source: str | Path | None = None, *, si: bool = False) -> Model:
    """Validate already-parsed data; raises SpecError. si=True: data testbed wrote itself (a model_dump), whose
    bare numbers are SI base units; otherwise every quantity must carry its unit, and what is legal but unusual
    (the model's unusual(): (field, why) pairs) is said on stderr."""
    what = WHAT.get(model.__name__, "a mapping of key: value")
    if data is None:
        raise SpecError(source, "", f"the file is empty; expected {what}")
    if not isinstance(data, dict):
        raise SpecError(source, "", f"expected {what} at the top level, got {written(data)}")
    try:
        result = model.model_validate(data, context={"si": si})
    except ValidationError as error:
        raise _from_validation_error(model, source, error) from None
    unusual = getattr(result, "unusual", None)
    if not si and unusual is not None:
        for field, message in unusual():
            say_unusual(source, field, message)
    return result


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file; raises SpecError naming the line of a syntax error."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise SpecError(path, "", f"cannot read file ({error.strerror or error})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "syntax"
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise SpecError(path, where, f"invalid YAML: {problem}") from None


def load_model(model: type[Model], path: str | Path) -> Model:
    """Load and validate one YAML file as `model`; raises SpecError."""
    return validate_data(model, load_yaml(path), path)
