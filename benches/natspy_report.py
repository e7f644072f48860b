"""What every nats-py bench ends with: run its coroutine, print the report as one JSON
line, or one readable line on standard error and exit status 1 (like canopy bench)."""

import asyncio
import json
import sys


def report(name: str, run, ok=lambda report: True) -> int:
    """Runs `run()` (a coroutine) and prints its report; `ok` says whether the report
    itself is a pass (a run that delivered less than it loaded is not)."""
    try:
        result = asyncio.run(run())
    except Exception as error:
        print(f"{name}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0 if ok(result) else 1
