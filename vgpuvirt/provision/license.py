"""Licensed desktops: the NVIDIA client configuration token and licensing feature type, delivered into the
guest on a read-only seed CD-ROM that the guest's first-boot agent reads.

An NVIDIA vGPU guest driver without a client configuration token runs unlicensed (degraded after a grace
period). NVIDIA's licensing guide has the guest hold the token under ``/etc/nvidia/ClientConfigToken/`` and
``FeatureType`` in ``/etc/nvidia/gridd.conf`` (Linux), or under ``%ProgramFiles%\\NVIDIA Corporation\\vGPU
Licensing\\ClientConfigToken`` and ``FeatureType`` in the ``nvlddmkm\\Global\\GridLicensing`` registry key
(Windows), then restarts its licensing service. This module writes exactly that as first-boot data:

- Linux: a cloud-init NoCloud seed (ISO 9660 volume ``cidata`` with ``user-data`` and ``meta-data``): a
  cloud-config whose ``write_files`` holds the token and gridd.conf, and whose ``runcmd`` restarts
  ``nvidia-gridd``;
- Windows: an OpenStack config drive (volume ``config-2``, ``openstack/latest/meta_data.json`` and
  ``user_data``) that cloudbase-init reads; the user data is a PowerShell script doing the same.

Everything here is pure (bytes in, bytes out); :mod:`.steps_license` puts the ISO into a libvirt storage
volume. The token is a secret: :class:`License` never shows it (``repr``, errors); logs, plans, the audit
record and ``--json`` carry only its SHA-256 (:attr:`License.sha256`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.xml.storage import check_name

#: The licensing feature a guest asks for -> gridd.conf / registry ``FeatureType`` (NVIDIA licensing guide):
#: 1 NVIDIA vGPU (the vGPU type decides the edition), 2 RTX Virtual Workstation, 4 Virtual Compute Server.
FEATURES = {"vgpu": 1, "vws": 2, "vcs": 4}
GUESTS = ("linux", "windows")
MAX_TOKEN_BYTES = 64 * 1024        # real tokens are a few KiB; anything much larger is the wrong file

# Where NVIDIA's driver looks (paths, not secrets: the noqa is for ruff's "token" name heuristic)
LINUX_TOKEN_DIR = "/etc/nvidia/ClientConfigToken"  # noqa: S105
LINUX_GRIDD_CONF = "/etc/nvidia/gridd.conf"
TOKEN_FILE = "client_configuration_token.tok"  # noqa: S105
WINDOWS_TOKEN_DIR = r"NVIDIA Corporation\vGPU Licensing\ClientConfigToken"  # noqa: S105  (under %ProgramFiles%)
WINDOWS_LICENSING_KEY = r"HKLM:\SYSTEM\CurrentControlSet\Services\nvlddmkm\Global\GridLicensing"
WINDOWS_SERVICE = "NVDisplay.ContainerLocalSystem"
SEED_VOLUME = "{name}-license-seed.iso"


@dataclass(frozen=True)
class License:
    """What a licensed desktop gets: ``token`` (the client configuration token's bytes, never shown),
    ``feature`` (a key of :data:`FEATURES`), ``guest`` (``linux``: cloud-init; ``windows``: cloudbase-init)
    and ``pool`` (the libvirt storage pool for the seed volume; None: the pool of the VM's linked clone, else
    ``default``)."""

    token: bytes = field(repr=False)
    feature: str = "vgpu"
    guest: str = "linux"
    pool: str | None = None

    def __post_init__(self) -> None:
        # The errors below describe the token, never quote it: an error message ends up in logs.
        if not isinstance(self.token, bytes) or not self.token.strip():
            raise InvalidSpec("license token", "(empty or not bytes)", "the client configuration token file's "
                                                                       "contents")
        if len(self.token) > MAX_TOKEN_BYTES:
            raise InvalidSpec("license token", f"({len(self.token)} bytes)",
                              f"a client configuration token (at most {MAX_TOKEN_BYTES} bytes)")
        if b"\0" in self.token:
            raise InvalidSpec("license token", "(binary data)", "a client configuration token (text)")
        if self.feature not in FEATURES:
            raise InvalidSpec("license feature", self.feature, " | ".join(FEATURES))
        if self.guest not in GUESTS:
            raise InvalidSpec("license guest", self.guest, " | ".join(GUESTS))
        if self.pool is not None:
            check_name("license seed storage pool", self.pool)

    @classmethod
    def from_file(cls, path: str | Path, *, feature: str = "vgpu", guest: str = "linux",
                  pool: str | None = None) -> License:
        """Read the token file (as downloaded from the NVIDIA licensing portal or a DLS instance)."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise InvalidSpec("license token file", str(path), f"a readable file ({exc.strerror})") from None
        return cls(data, feature, guest, pool)

    @classmethod
    def from_mapping(cls, opts: Mapping[str, object]) -> License:
        """From an options mapping (an Ansible module's ``license`` option): ``token_file`` (required),
        ``feature``, ``guest``, ``pool``; an unknown key is refused."""
        known = {"token_file", "feature", "guest", "pool"}
        if not isinstance(opts, Mapping) or set(opts) - known or "token_file" not in opts:
            raise InvalidSpec("license options", sorted(opts) if isinstance(opts, Mapping) else type(opts).__name__,
                              "token_file and optionally feature, guest, pool")
        pool = opts.get("pool")
        return cls.from_file(str(opts["token_file"]), feature=str(opts.get("feature") or "vgpu"),
                             guest=str(opts.get("guest") or "linux"), pool=None if pool is None else str(pool))

    @property
    def sha256(self) -> str:
        """What logs, plans and the audit record show of the token."""
        return hashlib.sha256(self.token).hexdigest()

    @property
    def feature_type(self) -> int:
        return FEATURES[self.feature]

    def seed_pool(self, disk_pool: str | None) -> str:
        return self.pool or disk_pool or "default"

    def to_dict(self) -> dict[str, object]:
        return {"token_sha256": self.sha256, "feature": self.feature, "feature_type": self.feature_type,
                "guest": self.guest, "pool": self.pool}


def gridd_conf(lic: License) -> str:
    """The gridd.conf the Linux guest gets: the feature type, nothing else to configure with a token."""
    return f"# written at first boot by vgpuvirt (cloud-init)\nFeatureType={lic.feature_type}\n"


def linux_user_data(lic: License) -> str:
    """cloud-config: the token and gridd.conf, then a restart of nvidia-gridd (which reads both at start)."""
    doc = {
        "write_files": [
            {"path": posixpath.join(LINUX_TOKEN_DIR, TOKEN_FILE), "owner": "root:root", "permissions": "0744",
             "encoding": "b64", "content": base64.b64encode(lic.token).decode()},
            {"path": LINUX_GRIDD_CONF, "owner": "root:root", "permissions": "0644", "content": gridd_conf(lic)},
        ],
        "runcmd": [["systemctl", "restart", "nvidia-gridd"]],
    }
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1 << 20)


