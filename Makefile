# dlop: set-up, build and tests in one place. `make help` lists the targets.
#
# Every target that needs it first installs what is missing (Debian packages,
# the .venv and its packages, dlop itself editable), then configures and builds
# incrementally. A second run does no needless work: the set-up scripts check
# and return at once, CMake configures only a folder with no cache or whose
# configure arguments changed (otherwise ninja re-runs CMake itself when a
# CMakeLists.txt changed), and ninja says "no work to do".

# $(,) is a comma inside $(call ...) arguments.
, := ,

VENV       ?= .venv
PYTHON     ?= python3
BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_TSAN ?= build-tsan
BUILD_TYPE ?= RelWithDebInfo
JOBS       ?= 2
# Debian's cmake, not the one a pip package may have put on the venv's PATH,
# so that every run configures build/ with the same CMake.
CMAKE      ?= $(firstword $(wildcard /usr/bin/cmake) cmake)
CTEST      ?= $(firstword $(wildcard /usr/bin/ctest) ctest)
# Extra arguments for every CMake configure, e.g. CMAKE_ARGS=-DDLOP_BUILD_BENCH=OFF
CMAKE_ARGS ?=

VENV_PY    := $(VENV)/bin/python
PYTEST     := $(VENV_PY) -m pytest
CTEST_RUN   = $(CTEST) --output-on-failure --no-tests=error -j$(JOBS) --test-dir

# Python_EXECUTABLE: the venv's, for the dlop._C extension (torch lives there).
CONFIGURE_ARGS = -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
  -DCMAKE_INSTALL_MESSAGE=LAZY --no-warn-unused-cli \
  -DPython_EXECUTABLE=$(abspath $(VENV_PY)) -DPython3_EXECUTABLE=$(abspath $(VENV_PY)) \
  $(CMAKE_ARGS)

# Sanitizer runs: UBSan findings fail the test; LSan is on with ASan.
# UCX's malloc/mmap hooks crash under ThreadSanitizer: turn them off for sanitizer runs.
SAN_ENV = UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no \
  ASAN_OPTIONS=detect_leaks=1 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(abspath tests/tsan.supp)

export VENV

.DEFAULT_GOAL := help
.NOTPARALLEL:
.PHONY: help deps system venv configure build demo test test-cpp test-python test-python-parallel \
  test-python-alone test-under-load check-bench gpu-carry test-asan test-tsan test-tsan-engine sanitize check \
  clean distclean

help:
	@echo 'dlop: make TARGET   (each target installs what is missing first)'
	@echo
	@echo '  demo         build, then run the main job on a built-in default (scripts/demo.sh)'
	@echo '  test         set-up, build, then the C++ suites (ctest) and the Python suites (pytest); prints each stage'"'"'s time'
	@echo '  check-bench  the benchmark lab'"'"'s smoke tests (tests/bench: bench/ run at tiny sizes; CI runs it after test)'
	@echo '  sanitize     the C++ suites under ASan+UBSan, the engine under TSan (CI runs it after check-bench)'
	@echo '  test-under-load  test'"'"'s C++ and Python suites beside $(BUSY) busy processes (run it before a change to timing)'
	@echo '  gpu-carry    make here what a lent GPU machine lacks (.gpu_deps, .gpu_data), check it fits, print the carry list'
	@echo '  check        the quick loop: incremental build, then the tests of the layers touched since HEAD'
	@echo '               (T=scheduler: a layer; T=tests/python/x.py or T="-R Regex": pytest or ctest arguments)'
	@echo '  build        install what is missing, configure and build in $(BUILD)/, install the executables into $(VENV)/bin'
	@echo '  test-cpp     the C++ GoogleTest suites (ctest in $(BUILD)/)'
	@echo '  test-python  the pytest suites in tests/python (the product'"'"'s)'
	@echo '  test-asan    the C++ suites built with -DDLOP_SANITIZE=address,undefined in $(BUILD_ASAN)/'
	@echo '  test-tsan    the C++ suites built with -DDLOP_SANITIZE=thread in $(BUILD_TSAN)/'
	@echo '  test-tsan-engine  the engine'"'"'s suites under TSan (what sanitize runs of TSan)'
	@echo '  deps         only install what is missing: Debian packages, $(VENV), dlop editable'
	@echo '  clean        remove the build folders (not $(VENV))'
	@echo '  distclean    clean, and remove $(VENV) and .stamps/'
	@echo
	@echo 'Variables: VENV=$(VENV) PYTHON=$(PYTHON) BUILD=$(BUILD) BUILD_TYPE=$(BUILD_TYPE) JOBS=$(JOBS) CMAKE_ARGS=$(CMAKE_ARGS)'
	@echo '  PYTHON_TESTS=$(PYTHON_TESTS) CTEST_ARGS=$(CTEST_ARGS) (a part of the suites, e.g. CTEST_ARGS="-R Config")'

