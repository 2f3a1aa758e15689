#!/bin/sh
# Regenerate the build system: configure, Makefile.in, build-aux/.
set -e
cd "$(dirname "$0")"
autoreconf -fi
