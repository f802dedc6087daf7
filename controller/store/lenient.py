"""Column types whose stored values read back as their type, or as NULL.

SQLite keeps whatever an edit writes into any column: ``'abc'`` in a number column,
``'yesterday'`` in a time column. Read through the plain types, such a value comes back
as the text (and fails whatever uses it: a job list answered ``INTERNAL`` for every
tenant) or raises while the row is fetched (a time that does not parse fails every query
that loads the row). Read through these, a value that is not of the column's type reads
as ``None``, as text that is not JSON does in a JSON column (``lenient_json``); the
readers treat ``None`` where a value belongs as a bad row (:mod:`controller.admission.reads`
logs and shows it). What is written, and the DDL, are the plain types' own; PostgreSQL
enforces the types, so there the values always pass.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, Float, Integer
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

__all__ = ["LenientBigInteger", "LenientBoolean", "LenientFloat", "LenientInteger", "LenientTime"]


class _Lenient(TypeDecorator[Any]):
    """The plain type's read, with a value it cannot read, or that is not one of the
    column's Python types (``kinds``; a bool is no number), as None."""

    cache_ok = True
    kinds: tuple[type, ...] = ()
    """The Python types a value as read may have."""
    native: type | None = None
    """The type SQLite returns for a value of the column's own type, taken as it is."""

    @staticmethod
    def raw_accepts(value: Any) -> bool:
        """Whether a value as stored may be read at all."""
        return True

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], Any] | None:
        plain: TypeEngine[Any] = self.impl_instance.dialect_impl(dialect)
        inner = plain.result_processor(dialect, coltype)
        if dialect.name != "sqlite":  # the server enforces the column's type
            return inner
        kinds, raw_accepts, native = self.kinds, self.raw_accepts, self.native
        number = bool not in kinds

        def process(value: Any) -> Any:
            if type(value) is native:  # what SQLite returns for a value the daemon wrote
                return value
            if value is None or not raw_accepts(value):
                return None
            try:
                value = inner(value) if inner is not None else value
            except (ValueError, TypeError, OverflowError):
                return None
            if not isinstance(value, kinds) or (number and isinstance(value, bool)):
                return None
            return value

        return process


class LenientInteger(_Lenient):
    cache_ok, impl, native, kinds = True, Integer, int, (int,)


class LenientBigInteger(LenientInteger):
    cache_ok, impl = True, BigInteger


class LenientFloat(_Lenient):
    cache_ok, impl, native, kinds = True, Float, float, (int, float)


class LenientBoolean(_Lenient):
    """A flag: stored 0 or 1 (SQLite), else None (the plain read takes any text as True)."""

    cache_ok, impl, kinds = True, Boolean, (bool,)
    raw_accepts = staticmethod(lambda value: value in (0, 1) and not isinstance(value, float))


class LenientTime(_Lenient):
    """``DateTime(timezone=True)``, read leniently."""

    cache_ok, impl, kinds = True, DateTime(timezone=True), (datetime,)
