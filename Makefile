# The two commands README.md opens with: `make demo` and `make test`. Both set up first.
.PHONY: setup demo test lint clean

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh $(ARGS)

test: setup
	bash scripts/run_tests.sh

lint: setup
	bash scripts/run_tests.sh --lint-only

clean:
	rm -rf .colcon .heisd-env.sh
