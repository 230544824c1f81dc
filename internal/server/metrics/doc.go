// Package metrics defines every Prometheus series nstance-server exports.
// Figures that are state (instances, groups, drains, agents, certificates,
// elections) are read from the live stores at scrape time by collectors;
// only events (RPCs, registrations, provider calls, reconciles, leadership
// changes, handshake failures) are counted as they happen. Labels stay
// bounded: tenant and group come from the shard's group registry, never an
// instance id. An anonymous scrape gets Public: the same series without
// tenant and group labels (merged); the full view needs the bearer token of
// --metrics-token-file (health.Metrics).
//
// gRPC, from grpc-ecosystem's middleware on every gRPC server (labels
// grpc_type, grpc_service, grpc_method, grpc_code):
//
//	grpc_server_started_total            counter
//	grpc_server_handled_total            counter   (+ grpc_code)
//	grpc_server_msg_received_total       counter
//	grpc_server_msg_sent_total           counter
//	grpc_server_handling_seconds         histogram
//
// Server process and leadership:
//
//	nstance_server_info{cluster,shard,server,version}  gauge  always 1 (join on instance for the shard)
//	nstance_server_ready                          gauge    1 when config loaded and cache synced
//	nstance_server_shard_leader                   gauge    1 while leading the shard
//	nstance_server_cluster_leader                 gauge    1 while leading the cluster
//	nstance_server_election_term{election}        gauge    term of the lease last seen (election: shard|cluster)
//	nstance_server_leadership_transitions_total{election,direction}  counter  direction: acquired|lost
//	nstance_server_tls_handshake_failures_total{listener,reason}     counter
//	nstance_server_certificate_expiry_timestamp_seconds{certificate} gauge    certificate: server|ca|agent_soonest
//	nstance_server_registrations_total{kind,outcome}                 counter  kind: agent|operator; outcome: ok or the gRPC code in snake case
//	nstance_server_provider_calls_total{operation}                   counter  operation: create|status|list|delete
//	nstance_server_provider_errors_total{operation}                  counter  (not_found from status is no error)
//	nstance_server_load_balancer_calls_total{load_balancer,operation,outcome} counter  operation: register|deregister|remove|remove_stranger; outcome: ok|error
//	nstance_server_provider_call_duration_seconds{operation}         histogram
//
// Reconciler (client-go work queue of the shard leader):
//
//	nstance_server_reconcile_queue_depth                    gauge
//	nstance_server_reconcile_enqueued_total                 counter
//	nstance_server_reconcile_retries_total                  counter
//	nstance_server_reconcile_queue_wait_seconds             histogram  time an item waited in the queue
//	nstance_server_reconcile_duration_seconds               histogram  time one reconcile of an item took
//	nstance_server_reconcile_unfinished_seconds             gauge
//	nstance_server_reconcile_longest_running_seconds        gauge
//
// Fleet (only while this server leads its shard; read at scrape time):
//
//	nstance_server_instances{tenant,group,state}            gauge  group "" for instances outside a group
//	nstance_server_group_desired_instances{tenant,group}    gauge
//	nstance_server_group_actual_instances{tenant,group}     gauge  active members (not on-demand)
//	nstance_server_group_ready_instances{tenant,group}      gauge
//	nstance_server_drains_pending{tenant,group}             gauge  pending deletion, drain not yet acknowledged
//	nstance_server_drains_past_deadline{tenant,group}       gauge  of those, past their drain deadline
//	nstance_server_drain_oldest_age_seconds{tenant,group}   gauge  age of the oldest pending drain
//	nstance_server_agents_connected                         gauge  instances with an open agent stream
//	nstance_server_health_report_oldest_age_seconds{tenant,group} gauge  oldest last health report among running members
//
// Plus the Go runtime (go_*) and process (process_*) collectors.
package metrics
