# Packaging. The build needs the package extra: .venv/bin/pip install -e '.[cpu,app,package]'
#   make package          the one-folder bundle in dist/onnx-local-llm/ and the .tar.gz
#   make package-cuda     the same with onnxruntime-gpu (the cuda extra instead of cpu)
#   make package-test     build, then run the bundle's self-test (tests/installer, slow)
PYTHON ?= .venv/bin/python

.PHONY: package package-cuda package-test icons

package:
	PYTHON=$(PYTHON) installer/build

package-cuda:
	PYTHON=$(PYTHON) installer/build --cuda

package-test: package
	PACKAGE_TEST=1 $(PYTHON) -m pytest -q -m slow tests/installer -p no:cacheprovider

icons:
	$(PYTHON) tools/make_icon.py
