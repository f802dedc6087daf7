"""What a JSON parser's complaint means for a file written by hand.

Python's ``json`` says where it stopped and what it expected there: a comma after the
last item of an object reads ``Expecting property name enclosed in double quotes`` at
the line after it, and ``"deadline": 6h`` reads ``Expecting ',' delimiter``. People write
job files with the habits of YAML, Python and JavaScript; :func:`json_problem` adds
what to change for those habits, and where, to the parser's own words.
"""

from __future__ import annotations

import json
import re

__all__ = ["json_problem"]

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(r"[^\s,:{}\[\]\"]+")
_NUMBER_END = re.compile(r"[0-9.]+$")
_DATE_REST = re.compile(r"-[0-9]{2}-[0-9]{2}[-0-9A-Za-z:.+]*")
_PYTHON = {"True": "true", "False": "false", "None": "null"}
_YAML_BOOLEANS = frozenset({"yes", "no", "on", "off", "Yes", "No", "On", "Off"})
_YAML_KEY = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*:(\s|$)")
_YAML_START = re.compile(r"(---|%YAML)(\s|$)")
"""A YAML document's first line: its start marker, or a directive."""


def json_problem(err: json.JSONDecodeError) -> str:
    """``err``'s message and place (``Expecting value at line 3 column 9``), and, when
    the text at that place shows a common mistake, what to change, in parentheses."""
    said = f"{err.msg} at line {err.lineno} column {err.colno}"
    hint = _hint(err.doc, err.pos, err.msg)
    return f"{said} ({hint})" if hint else said


def _token(text: str) -> str:
    """The unquoted word ``text`` begins with, up to JSON's next punctuation or blank."""
    found = _TOKEN.match(text)
    return found.group() if found else text[:1]


def _line(doc: str, pos: int) -> int:
    return doc.count("\n", 0, pos) + 1


def _place(doc: str, pos: int) -> str:
    return f"line {_line(doc, pos)} column {pos - (doc.rfind(chr(10), 0, pos) + 1) + 1}"


def _hint(doc: str, pos: int, msg: str) -> str:
    """What to change for the mistake at ``doc[pos]``; "" when none is recognised."""
    rest = doc[pos:]
    before = doc[:pos].rstrip()
    if not doc.strip():
        return "the file is empty"
    if not before and (_YAML_KEY.match(rest) or _YAML_START.match(rest)):
        # at the start, after blank lines or indentation too: the error is then past them
        return 'this reads as YAML: a job file is JSON, {"key": value, ...}'
    if rest[:1] in ("}", "]") and before.endswith(","):
        return (
            f"a comma after the last item, at {_place(doc, len(before) - 1)}: JSON allows "
            "none there; remove it"
        )
    if rest.startswith(("#", "//", "/*")):
        return "JSON has no comments; remove it"
    if rest[:1] == "'":
        return "JSON takes double quotes around keys and strings, not single ones"
    word = _WORD.match(rest)
    if msg.startswith("Expecting property name") and word:
        return f'a key without quotes: JSON takes "{word.group()}", in double quotes'
    if msg == "Expecting value" and word:
        name, text = word.group(), _token(rest)
        if name in _PYTHON:
            return f"JSON writes {_PYTHON[name]}, not {name}"
        if name in _YAML_BOOLEANS:
            return f"JSON writes true or false, not {name}"
        return f'text without quotes: JSON takes "{text}", in double quotes'
    if msg == "Expecting value" and rest[:1] in (".", "+"):
        return "a JSON number begins with a digit or '-': 0.5, not .5; 1, not +1"
    number = _NUMBER_END.search(before)
    if msg == "Expecting ',' delimiter" and word and number and not rest.startswith("x"):
        text = number.group() + _token(rest)  # "deadline": 6h
        return f'a number with a unit is text in JSON: put it in double quotes, "{text}"'
    date = _DATE_REST.match(rest)
    if msg == "Expecting ',' delimiter" and number and len(number.group()) == 4 and date:
        text = number.group() + date.group()  # "deadline": 2030-06-01T18:00:00Z
        return f'a time is text in JSON: put it in double quotes, "{text}"'
    if msg == "Expecting ',' delimiter" and "\n" in doc[len(before) : pos]:
        return f"a comma missing at the end of line {_line(doc, len(before))}"
    if msg.startswith("Extra data"):
        return "more after the end of the first JSON value: several jobs go in one list, [...]"
    return ""
