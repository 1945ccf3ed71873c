"""Four `k2bench import` processes of one file at once store one copy (SQLite and PostgreSQL): the
duplicate check runs inside the write transaction, under the store's write lock."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from k2bench.harness.store import Store

FIXTURE = Path(__file__).parent / "fixtures" / "run_small.json"
WORKER = """
import sys, time
from pathlib import Path
from k2bench.harness.cli import main
ready, go, path, url = sys.argv[1:5]
Path(ready).touch()
deadline = time.monotonic() + 120
while not Path(go).exists() and time.monotonic() < deadline:
    time.sleep(0.005)
sys.exit(main(["import", path, "--db", url]))
"""


def test_four_parallel_imports_of_one_file_store_one_copy(db_url, tmp_path):
    Store.open(db_url).close()  # created and migrated before the race, as a CI database would be
    go = tmp_path / "go"
    procs = []
    for i in range(4):
        ready = tmp_path / f"ready{i}"
        procs.append((ready, subprocess.Popen([sys.executable, "-c", WORKER, str(ready), str(go), str(FIXTURE), db_url],
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    deadline = time.monotonic() + 120
    while not all(r.exists() for r, _ in procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    results = [(p.wait(timeout=180), *p.communicate()) for _, p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2, 2, 2], results
    for code, _, err in results:
        if code == 2:
            assert "already stored as run" in err and "Traceback" not in err, err
    with Store.open(db_url, readonly=True) as store:
        assert len(store.list_runs()) == 1
