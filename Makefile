.PHONY: install test bench
install:
	bash scripts/install.sh

test:
	.venv/bin/python -m pytest -q

bench:
	.venv/bin/python benchmarks/run_all.py
