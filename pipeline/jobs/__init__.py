"""The jobs a user runs: index, rebuild, query, embed; their reports."""
