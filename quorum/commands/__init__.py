"""`quorum` subcommands."""
