"""Fixtures: a record (tenancy, policies, resource groups) loaded from a JSON document.

Backend.AI bootstraps installations and demos from fixture files; we do the same so
that a demo's record (the Binder image's users, their resource policy) is data in the
repository, created offline when an image is built, and so that loading it twice is
harmless. A document is a JSON object with any of these lists, created in this order
(later kinds may refer to earlier ones, in the document or already in the record)::

    {
      "domains":                     [{"name": "demo", "description": "..."}],
      "keypair_resource_policies":   [{"name": "demo", "total_resource_slots": {"cpu": 1}}],
      "user_resource_policies":      [{"name": "..."}],
      "project_resource_policies":   [{"name": "..."}],
      "projects":  [{"name": "demo-project", "domain": "demo"}],
      "users":     [{"email": "alice@demo.example", "password": "...", "domain": "demo",
                     "projects": ["demo-project"], "keypair_resource_policy": "demo"}],
      "keypairs":  [{"user": "alice@demo.example", "access_key": "AKIA...",
                     "secret_key": "...", "resource_policy": "demo"}],
      "resource_groups": [{"name": "gpu", "allowed_domains": ["demo"]}],
      "vfolders": [{"name": "shared", "project": "demo-project", "domain": "demo",
                    "permission": "rw", "files": {"README.md": "# Shared notes\n"}},
                   {"name": "alice-data", "owner": "alice@demo.example",
                    "shares": [{"email": "bob@demo.example", "permission": "ro"}]}]
    }

Each entry is created, or left exactly as it is when a row with the same key exists
(domain/policy/resource-group name, (domain, project name), user email, access key):
loading never overwrites what an operator changed since. Passwords are given in
plain text and hashed as every other password is (``tenancy.create_user``); every
user gets a default keypair with the named keypair resource policy.

A vfolder belongs to a user (``owner``: an email) or to a project (``project``: its
name in ``domain``, default ``default``); ``host`` defaults to the storage's default
host (``local:volume1``), ``permission`` (project folders only) to ``rw``. It is
created on the storage that :func:`populate` is given (the CLI builds it from the
hub's ``BackendAIManager.storage_volumes``; see ``backendai-admin fixture populate
--help``), with its ``files`` (relative path -> text) and its ``shares`` (users of
the owner's domain). Count and size limits of the resource policies are not
applied to fixtures; an existing folder (same owner or project, same name) is left
as it is, files included.

Everything is validated, and an error names the entry (``users[1]
(bob@demo.example): ...``). :func:`populate_file` loads a file in one transaction, so
a bad document leaves nothing behind; the folders it made on the storage are removed
again when the transaction does not commit.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session as DBSession

from ..common.errors import BackendAIError, InvalidRequest
from ..common.slots import MEM, ResourceSlot, parse_decimal, parse_size
from ..common.types import UserRole, VFolderOwnership, VFolderPermission, VFolderStatus
from ..models import (
    Domain,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ProjectResourcePolicy,
    ResourceGroup,
    UserResourcePolicy,
    VFolder,
    VFolderPermissionRow,
)
from . import tenancy, vfolders

SLOT_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$")
ACCESS_KEY_RE = re.compile(r"^[A-Za-z0-9]{4,20}$")
SECRET_KEY_RE = re.compile(r"^[A-Za-z0-9_\-+/=]{8,40}$")
DEFAULT_FOR_UNSPECIFIED = ("UNLIMITED", "LIMITED")


class FixtureError(InvalidRequest):
    """A fixture document that cannot be loaded; the message names the bad entry."""


# -- field checks ---------------------------------------------------------------------
# Each returns the value to store or raises ValueError with what is wrong.


def _str(max_len: int, pattern: re.Pattern | None = None, allow_empty: bool = True):
    def check(v):
        if not isinstance(v, str):
            raise ValueError(f"must be a string, not {v!r}")
        if not v and not allow_empty:
            raise ValueError("must not be empty")
        if len(v) > max_len:
            raise ValueError(f"is longer than {max_len} characters")
        if pattern is not None and not pattern.match(v):
            raise ValueError(f"{v!r} is not valid")
        return v

    return check


def _name(v):
    if not isinstance(v, str) or not tenancy.USERNAME_RE.match(v):
        raise ValueError(
            f"{v!r} is not a valid name (lowercase letters, digits, '.', '_', '-'; at most 64)"
        )
    return v


def _bool(v):
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, not {v!r}")
    return v


def _int(lo: int, hi: int | None = None):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int | Decimal) or v != int(v):
            raise ValueError(f"must be an integer, not {v!r}")
        v = int(v)
        if v < lo or (hi is not None and v > hi):
            raise ValueError(f"must be between {lo} and {hi}" if hi is not None else f"must be >= {lo}")
        return v

    return check


def _optional(check):
    def wrapped(v):
        return None if v is None else check(v)

    return wrapped


def _slots(v) -> ResourceSlot:
    """``{"cpu": 1, "mem": "2g", "cuda.device": 1}``: exact amounts, ``mem`` may have a unit."""
    if not isinstance(v, Mapping):
        raise ValueError(f"must be an object of slot amounts, not {v!r}")
    out = ResourceSlot()
    for k, amount in v.items():
        if not isinstance(k, str) or not SLOT_NAME_RE.match(k):
            raise ValueError(f"slot name {k!r} is not valid")
        if isinstance(amount, float):  # from a dict built in Python; files use Decimal
            amount = repr(amount)
        try:
            d = parse_size(amount) if k == MEM else parse_decimal(k, amount)
        except InvalidRequest as e:
            raise ValueError(f"slot {k!r}: {e.detail}") from None
        if d < 0:
            raise ValueError(f"slot {k!r} must not be negative, not {amount!r}")
        out[k] = d
    return out


def _list_of(check):
    def wrapped(v):
        if not isinstance(v, list):
            raise ValueError(f"must be a list, not {v!r}")
        return [check(x) for x in v]

    return wrapped


def _object(v):
    if not isinstance(v, Mapping):
        raise ValueError(f"must be an object, not {v!r}")
    return dict(v)


def _one_of(*choices: str):
    def check(v):
        if v not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, not {v!r}")
        return v

    return check


def _files(v):
    """``{"relative/path": "text"}``: paths inside the folder, text contents."""
    if not isinstance(v, Mapping):
        raise ValueError(f"must be an object of path: text, not {v!r}")
    out = {}
    for path, text in v.items():
        try:
            norm = vfolders.check_path(path, allow_root=False)
        except InvalidRequest as e:
            raise ValueError(e.detail) from None
        if not isinstance(text, str):
            raise ValueError(f"{path!r}: the content must be a string")
        out[norm] = text
    return out


_PERMISSION = _one_of(*VFolderPermission)


def _shares(v):
    if not isinstance(v, list):
        raise ValueError(f"must be a list, not {v!r}")
    out = []
    for i, sh in enumerate(v):
        if not isinstance(sh, Mapping) or set(sh) - {"email", "permission"} or "email" not in sh:
            raise ValueError(f"[{i}] must be {{\"email\", \"permission\"?}}, not {sh!r}")
        out.append({"email": _str(128, allow_empty=False)(sh["email"]),
                    "permission": _PERMISSION(sh.get("permission", VFolderPermission.READ_ONLY))})
    return out


def _vfolder_name(v):
    try:
        return vfolders.check_name(v)
    except InvalidRequest as e:
        raise ValueError(e.detail) from None


@dataclass(frozen=True)
class _Kind:
    """One list of a fixture document: its fields (check, required) and its key."""

    fields: dict[str, tuple[Callable[[Any], Any], bool]]
    describe: Callable[[dict], str]


_POLICY_COMMON = {"name": (_name, True)}
KINDS: dict[str, _Kind] = {
    "domains": _Kind(
        {
            "name": (_name, True),
            "description": (_str(512), False),
            "is_active": (_bool, False),
            "total_resource_slots": (_slots, False),
            "allowed_vfolder_hosts": (_object, False),
            "allowed_docker_registries": (_list_of(_str(256)), False),
        },
        lambda e: str(e.get("name")),
    ),
    "keypair_resource_policies": _Kind(
        {
            **_POLICY_COMMON,
            "total_resource_slots": (_slots, False),
            "default_for_unspecified": (_one_of(*DEFAULT_FOR_UNSPECIFIED), False),
            "max_concurrent_sessions": (_int(0), False),
            "max_containers_per_session": (_int(1), False),
            "max_session_lifetime": (_int(0), False),
            "idle_timeout": (_int(0), False),
            "max_lifetime_extension": (_int(0), False),
            "max_priority": (_int(0, 100), False),
            "max_pending_session_count": (_optional(_int(0)), False),
            "max_pending_session_resource_slots": (_optional(_slots), False),
            "allowed_vfolder_hosts": (_object, False),
            "max_pids_per_kernel": (_optional(_int(32)), False),
            "max_tmp_size": (_optional(_int(1 << 20)), False),
        },
        lambda e: str(e.get("name")),
    ),
    "user_resource_policies": _Kind(
        {
            **_POLICY_COMMON,
            "max_vfolder_count": (_int(0), False),
            "max_quota_scope_size": (_int(0), False),
        },
        lambda e: str(e.get("name")),
    ),
    "project_resource_policies": _Kind(
        {
            **_POLICY_COMMON,
            "max_vfolder_count": (_int(0), False),
            "max_quota_scope_size": (_int(0), False),
        },
        lambda e: str(e.get("name")),
    ),
    "projects": _Kind(
        {
            "name": (_name, True),
            "domain": (_name, False),
            "description": (_str(512), False),
            "is_active": (_bool, False),
            "total_resource_slots": (_slots, False),
            "allowed_vfolder_hosts": (_object, False),
            "resource_policy": (_optional(_name), False),
        },
        lambda e: f"{e.get('domain', tenancy.DEFAULT)}/{e.get('name')}",
    ),
    "users": _Kind(
        {
            "email": (_str(128), True),
            "password": (_str(128), True),
            "username": (_optional(_str(64)), False),
            "full_name": (_str(128), False),
            "role": (_str(16), False),
            "status": (_str(32), False),
            "domain": (_name, False),
            "projects": (_list_of(_name), False),
            "resource_policy": (_name, False),
            "keypair_resource_policy": (_name, False),
            "need_password_change": (_bool, False),
        },
        lambda e: str(e.get("email")),
    ),
    "keypairs": _Kind(
        {
            "user": (_str(128, allow_empty=False), True),
            "access_key": (_str(20, ACCESS_KEY_RE), True),
            "secret_key": (_str(40, SECRET_KEY_RE), True),
            "is_active": (_bool, False),
            "is_admin": (_bool, False),
            "is_default": (_bool, False),
            "rate_limit": (_int(0), False),
            "resource_policy": (_name, False),
        },
        lambda e: str(e.get("access_key")),
    ),
    "resource_groups": _Kind(
        {
            "name": (_name, True),
            "description": (_str(512), False),
            "is_active": (_bool, False),
            "is_public": (_bool, False),
            "scheduler": (_str(32, allow_empty=False), False),
            "scheduler_opts": (_object, False),
            "allowed_domains": (_list_of(_name), False),
            "allowed_projects": (_list_of(_str(64)), False),
            "allowed_keypairs": (_list_of(_str(20)), False),
        },
        lambda e: str(e.get("name")),
    ),
    "vfolders": _Kind(
        {
            "name": (_vfolder_name, True),
            "owner": (_str(128, allow_empty=False), False),
            "project": (_name, False),
            "domain": (_name, False),
            "host": (_str(128, allow_empty=False), False),
            "permission": (_PERMISSION, False),
            "usage_mode": (_one_of(*vfolders.USAGE_MODES), False),
            "shares": (_shares, False),
            "files": (_files, False),
        },
        lambda e: (f"{e.get('owner')}/{e.get('name')}" if e.get("owner") is not None else
                   f"{e.get('domain', tenancy.DEFAULT)}/{e.get('project')}/{e.get('name')}"),
    ),
}


def _validated(kind: str, idx: int, entry) -> tuple[str, dict]:
    """Check one entry's fields; returns (its label for messages, the checked values)."""
    spec = KINDS[kind]
    if not isinstance(entry, Mapping):
        raise FixtureError(f"fixture: {kind}[{idx}] must be an object, not {entry!r}")
    label = f"{kind}[{idx}] ({spec.describe(entry)})"
    unknown = sorted(set(entry) - set(spec.fields))
    if unknown:
        raise FixtureError(
            f"fixture: {label}: unknown field(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(spec.fields)}"
        )
    out = {}
    for field, (check, required) in spec.fields.items():
        if field not in entry:
            if required:
                raise FixtureError(f"fixture: {label}: {field!r} is required")
            continue
        try:
            out[field] = check(entry[field])
        except ValueError as e:
            raise FixtureError(f"fixture: {label}: {field} {e}") from None
    return label, out


