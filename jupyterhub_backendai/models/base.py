from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

from sqlalchemy import JSON, Column, DateTime, ForeignKey, MetaData, Table, TypeDecorator
from sqlalchemy.orm import DeclarativeBase

from ..common.slots import ResourceSlot

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def pair_table(name: str, *columns: tuple[str, str]) -> Table:
    """A table of pairs: each ``(column, "table.key")`` a foreign key whose rows go with
    the row they name, all of them the primary key."""
    return Table(name, Base.metadata, *(
        Column(col, ForeignKey(target, ondelete="CASCADE"), primary_key=True)
        for col, target in columns))


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value


class SlotsType(TypeDecorator):
    """A :class:`ResourceSlot` stored as JSON of decimal strings (exact on every backend)."""

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        return {k: str(Decimal(v)) for k, v in sorted(dict(value).items())}

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        if isinstance(value, str):
            value = json.loads(value)
        return ResourceSlot.from_json(value)
