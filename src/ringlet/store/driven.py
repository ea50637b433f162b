"""`Driven`: the calls the store makes on an `AsyncConnection`, served on PostgreSQL by the asyncpg
connection of a pooled connection (`Db.driver`), without SQLAlchemy's execution.

SQLAlchemy still writes every statement: `Driver` compiles a statement once for asyncpg (an INSERT or
UPDATE for the columns it is given: the parameters' keys that are not `b_`-prefixed, as in
`statements.py`), and converts its values with SQLAlchemy's own processors for their types, so a JSON value
is stored exactly as through SQLAlchemy. What it skips is SQLAlchemy's execution: its compiled-cache lookup,
its value and row processing, and a greenlet switch for each call into the driver, which cost two to three
times the CPU of the statement itself (`bench/driver.py`). So only the statements of a turn, which are made
once (`statements.py`), run here (`Db.hot`); a statement built for each call would be compiled each time.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.exc import IntegrityError

DIALECT = asyncpg_dialect()


class Driver:
    """A statement as asyncpg runs it: its SQL with `$n` placeholders, and how to make its values."""

    def __init__(self, statement: Any, keys: tuple[str, ...] = ()) -> None:
        columns = tuple(k for k in keys if not k.startswith("b_")) or None  # an INSERT's or UPDATE's
        compiled = statement.compile(dialect=DIALECT, column_keys=None if columns is None else list(columns))
        self.sql, self._compiled = compiled.string, compiled
        self.rows = not statement.is_dml or bool(compiled.effective_returning)
        """Whether it returns rows (a SELECT, a text statement, a RETURNING)."""
        self._names = tuple(compiled.positiontup or ())
        self._processors = tuple(compiled.binds[name].type.dialect_impl(DIALECT).bind_processor(DIALECT)
                                 for name in self._names)
        self._defaults = {c.key: c.default.arg for c in statement.table.c  # an INSERT's columns not given
                          if c.key not in (columns or ()) and c.default is not None and c.default.is_scalar} \
            if columns is not None and statement.is_insert else {}

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        """The statement's values in `$n` order: `params`, then the statement's own literals and defaults."""
        values = self._compiled.construct_params({**self._defaults, **params} if self._defaults else params)
        return [value if process is None else process(value)
                for value, process in zip((values[name] for name in self._names), self._processors, strict=True)]


@functools.lru_cache(maxsize=256)
def driver_of(statement: Any, keys: tuple[str, ...] = ()) -> Driver:
    """The `Driver` of a statement for parameters with these keys, made once while it is in use."""
    return Driver(statement, keys)


class Rows:
    """A result as the store reads it: rows by index (or `mappings()`), `first()`, `scalar()`, `rowcount`."""

    def __init__(self, rows: Sequence[Any], rowcount: int = -1) -> None:
        self._rows, self.rowcount = rows, rowcount

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def all(self) -> list[Any]:
        return list(self._rows)

    def first(self) -> Any:
        return self._rows[0] if self._rows else None

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        [row] = self._rows
        return row[0]

    def mappings(self) -> Rows:
        return Rows([dict(row.items()) for row in self._rows], self.rowcount)


class Driven:
    """`execute()` as the store calls it on an `AsyncConnection`, on an asyncpg connection: a list of
    parameters is an `executemany`; a unique or foreign key violated is SQLAlchemy's `IntegrityError`."""

    dialect = DIALECT

    def __init__(self, pg: Any) -> None:
        self.pg = pg

    async def execute(self, statement: Any, parameters: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
                      ) -> Rows:
        many = isinstance(parameters, list)
        first: Mapping[str, Any] = (parameters[0] if many else parameters) or {}  # type: ignore[index, assignment]
        driver = driver_of(statement, tuple(first) if statement.is_dml else ())
        try:
            if many:
                await self.pg.executemany(driver.sql, [driver.args(p) for p in parameters])  # type: ignore[union-attr]
                return Rows([], len(parameters))  # type: ignore[arg-type]
            if driver.rows:
                return Rows(await self.pg.fetch(driver.sql, *driver.args(first)))
            status: str = await self.pg.execute(driver.sql, *driver.args(first))
        except _integrity_violation() as exc:
            raise IntegrityError(driver.sql, None, exc) from exc
        return Rows([], int(status.rsplit(" ", 1)[-1]))


def _integrity_violation() -> type[Exception]:
    from asyncpg import IntegrityConstraintViolationError  # only ever on PostgreSQL (`ringlet[postgres]`)

    return IntegrityConstraintViolationError
