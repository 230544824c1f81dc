// Package scripts tests the shell side of the repository by running it:
// scripts/lib/progress.sh (heartbeat timing), scripts/envtest-assets.sh
// (cache check, lock, build progress) and .ci/run (installs, progress), with
// fake go, make and apt-get programs where the real ones would take minutes.
// A static pass checks that every long step of .ci/run,
// scripts/envtest-assets.sh and the `make dev-tmux-k8s` start-up goes through
// the progress helper and that no script pipes into an early-exiting reader.
package scripts
