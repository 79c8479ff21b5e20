"""The time-sliced vGPU scheduler: its values and encodings (:mod:`.model`, pure) and read / plan / apply
(:mod:`.service`)."""
