#!/usr/bin/env python3
"""pyiceberg's view of a table Caudal wrote (jobs/tests/iceberg.rs), run with the stack's
venv python ($CAUDAL_PYTHON):

    "$CAUDAL_PYTHON" scripts/iceberg-read.py CATALOG_URL CATALOG_NAME NAMESPACE.TABLE [S3_ENDPOINT]

CATALOG_URL is the SQL catalog's database (postgres://user@host:port/db; CATALOG_NAME is the
catalog's name in it) or a REST catalog (http://host:port or https://…; CATALOG_NAME is only a
label). S3_ENDPOINT, when the tables' files are on S3. The answer on stdout
is {"columns": [...], "snapshots": [{"id", "parent", "sequence", "summary", "rows"}, ...],
"rows": [{...}, ...]}: the current snapshot's rows, and for every snapshot (oldest first)
the rows it holds (time travel). Timestamps are answered as epoch milliseconds, floating
point numbers as their shortest round-trip text (repr), so no JSON parser can round them.
"""
import json
import os
import sys

import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog


def rows(table):
    out = []
    for row in table.to_pylist():
        out.append({k: plain(v) for k, v in row.items()})
    return out


def plain(v):
    if hasattr(v, "timestamp"):
        return round(v.timestamp() * 1000)
    if isinstance(v, float):
        return repr(v)
    return v


def main():
    url, name, ident = sys.argv[1], sys.argv[2], sys.argv[3]
    rest = url.startswith(("http://", "https://"))
    props = {"uri": url if rest else url.replace("postgres://", "postgresql+psycopg2://", 1)}
    if len(sys.argv) > 4:
        props.update({
            "s3.endpoint": sys.argv[4],
            "s3.access-key-id": os.environ.get("CAUDAL_S3_ACCESS_KEY_ID", "test"),
            "s3.secret-access-key": os.environ.get("CAUDAL_S3_SECRET_ACCESS_KEY", "test"),
            "s3.region": os.environ.get("CAUDAL_S3_REGION", "us-east-1"),
        })
    catalog = RestCatalog(name, **props) if rest else SqlCatalog(name, **props)
    table = catalog.load_table(ident)
    snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    answer = {
        "columns": [f.name for f in table.schema().fields],
        "snapshots": [
            {
                "id": s.snapshot_id,
                "parent": s.parent_snapshot_id,
                "sequence": s.sequence_number,
                "summary": dict(s.summary.additional_properties) if s.summary else {},
                "rows": table.scan(snapshot_id=s.snapshot_id).to_arrow().num_rows,
            }
            for s in snapshots
        ],
        "rows": rows(table.scan().to_arrow()) if snapshots else [],
    }
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
