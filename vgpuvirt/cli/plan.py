"""``vgpuvirt plan``: what ``provision`` would do, changing nothing (a dry run / diff).

    vgpuvirt --host sim:t4x2 plan --connect test:///default --count 4 --gpu 'fb>=2G,series=Q' --explain
"""

from __future__ import annotations

import argparse
from typing import Any

from vgpuvirt.cli.provision import add_request_args, run


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("plan", help="show what provision would do (dry run)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_request_args(p)
    p.set_defaults(func=lambda ctx, args: run(ctx, args, dry_run=True))
