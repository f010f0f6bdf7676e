"""Read the host, resolve one stack, then act: host facts (`facts.py`), the compatibility matrix
(`matrix.py`) and the plan (`plan.py`). Pure: the raw outputs come from playbooks/facts.yml."""
