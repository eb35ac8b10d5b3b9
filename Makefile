.PHONY: install test lint typecheck format
install:
	bash scripts/install.sh

test:
	.venv/bin/python -m pytest -q

lint:
	.venv/bin/ruff check src tests benchmarks experiments
	.venv/bin/ruff format --check src tests benchmarks experiments

typecheck:
	.venv/bin/mypy

format:
	.venv/bin/ruff format src tests benchmarks experiments
	.venv/bin/ruff check --fix src tests benchmarks experiments
