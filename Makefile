# lightbox — one entry point for setup, tests, lint, demo and benchmarks.
# Prerequisites: Python >= 3.11, a JDK 17+ and Maven (for the local Kafka broker and S3 server).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup test test-gpu test-torch lint docs demo bench kafka-jars s3-jars registry-app image image-test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed  ## virtualenv with lightbox and its dev tools

kafka-jars: setup  ## fetch Apache Kafka's jars from Maven Central (once; cached)
	$(BIN)/python -c "from lightbox.devservers.kafka_local import ensure_jars; print(ensure_jars())"

s3-jars: setup  ## fetch s3proxy's jars (a local S3 for the tests) from Maven Central (once; cached)
	$(BIN)/python -c "from lightbox.devservers.s3_local import ensure_jars; print(ensure_jars())"

registry-app: setup  ## fetch Apicurio Registry (a schema registry for the tests) from Maven Central (once; cached)
	$(BIN)/python -c "from lightbox.devservers.registry_local import ensure_app; print(ensure_app())"

test: setup kafka-jars s3-jars  ## the whole suite; starts its own Kafka broker; GPU tests skip without a GPU
	$(BIN)/pytest -q -p no:cacheprovider

test-gpu: setup  ## only the GPU tests (on a machine with an NVIDIA GPU and CuPy)
	$(BIN)/pytest -q -m gpu

test-torch: setup  ## the PyTorch runtime's tests (installs the [torch] extra: ~5 GB, ~5 min; not in CI)
	$(BIN)/pip install -q -e '.[dev,torch]'
	$(BIN)/pytest -q -p no:cacheprovider tests/gpu_kernels/test_segment_torch.py tests/gpu_kernels/test_segment_torch_gpu.py

lint: setup  ## ruff + mypy + the import layers (pyproject [tool.importlinter])
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

docs: setup  ## regenerate docs/settings.md from streams/settings.py (a test fails while it is stale)
	$(BIN)/lightbox settings --markdown > docs/settings.md

demo: setup kafka-jars  ## local broker, sample catalog, one worker, latency table, images in out/demo
	$(BIN)/lightbox demo --out out/demo

bench: setup  ## the quick CPU suite (bench/README.md): each bench at a small size, under 10 minutes
	mkdir -p bench/results
	PYTHONPATH=. $(BIN)/python bench/bench_retouch.py --width 1000 --height 750 --repeat 2 --out bench/results/bench_retouch.json
	PYTHONPATH=. $(BIN)/python bench/bench_decode.py --n 8 --n-large 1 --rounds 1
	PYTHONPATH=. $(BIN)/python bench/bench_segment.py --batches 1 4 --json bench/results/bench_segment.json
	PYTHONPATH=. $(BIN)/python bench/bench_output.py compliance --segmenter classical --count 8 --no-cutouts
	PYTHONPATH=. $(BIN)/python bench/bench_output.py tone
	PYTHONPATH=. $(BIN)/python bench/bench_batching.py --quick --seconds 4 --capacity-events 8 --images 4 --warmup 2 --configs fixed-1,adaptive

image:  ## build lightbox:cpu and lightbox:gpu with Docker (on local base stand-ins where no registry answers)
	infra/images/build.sh

image-test: setup kafka-jars s3-jars image  ## the built images: size, doctor, GPU ONNX Runtime, a worker and compose end to end
	$(BIN)/pytest -q -p no:cacheprovider -s tests/infra/test_images.py

clean:
	rm -rf out .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
