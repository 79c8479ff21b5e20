"""Creating and removing vGPUs: mdev ones (what exists: :mod:`.mdev_state`; the locked ops of one create or remove:
:mod:`.mdev_ops`) and NVIDIA vGPU 17+ ones on SR-IOV VFs (:mod:`.vendor`); and the orphans no domain uses
(:mod:`.gc`)."""
