"""The one error a bad input file produces: file, field and problem on one line, in the project's words
(pydantic's errors translated, a suggestion for a name that is nearly right)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class SpecError(Exception):
    """A user file that cannot be used. str() is the single line the CLI prints."""

    def __init__(self, source: str | Path | None, field: str, problem: str) -> None:
        self.source = str(source) if source is not None else "<input>"
        self.field = field
        self.problem = problem
        where = f"{self.source}: {field}" if field else self.source
        super().__init__(f"{where}: {problem}")


# pattern -> the allowed form in words (named_pattern); a message never shows the pattern itself
_PATTERN_WORDS: dict[str, str] = {}


def named_pattern(pattern: str, words: str) -> str:
    """`pattern`, remembered with the allowed form in words for messages."""
    _PATTERN_WORDS[pattern] = words
    return pattern


def closest(name: object, known: Iterable[str]) -> str | None:
    """The one of `known` that `name` is nearly (difflib), or None."""
    if not isinstance(name, str):
        return None
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """' (did you mean X?)' when `name` is close to one of `known`, else ''."""
    close = closest(name, known)
    return f" (did you mean {close}?)" if close else ""


def written(value: Any) -> str:
    """A value as the user wrote it (no Python type names)."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (int, float)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    return "a value of another kind"


def _expected_choices(expected: str) -> list[str]:
    """pydantic's "'a', 'b' or 'c'" -> ['a', 'b', 'c']."""
    return [part.strip().strip("'") for part in expected.replace(" or ", ", ").split(",") if part.strip()]


def in_words(error: dict[str, Any], known_keys: Iterable[str] = ()) -> str:
    """One pydantic error (an entry of ValidationError.errors()) as our one-line problem."""
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    value = error.get("input")
    got = f", got {written(value)}"
    if kind in ("value_error", "assertion_error"):
        message = str(error.get("msg", ""))
        for prefix in ("Value error, ", "Assertion failed, "):
            message = message.removeprefix(prefix)
        return message
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        loc = error.get("loc") or ("",)
        return "unknown key" + did_you_mean(str(loc[-1]), known_keys)
    if kind in ("missing", "missing_keyword_argument"):
        loc = error.get("loc") or ("",)
        return "this item is missing" if isinstance(loc[-1], int) else "required key is missing"
    if kind == "literal_error":
        choices = _expected_choices(str(ctx.get("expected", "")))
        return f"expected {ctx.get('expected', 'one of the known names')}{got}" + did_you_mean(value, choices)
    if kind == "string_pattern_mismatch":
        words = _PATTERN_WORDS.get(str(ctx.get("pattern")), "a name of letters, digits, '_', '.' or '-'")
        return f"expected {words}{got}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"expected a whole number{got}"
    if kind in ("float_parsing", "float_type", "finite_number"):
        return f"expected a number{got}"
    if kind in ("bool_parsing", "bool_type"):
        return f"expected true or false{got}"
    if kind in ("string_type", "string_sub_type"):
        return f"expected text{got}"
    if kind in ("dict_type", "model_type", "model_attributes_type", "dataclass_type"):
        return f"expected a mapping of key: value{got}"
    if kind in ("list_type", "tuple_type", "sequence_str", "iterable_type"):
        return f"expected a list{got}"
    bounds = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "more than"),
              "less_than_equal": ("le", "at most"), "less_than": ("lt", "less than")}
    if kind in bounds:
        key, words = bounds[kind]
        return f"must be {words} {ctx.get(key)}{got}"
    if kind == "too_short":
        return f"give at least {ctx.get('min_length', 1)} (got {ctx.get('actual_length', 0)})"
    if kind == "too_long":
        return f"give at most {ctx.get('max_length')}"
    message = str(error.get("msg", "invalid"))
    return message.replace("Input should be", "expected").replace("input", "value")
