"""Library errors name the API's keyword arguments (``force=True``); on the command line the same advice must
name the flag (``--force``). One table, applied to every error line the CLI prints.

tests/unit/test_cli_contract.py checks that every ``name=True|False|None`` the library writes into a message has
an entry here, so a new one cannot reach a user as Python.
"""

from __future__ import annotations

FLAG_FOR_KEYWORD: dict[str, str] = {   # applied in this order: a longer phrase before its parts
    "pin_cpus=False, --no-pin": "--no-pin",
    "pin_cpus=False": "--no-pin",
    "force=True": "--force",
    "allow_unknown_hosts=True": "--insecure-accept-unknown-host-key",
    "sudo=True": "--sudo",
    "use_nvml=True": "--nvml yes",
    "mdevctl=None": "--mdevctl ''",
    "hyperv=True": "<hyperv> in the template",
    "remove_storage=True": "--remove-storage",
    "dry_run=True": "--dry-run",
    "(ClonedDisk reserve_gib)": "(--clone-reserve GIB)",
    # what= words of InvalidSpec that name an option
    "invalid sysfs root ": "invalid --sysfs-root ",
    "invalid use_nvml True": "invalid --nvml yes",
    "invalid libvirt URI ": "invalid --connect ",
    "invalid host ": "invalid --host ",
}


def cli_words(text: str) -> str:
    """``text`` with the API's keyword arguments replaced by the CLI's flags."""
    for keyword, flag in FLAG_FOR_KEYWORD.items():
        text = text.replace(keyword, flag)
    return text
