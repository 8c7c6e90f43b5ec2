"""The exit codes of every `thaw` command, in one place (docs/CLI.md lists them)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and what it was asked could not be done
EXIT_INVALID = 2  # bad arguments or a bad config: nothing was done
EXIT_STORE = 3  # the object store could not be reached or read
EXIT_NO_PLAN = EXIT_FAILED  # `thaw plan`: no fleet meets the goals within the limits
