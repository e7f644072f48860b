"""Queries over a day of a canopy table (`[[tables]]`), timed through two engines a
user would point at it: DuckDB (its iceberg extension, reading the metadata file) and
pyiceberg (a scan with a row filter, into Arrow, aggregated there).

    python benches/table_query.py FOLDER [RUNS]

FOLDER is a local table place (the `catalog.db` and `warehouse/` that canopy writes,
as `KEEP=1 cargo bench --bench table_lag` leaves it); the table is `bench.t`. A last DuckDB
row, the anchor, reads the same Parquet files directly (no Iceberg metadata). Each
query runs RUNS times (default 5) after one warm-up; the median and the fastest are
printed, with the rows the query returned, so the engines can be checked against each
other. Needs duckdb, duckdb-extension-iceberg, -avro, pyiceberg[sql-sqlite,pyarrow]
and pandas (BENCHMARKS.md has the pip command).
"""

import datetime
import glob
import os
import statistics
import sys
import time

import duckdb
import pyarrow.compute as pc
from pyiceberg.catalog.sql import SqlCatalog

folder = os.path.abspath(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5

catalog = SqlCatalog(
    "canopy",
    uri=f"sqlite:///{folder}/catalog.db",
    warehouse=f"file://{folder}/warehouse",
)
table = catalog.load_table("bench.t")
metadata = table.metadata_location.removeprefix("file://")
snapshot = table.current_snapshot()
summary = snapshot.summary.additional_properties if snapshot else {}
files = table.inspect.files().column("file_path").to_pylist()

con = duckdb.connect()
for ext in ["avro", "iceberg"]:
    module = __import__(f"duckdb_extension_{ext}")
    found = glob.glob(
        os.path.join(os.path.dirname(module.__file__), "extensions", "*", f"{ext}.duckdb_extension")
    )
    con.execute(f"LOAD '{found[0]}'")

# The day the rows are in: the newest row's day, as a user asks for "today".
(day,) = con.execute(
    f"SELECT max(time)::DATE FROM iceberg_scan('{metadata}')"
).fetchone()
start = datetime.datetime.combine(day, datetime.time(), tzinfo=datetime.timezone.utc)
end = start + datetime.timedelta(days=1)
scan = f"iceberg_scan('{metadata}')"
where = f"time >= TIMESTAMPTZ '{start.isoformat()}' AND time < TIMESTAMPTZ '{end.isoformat()}'"

# The anchor: the same Parquet files read directly, without Iceberg's metadata.
parquet = "read_parquet([" + ", ".join(f"'{f.removeprefix('file://')}'" for f in files) + "])"

duck = {
    "count the day's rows": f"SELECT count(*) FROM {scan} WHERE {where}",
    "average temp per device (1,000 groups)": f"SELECT n, avg(temp), max(battery) FROM {scan} WHERE {where} GROUP BY n",
    "one device's day, newest 100 rows": f"SELECT * FROM {scan} WHERE {where} AND n = '17' ORDER BY \"offset\" DESC LIMIT 100",
    "anchor: the average, Parquet files directly": f"SELECT n, avg(temp), max(battery) FROM {parquet} WHERE {where} GROUP BY n",
}


def day_filter():
    return f"time >= '{start.isoformat()}' and time < '{end.isoformat()}'"


def py_count():
    return table.scan(row_filter=day_filter(), selected_fields=("offset",)).to_arrow().num_rows


def py_group():
    arrow = table.scan(
        row_filter=day_filter(), selected_fields=("n", "temp", "battery")
    ).to_arrow()
    return arrow.group_by("n").aggregate([("temp", "mean"), ("battery", "max")]).num_rows


def py_device():
    arrow = table.scan(row_filter=f"{day_filter()} and n == '17'").to_arrow()
    top = pc.sort_indices(arrow, sort_keys=[("offset", "descending")])[:100]
    return arrow.take(top).num_rows


pyiceberg = {
    "count the day's rows": py_count,
    "average temp per device (1,000 groups)": py_group,
    "one device's day, newest 100 rows": py_device,
}


def timed(run):
    run()
    times, rows = [], None
    for _ in range(runs):
        began = time.perf_counter()
        rows = run()
        times.append(time.perf_counter() - began)
    return statistics.median(times), min(times), rows


print(
    f"table bench.t: {snapshot.summary.additional_properties.get('total-records', '?') if snapshot else 0} rows "
    f"in {len(files)} data files, committed offset {summary.get('canopy.committed-offset')}, day {day}; "
    f"{runs} runs each"
)
for name, sql in duck.items():
    def run(sql=sql):
        result = con.execute(sql).fetchall()
        return result[0][0] if name.startswith("count") else len(result)

    median, best, rows = timed(run)
    print(f"duckdb    | {name:40} | median {median * 1000:8.1f} ms | best {best * 1000:8.1f} ms | {rows} rows")
for name, run in pyiceberg.items():
    median, best, rows = timed(run)
    print(f"pyiceberg | {name:40} | median {median * 1000:8.1f} ms | best {best * 1000:8.1f} ms | {rows} rows")
