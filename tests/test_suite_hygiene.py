"""The suite's own rules: a run fails on what it leaves on the Docker engine, and never
counts another run's objects as its own (scripts/test, tests/engine_check.py)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap

from .hub import KERNEL_IMAGE, REPO


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_run_that_leaves_a_container_fails_and_names_it(tmp_path, docker_image):
    """A pytest run (the suite's conftest, as scripts/test loads it) whose test leaves a
    container of its run behind ends failed, naming it; a container of another run on
    the same engine, made meanwhile, is reported as someone else's and does not fail it."""
    run = secrets.token_hex(4)
    other = secrets.token_hex(4)
    ours = f"i-leak-{run}-0"
    theirs = f"i-leak-{other}-0"
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(f"""
        import subprocess

        def test_leaves_a_container():
            for agent in ({ours!r}, {theirs!r}):
                subprocess.run(["docker", "create", "--label", "ai.backend.agent-id=" + agent,
                                {KERNEL_IMAGE!r}, "true"], check=True, capture_output=True)
    """))
    env = dict(os.environ, BACKENDAI_TEST_RUN=run)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
             "-n", "0", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        assert "1 passed" in out, out[-3000:]
        assert r.returncode == 1, out[-3000:]  # the test passed; the run did not
        assert "engine: 1 object(s) of this run left behind:" in out, out[-3000:]
        assert "container " in out and ours in out, out[-3000:]
        assert "by others (not this run's, left alone): container " in out, out[-3000:]
        left = out.split("left behind:", 1)[1]
        assert theirs not in left, out[-3000:]
    finally:
        for agent in (ours, theirs):
            ids = _docker("ps", "-aq", "--filter", f"label=ai.backend.agent-id={agent}").split()
            if ids:
                _docker("rm", "-f", *ids)


def test_a_clean_run_passes(tmp_path, docker_image):
    """The same run with the container removed by its test passes."""
    run = secrets.token_hex(4)
    (tmp_path / "test_tidy.py").write_text(textwrap.dedent(f"""
        import subprocess

        def test_removes_its_container():
            cid = subprocess.run(["docker", "create", "--label",
                                  "ai.backend.agent-id=i-tidy-{run}-0", {KERNEL_IMAGE!r}, "true"],
                                 check=True, capture_output=True, text=True).stdout.strip()
            subprocess.run(["docker", "rm", cid], check=True, capture_output=True)
    """))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-n", "0", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        cwd=REPO, env=dict(os.environ, BACKENDAI_TEST_RUN=run), capture_output=True, text=True,
        timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "left behind" not in r.stdout
