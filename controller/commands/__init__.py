"""The ``oasis`` subcommands, one module each."""
