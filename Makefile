.PHONY: install test typecheck
install:
	bash scripts/install.sh

test:
	.venv/bin/python -m pytest -q

typecheck:
	.venv/bin/mypy
