"""Never runs: its requirements.txt asks for a torch the stack does not have."""

raise SystemExit("requirements_torch must have been refused before it started")
