"""The shapes every admin operation shares (:mod:`.admin`, :mod:`.capacity`): slots read
from JSON, a page of rows, names, references to other rows, what a hidden row answers,
what the default row refuses. One each, so that a rule is written once for all kinds."""

from __future__ import annotations

import re
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session as DBSession

from ..common.errors import Conflict, InvalidRequest
from ..common.slots import (
    MEM,
    ResourceSlot,
    is_known_slot,
    is_mig_slot,
    parse_decimal,
    parse_size,
    unknown_slot_words,
)
from . import access, responses, tenancy
from .access import Principal

NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$")
DEFAULT = tenancy.DEFAULT


def parse_slots(field: str, value: dict) -> ResourceSlot:
    """Slots from JSON: known slot names only (cpu, mem, cuda.device, cuda.mig-<profile>),
    non-negative exact amounts, ``mem`` with units, MIG instances whole."""
    out = ResourceSlot()
    for k, v in value.items():
        if not is_known_slot(k):
            raise InvalidRequest(f"{field}: {unknown_slot_words(k)}")
        if k == MEM:
            try:
                amount = parse_size(v)
            except InvalidRequest as e:
                raise InvalidRequest(f"{field}.{k}: {e.detail}") from None
        else:
            amount = parse_decimal(f"{field}.{k}", v)
        if amount < 0:
            raise InvalidRequest(f"{field}.{k} must not be negative")
        if amount >= Decimal(10) ** 18 or amount != amount.quantize(Decimal("0.001")):
            raise InvalidRequest(f"{field}.{k}: at most 18 digits and 3 decimal places")
        if is_mig_slot(k) and amount != amount.to_integral_value():
            raise InvalidRequest(f"{field}.{k} must be a whole number of MIG instances, not {v!r}")
        out[k] = amount
    return out


def page(db: DBSession, stmt, order, offset: int, limit: int,
          model: type[responses.Response]) -> dict:
    total = db.scalar(select(func.count()).select_from(stmt.order_by(None).subquery()))
    rows = db.scalars(stmt.order_by(*order).offset(offset).limit(limit)).unique().all()
    return {"items": model.bodies(rows), "total": total, "offset": offset, "limit": limit}


def check_name(field: str, value: str) -> None:
    if not NAME_RE.fullmatch(value):
        raise InvalidRequest(
            f"{field}: {value!r} is not a valid name (1-64 letters, digits, '.', '_', '-', "
            "starting with a letter or digit)"
        )


def need(db: DBSession, model, key, field: str, label: str):
    if key is None:
        return None
    if db.get(model, key) is None:
        raise InvalidRequest(f"{field}: no {label} {key!r}")
    return key


# The shapes every kind of object shares: one each, so that a rule (what a hidden row
# answers, what the default one refuses) is written once for all kinds.


def visible(db: DBSession, model, key, label: str, may_see):
    """The row ``key`` of ``model`` if ``may_see(row)``; a hidden row is as absent (404)."""
    row = db.get(model, key)
    if row is None or not may_see(row):
        raise access.not_found(label, key)
    return row


def in_usable_group(db: DBSession, p: Principal, group_of):
    """``may_see`` for rows that belong to a resource group (``group_of(row)``; None: to
    every group): the caller may use that group."""
    names = access.usable_group_names(db, p)
    return lambda row: names is None or group_of(row) is None or group_of(row) in names


def filtered(stmt, filters: dict, columns: dict):
    """``stmt`` narrowed to ``column == value`` for each filter given (filter -> column)."""
    for key, col in columns.items():
        if key in filters:
            stmt = stmt.where(col == filters[key])
    return stmt


def count(db: DBSession, column, value) -> int:
    """How many rows of ``column``'s table have ``value`` there."""
    return db.scalar(select(func.count()).select_from(column.class_).where(column == value))


def insert_named(db: DBSession, model, label: str, body: dict, fields):
    """A new ``model`` row named ``body["name"]`` with ``fields`` of ``body``; 409 if the
    name is taken."""
    if db.get(model, body["name"]) is not None:
        raise Conflict(f"{label} {body['name']!r} exists")
    row = model(name=body["name"])
    apply_fields(row, body, fields)
    db.add(row)
    db.flush()
    return row


def updated(db: DBSession, row, body: dict, fields, view: type[responses.Response]) -> dict:
    """``row`` with ``fields`` of ``body`` set, as ``view`` answers it."""
    apply_fields(row, body, fields)
    db.flush()
    return view.body(row)


def delete_unused(db: DBSession, row, label: str, uses=(), in_use: str = "") -> None:
    """Delete the named ``row`` unless it is the default one or a column in ``uses``
    still names it (409, ``in_use`` says so)."""
    if row.name == DEFAULT:
        raise Conflict(f"the default {label} cannot be deleted")
    if any(count(db, col, row.name) for col in uses):
        raise Conflict(in_use)
    db.delete(row)
    db.flush()


def apply_fields(obj, body: dict, fields, slot_fields=("total_resource_slots",)) -> None:
    for k in fields:
        if k in body:
            v = body[k]
            if k in slot_fields or k.endswith("_slots"):
                v = None if v is None else parse_slots(k, v)
            setattr(obj, k, v)
