#!/usr/bin/env bash
# Installs arcpool from BUILD_DIR into a scratch prefix, then configures, builds and runs the
# consumer project against it, and checks the pkg-config file. Usage: run.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$here" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
ARCPOOL_DRIVER=${ARCPOOL_DRIVER:-} "$work/consumer/consumer"
ls "$work/prefix"/lib*/libarcpool.so.0 >/dev/null
PKG_CONFIG_PATH=$(ls -d "$work/prefix"/lib*/pkgconfig) pkg-config --libs --cflags arcpool
echo "package consumer ok"
