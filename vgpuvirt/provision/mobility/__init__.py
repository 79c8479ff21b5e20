"""Moving GPU VMs between hosts: pre-checks, live and offline migration, host cordon and drain, suspend.

See docs/mobility.md.
"""

from vgpuvirt.provision.mobility.checks import HostFacts, MigrationPlan, Move, Side, plan_migration, read_facts
from vgpuvirt.provision.mobility.migrate import MigrationRefused, MigrationResult, migrate, release_source
from vgpuvirt.provision.mobility.steps import MigrateDomain

__all__ = ["HostFacts", "MigrateDomain", "MigrationPlan", "MigrationRefused", "MigrationResult", "Move", "Side",
           "migrate", "plan_migration", "read_facts", "release_source"]
