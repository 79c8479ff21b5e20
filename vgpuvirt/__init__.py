"""vgpuvirt: GPU-backed virtual machines on KVM/libvirt hosts."""

from vgpuvirt.errors import VgpuvirtError
from vgpuvirt.host import Host, LocalHost, Op, Snapshot

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # SSHHost pulls in paramiko; import it only when asked for.
    if name == "SSHHost":
        from vgpuvirt.host.ssh import SSHHost
        return SSHHost
    raise AttributeError(name)


__all__ = ["Host", "LocalHost", "Op", "SSHHost", "Snapshot", "VgpuvirtError", "__version__"]
