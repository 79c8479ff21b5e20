"""MIG: the state read in one round trip (:mod:`.state`), the ``nvidia-smi mig`` parsers (:mod:`.parse`), the
changes as argv (:mod:`.ops`) and a wanted geometry as changes (:mod:`.geometry`)."""
