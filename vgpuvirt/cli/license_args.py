"""The licensed-desktop options of ``provision`` and ``plan``: ``--license-token FILE [--license-feature vgpu]
[--license-guest linux|windows] [--license-pool POOL]`` (see :mod:`vgpuvirt.provision.license`)."""

from __future__ import annotations

import argparse

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.provision.license import FEATURES, GUESTS, License


def add_license_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--license-token", default=None, metavar="FILE",
                   help="NVIDIA client configuration token file: each VM gets it (and the feature type) on a "
                        "read-only seed CD-ROM its first boot applies; only its SHA-256 is ever printed")
    p.add_argument("--license-feature", choices=tuple(FEATURES), default=None,
                   help="licensed feature (gridd.conf FeatureType): vgpu (1, default), vws (2), vcs (4)")
    p.add_argument("--license-guest", choices=GUESTS, default=None,
                   help="linux (cloud-init NoCloud seed, default) or windows (cloudbase-init config drive)")
    p.add_argument("--license-pool", default=None, metavar="POOL",
                   help="storage pool for the seed volumes (default: the --pool of --clone, else 'default')")


def license_from_args(args: argparse.Namespace) -> License | None:
    extra = [f"--{n.replace('_', '-')}" for n in ("license_feature", "license_guest", "license_pool")
             if getattr(args, n) is not None]
    if args.license_token is None:
        if extra:
            raise InvalidSpec(" ".join(extra), "without --license-token", "--license-token FILE with them")
        return None
    return License.from_file(args.license_token, feature=args.license_feature or "vgpu",
                             guest=args.license_guest or "linux", pool=args.license_pool)
