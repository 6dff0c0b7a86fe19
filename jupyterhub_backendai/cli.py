"""``backendai-admin``: bootstrap the record (schema, superadmin, domains, users, keypairs)."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys

from .common.errors import BackendAIError
from .manager import tenancy
from .models.db import make_engine, make_sessionmaker, upgrade


def _session(url: str):
    engine = make_engine(url)
    upgrade(engine)
    sm = make_sessionmaker(engine)
    with sm.begin() as s:
        tenancy.ensure_defaults(s)
    return sm


def create_superadmin(url: str, email: str, password: str | None, *, exist_ok: bool = True) -> dict:
    """Create the first superadmin; returns what to show the operator (password only if generated)."""
    sm = _session(url)
    generated = password is None
    password = password or secrets.token_urlsafe(12)
    with sm.begin() as s:
        existing = tenancy.find_user(s, email)
        if existing is not None:
            if not exist_ok:
                raise SystemExit(f"user {email} exists")
            return {"email": email, "created": False}
        user, kp, secret = tenancy.create_user(
            s, email=email, password=password, role="superadmin", username="admin"
            if tenancy.find_user(s, "admin") is None else None,
        )
        out = {"email": email, "username": user.username, "created": True,
               "access_key": kp.access_key, "secret_key": secret}
        if generated:
            out["password"] = password
        return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="backendai-admin", description=__doc__)
    p.add_argument(
        "--db",
        default=os.environ.get("BACKENDAI_DB_URL", "sqlite:///backendai.sqlite"),
        help="database URL (env BACKENDAI_DB_URL)",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("db-upgrade", help="create or migrate the schema")
    sa = sub.add_parser("create-superadmin", help="create the first superadmin")
    sa.add_argument("--email", default=os.environ.get("BACKENDAI_ADMIN_EMAIL", "admin@example.com"))
    sa.add_argument("--password", default=os.environ.get("BACKENDAI_ADMIN_PASSWORD"))
    d = sub.add_parser("create-domain")
    d.add_argument("name")
    pr = sub.add_parser("create-project")
    pr.add_argument("name")
    pr.add_argument("--domain", default="default")
    u = sub.add_parser("create-user")
    u.add_argument("--email", required=True)
    u.add_argument("--password", required=True)
    u.add_argument("--username")
    u.add_argument("--role", default="user")
    u.add_argument("--domain", default="default")
    u.add_argument("--status", default="active")
    u.add_argument("--project", action="append", dest="projects")
    k = sub.add_parser("create-keypair")
    k.add_argument("--email", required=True)
    args = p.parse_args(argv)

    try:
        if args.cmd == "create-superadmin":
            out = create_superadmin(args.db, args.email, args.password)
        else:
            sm = _session(args.db)
            with sm.begin() as s:
                if args.cmd == "db-upgrade":
                    out = {"upgraded": True}
                elif args.cmd == "create-domain":
                    out = {"domain": tenancy.create_domain(s, args.name).name}
                elif args.cmd == "create-project":
                    pj = tenancy.create_project(s, args.domain, args.name)
                    out = {"project": pj.name, "id": pj.id, "domain": pj.domain_name}
                elif args.cmd == "create-user":
                    user, kp, secret = tenancy.create_user(
                        s, email=args.email, password=args.password, username=args.username,
                        role=args.role, domain=args.domain, status=args.status,
                        projects=args.projects,
                    )
                    out = {"username": user.username, "email": user.email,
                           "access_key": kp.access_key, "secret_key": secret}
                elif args.cmd == "create-keypair":
                    user = tenancy.find_user(s, args.email)
                    if user is None:
                        raise SystemExit(f"no user {args.email}")
                    kp, secret = tenancy.create_keypair(s, user)
                    out = {"access_key": kp.access_key, "secret_key": secret}
    except BackendAIError as e:
        print(f"backendai-admin: {e.detail}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
