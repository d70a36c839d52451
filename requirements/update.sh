#!/usr/bin/env bash
# Regenerates the hash-pinned lock files the image (Dockerfile) and `make setup` (tests/setup.sh)
# install from, with pip-compile (pip-tools) in a throwaway virtualenv:
#   runtime.lock  pyproject.toml's dependencies
#   test.lock     the same pins plus the `test` extra (constrained by runtime.lock)
#   build.lock    the build backend (setuptools, wheel), for --no-build-isolation builds
# Run after changing dependencies in pyproject.toml, or to take newer releases; review the diff.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools"
"$tools/bin/pip" install -q pip-tools
unset PIP_FIND_LINKS  # a local wheel folder must not end up in the lock files
compile=("$tools/bin/pip-compile" -q --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links
         --allow-unsafe)
"${compile[@]}" --output-file requirements/runtime.lock pyproject.toml
"${compile[@]}" --extra test -c requirements/runtime.lock --output-file requirements/test.lock pyproject.toml
"${compile[@]}" -c requirements/test.lock --output-file requirements/build.lock requirements/build.in