# -- creation -------------------------------------------------------------------------


class _Loader:
    def __init__(self, db: DBSession):
        self.db = db
        self.created: dict[str, list[str]] = {k: [] for k in KINDS}
        self.existing: dict[str, list[str]] = {k: [] for k in KINDS}
        # Folders whose rows were made: their directories and files come after.
        self.folders: list[dict] = []

    def _need(self, label: str, model, key, what: str):
        row = self.db.get(model, key)
        if row is None:
            raise FixtureError(f"fixture: {label}: no {what} {key!r}")
        return row

    def _done(self, kind: str, key: str, created: bool) -> None:
        (self.created if created else self.existing)[kind].append(key)

    def simple(self, kind: str, model, label: str, v: dict) -> None:
        """Domains, policies: rows keyed by their name, fields as given."""
        if self.db.get(model, v["name"]) is not None:
            self._done(kind, v["name"], False)
            return
        self.db.add(model(**v))
        self.db.flush()
        self._done(kind, v["name"], True)

    def project(self, label: str, v: dict) -> None:
        domain = v.pop("domain", tenancy.DEFAULT)
        key = f"{domain}/{v['name']}"
        self._need(label, Domain, domain, "domain")
        if v.get("resource_policy") is not None:
            self._need(label, ProjectResourcePolicy, v["resource_policy"], "project resource policy")
        found = self.db.scalar(
            select(Project).where(Project.domain_name == domain, Project.name == v["name"])
        )
        if found is not None:
            self._done("projects", key, False)
            return
        p = tenancy.create_project(self.db, domain, v.pop("name"))
        for field, value in v.items():
            setattr(p, field, value)
        self.db.flush()
        self._done("projects", key, True)

    def user(self, label: str, v: dict) -> None:
        if tenancy.find_user(self.db, v["email"]) is not None:
            self._done("users", v["email"], False)
            return
        kp_policy = v.get("keypair_resource_policy", tenancy.DEFAULT)
        user_policy = v.get("resource_policy", tenancy.DEFAULT)
        self._need(label, KeypairResourcePolicy, kp_policy, "keypair resource policy")
        self._need(label, UserResourcePolicy, user_policy, "user resource policy")
        domain = v.get("domain", tenancy.DEFAULT)
        projects = v.get("projects")
        self._need(label, Domain, domain, "domain")
        for name in projects if projects is not None else [tenancy.DEFAULT]:
            if self.db.scalar(
                select(Project.id).where(Project.domain_name == domain, Project.name == name)
            ) is None:
                raise FixtureError(f"fixture: {label}: no project {name!r} in domain {domain!r}")
        try:
            user, kp, _secret = tenancy.create_user(
                self.db,
                email=v["email"],
                password=v["password"],
                username=v.get("username"),
                role=v.get("role", UserRole.USER),
                domain=domain,
                status=v.get("status", "active"),
                projects=projects,
            )
        except BackendAIError as e:
            raise FixtureError(f"fixture: {label}: {e.detail}") from None
        user.resource_policy = user_policy
        user.full_name = v.get("full_name", "")
        user.need_password_change = v.get("need_password_change", False)
        kp.resource_policy = kp_policy
        self.db.flush()
        self._done("users", v["email"], True)

    def keypair(self, label: str, v: dict) -> None:
        user = tenancy.find_user(self.db, v["user"])
        if user is None:
            raise FixtureError(f"fixture: {label}: no user {v['user']!r}")
        found = self.db.get(Keypair, v["access_key"])
        if found is not None:
            if found.user_id != user.id:
                raise FixtureError(
                    f"fixture: {label}: access key {v['access_key']!r} belongs to another user"
                )
            self._done("keypairs", v["access_key"], False)
            return
        policy = v.get("resource_policy", tenancy.DEFAULT)
        self._need(label, KeypairResourcePolicy, policy, "keypair resource policy")
        if v.get("is_default"):
            for other in user.keypairs:
                other.is_default = False
        kp = Keypair(
            access_key=v["access_key"],
            secret_key=v["secret_key"],
            user=user,
            is_active=v.get("is_active", True),
            is_admin=v.get("is_admin", user.role in (UserRole.SUPERADMIN, UserRole.ADMIN)),
            is_default=v.get("is_default", False),
            resource_policy=policy,
        )
        if "rate_limit" in v:
            kp.rate_limit = v["rate_limit"]
        self.db.add(kp)
        self.db.flush()
        self._done("keypairs", v["access_key"], True)

    def vfolder(self, label: str, v: dict, default_host: str, known_hosts: list[str]) -> None:
        if ("owner" in v) == ("project" in v):
            raise FixtureError(f"fixture: {label}: give either 'owner' (an email) or 'project'")
        host = v.get("host", default_host)
        if host not in known_hosts:
            raise FixtureError(f"fixture: {label}: unknown vfolder host {host!r} "
                               f"(the storage has: {', '.join(known_hosts) or 'none'})")
        if "owner" in v:
            for k in ("domain", "permission"):
                if k in v:
                    raise FixtureError(f"fixture: {label}: {k!r} is for project folders")
            owner = tenancy.find_user(self.db, v["owner"])
            if owner is None:
                raise FixtureError(f"fixture: {label}: no user {v['owner']!r}")
            scope, domain, project = vfolders.quota_scope_of_user(owner.id), owner.domain_name, None
        else:
            if v.get("shares"):
                raise FixtureError(f"fixture: {label}: project folders are shared through "
                                   "project membership, not 'shares'")
            domain = v.get("domain", tenancy.DEFAULT)
            project = self.db.scalar(select(Project).where(Project.domain_name == domain,
                                                           Project.name == v["project"]))
            if project is None:
                raise FixtureError(f"fixture: {label}: no project {v['project']!r} in domain "
                                   f"{domain!r}")
            owner, scope = None, vfolders.quota_scope_of_project(project.id)
        key = f"{scope}/{v['name']}"
        if self.db.scalar(select(VFolder.id).where(VFolder.quota_scope_id == scope,
                                                   VFolder.name == v["name"])):
            self._done("vfolders", key, False)
            return
        f = VFolder(
            name=v["name"], host=host, quota_scope_id=scope,
            ownership_type=VFolderOwnership.USER if owner else VFolderOwnership.PROJECT,
            user_id=owner.id if owner else None, project_id=project.id if project else None,
            domain_name=domain, creator=owner.email if owner else "fixture",
            usage_mode=v.get("usage_mode", "general"),
            permission=v.get("permission", VFolderPermission.READ_WRITE),
            status=VFolderStatus.READY,
        )
        self.db.add(f)
        self.db.flush()
        for sh in v.get("shares", []):
            user = tenancy.find_user(self.db, sh["email"])
            if user is None or user.domain_name != domain:
                raise FixtureError(f"fixture: {label}: shares: no user {sh['email']!r} in "
                                   f"domain {domain!r}")
            if user.id == f.user_id:
                raise FixtureError(f"fixture: {label}: shares: the owner cannot be a sharee")
            if self.db.get(VFolderPermissionRow, (f.id, user.id)) is not None:
                raise FixtureError(f"fixture: {label}: shares: {sh['email']!r} twice")
            self.db.add(VFolderPermissionRow(vfolder_id=f.id, user_id=user.id,
                                             permission=sh["permission"]))
        self.db.flush()
        self.folders.append({"host": host, "quota_scope_id": scope, "id": f.id,
                             "files": v.get("files", {}), "label": label})
        self._done("vfolders", key, True)

    def resource_group(self, label: str, v: dict) -> None:
        for d in v.get("allowed_domains", []):
            self._need(label, Domain, d, "domain")
        self.simple("resource_groups", ResourceGroup, label, v)


