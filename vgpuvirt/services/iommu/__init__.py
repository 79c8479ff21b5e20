"""Can these PCI devices be assigned to a VM (:mod:`.check`, also over an inventory: :mod:`.from_inventory`), and
binding whole IOMMU groups to vfio-pci and back (:mod:`.vfio_binding`); :mod:`.api` is the public face of both."""
