#!/bin/bash
# User data for an nstance-server instance (cloud-init runs it once, as root,
# at first boot; docs/install-aws.md). It installs the nstance-server binary
# (downloaded and checked against a pinned SHA-256, or already in the AMI),
# writes /etc/nstance/server.env and the hardened systemd unit, and starts the
# server. The server joins its shard's election; the winner attaches the
# shard's leader network interface (NSTANCE_LEADER_ENI).
#
# Settings, as environment variables set before this script runs (the
# CloudFormation example in deploy/aws/cloudformation writes them above it):
#   NSTANCE_SHARD             shard ID, the config/<shard>.jsonc in storage
#   NSTANCE_STORAGE_BUCKET    S3 bucket of the cluster
#   NSTANCE_STORAGE_PREFIX    key prefix inside it (may be empty)
#   NSTANCE_LEADER_ENI        the shard's leader network interface (eni-...)
#   NSTANCE_LEADER_ADDRESS    its fixed private address (advertised to clients)
#   NSTANCE_RELEASE_URL       base URL of nstance-server-linux-<arch>; empty:
#                             use /usr/local/bin/nstance-server from the AMI
#   NSTANCE_SHA256_AMD64      SHA-256 of nstance-server-linux-amd64
#   NSTANCE_SHA256_ARM64      SHA-256 of nstance-server-linux-arm64
#   NSTANCE_KEY_SECRET_ID     optional: Secrets Manager secret holding the
#                             encryption key, fetched with the aws CLI into a
#                             systemd credential (needs the aws CLI in the
#                             AMI; not needed when the shard config reads the
#                             key from Secrets Manager or SSM itself)
#   AWS_REGION                region of the bucket and the instance
#   NSTANCE_INSTALL_ROOT      tests only: a directory standing in for /
# Avoid the dollar-brace form of expansion in this file: the CloudFormation
# template embeds it in Fn::Sub, which would take it for a reference.
set -euo pipefail
umask 022

log() { echo "nstance-user-data: $*" >&2; }
die() { log "error: $*"; exit 1; }

for v in NSTANCE_SHARD NSTANCE_STORAGE_BUCKET NSTANCE_LEADER_ENI NSTANCE_LEADER_ADDRESS AWS_REGION; do
	[ -n "$(printenv "$v" || true)" ] || die "$v is not set"
done
NSTANCE_STORAGE_PREFIX=$(printenv NSTANCE_STORAGE_PREFIX || true)
NSTANCE_RELEASE_URL=$(printenv NSTANCE_RELEASE_URL || true)
NSTANCE_KEY_SECRET_ID=$(printenv NSTANCE_KEY_SECRET_ID || true)
root=$(printenv NSTANCE_INSTALL_ROOT || true)

# Instance identity from IMDSv2 (the server ID is the instance ID).
imds() {
	local token
	token=$(curl -fsS --retry 5 --retry-connrefused -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 300" \
		http://169.254.169.254/latest/api/token)
	curl -fsS --retry 5 --retry-connrefused -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/meta-data/$1"
}
instance_id=$(imds instance-id)
[ -n "$instance_id" ] || die "no instance ID from the instance metadata service"

case "$(uname -m)" in
x86_64) arch=amd64 want=$(printenv NSTANCE_SHA256_AMD64 || true) ;;
aarch64) arch=arm64 want=$(printenv NSTANCE_SHA256_ARM64 || true) ;;
*) die "unsupported machine $(uname -m)" ;;
esac

bin=$root/usr/local/bin/nstance-server
if [ -n "$NSTANCE_RELEASE_URL" ]; then
	[[ $want =~ ^[0-9a-f]{64}$ ]] || die "NSTANCE_SHA256_$arch is not a SHA-256 (64 hex digits): '$want'"
	tmp=$(mktemp)
	trap 'rm -f "$tmp"' EXIT
	log "downloading $NSTANCE_RELEASE_URL/nstance-server-linux-$arch"
	curl -fsSL --retry 10 --retry-connrefused -o "$tmp" "$NSTANCE_RELEASE_URL/nstance-server-linux-$arch"
	got=$(sha256sum "$tmp" | cut -d' ' -f1)
	[ "$got" = "$want" ] || die "nstance-server-linux-$arch has SHA-256 $got, want $want"
	install -D -m 0755 "$tmp" "$bin"
