# The two commands of the README: `make run` and `make test`.
.PHONY: format help run test test-fast lint lint-imports setup migrate worker web bench-quick check clean

run:            ## set up, migrate, demo user + zoo, start web server and a Celery worker
	scripts/run.sh

test:           ## import contracts, ruff, mypy, the whole suite (PostgreSQL + Redis, started if absent), `dialect` tests on SQLite
	scripts/test.sh $(ARGS)

test-fast:      ## the edit loop: no integration/browser/slow tests, test database kept (--reuse-db), no lint
	scripts/test_fast.sh $(ARGS)

lint: setup     ## ruff check, mypy on the engines ([tool.ruff], [tool.mypy]) and the import contracts; no tests
	.venv/bin/ruff check .
	.venv/bin/ruff format --check tuning/engine scheduling/horus core/onnx_models common
	.venv/bin/mypy
	.venv/bin/lint-imports --no-cache --no-logo

lint-imports: setup  ## only the architecture contracts (pyproject.toml [tool.importlinter])
	.venv/bin/lint-imports --no-cache

setup:
	scripts/setup_venv.sh

migrate: setup
	.venv/bin/python manage.py migrate --noinput

check: setup
	.venv/bin/python manage.py check
	.venv/bin/python manage.py makemigrations --check --dry-run

worker: setup    ## the worker of `make run` (with celery beat inside: periodic recovery)
	scripts/worker.sh

web: setup
	.venv/bin/gunicorn -c config/gunicorn.py config.wsgi:application --bind 127.0.0.1:8000

bench-quick: setup
	.venv/bin/python bench/tuning_time.py --quick --json bench/results/tuning_time.json
	.venv/bin/python bench/scheduling.py --quick --json bench/results/scheduling.json

clean:
	rm -rf var staticfiles .pytest_cache

help:           ## this list
	@grep -E '^[a-z-]+:.*## ' Makefile | sed -E 's/:[^#]*## /\t/' | expand -t 16

format: setup   ## ruff format the engines (the formatted scope `make test` checks), then ruff check --fix
	.venv/bin/ruff format tuning/engine scheduling/horus core/onnx_models common
	.venv/bin/ruff check --fix .
