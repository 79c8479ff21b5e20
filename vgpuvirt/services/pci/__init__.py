"""PCI and sysfs: every sysfs/procfs path the services use (:mod:`.sysfs`), the pure parsers of sysfs text formats
(:mod:`.parsers`), SR-IOV virtual functions (:mod:`.sriov`)."""
