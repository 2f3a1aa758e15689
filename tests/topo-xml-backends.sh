#!/bin/sh
# The topology tests under each of hwloc's XML readers: its own minimal
# parser and, where libhwloc-plugins is installed (apt's default with
# recommends), libxml2. Their errors differ; ours must not depend on which.
set -e
dir=$(dirname "$0")
for libxml in 0 1; do
	echo "== HWLOC_LIBXML_IMPORT=$libxml"
	HWLOC_LIBXML_IMPORT=$libxml "$dir/test_topo"
done
