from alembic import context
from sqlalchemy import pool

from jupyterhub_backendai.models import Base
from jupyterhub_backendai.models.db import VERSION_TABLE, make_engine

config = context.config
target_metadata = Base.metadata


#: How every run is configured: our metadata, our own version table, batch mode (SQLite).
OPTIONS = {"target_metadata": target_metadata, "version_table": VERSION_TABLE,
           "render_as_batch": True}


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True,
                      **OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection) -> None:
    context.configure(connection=connection, **OPTIONS)
    context.run_migrations()


def run_migrations_online() -> None:
    conn = config.attributes.get("connection")
    if conn is not None:
        _run_on(conn)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    with engine.begin() as connection:
        _run_on(connection)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
