"""Use cases: each a function that composes the pure core with the adapters and returns a result; the commands
parse, call one, and render it."""
