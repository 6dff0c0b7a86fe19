"""Bad requests get a clear 4xx and leave nothing behind: no session, no slots, no container."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from jupyterhub_backendai.models import Agent, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .conftest import containers_of

CASES = [
    ({"image": "no-such/image:1"}, "unknown image"),
    ({"cpu": "-1"}, "cpu must be positive"),
    ({"cpu": "0"}, "cpu must be positive"),
    ({"cpu": "abc"}, "cpu must be a number"),
    ({"cpu": "nan"}, "finite"),
    ({"cpu": "100000"}, "exceeds what any agent has"),
    ({"mem": "-5g"}, "invalid size"),
    ({"mem": "1"}, "at least 64m"),
    ({"mem": "99999t"}, "exceeds what any agent has"),
    ({"gpu": "1.5"}, "whole number"),
    ({"gpu": "4"}, "exceeds what any agent has"),
    ({"cpu": "0.1"}, "needs at least cpu=0.25"),
    ({"bogus": "1"}, "unknown option"),
    ({"cpu": ["1", "2"]}, "must be a number"),
]


@pytest.fixture
def hub(make_hub, db_url, docker_image):
    return make_hub(db_url=db_url, backend="docker")


def _nothing_left(hub):
    engine = make_engine(hub.db_url)
    try:
        with make_sessionmaker(engine)() as s:
            assert s.scalar(select(func.count()).select_from(Session)) == 0
            assert s.get(Agent, hub.agent_id).occupied_slots.nonzero() == {}
    finally:
        engine.dispose()
    assert containers_of(hub.agent_id) == []
    assert hub.server_model("admin", "bad") is None or not hub.server_model("admin", "bad")["ready"]


def test_bad_options_through_api(hub):
    for options, message in CASES:
        r = hub.spawn("admin", "bad", options)
        assert r.status_code == 400, (options, r.status_code, r.text)
        assert message in r.json()["message"], (options, r.json())
    _nothing_left(hub)


def test_malformed_form(hub):
    s = hub.login()
    xsrf = s.cookies.get("_xsrf")
    for form, message in [
        ({"image": hub.image, "cpu": "lots", "mem": "1g"}, "cpu must be a number"),
        ({"image": hub.image, "cpu": ["1", "2"], "mem": "1g"}, "exactly one value"),
        ({"image": "<script>x</script>", "cpu": "1", "mem": "1g"}, "unknown image"),
    ]:
        r = s.post(hub.base + "/hub/spawn/admin/bad", data={**form, "_xsrf": xsrf})
        assert r.status_code == 400, (form, r.status_code)
        assert message in r.text, (form, r.text[-2000:])
        assert "<script>x</script>" not in r.text
    _nothing_left(hub)


def test_form_offers_kernel_images(hub):
    s = hub.login()
    r = s.get(hub.base + "/hub/spawn")
    assert r.status_code == 200
    assert f'<option value="{hub.image}">' in r.text
    assert 'name="cpu"' in r.text and 'name="mem"' in r.text and 'name="gpu"' in r.text
