"""The one change engine: every change vgpuvirt makes to a host or its libvirt is a typed step run by one runner.

* :mod:`.step`: the contract (``Step``, ``HostStep``, ``DomainStep``, ``Phase``, the kind registry and the
  provenance entries steps leave);
* one module per family of kinds: :mod:`.mdev` (create, remove), :mod:`.vendor_vf` (set, clear a VF's vGPU type),
  :mod:`.nvidia_mode` (mixed/equal-size), :mod:`.sriov` (VF count), :mod:`.driver` (vfio-pci and back),
  :mod:`.mig` (MIG mode, GPU and compute instances), :mod:`.scheduler` (NVML, the modprobe.d file),
  :mod:`.domain`, :mod:`.storage`;
* :mod:`.runner`: ``Runner`` (batches, journal, rollback in reverse of exactly what ran), ``run_host``,
  ``run_hosts`` and the one ``Report`` format;
* :mod:`.identity`: the names vgpuvirt derives from a VM's name (mdev and domain UUIDs).

Adding a kind of change is one class and one test (docs/change.md).
"""
