#!/usr/bin/env bash
# Turns a fresh GPU instance into a Thaw worker. Runs once, as root, from EC2 user data.
#
# The ec2 provider (warm_pool/providers/ec2.py) puts the THAW_* assignments in front of this file.
# The AMI brings the NVIDIA driver, curl and Python 3.11+. The cluster token is not
# here: the worker reads it from the Secrets Manager secret (or the SSM parameter) named
# below, with its instance role.
set -euo pipefail

: "${THAW_CONTROLLER_URL:?must be set: the URL workers reach the controller at}"
: "${THAW_CLUSTER:?must be set: the cluster name}"
: "${THAW_SHAPE:?must be set: the instance shape this instance serves}"
: "${THAW_WORKER_ID:?must be set: the worker id the controller launched this instance for}"
: "${THAW_WORKER_PORT:?must be set: the port thaw worker listens on}"
THAW_TOKEN_SECRET="${THAW_TOKEN_SECRET:-}"
THAW_TOKEN_SSM_PARAMETER="${THAW_TOKEN_SSM_PARAMETER:-}"
if [[ -z "$THAW_TOKEN_SECRET" && -z "$THAW_TOKEN_SSM_PARAMETER" ]]; then
    echo "THAW_TOKEN_SECRET or THAW_TOKEN_SSM_PARAMETER must be set: where the cluster token is" >&2
    exit 1
fi
THAW_PACKAGE="${THAW_PACKAGE:-thaw-serve[gpu]}"
# Optional: an s3:// URI of the Thaw config file, fetched with the instance role. Without
# it the worker reads /etc/thaw/thaw.yaml if the AMI has one.
THAW_CONFIG_URI="${THAW_CONFIG_URI:-}"
# Where the instance-store NVMe is mounted: the disk tier of the weight cache (the
# config's shapes[].cache.dir). Without instance store it is a directory on the root volume.
THAW_CACHE_MOUNT="${THAW_CACHE_MOUNT:-/mnt/thaw-cache}"

# Tests (tests/test_infra.py) run this script with stub commands and a scratch
# directory standing in for /; on an instance it is unset.
ROOT="${THAW_BOOTSTRAP_ROOT:-}"
PREFIX="$ROOT/opt/thaw"
VENV="$PREFIX/venv"
HOME_DIR="$ROOT/var/lib/thaw"
UNIT="$ROOT/etc/systemd/system/thaw-worker.service"
CONFIG="$ROOT/etc/thaw/thaw.yaml"
IMDS=http://169.254.169.254

log() { echo "thaw-bootstrap: $*" >&2; }

# A double-quoted systemd word: backslashes, quotes and % (specifiers) escaped.
unit_word() {
    local v="${1//\\/\\\\}"
    v="${v//\"/\\\"}"
    printf '"%s"' "${v//%/%%}"
}
# The same for ExecStart=, where systemd also expands $VARIABLES.
exec_word() {
    local v
    v="$(unit_word "$1")"
    printf '%s' "${v//\$/\$\$}"
}

# IMDSv2: a session token first, then metadata reads that carry it.
IMDS_TOKEN="$(curl -fsS --retry 5 --retry-connrefused -X PUT \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "$IMDS/latest/api/token")"
imds() {
    curl -fsS --retry 5 --retry-connrefused \
        -H "X-aws-ec2-metadata-token: $IMDS_TOKEN" "$IMDS/latest/meta-data/$1"
}
INSTANCE_ID="$(imds instance-id)"
PRIVATE_IP="$(imds local-ipv4)"
REGION="$(imds placement/region)"
log "instance $INSTANCE_ID ($PRIVATE_IP, $REGION), worker $THAW_WORKER_ID, shape $THAW_SHAPE"

PYTHON=""
for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 \
        && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        PYTHON="$candidate"
        break
    fi
done
if [ -z "$PYTHON" ]; then
    log "no Python 3.11 or newer in this AMI"
    exit 1
fi

mkdir -p "$PREFIX"
if ! "$PYTHON" -m venv "$VENV"; then
    log "$PYTHON -m venv failed: the AMI needs Python's venv module (Ubuntu: the python3-venv package)"
    exit 1
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
log "installing $THAW_PACKAGE"
"$VENV/bin/python" -m pip install --quiet "$THAW_PACKAGE"

if [ -n "$THAW_CONFIG_URI" ]; then
    log "fetching the config from $THAW_CONFIG_URI"
    mkdir -p "$(dirname "$CONFIG")"
    AWS_DEFAULT_REGION="$REGION" "$VENV/bin/python" - "$THAW_CONFIG_URI" "$CONFIG" <<'PY'