def windows_user_data(lic: License) -> str:
    """A PowerShell script cloudbase-init runs at first boot (``#ps1_sysnative``: 64-bit PowerShell)."""
    b64 = base64.b64encode(lic.token).decode()          # [A-Za-z0-9+/=]: safe inside single quotes
    return "\r\n".join([
        "#ps1_sysnative",
        "$ErrorActionPreference = 'Stop'",
        f"$dir = Join-Path $env:ProgramFiles '{WINDOWS_TOKEN_DIR}'",
        "New-Item -ItemType Directory -Force -Path $dir | Out-Null",
        f"[IO.File]::WriteAllBytes((Join-Path $dir '{TOKEN_FILE}'), [Convert]::FromBase64String('{b64}'))",
        f"$key = '{WINDOWS_LICENSING_KEY}'",
        # New-Item -Force on an existing registry key would recreate it, dropping its other values
        "if (-not (Test-Path $key)) { New-Item -Path $key -Force | Out-Null }",
        f"New-ItemProperty -Path $key -Name FeatureType -PropertyType DWord -Value {lic.feature_type} -Force "
        "| Out-Null",
        f"Restart-Service -Name '{WINDOWS_SERVICE}'",
        "",
    ])


def seed_files(lic: License, vm: str, instance_id: str) -> dict[str, bytes]:
    """The seed's files by path (``/`` separated, as the guest sees them) and its volume label under ``""``."""
    if lic.guest == "windows":
        meta = {"uuid": instance_id, "hostname": vm, "name": vm}
        return {"": b"config-2",
                "openstack/latest/meta_data.json": json.dumps(meta, sort_keys=True).encode(),
                "openstack/latest/user_data": windows_user_data(lic).encode()}
    meta_data = yaml.safe_dump({"instance-id": instance_id, "local-hostname": vm}, sort_keys=False)
    return {"": b"cidata", "meta-data": meta_data.encode(), "user-data": linux_user_data(lic).encode()}


def _iso_name(name: str, is_dir: bool) -> str:
    # ISO 9660 level 3 names (d-characters); the guests read the Rock Ridge (Linux) and Joliet (Windows) names
    base = "".join(c if c.isalnum() else "_" for c in name.upper())
    return base if is_dir else f"{base}.;1"


def build_iso(files: dict[str, bytes]) -> bytes:
    """An ISO 9660 image with Rock Ridge and Joliet names holding ``files`` (label under ``""``)."""
    import pycdlib

    label = files[""].decode()
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=label, joliet=3, rock_ridge="1.09")
    made: set[str] = set()
    for path, data in sorted(files.items()):
        if not path:
            continue
        parts = path.split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            if d not in made:
                iso.add_directory("/" + "/".join(_iso_name(p, True) for p in parts[:i]), rr_name=parts[i - 1],
                                  joliet_path="/" + d)
                made.add(d)
        iso_path = "/" + "/".join([*(_iso_name(p, True) for p in parts[:-1]), _iso_name(parts[-1], False)])
        iso.add_fp(io.BytesIO(data), len(data), iso_path, rr_name=parts[-1], joliet_path="/" + path)
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def seed_iso(lic: License, vm: str, instance_id: str) -> bytes:
    """The seed CD-ROM image for ``vm`` (``instance_id``: the domain UUID, so cloud-init runs once per VM)."""
    return build_iso(seed_files(lic, vm, instance_id))


def seed_volume_name(vm: str) -> str:
    return check_name("license seed volume name", SEED_VOLUME.replace("{name}", vm))
