"""``python -m shardwise.cli``: the same as the ``shardwise`` command."""

from shardwise.cli import main

if __name__ == "__main__":
    main()