# ---- set-up ------------------------------------------------------------------

deps: system venv

system:
	@scripts/setup-system.sh

venv: system
	@PYTHON='$(PYTHON)' scripts/setup-python.sh '$(VENV)'

# ---- build -------------------------------------------------------------------

# $(call cmake_configure,DIR,EXTRA_ARGS): configure DIR when it has no cache,
# or when the arguments differ from those it was last configured with (kept in
# DIR/.dlop-configure-args). Otherwise ninja re-runs CMake when it must.
define cmake_configure
	@args='$(strip $(CONFIGURE_ARGS) $(2))'; \
	if [ ! -f $(1)/CMakeCache.txt ] || [ ! -f $(1)/build.ninja ] || \
	   [ "$$(cat $(1)/.dlop-configure-args 2>/dev/null)" != "$$args" ]; then \
	  echo "$(CMAKE) -S . -B $(1) $$args"; \
	  rm -f $(1)/.dlop-configure-args; \
	  $(CMAKE) -S . -B $(1) $$args && echo "$$args" >$(1)/.dlop-configure-args; \
	fi
endef

configure: deps
	$(call cmake_configure,$(BUILD))

# dlop._C (later) is written by the build straight into python/dlop/, where the
# editable install finds it; executables are installed into the venv.
build: configure
	$(CMAKE) --build $(BUILD) -j$(JOBS)
	$(CMAKE) --install $(BUILD) --prefix $(VENV) --component bin

# ---- run ---------------------------------------------------------------------

demo: build
	scripts/demo.sh

# ---- tests -------------------------------------------------------------------

# Stages in order, each one's time printed at the end (scripts/stages.sh).
test:
	@scripts/stages.sh test "set-up:$(MAKE) --no-print-directory deps" "build:$(MAKE) --no-print-directory build" \
	  "C++ tests:$(MAKE) --no-print-directory test-cpp" "Python tests:$(MAKE) --no-print-directory test-python"

sanitize:
	@scripts/stages.sh sanitize "ASan+UBSan:$(MAKE) --no-print-directory test-asan" \
	  "TSan (engine):$(MAKE) --no-print-directory test-tsan-engine"

T ?=
check: build
	@scripts/check.sh $(T)

# A part of the suites: CTEST_ARGS="-R Regex" for test-cpp, PYTHON_TESTS="tests/python/x.py" for test-python.
CTEST_ARGS   ?=
PYTHON_TESTS ?= tests/python

RUN_CPP = $(CTEST_RUN) $(BUILD) $(CTEST_ARGS)
test-cpp: build
	$(RUN_CPP)

# With tests/python present, pytest collecting no test (exit 5) is a failure.
# tests/python tests the product (python/dlop and the C++ under it); the
# benchmark lab's smoke tests (tests/bench) run in check-bench.
# -n: one pytest worker per job; most tests wait on processes, sockets and
# servers, so two workers keep two cores busy. --dist loadfile: a file's tests
# stay on one worker, which starts the file's servers and ranks once.
# --durations: the slowest 30 tests, so where the suite's time goes is in every log.
PYTEST_ARGS ?= -n $(JOBS) --dist loadfile --durations=30
RUN_PARALLEL = $(PYTEST) $(PYTEST_ARGS) -m 'not alone' $(PYTHON_TESTS)
# Tests marked "alone" measure time or count machine-wide state: they run afterwards, one at a time, and
# one that fails runs once more, which the log's end names (tests/conftest.py). Exit 5: the selection
# (PYTHON_TESTS) holds no alone test.
RUN_ALONE = $(PYTEST) -m alone $(PYTHON_TESTS) || [ $$? -eq 5 ]
test-python: test-python-parallel test-python-alone

