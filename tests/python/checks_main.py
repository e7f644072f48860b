"""How each nats-py check script runs: `python <script> nats://127.0.0.1:PORT` runs its
`main(url)`; the first failure prints its traceback and exits 1, success prints "all
checks passed" (what tests/it/python.rs looks for)."""
import asyncio
import sys
import traceback


def run(main) -> None:
    try:
        asyncio.run(main(sys.argv[1]))
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    print("all checks passed")
