"""Hub start: what ``backendai-hub`` costs before the hub answers.

    python benchmarks/hubstart.py [--rounds N]

Three measurements, rounds interleaved so that load from elsewhere hits both alike:

  import:  ``python -m jupyterhub --version`` (JupyterHub's own entry point, the baseline)
           against ``python -m jupyterhub_backendai.hubmain --version`` (the launcher's):
           both import JupyterHub's application and stop; the difference is the optional
           ``iri`` format checker that hubmain keeps from loading (iriguard.py says why).
  server:  ``jupyterhub-singleuser --version`` (the baseline) against
           ``backendai-singleuser --version`` (what the local backend starts for a
           session's Jupyter server, singleusermain.py): both import the server and stop;
           the difference is the same optional checker.
  start:   the whole start as the tests and an operator run it (tests/hub.py: the launcher
           on a fresh SQLite state directory, migrations, the first superadmin, JupyterHub,
           CHP, the in-process local agent) until GET /hub/api/ answers 200 through the proxy.

The last line printed is machine-readable:

    plain_import_s=<f> hubmain_import_s=<f> ratio=<f> plain_server_s=<f>
    server_s=<f> server_ratio=<f> hub_start_p50_s=<f>
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _run(module: str) -> float:
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", module, "--version"], check=True,
                   stdout=subprocess.DEVNULL)
    return time.monotonic() - t


def _script(name: str) -> float:
    t = time.monotonic()
    subprocess.run([os.path.join(os.path.dirname(sys.executable), name), "--version"],
                   check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t


def _pair(i: int, measure, baseline: str, ours: str) -> tuple[float, float]:
    """(baseline's time, ours) measured one after the other, the order alternating with
    the round ``i`` so that neither always runs on the other's warm caches."""
    if i % 2:
        return measure(baseline), measure(ours)
    o = measure(ours)
    return measure(baseline), o


def _hub_start() -> float:
    from tests.hub import Hub

    d = tempfile.mkdtemp(prefix="bench-hubstart-")
    t = time.monotonic()
    hub = Hub(backend="local", db_url=f"sqlite:///{d}/backendai.sqlite").start()
    took = time.monotonic() - t
    hub.close()
    shutil.rmtree(hub.dir, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    _run("jupyterhub")  # warm the file cache for both
    _script("jupyterhub-singleuser")
    plain, ours, splain, sours, starts = [], [], [], [], []
    for i in range(args.rounds):
        base, our = _pair(i, _run, "jupyterhub", "jupyterhub_backendai.hubmain")
        plain.append(base)
        ours.append(our)
        base, our = _pair(i, _script, "jupyterhub-singleuser", "backendai-singleuser")
        splain.append(base)
        sours.append(our)
        starts.append(_hub_start())
    p, o, sp, so, s = (statistics.median(x) for x in (plain, ours, splain, sours, starts))
    print(f"import (median of {args.rounds}): python -m jupyterhub {p:.2f} s, "
          f"python -m jupyterhub_backendai.hubmain {o:.2f} s")
    print(f"server import (median of {args.rounds}): jupyterhub-singleuser {sp:.2f} s, "
          f"backendai-singleuser {so:.2f} s")
    print(f"hub start to answering (median of {args.rounds}): {s:.2f} s "
          f"(all: {', '.join(f'{x:.2f}' for x in starts)})")
    print(f"plain_import_s={p:.3f} hubmain_import_s={o:.3f} ratio={o / p:.3f} "
          f"plain_server_s={sp:.3f} server_s={so:.3f} server_ratio={so / sp:.3f} "
          f"hub_start_p50_s={s:.3f}")


if __name__ == "__main__":
    main()
