"""What a host has, read in ONE round trip (:mod:`.host_read`), parsed and built (:mod:`.parse`, :mod:`.build`,
:mod:`.nvidia`, :mod:`.health`), and the inventory's frozen values (:mod:`.parts`, :mod:`.model`: the JSON contract
of DESIGN.md). Pure except :mod:`.read` and :mod:`.host_read`, which ask the host."""
