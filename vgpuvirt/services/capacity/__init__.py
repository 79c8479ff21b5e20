"""The capacity model: every physical GPU as one budget (:mod:`.budget`'s rules, :mod:`.build` from an inventory)
and the count per vGPU type (:mod:`.per_type`). Pure."""
