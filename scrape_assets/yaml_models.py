"""Parse a YAML document into a pydantic model, turning every problem into one clear SpecError.

Shared by site specs (:mod:`scrape_assets.spec`) and fault specs (:mod:`scrape_assets.faults`):
the error names the source file, the dotted key and what was expected.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from scrape_assets.errors import SpecError, UnreadableFileError

Model = TypeVar("Model", bound=BaseModel)
#: libyaml's safe loader when PyYAML was built with it (the wheels are), ~13x faster than
#: ``yaml.SafeLoader`` (a 100-category spec: 13 -> 1 ms; specs are loaded several times per
#: run, by the definitions and by each step's resources). The same data for any spec either
#: accepts; their errors name the same line and column in other words, and a few documents
#: outside YAML 1.1's rules (a tab after ``key:``) are accepted by one only.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """The safe loader, refusing a key given twice in one mapping.

    PyYAML keeps the last of two equal keys without a word (YAML 1.2 says keys must be
    unique): a second ``travel:`` in ``categories`` would silently point the partition at
    another page, a second ``politeness:`` replace the first. The error names the key and
    both lines.
    """

    def construct_document(self, node):
        # Checked on the composed document, before construction: merging (<<) rewrites a
        # mapping's node in place, and an alias constructs the same node again.
        seen: set[int] = set()
        stack = [node]
        while stack:
            current = stack.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            if isinstance(current, yaml.MappingNode):
                first_line: dict = {}
                for key_node, value_node in current.value:
                    stack += [key_node, value_node]
                    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node)  # the value: 0x1 is 1, yes is True
                    try:
                        hash(key)
                    except TypeError:
                        continue
                    if key in first_line:
                        raise yaml.constructor.ConstructorError(
                            "while reading a mapping", current.start_mark,
                            f"found the key {key!r} a second time (first on line {first_line[key] + 1})",
                            key_node.start_mark)
                    first_line[key] = key_node.start_mark.line
            elif isinstance(current, yaml.SequenceNode):
                stack += current.value
        return super().construct_document(node)
#: Given the first pydantic error, return ``(key, detail)`` to override the defaults, or None.
Explain = Callable[[dict, str | None], "tuple[str | None, str] | None"]


#: Problems listed after the first in one error message (the rest are counted).
MAX_MORE = 5


def parse_yaml_model(
    text: str,
    source: str,
    model: type[Model],
    *,
    expected_top: str = "a mapping at the top level",
    unknown_key_hint: str = "",
    empty_is_mapping: bool = False,
    location: Callable[[tuple], str] | None = None,
    explain: Explain | None = None,
) -> Model:
    """Parse ``text`` (YAML, or JSON which is YAML too) and validate it as ``model``.

    Args:
        source: file path or name used in error messages.
        expected_top: what the top level should be, for the message when it is not a mapping.
        unknown_key_hint: appended to "unknown key" (e.g. where the valid keys are listed).
        empty_is_mapping: treat an empty document as ``{}``.
        location: formats a pydantic error location as a dotted key (default: join with ``.``).
        explain: special cases for any error, see :data:`Explain`.

    Raises:
        SpecError: malformed document, or a key missing, unknown or of the wrong value: the
            first problem (a misspelt key first), then up to :data:`MAX_MORE` others.
    """
    # Besides YAMLError: libyaml encodes the text (UnicodeEncodeError: a lone surrogate), and
    # PyYAML raises ValueError for a value its resolver took for a date or a number
    # ({2001-13-01: a}, {!!int abc: a}).
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader
    except (yaml.YAMLError, UnicodeEncodeError, ValueError) as exc:
        raise SpecError(source, None, f"not valid YAML: {exc}") from exc
    if data is None and empty_is_mapping:
        data = {}
    if not isinstance(data, dict):
        got = "an empty document (or null)" if data is None else type(data).__name__
        raise SpecError(source, None, f"expected {expected_top}, got {got}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        where = location or (lambda loc: ".".join(str(p) for p in loc))

        def describe(error, hint: bool = True) -> tuple[str | None, str]:
            key = where(error["loc"]) or None
            special = explain(error, key) if explain is not None else None
            if special is not None:
                return special
            if error["type"] == "missing":
                return key, "required key is missing"
            if error["type"] == "extra_forbidden":
                return key, "unknown key" + (f" ({unknown_key_hint})" if unknown_key_hint and hint else "")
            detail = error["msg"].removeprefix("Value error, ")
            if not isinstance(error["input"], (dict, list)) and ", got " not in detail:  # (a validator's own says it)
                detail += f" (got {_as_typed(error['input'])})"
            if isinstance(error["input"], (bool, int, float)) and (
                    "[key]" in error["loc"] or error["msg"].startswith("Keys should be strings")):
                detail += ("; YAML reads an unquoted key such as no, yes, on or off as a boolean and 0755 as a "
                           "number: quote it, e.g. 'no':")
            return key, detail

        # A misspelt key shows up as "unknown key" plus "required key missing": name the misspelling
        # first; the others follow (up to MAX_MORE), so every typo is fixed in one go.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        key, detail = describe(first)
        others = [describe(e, hint=False) for e in errors if e is not first]  # the hint said once
        more = ""
        if others:
            listed = "; ".join(f"{k}: {d}" if k else d for k, d in others[:MAX_MORE])
            more = f" (also {listed}" + (f"; and {len(others) - MAX_MORE} more" if len(others) > MAX_MORE else "") + ")"
        raise SpecError(source, key, detail + more) from exc


def read_text_file(path: Path, what: str) -> str:
    """The text of a YAML/JSON file a user wrote (UTF-8).

    Args:
        what: the file's role for the message, e.g. ``"spec file"``.

    Raises:
        UnreadableFileError: a :class:`SpecError` naming ``path``: it cannot be read (``cannot read <what>: <reason>``, with
            the absolute path when ``path`` is relative), or
            it is not UTF-8 (the first bad byte and its offset).
    """
    try:
        return path.read_text("utf-8")
    except OSError as exc:
        # A relative path is read from the current folder: name it, the user may expect another.
        where = "" if path.is_absolute() else f" {path.absolute()}"
        raise UnreadableFileError(str(path), None, f"cannot read {what}{where}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise UnreadableFileError(str(path), None, f"expected UTF-8 text, found byte {exc.object[exc.start]:#04x} at offset "
                                         f"{exc.start}") from exc


def _as_typed(value: object) -> str:
    """``value`` quoted as a YAML author typed it: a regex ``_\\d+`` shows as ``'_\\d+'``, not
    Python's ``'_\\\\d+'``; a string with a quote or a character that does not print (a tab,
    a control character) keeps Python's escapes, so it stays unambiguous."""
    if isinstance(value, str) and value.isprintable() and "'" not in value:
        return f"'{value}'"
    return repr(value)

