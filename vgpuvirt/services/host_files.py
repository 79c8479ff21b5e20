"""Files vgpuvirt installs on a host outside sysfs (``layout install-boot``: the unit, its program, the shipped
scripts), written as one batch item: ONE exec of ``python3 -c`` with the files as JSON on stdin (data, never a
shell string), each file atomically (a new file, fsync, rename) or as a symlink.

Before it writes anything the installer prints, as its first line of output, each file's previous state (its text
and mode, its link target, or ``null``: absent), so the install is undone exactly (:func:`previous`): files that
were there get their text back, files that were not are removed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from vgpuvirt.errors import DeviceError
from vgpuvirt.host.base import Op, OpResult
from vgpuvirt.services.mutation import Planned

#: path -> {"text", "mode"} | {"link"} | None (remove it)
Files = Mapping[str, Mapping[str, str] | None]

# Run on the host: stdlib only, argv/stdin data only.
INSTALLER = """\
import json, os, sys
prefix = sys.argv[1]
files = json.load(sys.stdin)
def at(rel):
    return os.path.join(prefix, rel.lstrip('/'))
before = {}
for rel in files:
    path = at(rel)
    if os.path.islink(path):
        before[rel] = {'link': os.readlink(path)}
    elif os.path.isfile(path):
        with open(path) as f:
            before[rel] = {'text': f.read(), 'mode': '%o' % (os.stat(path).st_mode & 0o7777)}
    else:
        before[rel] = None
print(json.dumps(before, sort_keys=True), flush=True)
for rel, spec in files.items():
    path = at(rel)
    if spec is None:
        if os.path.lexists(path):
            os.unlink(path)
        print(path)
        continue
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if spec.get('link'):
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(spec['link'], path)
        print(path)
        continue
    tmp = path + '.vgpuvirt-tmp'
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, int(spec['mode'], 8))
    with os.fdopen(fd, 'w') as f:
        f.write(spec['text'])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    print(path, flush=True)
"""


def paths(files: Files, prefix: str) -> list[str]:
    """Where the files land on the host (what the installer prints, one per file)."""
    return [os.path.join(prefix, rel.lstrip("/")) for rel in files]


def install_item(host: str, files: Files, prefix: str = "/", *, timeout: float = 60.0) -> Planned:
    """Write (or, for a ``None`` spec, remove) ``files`` under ``prefix`` in one exec."""
    op = Op.exec(["python3", "-c", INSTALLER, prefix], stdin=json.dumps(dict(files), sort_keys=True),
                 timeout=timeout, group=f"files:{prefix}")

    def explain(bad: OpResult) -> DeviceError:
        said = (bad.stderr or bad.error or "").strip()[-300:] or "no output"
        return DeviceError(host, prefix, f"writing the files failed (exit {bad.rc}): {said}")

    return Planned("files.install", prefix, (op,), explain, {"files": sorted(files)}, intent=f"{len(files)} file(s)",
                   message=f"{len(files)} file(s) written", dry_message=f"would write {len(files)} file(s)")


def previous(results: Sequence[OpResult]) -> Files | None:
    """The files as they were, from the installer's first line of output (None: it did not get that far)."""
    for r in results:
        first = r.stdout.split("\n", 1)[0]
        if first.startswith("{"):
            try:
                before = json.loads(first)
            except ValueError:
                return None
            return before if isinstance(before, dict) else None
    return None
