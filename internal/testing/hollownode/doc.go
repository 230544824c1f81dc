// Package hollownode runs hollow kubelets for tests: kubemark (built from
// k8s.io/kubernetes by scripts/envtest-assets.sh, next to the envtest
// binaries) started as a child process with --morph=kubelet. A hollow kubelet
// is the real kubelet code with a fake container runtime, fake cAdvisor and a
// stub container manager: it registers its Node, keeps the Node's status and
// lease current, runs the pods bound to it (their containers only pretend to
// run) and honours deletion and eviction, all through the API server with the
// node identity of its client certificate. It needs neither root nor cgroups
// (about 80 MB resident when idle), and runs the same as root or not: it
// writes only under /tmp.
//
// # Identity and providerID
//
// kubemark always registers its Node with spec.providerID "kubemark://NAME";
// no flag changes that. The kubelet keeps a Node that already exists, though,
// so when the providerID matters the caller creates the Node first, with the
// providerID it wants, using the same node identity (CN=system:node:NAME,
// O=system:nodes; the NodeRestriction admission plugin lets a node create
// only its own Node). Start does not create the Node: doing it is the
// caller's (and in the product, the instance's user data's) job. With
// Options.ProviderID set, Node.WaitReady fails when the Ready Node carries a
// different providerID.
//
// # What it listens on
//
// kubemark hard-codes the kubelet's bind address (every interface, IPv4 and
// IPv6) and has no flag for it: the kubelet port (picked with portpick, so
// it does not collide with other tests) is reachable from other hosts. It
// is plain HTTP without authentication (kubemark gives the kubelet server
// no TLS and no authenticator) with the debugging handlers on: anyone who
// reaches the port can read /pods and /configz and, through /logs/, the
// files under the host's /var/log that the process may read. The read-only
// port is off (--kubelet-read-only-port=0); nothing else listens on TCP.
// Only a network namespace could keep the port off the network; hollownode
// does not do that, because the kubelet must reach the API server on the
// host's loopback, which a namespace of its own does not have (it would need
// a veth pair, routes and an API server listening on that address). Run
// hollow kubelets on machines whose network peers you trust, or behind a
// host firewall.
//
// # What it writes
//
// The kubelet's root directory (pods, plugins, pod-resources socket,
// checkpoints) is /tmp/hollow-kubelet.<random>, and the fake runtime listens
// on the unix socket /tmp/kubelet_remote_<random>.sock: kubemark takes both
// from fixed patterns under /tmp (ignoring TMPDIR) and removes neither. Each
// Node therefore learns their exact names from the process's log while it
// starts (kubemark logs the root directory; Start passes
// --vmodule=remote_runtime=3 so the kubelet logs the socket) and removes
// exactly those two paths after the process ends; it never deletes by
// pattern. A process killed from outside before it logged them can still
// leave them behind. Everything else (kubeconfig, log) lives in
// the Node's own directory under t.TempDir().
//
// # Lifetime
//
// Start returns once the process runs and its runtime socket is up;
// WaitReady waits (watching, bounded by the context) for the Node to be
// Ready. The process is stopped by its PID at the test's cleanup (SIGTERM,
// SIGKILL after a grace period), or earlier with Stop. Its stdout and stderr
// go to Node.LogPath; when the test failed, cleanup prints the log's tail.
//
// The kubelet speaks protobuf to the API server by default; a server that
// speaks only JSON (dev-k8s) needs Options.ContentType = ContentTypeJSON.
package hollownode
