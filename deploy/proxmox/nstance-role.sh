#!/bin/sh
# Creates what nstance-server needs in a Proxmox VE cluster (docs/install-proxmox.md):
# the NstanceServer role, the nstance@pve user and its API token, the resource
# pool the template and the instances live in, and the ACLs that scope the
# role to that pool, the two storages, the nodes and the bridge's SDN zone.
#
# Run as root on one node of the cluster:
#   sh nstance-role.sh [pool] [cloud-init storage] [disk storage] [sdn zone]
# (defaults: nstance local local-lvm localnetwork). It can be run again: the
# role's privileges are reset, the rest is kept. The token's secret is printed
# once, by the last command; keep it for shard.infra.options.token_secret_file.
set -eu

POOL=${1:-nstance}
CI_STORAGE=${2:-local}
DISK_STORAGE=${3:-local-lvm}
ZONE=${4:-localnetwork}
ROLE=NstanceServer
USER_ID=nstance@pve
TOKEN=server

# The privileges of every API call the provider makes (proxmox.Calls in
# internal/server/provider/proxmox; a test keeps the two equal).
PRIVS="Datastore.Allocate,Datastore.AllocateSpace,Datastore.AllocateTemplate,Datastore.Audit,SDN.Use,Sys.Audit,VM.Allocate,VM.Audit,VM.Clone,VM.Config.CDROM,VM.Config.CPU,VM.Config.Memory,VM.Config.Options,VM.PowerMgmt"

if pveum role list --output-format json | grep -q "\"roleid\":\"$ROLE\""; then
	pveum role modify "$ROLE" --privs "$PRIVS"
else
	pveum role add "$ROLE" --privs "$PRIVS"
fi
pveum user list --output-format json | grep -q "\"userid\":\"$USER_ID\"" ||
	pveum user add "$USER_ID" --comment "nstance-server (API token only)"
pveum pool list --output-format json | grep -q "\"poolid\":\"$POOL\"" ||
	pveum pool add "$POOL" --comment "nstance instances and their template"

# VMs: the template and every instance are in the pool (clones join it).
pveum acl modify "/pool/$POOL" --users "$USER_ID" --roles "$ROLE"
# The cloud-init seed ISOs (upload, attach, delete) and the clones' disks.
pveum acl modify "/storage/$CI_STORAGE" --users "$USER_ID" --roles "$ROLE"
pveum acl modify "/storage/$DISK_STORAGE" --users "$USER_ID" --roles "$ROLE"
# Node memory for placement (Sys.Audit).
pveum acl modify /nodes --users "$USER_ID" --roles "$ROLE"
# The bridges of the template's network devices (SDN.Use).
pveum acl modify "/sdn/zones/$ZONE" --users "$USER_ID" --roles "$ROLE"

# Without privilege separation the token has the user's privileges (the ACLs above).
pveum user token add "$USER_ID" "$TOKEN" --privsep 0 --comment "nstance-server"