test-python-parallel: build
	$(RUN_PARALLEL)

test-python-alone: build
	$(RUN_ALONE)

# test's C++ and parallel Python suites beside BUSY busy processes at normal priority (four: two a core on
# CI's two cores, a load average of 6 with the suite's own two), started and always killed by
# scripts/under_load.sh; then the alone tests, which need the machine to themselves, once the load is gone.
# The build comes first, without the load (it is not what this measures).
BUSY ?= 4
test-under-load: build
	@scripts/under_load.sh $(BUSY) "$(RUN_CPP) && $(RUN_PARALLEL)" "$(subst $$,\$$,$(RUN_ALONE))"

# The benchmark lab (bench/, python -m bench.NAME) at tiny sizes: its harnesses run end to end and write what
# their reports read. Not part of test: the product's tests stay lean; CI runs both.
check-bench: build
	@$(VENV_PY) scripts/install_peers.py || exit 1; echo "$(PYTEST) $(PYTEST_ARGS) -m 'not alone' tests/bench"; $(PYTEST) $(PYTEST_ARGS) -m 'not alone' tests/bench && \
	  { echo "$(PYTEST) -m alone tests/bench"; $(PYTEST) -m alone tests/bench; rc=$$?; [ $$rc -eq 5 ] || exit $$rc; }

test-asan: deps
	$(call cmake_configure,$(BUILD_ASAN),-DDLOP_SANITIZE=address$(,)undefined -DDLOP_BUILD_TORCH_EXTENSION=OFF -DDLOP_BUILD_BENCH=OFF)
	$(CMAKE) --build $(BUILD_ASAN) -j$(JOBS)
	$(SAN_ENV) $(CTEST_RUN) $(BUILD_ASAN)

test-tsan: deps
	$(call cmake_configure,$(BUILD_TSAN),-DDLOP_SANITIZE=thread -DDLOP_BUILD_TORCH_EXTENSION=OFF -DDLOP_BUILD_BENCH=OFF)
	$(CMAKE) --build $(BUILD_TSAN) -j$(JOBS)
	$(SAN_ENV) $(CTEST_RUN) $(BUILD_TSAN)

# The default test run: the engine (scheduler), its fast path and the wait-policy tests under ThreadSanitizer.
test-tsan-engine: deps
	$(call cmake_configure,$(BUILD_TSAN),-DDLOP_SANITIZE=thread -DDLOP_BUILD_TORCH_EXTENSION=OFF -DDLOP_BUILD_BENCH=OFF)
	$(CMAKE) --build $(BUILD_TSAN) -j$(JOBS) --target dlop_scheduler_tests dlop_core_tests
	$(SAN_ENV) $(CTEST_RUN) $(BUILD_TSAN) -R '^(Communicator|WaitPolicy|InlinePath|ReadyEvent)\.|/(InlinePathRanks|ShmEngineKill)\.'


# ---- a lent GPU machine ---------------------------------------------------------

# What the GPU scripts' commands carry there (scripts/gpu_plan.md): made once, checked against the 64 MiB a
# device run copies. check-bench rehearses the scripts themselves (tests/bench/test_gpu_plan.py).
gpu-carry: venv
	@PYTHON=$(VENV_PY) scripts/gpu_carry.sh

# ---- cleaning ----------------------------------------------------------------

# Build outputs only: the build folders, and the extension the build writes
# into python/dlop/. The venv and the stamps stay.
clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_TSAN)
	rm -f python/dlop/_C*.so

distclean: clean
	rm -rf $(VENV) .stamps

