"""The emulated ``nvidia-smi`` MIG forms with random argv: never an exception, always an exit status, and a
refused command (non-zero exit with nothing printed on stdout) leaves the simulated host unchanged."""

from __future__ import annotations

import copy

from fuzzkit import count, fuzz_settings, junk_text
from hypothesis import given
from hypothesis import strategies as st

from vgpuvirt.sim import SimHost

WORDS = ["mig", "-i", "-gi", "-ci", "-lgip", "-lgipp", "-lgi", "-lci", "-cgi", "-C", "-cci", "-dci", "-dgi", "-mig",
         "-r", "0", "1", "2", "9", "13", "19", "14:0", "9:4", "1g.10gb", "3g.40gb,1g.10gb", ",", "1,,2", "", ":",
         "0000:17:00.0", "17:00.0", "-1", "99999999999999999999"]


@fuzz_settings(300)
@given(argv=st.lists(st.sampled_from(WORDS) | junk_text(12, nul=False), max_size=7),
       profile=st.sampled_from(["a100-sriov", "a30-mig"]))
def test_random_mig_argv(argv: list[str], profile: str) -> None:
    count("test_random_mig_argv")
    host = SimHost.from_profile(profile)
    before = copy.deepcopy([(g.mig_enabled, g.mig_pending, g.gpu_instances, g.compute_instances)
                            for g in host.model.gpus.values()])
    res = host.run(["nvidia-smi", *argv])
    assert isinstance(res.exit_code, int)
    after = [(g.mig_enabled, g.mig_pending, g.gpu_instances, g.compute_instances) for g in host.model.gpus.values()]
    if res.exit_code != 0 and not res.stdout:
        assert after == before, (argv, res.stderr)
