# Two entry points (see README): `make demo` runs the main job, `make test` runs the tests.
# Each creates .venv with everything the project needs if it is missing.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean espnet-env browser

# uv installs the same packages as pip, fetching and unpacking them in parallel: the
# 5.7 GB environment (torch's CUDA wheels) takes a quarter of pip's time. Bytecode is compiled
# at install, as pip does, so the first test run does not compile it in every process; so are
# the numba kernels of librosa (the reference of the frontend parity tests), which it compiles
# on first use and caches beside its code.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet uv
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -e '.[dev]'
	$(PY) -c "import librosa, numpy; librosa.feature.mfcc(y=numpy.zeros(16000, 'float32'), sr=16000)"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash recipes/an4/run.sh --quick

test: $(STAMP)
	$(PY) -m pytest -n auto --maxprocesses 4 --dist worksteal --durations=15

# Chromium and its WebDriver for the browser tests (tests/explore), from Debian, as root.
# Without them those tests skip and say so.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
		echo "chromium and chromedriver are installed"; \
	else \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends chromium chromium-driver; \
	fi

# ESPnet for `python -m bench espnet`, in its own environment: its requirements pin versions
# that clash with ours and pull speech-enhancement and TTS packages that do not install from
# the registry. It gets ESPnet without them, the few packages its ASR models and beam search
# import, and this project's .venv (torch and the rest) through a path file.
ESPNET_VENV ?= .venv-espnet
ESPNET_PACKAGES := espnet==202511 configargparse typeguard humanfriendly torch_complex kaldiio \
	jamo hydra-core omegaconf antlr4-python3-runtime editdistance nltk

espnet-env: $(STAMP)
	$(PY) -m venv $(ESPNET_VENV)
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
		"$$($(ESPNET_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/asr_venv.pth"
	$(ESPNET_VENV)/bin/pip install --quiet --no-deps $(ESPNET_PACKAGES)
	$(ESPNET_VENV)/bin/python -c "import espnet2.asr.espnet_model, espnet.nets.batch_beam_search"

lint: $(STAMP)
	$(VENV)/bin/ruff check asr tests bench recipes
	$(VENV)/bin/ruff format --check asr tests

# The environments only: data/ and exp/ hold what recipes prepared and trained (hours of it).
clean:
	rm -rf $(VENV) $(ESPNET_VENV)
