"""The base of Backend.AI's client routes (``api/compat/``): the admin API's
authentication (keypair signatures, tokens) with Backend.AI's error shape."""

from __future__ import annotations

from ...common.errors import InvalidRequest
from ..base import APIBase, _check_text, parse_json_body

_PROBLEM_TYPES = {
    400: "invalid-api-params", 401: "auth-failed", 403: "forbidden", 404: "object-not-found",
    405: "method-not-allowed", 409: "conflict", 412: "quota-exceeded",
    413: "vfolder-quota-exceeded", 429: "too-many-requests",
}


class CompatBase(APIBase):
    """The admin API's authentication (signatures, tokens), Backend.AI's error shape."""

    def problem(self, status_code: int, title: str, detail: str) -> dict:
        """Backend.AI's shape of the same problem (its clients read these fields)."""
        kind = _PROBLEM_TYPES.get(status_code, "internal-server-error" if status_code >= 500
                                  else "generic-bad-request")
        # title: what went wrong, in words (the CLI prints it); msg: the same (it prints it too
        # for most types), detail: RFC 9457's field, as the admin API sends it.
        return {"type": f"https://api.backend.ai/probs/{kind}",
                "title": f"{title}: {detail}" if detail != title else title,
                "status": status_code, "detail": detail}

    async def prepare(self):
        await super().prepare()
        # Query parameters are read ad hoc by these handlers: none may carry text a
        # database cannot store (the admin API checks its own in APIBase.query).
        for name, values in self.request.query_arguments.items():
            for raw in values:
                try:
                    _check_text(raw.decode("utf-8"), name)
                except UnicodeDecodeError:
                    raise InvalidRequest(f"query parameter {name!r} is not UTF-8") from None

    def json_body(self) -> dict:
        """The JSON object body (Backend.AI's clients send one even with GET); {} when none.
        Strings a database cannot store (NUL, lone surrogates) are a 400 here, for every
        handler, as :func:`..base.validate` makes them for the admin API."""
        raw = self.request.body
        if not raw or not raw.strip():
            return {}
        data = parse_json_body(raw)
        if not isinstance(data, dict):
            raise InvalidRequest("the body must be a JSON object")
        _check_text(data)
        return data


__all__ = ["CompatBase"]