_SIMPLE = {
    "domains": Domain,
    "keypair_resource_policies": KeypairResourcePolicy,
    "user_resource_policies": UserResourcePolicy,
    "project_resource_policies": ProjectResourcePolicy,
}


def _run(coro):
    import asyncio

    return asyncio.run(coro)


async def _make_folders(storage, folders: list[dict]) -> None:
    """Directories and files of new folders; on any failure, remove every one of them."""
    done = []
    try:
        for f in folders:
            done.append(f)
            await storage.create_folder(f["host"], f["quota_scope_id"], f["id"])
            for path, text in sorted(f["files"].items()):
                if "/" in path:
                    await storage.mkdir(f["host"], f["quota_scope_id"], f["id"],
                                        path.rsplit("/", 1)[0], parents=True)

                async def chunks(data=text.encode("utf-8")):
                    yield data

                await storage.upload(f["host"], f["quota_scope_id"], f["id"], path, chunks())
    except BaseException as e:
        await remove_folders(storage, done)
        if isinstance(e, BackendAIError):
            raise FixtureError(f"fixture: {f['label']}: the storage refused: {e.detail}") from None
        raise


async def remove_folders(storage, folders: list[dict]) -> None:
    for f in folders:
        try:
            await storage.delete_folder(f["host"], f["quota_scope_id"], f["id"])
        except Exception:
            pass


