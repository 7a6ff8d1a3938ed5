# mailroom — the two commands a newcomer needs: `make demo` and `make test`.
# Both install what they need (system packages when run as root, a local venv).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
APT_PACKAGES := postgresql-15 postgresql-15-pgtap libtap-parser-sourcehandler-pgtap-perl pgbouncer postfix postgresql-15-cron \
                chromium wrk libmail-dkim-perl spamassassin spamd
# what only `make bench` needs: the signing milter of the DKIM reference (bench/opendkim_peer.py runs a
# private one; the system's service is stopped after the install, as postfix is)
BENCH_APT_PACKAGES := opendkim
# Citus (tests/citus, docs/scale.md): no registry here ships it; the source and its build script sit
# beside the checkout (../shared/citus/build.sh: Debian build deps, about a minute, then at once)
CITUS_BUILD ?= $(CURDIR)/../shared/citus/build.sh
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help deps deps-apt deps-citus deps-bench venv lint caniemail test test-pgtap test-py demo bench bench-quick snapshot screenshots wheel soak load clean

help:
	@echo "make demo         the whole story end to end on a private PostgreSQL cluster"
	@echo "make test         lint, pgTAP (pg_prove) and pytest against a cluster the run starts"
	@echo "make lint         sqlfluff (sql/, migrations/) and ruff"
	@echo "make bench        figures in bench/results.md (~35 min, written after each area; BENCH_ARGS=\"--only outbound --rounds 2\"); bench-quick (< 2 min)"
	@echo "make snapshot     rewrite tests/db/schema.snapshot after changing migrations/ or sql/"
	@echo "make caniemail    refresh driver/mailroom/checks/data from the npm package caniemail (CANIEMAIL_VERSION)"
	@echo "make screenshots  regenerate docs/img/http-*.png (docs/http.md) on a throwaway cluster, headless chromium"
	@echo "make wheel        build dist/mailroom-*.whl and the sdist (they carry migrations/ and sql/)"
	@echo "make soak         the fault-injection run for SOAK_SECONDS (1800) under load (docs/reliability.md)"
	@echo "make load         load held: 1,000 SMTP sessions, 5,000 SSE streams, 1,000 MCP waits, REST at 200/s (~10 min; LOAD_ARGS)"

# `deps` is the system packages (deps-apt) and the Citus build (deps-citus), timed apart by .ci/run
deps: deps-apt deps-citus

deps-apt:
	@if command -v pg_prove >/dev/null 2>&1 && [ -f /usr/share/postgresql/15/extension/pgtap.control ] \
	    && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	    && { command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; } \
	    && { command -v smtp-source >/dev/null 2>&1 || [ -x /usr/sbin/smtp-source ]; } \
	    && command -v chromium >/dev/null 2>&1 && command -v wrk >/dev/null 2>&1 \
	    && { command -v spamd >/dev/null 2>&1 || [ -x /usr/sbin/spamd ]; }; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	    echo "installing $(APT_PACKAGES)"; \
	    echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null || exit 1; \
	    if postfix status >/dev/null 2>&1; then postfix stop >/dev/null 2>&1; fi; \
	else \
	    echo "missing system packages; run: sudo apt-get install -y $(APT_PACKAGES)"; exit 1; \
	fi

deps-bench:
	@if [ -x /usr/sbin/opendkim ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	    echo "installing $(BENCH_APT_PACKAGES)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BENCH_APT_PACKAGES) >/dev/null || exit 1; \
	    if command -v service >/dev/null 2>&1; then service opendkim stop >/dev/null 2>&1 || true; fi; \
	else \
	    echo "no opendkim: the DKIM reference rows are skipped (sudo apt-get install -y $(BENCH_APT_PACKAGES))"; \
	fi

deps-citus:
	@if [ -x "$(CITUS_BUILD)" ] && [ "$$(id -u)" = 0 ]; then "$(CITUS_BUILD)"; \
	elif [ ! -f /usr/lib/postgresql/15/lib/citus.so ]; then echo "Citus not installed: tests/citus will be skipped"; fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: venv
	$(VENV)/bin/sqlfluff lint --disable-progress-bar --nocolor sql migrations
	$(VENV)/bin/ruff check driver tests bench

test: deps venv lint
	$(PY) -m mailroom.testing all --fast-paths-off-pass

test-pgtap: deps venv
	$(PY) -m mailroom.testing pgtap

test-py: deps venv
	$(PY) -m pytest

demo: deps venv
	$(VENV)/bin/mailroom demo

snapshot: deps venv
	$(PY) -m mailroom.testing snapshot

# the images of docs/http.md: a throwaway cluster, real SMTP, headless chromium (not in CI; SCREENSHOTS="http-inbox …")
screenshots: deps-apt venv
	$(PY) scripts/screenshots.py $(SCREENSHOTS)

# the HTML check's data (docs/checks.md): caniemail.com's support data as the npm package ships it
CANIEMAIL_VERSION ?= 2.0.2
caniemail:
	$(PYTHON) scripts/refresh_caniemail.py --version $(CANIEMAIL_VERSION)

wheel: venv
	rm -rf dist build
	$(PY) -m build --outdir dist .

# extra options of bench.run: --only AREA ..., --rounds N, --output FILE
BENCH_ARGS ?=

bench: deps deps-bench venv
	$(PY) -m bench.run $(BENCH_ARGS)

bench-quick: deps deps-bench venv
	$(PY) -m bench.run --quick $(BENCH_ARGS)

# the fault-injection suite's long run (tests/faults, docs/reliability.md): the CI run injects faults for
# 60 s; this one for SOAK_SECONDS, with SOAK_SEED (its figures in SOAK_REPORT, JSON)
# seconds the long-outage test keeps PostgreSQL down in make soak (45 in make test)
SOAK_OUTAGE ?= 245
SOAK_SECONDS ?= 1800
SOAK_SEED    ?= 34
SOAK_REPORT  ?= soak-report.json
soak: deps venv
	MAILROOM_SOAK_SECONDS=$(SOAK_SECONDS) MAILROOM_FAULT_SEED=$(SOAK_SEED) MAILROOM_FAULT_REPORT=$(SOAK_REPORT) \
	    $(PY) -m pytest tests/faults/test_fault_injection.py -p no:xdist -p no:cacheprovider -s -q
	MAILROOM_TEST_OUTAGE=$(SOAK_OUTAGE) $(PY) -m pytest tests/ops/test_long_outage.py -p no:xdist -p no:cacheprovider -s -q

# load held (bench/load.py, docs/reliability.md "Load held"): a throwaway cluster, `mailroom run` and `mailroom mcp
# --http-port`, each scenario apart, figures printed (not in make test nor CI); LOAD_ARGS="--only sse --scale 0.2"
LOAD_ARGS ?=
load: deps venv
	$(PY) -m bench.load $(LOAD_ARGS)

clean:
	-$(VENV)/bin/mailroom db down 2>/dev/null
	rm -rf .mailroom .pytest_cache .ruff_cache
