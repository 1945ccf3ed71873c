"""Run store: SQLAlchemy 2 ORM + Alembic migrations (shipped in ./migrations, applied by read-write opens
through upgrade.py, which guards them against data loss; read-only opens never upgrade).

The Store's API (docs/store.md describes the database and the JSON): Store.open(url), create_run /
add_point / finish_run / import_run / import_runs (several documents in one transaction) to write;
list_runs / get_run / export_run / points_frame /
requests_frame / itl_ms / change_points_frame to read.
"""

from k2bench.harness.store.db import default_db_url
from k2bench.harness.store.store import Store, effective_status

__all__ = ["Store", "default_db_url", "effective_status"]