def populate(db_session: DBSession, data: Mapping, storage=None,
             default_host: str = tenancy.DEFAULT_VFOLDER_HOST) -> dict:
    """Create what ``data`` describes and is not in the record yet; return what happened.

    Runs inside the caller's transaction, in a savepoint: on error (a
    :class:`FixtureError`, 400, naming the entry) nothing of ``data`` stays in the
    session, whatever the caller does next. The returned ``{"created": {kind:
    [keys]}, "existing": {kind: [keys]}}`` says what was made and what was left.

    ``storage`` (a :class:`~..storageproxy.client.StorageRegistry`) is needed for
    ``vfolders``: their directories and files are made on it once the rows are
    written (and removed again if that fails). The new folders are listed under
    ``"folders"`` in the result, so that a caller whose commit fails can remove
    them (:func:`remove_folders`), as :func:`populate_file` does.
    """
    if not isinstance(data, Mapping):
        raise FixtureError(f"fixture: the document must be a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - set(KINDS))
    if unknown:
        raise FixtureError(
            f"fixture: unknown section(s) {', '.join(map(repr, unknown))}; known: {', '.join(KINDS)}"
        )
    # Check every entry's fields before touching the record, and refuse duplicates
    # (a second entry with the same key would silently be "left as it is").
    checked: dict[str, list[tuple[str, dict]]] = {}
    for kind, spec in KINDS.items():
        entries = data.get(kind, [])
        if not isinstance(entries, list):
            raise FixtureError(f"fixture: {kind!r} must be a list, not {type(entries).__name__}")
        seen: dict[str, int] = {}
        checked[kind] = []
        for idx, entry in enumerate(entries):
            label, values = _validated(kind, idx, entry)
            key = spec.describe(entry).lower()
            if key in seen:
                raise FixtureError(f"fixture: {label}: duplicate of {kind}[{seen[key]}]")
            seen[key] = idx
            checked[kind].append((label, values))

    if checked["vfolders"] and storage is None:
        raise FixtureError("fixture: 'vfolders' need a storage to create them on")
    known_hosts = _run(storage.hosts()) if checked["vfolders"] else []
    loader = _Loader(db_session)
    with db_session.begin_nested():
        for kind in KINDS:
            for label, values in checked[kind]:
                if kind in _SIMPLE:
                    loader.simple(kind, _SIMPLE[kind], label, values)
                elif kind == "projects":
                    loader.project(label, values)
                elif kind == "users":
                    loader.user(label, values)
                elif kind == "keypairs":
                    loader.keypair(label, values)
                elif kind == "resource_groups":
                    loader.resource_group(label, values)
                elif kind == "vfolders":
                    loader.vfolder(label, values, default_host, known_hosts)
        if loader.folders:
            _run(_make_folders(storage, loader.folders))
    return {"created": loader.created, "existing": loader.existing,
            "folders": [{k: f[k] for k in ("host", "quota_scope_id", "id")}
                        for f in loader.folders]}


def load_document(path: str) -> dict:
    """Read a fixture file; numbers with a fraction become ``Decimal`` (exact slots)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, parse_float=Decimal)
    except OSError as e:
        raise FixtureError(f"fixture: cannot read {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise FixtureError(f"fixture: {path} is not valid JSON: {e}") from None


def storage_from(volumes: dict | None = None, config_file: str | None = None):
    """The storage a hub would use, for ``vfolders`` of a fixture made before it runs:
    (storage registry, default vfolder host).

    ``volumes`` ({name: path} or {name: {"backend": "vfs", "path": ...}}) wins; else
    ``config_file`` (a JupyterHub configuration file; its
    ``c.BackendAIManager.storage_volumes``, ``storage_proxies`` and
    ``default_vfolder_host``); else the manager's defaults (one vfs volume
    ``volume1`` under ``./backendai-vfroot``, as a hub started here would have).
    """
    import os

    from ..storageproxy.client import make_storage_registry

    proxies: dict = {}
    default_host = tenancy.DEFAULT_VFOLDER_HOST
    conf_volumes = None
    if config_file:
        from traitlets.config.loader import PyFileConfigLoader

        loader = PyFileConfigLoader(os.path.basename(config_file),
                                    path=os.path.dirname(os.path.abspath(config_file)))
        try:
            cfg = loader.load_config().get("BackendAIManager", {})
        except Exception as e:
            raise FixtureError(f"fixture: cannot load {config_file}: {e}") from None
        conf_volumes = dict(cfg.get("storage_volumes", {})) or None
        proxies = dict(cfg.get("storage_proxies", {}))
        default_host = cfg.get("default_vfolder_host", default_host)
    if volumes:
        conf_volumes = {name: v if isinstance(v, Mapping) else {"backend": "vfs", "path": v}
                        for name, v in volumes.items()}
    if conf_volumes is None:
        # = BackendAIManager.storage_volumes' default (manager/core.py)
        conf_volumes = {"volume1": {"backend": "vfs",
                                    "path": os.path.abspath("backendai-vfroot/volume1")}}
    try:
        return make_storage_registry(proxies, conf_volumes), default_host
    except (ValueError, KeyError, OSError) as e:
        raise FixtureError(f"fixture: bad storage configuration: {e}") from None


def populate_file(db_url: str, path: str, storage=None,
                  default_host: str = tenancy.DEFAULT_VFOLDER_HOST) -> dict:
    """Migrate the database at ``db_url`` and load the fixture file ``path`` into it.

    The default rows and the whole document go in one transaction: a bad document
    leaves the record as it was, and the storage without the folders it made.
    """
    from ..models.db import make_engine, make_sessionmaker, upgrade

    data = load_document(path)
    if storage is None and isinstance(data, Mapping) and data.get("vfolders"):
        storage, default_host = storage_from()
    engine = make_engine(db_url)
    out = None
    try:
        upgrade(engine)
        with make_sessionmaker(engine).begin() as s:
            tenancy.ensure_defaults(s, default_host)
            out = populate(s, data, storage, default_host)
        return out
    except BaseException:
        if out is not None and out["folders"]:  # the commit failed after the storage work
            _run(remove_folders(storage, out["folders"]))
        raise
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    """``python -m jupyterhub_backendai.manager.fixtures <db_url> <file>``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m jupyterhub_backendai.manager.fixtures DB_URL FILE", file=sys.stderr)
        return 2
    try:
        out = populate_file(argv[0], argv[1])
    except BackendAIError as e:
        print(e.detail, file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
