"""``python -m shardwise``: the same as the ``shardwise`` command, and as quick to start
(``python -m shardwise.cli`` imports the whole command before it can restart with huge
pages)."""

from shardwise._main import main

if __name__ == "__main__":
    main()
