"""Read a YAML file into a pydantic model, turning every failure into one SpecError line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from testbed.spec.errors import SpecError

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


def _problem(error: dict[str, Any]) -> str:
    message = str(error.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    if error.get("type") == "extra_forbidden":
        message = "unknown key"
    elif error.get("type") == "missing":
        message = "required key is missing"
    return message


# Model-level checks name their field themselves as "field: problem" (brackets may hold spaces: links[a, b]).
_NAMED = re.compile(r"^((?:[A-Za-z_]|\[[^\]]*\])(?:[^\s:\[]|\[[^\]]*\])*): (.*)$")


def _from_validation_error(source: str | Path | None, error: ValidationError) -> SpecError:
    first = error.errors()[0]
    loc = tuple(part for part in first.get("loc", ()) if part != "__root__")
    problem = _problem(first)
    named = _NAMED.match(problem)
    if named and first.get("type") == "value_error":
        inner, problem = named.groups()
        path = field_path(loc)
        return SpecError(source, f"{path}.{inner}" if path else inner, problem)
    return SpecError(source, field_path(loc), problem)


def validate_data(model: type[Model], data: Any, source: str | Path | None = None) -> Model:
    """Validate already-parsed data; raises SpecError."""
    if not isinstance(data, dict):
        raise SpecError(source, "", f"expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise _from_validation_error(source, error) from None


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
