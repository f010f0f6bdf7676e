"""The probe's pure core: trace schema, steady-state rule, summary, energy and verdict (stdlib only)."""
