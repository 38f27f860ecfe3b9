"""A worker for the backfill benchmark: ``lightbox worker`` with the backfill release rules the
benchmark compares, which are not settings (the product always runs the defaults).

    python bench/backfill_worker.py [--no-pipelined] [--no-wait-for-live] [--loglevel L]

Every other setting comes from the environment (``LIGHTBOX_*``), as for ``lightbox worker``.
``--no-pipelined``: every released backfill batch goes through the device before the next is
decoded (the first rule); ``--no-wait-for-live``: a closed backfill batch waits only for the
previous one, not for live inputs (:class:`agents.tiers.BackfillRules`). With the backfill tier in
a child process, the child gets the same rules.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.tiers import BackfillRules
from agents.worker import run_worker
from streams.settings import Settings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-pipelined", action="store_true")
    ap.add_argument("--no-wait-for-live", action="store_true")
    ap.add_argument("--loglevel", "-l", default=None)
    args = ap.parse_args(argv)
    settings = Settings()
    rules = BackfillRules(pipelined=not args.no_pipelined, wait_for_live=not args.no_wait_for_live)
    return run_worker(settings, {}, args.loglevel or settings.observe.log_level, rules=rules)


if __name__ == "__main__":
    raise SystemExit(main())