import sys

import boto3

uri, dest = sys.argv[1], sys.argv[2]
bucket, _, key = uri.removeprefix("s3://").partition("/")
boto3.client("s3").download_file(bucket, key, dest)
PY
fi
CONFIG_ENV=""
if [ -f "$CONFIG" ]; then
    CONFIG_ENV="Environment=$(unit_word "THAW_CONFIG=$CONFIG")"
else
    log "no config at $CONFIG: the worker falls back to its default path"
fi
# Where the worker reads the cluster token (the secret wins when both are given).
if [ -n "$THAW_TOKEN_SECRET" ]; then
    TOKEN_ENV="Environment=$(unit_word "THAW_CLUSTER_TOKEN_SECRET=$THAW_TOKEN_SECRET")"
else
    TOKEN_ENV="Environment=$(unit_word "THAW_CLUSTER_TOKEN_SSM_PARAMETER=$THAW_TOKEN_SSM_PARAMETER")"
fi

# The worker runs as its own user; its state (model cache, snapshots) lives in its home.
if ! id thaw >/dev/null 2>&1; then
    useradd --system --home-dir "$HOME_DIR" --create-home --shell /usr/sbin/nologin thaw
fi

# The weight cache's disk: instance store is blank after every stop, so the worker's unit
# mounts it (formatting it) before each start, as root; here it is done once now too.
MOUNT_CACHE="$PREFIX/mount-cache.sh"
cat >"$MOUNT_CACHE" <<'SH'
#!/usr/bin/env bash
# mount-cache.sh MOUNTPOINT OWNER [ROOT]: the instance-store NVMe drives, striped when
# there are several, as a fresh XFS at MOUNTPOINT (nothing on them outlives a stop).
set -euo pipefail
mp="${3:-}$1"
owner="$2"
mkdir -p "$mp"
while read -r _ m _; do
    if [ "$m" = "$mp" ]; then exit 0; fi
done </proc/mounts
devices=()
declare -A seen=()
for link in "${3:-}"/dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_*; do
    [ -e "$link" ] || continue
    case "$link" in *-part*) continue ;; esac
    dev="$(readlink -f "$link")"
    if [ -n "${seen[$dev]:-}" ]; then continue; fi
    seen[$dev]=1
    devices+=("$dev")
done
if [ "${#devices[@]}" -eq 0 ]; then
    echo "mount-cache: no instance-store NVMe; $mp stays on the root volume" >&2
else
    dev="${devices[0]}"
    if [ "${#devices[@]}" -gt 1 ]; then
        dev=/dev/md/thaw-cache
        if [ ! -e "$dev" ]; then
            mdadm --create "$dev" --level=0 --raid-devices="${#devices[@]}" "${devices[@]}" --run --force
        fi
    fi
    mkfs.xfs -f -q "$dev"
    mount -o noatime "$dev" "$mp"
fi
chown "$owner" "$mp"
SH
chmod 0755 "$MOUNT_CACHE"
"$BASH" "$MOUNT_CACHE" "$THAW_CACHE_MOUNT" thaw "$ROOT"

mkdir -p "$(dirname "$UNIT")"
cat >"$UNIT" <<UNIT
[Unit]
Description=Thaw worker
Wants=network-online.target
After=network-online.target

[Service]
User=thaw
WorkingDirectory=$HOME_DIR
$TOKEN_ENV
Environment=$(unit_word "THAW_CLUSTER=$THAW_CLUSTER")
Environment=$(unit_word "AWS_REGION=$REGION")
Environment=$(unit_word "AWS_DEFAULT_REGION=$REGION")
$CONFIG_ENV
ExecStartPre=+$(exec_word "$MOUNT_CACHE") $(exec_word "$THAW_CACHE_MOUNT") thaw
ExecStart=$VENV/bin/thaw worker \
    --controller $(exec_word "$THAW_CONTROLLER_URL") \
    --shape $(exec_word "$THAW_SHAPE") \
    --instance-id $(exec_word "$INSTANCE_ID") \
    --worker-id $(exec_word "$THAW_WORKER_ID") \
    --host 0.0.0.0 \
    --port $(exec_word "$THAW_WORKER_PORT") \
    --advertise-host $(exec_word "$PRIVATE_IP")
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT

systemctl daemon-reload
systemctl enable --now thaw-worker.service
log "thaw-worker.service started"
