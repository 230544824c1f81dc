// Package metrics defines the operator's own Prometheus series, registered
// on controller-runtime's registry next to its controller_runtime_*,
// workqueue_*, rest_client_* and leader_election_* series:
//
//	nstance_operator_group_sync_duration_seconds{shard,op,result}  histogram  UpsertGroup/DeleteGroup calls to a shard
//	nstance_operator_stream_reconnects_total{shard,stream}          counter    watch streams reopened after a failure
//	nstance_operator_shard_up{shard}                               gauge      1 while the gRPC connection to the shard is ready
//	nstance_operator_imported_groups_total                         counter    server groups imported into Kubernetes
//	nstance_operator_drain_duration_seconds{shard,outcome}         histogram  announcement to acknowledgement (drained, skipped)
//	nstance_operator_evictions_total{outcome}                      counter    evicted, gone, blocked (PodDisruptionBudget), error
//	nstance_operator_drains_pending                                gauge      drains tracked: announced, instance not yet deleted
package metrics