fi
[ -x "$bin" ] || die "$bin is missing: set NSTANCE_RELEASE_URL or bake the binary into the AMI"
"$bin" --version >/dev/null || die "$bin does not run"

install -d -m 0755 "$root/etc/nstance" "$root/etc/systemd/system"
env_file=$root/etc/nstance/server.env
cat > "$env_file.tmp" <<ENV
NSTANCE_SERVER_ID=$instance_id
NSTANCE_SHARD=$NSTANCE_SHARD
NSTANCE_STORAGE=s3
NSTANCE_STORAGE_BUCKET=$NSTANCE_STORAGE_BUCKET
NSTANCE_STORAGE_PREFIX=$NSTANCE_STORAGE_PREFIX
NSTANCE_ADVERTISE_HOST=$NSTANCE_LEADER_ADDRESS
NSTANCE_LEADER_ENI=$NSTANCE_LEADER_ENI
AWS_REGION=$AWS_REGION
ENV
chmod 0644 "$env_file.tmp"
mv "$env_file.tmp" "$env_file"

# The unit, as in deploy/aws/systemd/nstance-server.service.
cat > "$root/etc/systemd/system/nstance-server.service" <<'UNIT'
# nstance-server as a hardened systemd service (docs/install-aws.md).
# Settings come from /etc/nstance/server.env (NSTANCE_* variables, one per
# flag; `nstance-server --help` lists them). The server keeps nothing on disk
# but its SQLite cache, which it rebuilds from object storage at start.
[Unit]
Description=Nstance shard server
Documentation=https://github.com/nstance-dev/nstance/blob/main/docs/install-aws.md
Wants=network-online.target
After=network-online.target
StartLimitIntervalSec=0

[Service]
Type=simple
ExecStart=/usr/local/bin/nstance-server
EnvironmentFile=/etc/nstance/server.env
Environment=NSTANCE_CACHE_DIR=%C/nstance-server NSTANCE_LOG_FORMAT=json HOME=%S/nstance-server
Restart=always
RestartSec=2s
# SIGTERM: the leader steps down and releases its lease and interface.
KillSignal=SIGTERM
TimeoutStopSec=30s
LimitNOFILE=1048576

# An unprivileged user allocated at start; no login, no files outside the
# directories below.
DynamicUser=yes
User=nstance-server
Group=nstance-server
StateDirectory=nstance-server
StateDirectoryMode=0700
CacheDirectory=nstance-server
CacheDirectoryMode=0700
WorkingDirectory=%S/nstance-server
UMask=0077

NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
PrivateUsers=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
RemoveIPC=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources
SystemCallErrorNumber=EPERM
DevicePolicy=closed

[Install]
WantedBy=multi-user.target
UNIT

# Optional: the encryption key as a systemd credential (readable by the
# service only, never in the environment of other processes).
if [ -n "$NSTANCE_KEY_SECRET_ID" ]; then
	command -v aws >/dev/null || die "NSTANCE_KEY_SECRET_ID is set but the aws CLI is missing"
	install -d -m 0700 "$root/etc/nstance/credentials"
	(
		umask 077
		aws secretsmanager get-secret-value --region "$AWS_REGION" --secret-id "$NSTANCE_KEY_SECRET_ID" \
			--query SecretString --output text > "$root/etc/nstance/credentials/encryption-key"
	)
	install -d -m 0755 "$root/etc/systemd/system/nstance-server.service.d"
	cat > "$root/etc/systemd/system/nstance-server.service.d/encryption-key.conf" <<'DROPIN'
[Service]
LoadCredential=encryption-key:/etc/nstance/credentials/encryption-key
DROPIN
	log "encryption key at /run/credentials/nstance-server.service/encryption-key (config: provider file)"
fi

systemctl daemon-reload
systemctl enable --now nstance-server.service
log "nstance-server $instance_id started for shard $NSTANCE_SHARD"
