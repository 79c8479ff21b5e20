"""Names vgpuvirt derives from a VM's name (UUIDv5 in one namespace): its vGPUs' mdev UUIDs and its domain UUID.

Derived, not stored: a rerun after a cut finds the devices a lost batch made, and teardown can tell
whether an mdev was made for a domain from the two names alone (metadata copied from another domain
names that domain's UUIDs, which do not derive from this domain's name).
"""

from __future__ import annotations

import uuid as _uuid
from functools import lru_cache

from vgpuvirt.model import MdevUuid

NAMESPACE = _uuid.UUID("7f6c3b2e-5a41-4c8e-9d1f-6b0a2e9c4d17")
#: How many GPU requests per VM :func:`made_for` searches; far more than a VM has PCI slots.
MAX_GPUS_PER_VM = 256


def mdev_uuid_for(vm: str, index: int) -> MdevUuid:
    return MdevUuid(str(_uuid.uuid5(NAMESPACE, f"mdev/{vm}/{index}")))


def domain_uuid_for(vm: str) -> str:
    return str(_uuid.uuid5(NAMESPACE, f"domain/{vm}"))


@lru_cache(maxsize=1024)
def _mdev_uuids(vm: str) -> frozenset[MdevUuid]:
    return frozenset(mdev_uuid_for(vm, i) for i in range(MAX_GPUS_PER_VM))


def made_for(uuid: MdevUuid, vm: str) -> bool:
    """Whether ``uuid`` is one vgpuvirt derives for ``vm`` (one of its GPU requests)."""
    return uuid in _mdev_uuids(vm)
