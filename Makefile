# Two commands do everything on a fresh machine:
#   make demo   set up, then run the main job on the small built-in config
#   make test   set up, then run the test suite (what .ci/run calls)
ROOT := $(dir $(lastword $(MAKEFILE_LIST)))
# the Python (3.10+) that makes $(VENV); clean asks it, from this folder, which files wan-trt wrote
BASE_PY ?= python3
VENV ?= $(ROOT).venv
PY := $(VENV)/bin/python
WAN := $(VENV)/bin/wan-trt
DEMO_CONFIG ?= universal-small
DEMO_OUT ?= out/demo

.PHONY: setup demo test test-slow clean

setup: $(VENV)/.installed

$(VENV)/.installed: $(ROOT)requirements-cpu.txt $(ROOT)setup.cfg $(ROOT)pyproject.toml
	$(BASE_PY) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r $(ROOT)requirements-cpu.txt
	$(PY) -m pip install -q -e '$(ROOT).[dev]'
	touch $@

demo: setup
	$(WAN) info --config $(DEMO_CONFIG)
	$(WAN) export --config $(DEMO_CONFIG) --precision fp32 --out $(DEMO_OUT)/export --overwrite
	$(WAN) check $(DEMO_OUT)/export --blocks 8
	$(WAN) build $(DEMO_OUT)/export --backend aoti --fp32 --device cpu
	$(WAN) check $(DEMO_OUT)/export/engine_aoti_cpu.pt2 --blocks 8
	$(WAN) bench $(DEMO_OUT)/export --device cpu --blocks 4 --aoti-engine $(DEMO_OUT)/export/engine_aoti_cpu.pt2 \
		--backends reference-eager,torch-eager,onnxruntime,aoti --out $(DEMO_OUT)/bench.json --overwrite
	$(WAN) stream --config $(DEMO_CONFIG) --blocks 8 --out $(DEMO_OUT)/stream --overwrite
	@echo "demo: video of 8 streamed blocks (93 frames; random weights, so noise) in $(DEMO_OUT)/stream/video.mp4"

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

# the environment and what `make demo` wrote: in its output folders and its bench report, what wan-trt wrote and nothing
# else (a user's files there stay). The package judges that (`python3 -m wan_trt.owned`: the standard library only, no
# $(VENV) needed), asked only where there is something to judge, so that a fresh clone cleans with no Python; where
# none answers, nothing is removed.
clean:
	if [ -e $(DEMO_OUT)/export ] || [ -e $(DEMO_OUT)/stream ] || [ -e $(DEMO_OUT)/bench.json ]; then \
	  PYTHONPATH="$(ROOT)" $(BASE_PY) -c "import wan_trt.owned" 2> /dev/null || { \
	    echo "make clean: '$(BASE_PY) -m wan_trt.owned' did not run to tell wan-trt's files from others:" \
	      "nothing removed; install Python 3.10+ or name one with BASE_PY=/path/to/python3" >&2; \
	    exit 1; }; \
	  PYTHONPATH="$(ROOT)" $(BASE_PY) -m wan_trt.owned clean $(DEMO_OUT)/export $(DEMO_OUT)/stream $(DEMO_OUT)/bench.json; fi
	rm -rf $(VENV)
	rmdir $(DEMO_OUT) 2> /dev/null || true
