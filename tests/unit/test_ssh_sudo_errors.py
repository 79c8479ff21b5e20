"""What sudo says when it does not run the command, read into one clear RemoteRequirementMissing."""

from __future__ import annotations

import pytest

from vgpuvirt.host.ssh_agent import sudo_problem


@pytest.mark.parametrize("rc, err, fragment", [
    (127, b"bash: line 1: sudo: command not found\n", "sudo is not installed"),
    (127, b"sh: 1: sudo: not found\n", "sudo is not installed"),
    (1, b"sudo: a password is required\n", "needs a password"),
    (1, b"sudo: a terminal is required to read the password; either use the -S option to read from standard "
        b"input or configure an askpass helper\nsudo: a password is required\n", "needs a password"),
    (1, b"alice is not in the sudoers file.  This incident will be reported.\n", "sudo refused"),
    (1, b"Sorry, user alice is not allowed to execute '/usr/bin/python3 -I -S -c ...' as root on gpu1.\n",
     "sudo refused"),
])
def test_sudo_that_did_not_run_the_command(rc: int, err: bytes, fragment: str) -> None:
    problem = sudo_problem("ssh://gpu1", rc, err)
    assert problem is not None and fragment in str(problem) and "\n" not in str(problem)


@pytest.mark.parametrize("rc, err", [
    (0, b""),
    (1, b"sudo: python3: command not found\n"),          # sudo ran; the program is what is missing
    (1, b"mdevctl: device not found\n"),
    (2, b"Traceback (most recent call last):\n"),
])
def test_other_failures_are_not_blamed_on_sudo(rc: int, err: bytes) -> None:
    assert sudo_problem("ssh://gpu1", rc, err) is None
