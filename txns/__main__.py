"""``python -m txns``: the same as the ``txns`` command (see :mod:`txns.cli`)."""

from txns.cli import entry

if __name__ == "__main__":
    entry()
