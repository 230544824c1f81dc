#!/bin/sh
# User data of a development node: a Go template that nstance-server renders
# for each instance ({{ .Instance.Hostname }} in shard {{ .Shard }}). The
# agent runs it in the instance's directory once its first files are there.
# It joins the dev cluster's API server as a hollow kubelet
# (nstance-hollow-kubelet) with the client certificate Nstance issued for
# this node (CN=system:node:{{ .Instance.Hostname }}, O=system:nodes, signed
# by the imported CA "kubernetes"); its key never left this instance.
set -eu
server='{{ .Vars.kube_server }}'
server_ca='{{ .Vars.kube_ca }}'
kubelet='{{ .Vars.hollow_kubelet }}'
if [ -z "$server" ]; then
	echo "node: no Kubernetes API server in this dev stack: no kubelet on this instance"
	exit 0
fi
crt="$NSTANCE_FILES_DIR/kubelet/client.crt"
key="$NSTANCE_KEYS_DIR/kubelet-client.key"
# The API server may still be starting, the certificate still being issued.
echo "node: waiting for the API server's CA ($server_ca), $kubelet and the kubelet client certificate"
waited=0
while [ ! -s "$server_ca" ] || [ ! -x "$kubelet" ] || [ ! -s "$crt" ] || [ ! -s "$key" ]; do
	sleep 0.2
	waited=$((waited + 1))
	if [ $((waited % 150)) -eq 0 ]; then echo "node: still waiting ($((waited / 5))s)"; fi
done
# An API server on a port chosen at start (make dev-tmux-apiserver) writes its
# URL beside its CA.
if [ -s "$(dirname "$server_ca")/server-url" ]; then server=$(cat "$(dirname "$server_ca")/server-url"); fi
umask 077
mkdir -p kubelet
cat > kubelet/kubeconfig <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: dev
  cluster: {server: "$server", certificate-authority: "$server_ca"}
users:
- name: node
  user: {client-certificate: "$crt", client-key: "$key"}
contexts:
- name: dev
  context: {cluster: dev, user: node}
current-context: dev
KUBECONFIG
echo "node: starting the hollow kubelet {{ .Instance.Hostname }} ($NSTANCE_PROVIDER_ID)"
exec "$kubelet" --name '{{ .Instance.Hostname }}' --kubeconfig kubelet/kubeconfig --provider-id "$NSTANCE_PROVIDER_ID" \
	--root-dir "$PWD/kubelet/root" --content-type '{{ .Vars.kube_content_type }}' \
	--node-labels 'node.kubernetes.io/instance-type={{ .Instance.Type }},nstance.dev/group={{ .Group }},nstance.dev/shard={{ .Shard }}'
