"""Reads a Canopy table with pyiceberg, an independent Iceberg reader, through the
table's SQL catalog, and prints what it found as one JSON object.

Usage: python iceberg_read.py FOLDER TABLE [DAY]
  FOLDER  the table folder (catalog.db and warehouse/ inside)
  TABLE   namespace.name
  DAY     YYYY-MM-DD: also count the rows of that day through a filter on `time`
"""
import json
import sys

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

folder, name = sys.argv[1], sys.argv[2]
catalog = SqlCatalog(
    "canopy",
    uri=f"sqlite:///{folder}/catalog.db",
    warehouse=f"file://{folder}/warehouse",
)
table = catalog.load_table(name)
rows = table.scan().to_arrow().to_pylist()
snapshot = table.current_snapshot()
found = {
    "columns": [field.name for field in table.schema().fields],
    "partition": [str(field.transform) for field in table.spec().fields],
    "rows": [
        {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
        for row in rows
    ],
    "snapshots": len(table.snapshots()),
    "committed_offset": snapshot.summary.additional_properties.get("canopy.committed-offset")
    if snapshot
    else None,
}
if len(sys.argv) > 3:
    day = sys.argv[3]
    start = f"{day}T00:00:00+00:00"
    import datetime

    end_day = datetime.date.fromisoformat(day) + datetime.timedelta(days=1)
    end = f"{end_day.isoformat()}T00:00:00+00:00"
    scan = table.scan(row_filter=And(GreaterThanOrEqual("time", start), LessThan("time", end)))
    found["day_rows"] = scan.to_arrow().num_rows
    found["day_files"] = len(list(scan.plan_files()))
print(json.dumps(found))
