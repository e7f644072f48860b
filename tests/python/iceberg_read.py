"""Reads a Canopy table with pyiceberg, an independent Iceberg reader, through the
table's SQL catalog, and prints what it found as one JSON object.

Usage: python iceberg_read.py FOLDER TABLE [DAY]
  FOLDER  the table folder (catalog.db and warehouse/ inside), or `s3://bucket/prefix/tables`
          for a store on S3: then the table is opened from its own folder there, through
          its version hint, with the S3 endpoint from CANOPY_TEST_S3_ENDPOINT
  TABLE   namespace.name
  DAY     YYYY-MM-DD: also count the rows of that day through a filter on `time`
"""
import json
import os
import sys

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
from pyiceberg.table import StaticTable

folder, name = sys.argv[1], sys.argv[2]
if folder.startswith("s3://"):
    location = f"{folder}/{name.replace('.', '/')}"
    properties = {
        "s3.endpoint": os.environ["CANOPY_TEST_S3_ENDPOINT"],
        "s3.access-key-id": "test",
        "s3.secret-access-key": "test",
        "s3.region": "us-east-1",
    }
    try:
        table = StaticTable.from_metadata(location, properties)
    except FileNotFoundError:
        sys.exit("NoSuchTable: no version hint yet")
    # Where the data files are, so the test sees they went to the bucket.
    files = [task.file.file_path for task in table.scan().plan_files()]
else:
    catalog = SqlCatalog(
        "canopy",
        uri=f"sqlite:///{folder}/catalog.db",
        warehouse=f"file://{folder}/warehouse",
    )
    table = catalog.load_table(name)
    files = [task.file.file_path for task in table.scan().plan_files()]
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
    "files": files,
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
