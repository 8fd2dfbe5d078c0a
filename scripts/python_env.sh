# Sourced by the scripts: the project's Python. By default a virtual environment (VIDIT_VENV,
# default <checkout>/.venv) that scripts/install_deps.sh makes, never the system Python (Debian's
# refuses `pip install`: PEP 668). PYTHON=/path/to/python overrides it (e.g. a cluster's own CUDA
# torch); install_deps.sh then installs nothing into it that is not a virtual environment.
# Exports VIDIT_VENV, PYTHON and VIDIT_PYTHON_GIVEN (1 when PYTHON came from the caller). The
# build hands PYTHON to CMake, so LibTorch and every Python reference the tests run come from it.
VIDIT_ROOT=${VIDIT_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export VIDIT_VENV=${VIDIT_VENV:-$VIDIT_ROOT/.venv}
if [[ -n "${PYTHON:-}" && "${PYTHON}" != "$VIDIT_VENV/bin/python" ]]; then
  export VIDIT_PYTHON_GIVEN=1
else
  export VIDIT_PYTHON_GIVEN=0 PYTHON=$VIDIT_VENV/bin/python
fi
