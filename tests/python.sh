#!/bin/sh
# The Python package's pytest suite (python/tests): the API against two
# rdmapsd on loopback, the digits example (sync bit-identical to a
# reference, async and bounded learning, launch paths, srun under a private
# single-node Slurm where one is installed), rdmaps.torch.  It needs an
# interpreter with torch, numpy, sklearn and pytest: $RDMAPS_PYTHON if set,
# else Debian's /usr/bin/python3 (python3-torch and friends install there),
# else the first python3 on PATH; without one it is skipped (77).
# Run by `make check`, which sets top_srcdir and top_builddir.
: "${top_srcdir:=.}" "${top_builddir:=.}"
py=
for c in ${RDMAPS_PYTHON:-} /usr/bin/python3 python3; do
	if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch, numpy, sklearn, pytest' >/dev/null 2>&1; then
		py=$c
		break
	fi
done
if [ -z "$py" ]; then
	echo "SKIP: no python3 with torch, numpy, sklearn and pytest" \
		"(apt-get install python3-torch python3-numpy python3-sklearn python3-pytest)"
	exit 77
fi
builddir=$(cd "$top_builddir" && pwd) srcdir=$(cd "$top_srcdir" && pwd)
lib=$builddir/.libs/librdmaps.so
if [ ! -f "$lib" ]; then
	echo "SKIP: no $lib (a static-only build?)"
	exit 77
fi
# A library built with -fsanitize (CI's ASan and TSan passes) cannot be
# loaded into a python that was not: its runtime must come first in the
# process, and preloading it would report the interpreter's own leaks.
if nm -D "$lib" 2>/dev/null | grep -qE ' U (__asan_init|__tsan_init|__ubsan_handle_)'; then
	echo "SKIP: $lib is built with a sanitizer; the Python suite runs in the plain build"
	exit 77
fi
echo "python: $py ($("$py" -c 'import sys, torch, numpy; print(sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__)'))"
# the package from the source tree, the library and rdmapsd from the build
# tree; nothing written into the source tree (distcheck makes it read-only)
RDMAPS_LIBRARY=$lib RDMAPS_RDMAPSD=$builddir/rdmapsd PYTHONPATH=$srcdir/python PYTHONDONTWRITEBYTECODE=1
export RDMAPS_LIBRARY RDMAPS_RDMAPSD PYTHONPATH PYTHONDONTWRITEBYTECODE
cd "$builddir" && exec "$py" -m pytest -q -p no:cacheprovider "$srcdir/python/tests"
