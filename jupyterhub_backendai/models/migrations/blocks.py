"""The building blocks of the migrations in ``versions/``.

A migration states only what is its own, as data: the tables it creates
(:class:`CreateTable`), the columns it adds (:class:`AddColumns`), and any rows it writes
(a plain function); :func:`migration` makes its ``upgrade`` and ``downgrade`` of them::

    upgrade, downgrade = migration(
        CreateTable("image_aliases", "alias  str256", "image  str512",
                    fk=["image images.name on delete cascade"], index="image"),
        AddColumns("images", "pull_policy  str16?", "owner_id  str32?"),
    )

The blocks run the alembic operations that autogenerate writes, in its order: a table's
indexes are made in a batch after the table and dropped, in reverse order, in a batch
before it; a table's new columns are added in one batch and dropped, in reverse order, in
one batch (on SQLite: one copy of the table). A downgrade undoes the steps in reverse
order. Constraints and indexes are named as the models' naming convention names them
(``models.base.NAMING``), as final names (``op.f``).

A column is written as a string, ``"<name> <type>[?] [default=<text>]"``:

- ``<type>``: ``str<N>`` (``String(length=N)``), ``text``, ``int``, ``bigint``,
  ``float``, ``bool``, ``json``, ``slots`` (:class:`SlotsType`) or ``time``
  (:class:`UTCDateTime` with a zone);
- ``?``: the column is nullable (else NOT NULL);
- ``default=<text>``: its server default, the text as written (``default=[]``).

Alembic loads every ``.py`` file in ``versions/`` as a revision, so this module lives
beside that folder, not in it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

from jupyterhub_backendai.models.base import SlotsType, UTCDateTime

TYPES: dict[str, Callable[[], sa.types.TypeEngine]] = {
    "text": sa.Text,
    "int": sa.Integer,
    "bigint": sa.BigInteger,
    "float": sa.Float,
    "bool": sa.Boolean,
    "json": sa.JSON,
    "slots": SlotsType,
    "time": lambda: UTCDateTime(timezone=True),
}
_COLUMN = re.compile(
    r"(?P<name>\w+)\s+(?P<type>\w+?)(?P<null>\?)?(?:\s+default=(?P<default>\S+))?")


def _type(word: str) -> sa.types.TypeEngine:
    if word.startswith("str") and word[3:].isdigit():
        return sa.String(length=int(word[3:]))
    return TYPES[word]()


def column(spec: str) -> sa.Column:
    """A new ``sa.Column`` as ``spec`` describes it (see the module's doc)."""
    m = _COLUMN.fullmatch(spec.strip())
    if m is None:
        raise ValueError(f"not a column: {spec!r}")
    return sa.Column(m["name"], _type(m["type"]), nullable=bool(m["null"]),
                     server_default=m["default"])


def _words(names: str | Sequence[str]) -> list[str]:
    return names.split() if isinstance(names, str) else list(names)


class CreateTable:
    """A table, its foreign keys, primary key, unique constraints and one-column indexes.

    ``pk``: the primary key's columns (default: the first column); ``fk``: one
    ``"<column> <table>.<column> [on delete <action>]"`` a foreign key, in the order they
    are declared; ``unique``: one ``"<column> ..."`` a unique constraint; ``index``: the
    columns each indexed alone. ``table``: the table, once the upgrade has made it.
    """

    def __init__(self, name: str, *columns: str, pk: str | None = None,
                 fk: Sequence[str] = (), unique: Sequence[str] = (), index: str = ""):
        self.name, self.columns, self.pk = name, columns, pk
        self.fk, self.unique, self.index = fk, unique, _words(index)
        self.table: sa.Table | None = None

    def _foreign_key(self, decl: str) -> sa.ForeignKeyConstraint:
        col, target, *action = decl.split()
        if action and [w.lower() for w in action[:2]] != ["on", "delete"]:
            raise ValueError(f"not a foreign key: {decl!r}")
        kw = {"ondelete": " ".join(action[2:]).upper()} if action else {}
        name = f"fk_{self.name}_{col}_{target.split('.')[0]}"
        return sa.ForeignKeyConstraint([col], [target], name=op.f(name), **kw)

    def _elements(self) -> list[sa.schema.SchemaItem]:
        cols = [column(spec) for spec in self.columns]
        pk = _words(self.pk) if self.pk else [cols[0].name]
        uniques = [_words(u) for u in self.unique]
        return [
            *cols,
            *(self._foreign_key(decl) for decl in self.fk),
            sa.PrimaryKeyConstraint(*pk, name=op.f(f"pk_{self.name}")),
            *(sa.UniqueConstraint(*u, name=op.f(f"uq_{self.name}_{u[0]}")) for u in uniques),
        ]

    def up(self) -> None:
        self.table = op.create_table(self.name, *self._elements())
        if self.index:
            with op.batch_alter_table(self.name, schema=None) as batch_op:
                for col in self.index:
                    batch_op.create_index(batch_op.f(f"ix_{self.name}_{col}"), [col],
                                          unique=False)

    def down(self) -> None:
        if self.index:
            with op.batch_alter_table(self.name, schema=None) as batch_op:
                for col in reversed(self.index):
                    batch_op.drop_index(batch_op.f(f"ix_{self.name}_{col}"))
        op.drop_table(self.name)


class AddColumns:
    """Columns added to an existing table."""

    def __init__(self, table: str, *columns: str):
        self.table, self.columns = table, columns

    def up(self) -> None:
        with op.batch_alter_table(self.table, schema=None) as batch_op:
            for spec in self.columns:
                batch_op.add_column(column(spec))

    def down(self) -> None:
        with op.batch_alter_table(self.table, schema=None) as batch_op:
            for spec in reversed(self.columns):
                batch_op.drop_column(column(spec).name)


Step = CreateTable | AddColumns | Callable[[], None]


def migration(*steps: Step) -> tuple[Callable[[], None], Callable[[], None]]:
    """``(upgrade, downgrade)`` of a migration made of ``steps``, done in order and undone
    in reverse order. A plain function is a step of the upgrade only (rows written, say):
    the downgrade passes it over."""

    def upgrade() -> None:
        for step in steps:
            step.up() if isinstance(step, CreateTable | AddColumns) else step()

    def downgrade() -> None:
        for step in reversed(steps):
            if isinstance(step, CreateTable | AddColumns):
                step.down()

    return upgrade, downgrade
