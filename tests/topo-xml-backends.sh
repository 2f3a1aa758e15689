#!/bin/sh
# The topology tests under each of hwloc's XML readers: its own minimal
# parser and, where libhwloc-plugins is installed (apt's default with
# recommends), libxml2. Their errors differ; ours must not depend on which.
set -e
# The program is built, so it lives in the build tree (not beside this
# script in a VPATH build such as distcheck's); the harness sets top_builddir.
prog=${top_builddir:-.}/tests/test_topo
for libxml in 0 1; do
	echo "== HWLOC_LIBXML_IMPORT=$libxml"
	HWLOC_LIBXML_IMPORT=$libxml "$prog"
done
